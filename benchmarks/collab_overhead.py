"""CoVeil's per-step cost against undefended fusion, side by side in one run (paper 003; issue target ≤ 1.10).

Each round decodes the same built-in examples once undefended and once under CoVeil (both fusion modes),
in alternating order, with the same models and KV-cached steps; a step's time covers both parties'
forward passes, the defence and the fusion (harness/collab/engine.py). The result is the median over
rounds of each round's ratio (CoVeil seconds per step / undefended seconds per step), with the min-max
range, and the defence's own share of a step.

    python -m benchmarks.collab_overhead --model smollm2-135m --out docs/benchmarks/collab_overhead_smollm2.md
"""
from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.rounds import emit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--examples", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lam", type=float, default=2.0)
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from benchmarks.models import load_named_model
    from harness.collab import benchmarks, engine, prompts
    from harness.collab.defences import CoVeil, Defence

    loaded = load_named_model(args.model)
    tok, vocab = loaded.tokenizer, len(loaded.tokenizer)
    bench = benchmarks.load_benchmark(OmegaConf.create(dict(name="builtin", path=None, hub_id=None,
                                                            n_examples=args.examples, max_context_words=None,
                                                            answer_critical=False)))
    inputs = [(ex, prompts.encode(tok, prompts.party_text(ex, private=True)),
               prompts.encode(tok, prompts.party_text(ex, private=False))) for ex in bench.examples]
    defences = {"undefended": Defence(0.3), "coveil": CoVeil(0.3, args.lam, args.candidates)}
    lines = []
    for mode in ("cloud", "edge"):
        ratios, shares = [], []
        for r in range(args.rounds):
            per_step = {}
            order = list(defences) if r % 2 == 0 else list(reversed(defences))
            for name in order:
                steps, defence_s = [], 0.0
                for ex, e_ids, c_ids in inputs:
                    # min_new_tokens-like: no EOS stop, so both arms time the same number of steps.
                    d = engine.collaborate(loaded.model, loaded.model, e_ids, c_ids, defences[name], mode=mode,
                                           max_new_tokens=args.steps, vocab=vocab, eos=None,
                                           rng=torch.Generator().manual_seed(0), example_id=ex.id, view_top=100)
                    steps += d.step_seconds
                    defence_s += d.defence_seconds
                per_step[name] = statistics.fmean(steps)
                if name == "coveil":
                    shares.append(defence_s / sum(steps))
            ratios.append(per_step["coveil"] / per_step["undefended"])
        lines.append(f"| {mode}-side | {statistics.median(ratios):.3f} | [{min(ratios):.3f}, {max(ratios):.3f}] | "
                     f"{100 * statistics.median(shares):.2f}% |")
    report = "\n".join([
        f"# CoVeil per-step overhead ({args.model}, λ={args.lam:g}, |C|={args.candidates})", "",
        f"`python -m benchmarks.collab_overhead --model {args.model} --examples {args.examples} --steps {args.steps} "
        f"--rounds {args.rounds} --lam {args.lam:g} --candidates {args.candidates} --threads {args.threads}`", "",
        f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s). "
        f"Both roles played by {args.model}; {len(inputs)} built-in examples × {args.steps} steps per arm and round.", "",
        "| fusion | CoVeil / undefended s/step (median over rounds) | min–max | CoVeil's own share of a step |",
        "|:--|--:|--:|--:|", *lines, ""])
    emit(report, args.out)


if __name__ == "__main__":
    main()
