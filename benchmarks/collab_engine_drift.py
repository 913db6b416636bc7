"""How far the batched collab engine's numbers lie from the engine before batching, for deterministic defences.

The batched engine (collab.rng=per_example) gives every example the same bits at any batch size, but not the
bits of the engine before batching (collab.rng=shared: one example, one row a forward), because MKL's one-row
kernel (gemv) rounds differently from the kernel of four rows and more (harness/collab/batching.py). This
decodes the same examples both ways for deterministic defences (their outputs do not depend on the random
stream) and counts what moved: output ids, the exposures' token ids (the uploaded top-view_top ids in their
order, or the synced token) and the largest difference of an uploaded probability.

    python benchmarks/collab_engine_drift.py --examples 8 --max-new-tokens 48
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):      # run as a file: the repository on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.rounds import commit_label, emit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POINTS = (("collab_none", None, "cloud"), ("coveil", 1.0, "cloud"), ("collab_cogenesis", 10.0, "cloud"),
          ("collab_none", None, "edge"), ("coveil", 1.5, "edge"))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--path", type=Path, default=ROOT.parent / "shared" / "data" / "pubmedqa" / "ori_pqal.json")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from omegaconf import OmegaConf

    from benchmarks.models import load_named_model
    from harness.collab import batching, benchmarks, protocol
    from harness.collab.defences import make_defence

    lm = load_named_model(args.model)
    examples = benchmarks.load_benchmark(OmegaConf.create(dict(
        name="pubmedqa", path=str(args.path), hub_id=None, n_examples=args.examples, max_context_words=200,
        answer_critical=False))).examples
    rows = []
    for name, lam, mode in POINTS:
        d = make_defence(name, lam, alpha=0.3, candidates=100, dp_delta=1e-5, renyi_order=2.0)
        out, seconds = {}, {}
        for rng, b in (("shared", 1), ("per_example", len(examples))):
            pair = protocol.Pair(lm.model, lm.model, lm.tokenizer, len(lm.tokenizer), lm.tokenizer.eos_token_id,
                                 batch_size=b, rng=rng, prompt_cache=batching.PromptCache())
            start = time.process_time()
            out[rng] = protocol.collaborate_all(pair, examples, d, mode=mode, max_new_tokens=args.max_new_tokens,
                                                seed=0, view_top=100, desc=f"{name} {mode} {rng}")
            seconds[rng] = time.process_time() - start
        old, new = out["shared"], out["per_example"]
        moved, diff = 0, 0.0
        pairs = list(zip(old.view.exposures, new.view.exposures, strict=True))
        for x, y in pairs:
            if x.tensor.dim() == 2:         # uploaded (id, probability) rows
                moved += not torch.equal(x.tensor[:, 0], y.tensor[:, 0])
                if x.tensor.shape == y.tensor.shape and x.tensor.numel():
                    diff = max(diff, float((x.tensor[:, 1] - y.tensor[:, 1]).abs().max()))
            else:
                moved += not torch.equal(x.tensor, y.tensor)
        same = sum(a == b for a, b in zip(old.output_ids, new.output_ids))
        rows.append(f"| {name}{'' if lam is None else f' {lam:g}'} | {mode} | {same}/{len(examples)} | "
                    f"{moved}/{len(pairs)} | {diff:.1e} | {seconds['shared']:.0f} / {seconds['per_example']:.0f} |")
    text = "\n".join([
        f"# The batched collab engine against the engine before batching ({args.model})", "",
        f"`python benchmarks/collab_engine_drift.py --model {args.model} --examples {args.examples} "
        f"--max-new-tokens {args.max_new_tokens}`", "",
        f"Commit {commit_label()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the first {len(examples)} "
        "PubMedQA examples, one model in both roles, seed 0, view_top 100, 1 thread.", "",
        "| defence | fusion | examples with equal output ids | exposures whose ids moved | largest uploaded-probability "
        "difference | CPU-s before / batched |", "|:--|:--|--:|--:|--:|--:|", *rows, ""])
    emit(text, args.out)


if __name__ == "__main__":
    main()
