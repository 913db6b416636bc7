"""One split training step (harness/splitft/step.py) against a plain training step of the same model, side
by side in one run (issue 12: split ≤ 1.3× plain).

Each round times, on the same batch and in a rotated order: `plain` (model(ids) → cross-entropy →
backward → AdamW step over A's and C's parameters), `split` (the split step with no defence: the cut
crossings, the server's detached copies and its backward through frozen B) and `privpair` (the same with
W1/W2 in their STE forms). The result is the median over rounds of each round's ratio to plain, with the
min–max range. Recording a step for the adversary view and measuring H are off, as on unrecorded steps.

    python -m benchmarks.splitft_step --model smollm2-135m --k 2 --m 28 --out docs/benchmarks/splitft_step.md
"""
from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.rounds import emit, median_range, round_ratios, run_rounds, wall_seconds

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama-4l")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--m", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from benchmarks.models import load_named_model
    from harness.splitft import trainable
    from harness.splitft.defences import Defence
    from harness.splitft.privpair import PrivPair, token_ce
    from harness.splitft.step import split_step

    model = load_named_model(args.model).model
    model.train()
    part, names = trainable.make_trainable(model, args.k, args.m, None)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([params[n] for n in names], lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    privpair = PrivPair(1.0, OmegaConf.load(ROOT / "conf" / "splitft" / "default.yaml").privpair)
    privpair.setup(part, ids, torch.Generator().manual_seed(0))

    def plain() -> None:
        opt.zero_grad(set_to_none=True)
        token_ce(model(input_ids=ids).logits, ids).mean().backward()
        opt.step()

    steps = {"plain": plain, "split": lambda: split_step(part, Defence(), ids, opt),
             "privpair": lambda: split_step(part, privpair, ids, opt)}
    for fn in steps.values():      # warm-up: allocator, lazy imports
        fn()
    times = run_rounds({name: wall_seconds(fn) for name, fn in steps.items()}, args.rounds)
    ratios = {k: round_ratios(times, k, "plain") for k in ("split", "privpair")}
    lines = [f"# Split step vs plain training step: {args.model}, k={args.k}, m={args.m}", "",
             f"batch {args.batch} × {args.seq} tokens, {args.rounds} rounds, {args.threads} torch thread(s), "
             f"{platform.processor() or platform.machine()}, torch {torch.__version__}", "",
             "| step | median seconds | ratio to plain (median [min, max]) |", "| --- | --- | --- |",
             f"| plain | {statistics.median(times['plain']):.4f} | 1 |"]
    for k, rs in ratios.items():
        med, lo, hi = median_range(rs)
        lines.append(f"| {k} | {statistics.median(times[k]):.4f} | {med:.3f} [{lo:.3f}, {hi:.3f}] |")
    text = "\n".join(lines) + "\n"
    emit(text, args.out)


if __name__ == "__main__":
    main()
