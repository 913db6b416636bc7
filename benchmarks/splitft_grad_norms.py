"""The scale of the gradient a client sends up (∂L/∂s'_B at cut m): the ℓ2 norms of its token rows in one
undefended split step, the numbers a `splitft.grad_up.clip` is chosen against (docs/splitft.md "The guard
on the gradient sent up"). The step is the runner's (harness/splitft/step.split_step) on the pretrained
model, LoRA as `experiment=splitft` sets it, one batch of `--batch` × `--tokens` tokens from the start of
`--text`. The last position's row is left out: no label reads it, so it is exactly 0.

    python -m benchmarks.splitft_grad_norms --model smollm2-135m --k 2 --m 28 --text ../shared/data/wikitext2/wiki.test.raw
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.models import load_named_model
from harness.splitft import defences, trainable
from harness.splitft.step import GRAD_UP, Recorder, split_step

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama-4l")
    ap.add_argument("--text", default=str(ROOT / "attacks" / "data" / "builtin_corpus.txt"))
    ap.add_argument("--k", type=int, default=1)    # the cuts of conf/splitft/default.yaml; experiment=splitft
    ap.add_argument("--m", type=int, default=2)    # on SmolLM2 cuts at 2 and 28
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    loaded = load_named_model(args.model)
    lora = OmegaConf.load(ROOT / "conf" / "splitft" / "default.yaml").lora
    lora.enabled = True
    part, names = trainable.make_trainable(loaded.model, args.k, args.m, lora)
    n = args.batch * args.tokens
    ids = torch.tensor(loaded.tokenizer(Path(args.text).read_text()[: 200 * n])["input_ids"][:n])
    optimizer = torch.optim.AdamW([dict(loaded.model.named_parameters())[p] for p in names], lr=1e-3)
    record = Recorder()
    split_step(part, defences.Defence(), ids.view(args.batch, args.tokens), optimizer, record=record)
    (grad,) = [e["tensor"] for e in record.exposures if e["channel"] == GRAD_UP]
    norms = grad.norm(dim=-1)[:, :-1].flatten()
    q = torch.quantile(norms, torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0]))
    print(f"{args.model} k={args.k} m={args.m} batch {args.batch}x{args.tokens}: rows of dL/ds'_B, l2 norm "
          f"min {q[0]:.2g}, 10% {q[1]:.2g}, median {q[2]:.2g}, 90% {q[3]:.2g}, max {q[4]:.2g}")


if __name__ == "__main__":
    main()
