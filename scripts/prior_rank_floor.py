"""The pruning recall a schedule guarantees teacher-forced, at every ε, from the prior alone (issue 52;
docs/sequential_attack.md, "Pruning that keeps the answer").

A stage `[layers_upto, keep, prior_keep]` keeps the prior's prior_keep best among its candidates; the first
stage's candidates are the whole vocabulary, so a truth the prior ranks below the narrowest prior_keep up to a
stage survives that stage and every one before it, for both scorers, whatever the exposures say (a stage
without a third element ends the bound; prune_prior and prune_union_prior, null by default, are not read). Teacher-forced the prior is the model's next-token distribution after the true prefix: it
does not depend on ε or on the view. So the fraction of positions whose truth the prior ranks below prior_keep is
a lower bound on that stage's pruning recall at every ε, computed here without an attack: one prefill per
prompt (`sq.Prefill`, as the attacker reads it). Per stage: the count, the fraction and its Clopper–Pearson 95%
interval, and the quantiles of the truth's prior rank. Free-running has no such bound: its prior follows the
attacker's own recovery.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python scripts/prior_rank_floor.py \\
        --dolly ../shared/data/dolly/dolly_prompts.jsonl --out docs/results/sequential/prune_schedule/issue52
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dolly", type=Path, required=True, help="dolly_prompts.jsonl")
    parser.add_argument("--prompts", type=int, default=10, help="workload.n_prompts (the committed curve's: 10)")
    parser.add_argument("--positions", type=int, default=32, help="attack.sequential.max_positions")
    parser.add_argument("--prune", default=None, help="a schedule as JSON; default: the YAML's")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import numpy as np
    import torch
    from prune_schedule import compose_dolly  # scripts/ is this script's own folder on sys.path

    import harness.schema  # noqa: F401  (the sb.* resolvers)
    from attacks.splitee import sequential as sq
    from harness.results import atomic_write_bytes
    from metrics.proportions import clopper_pearson

    torch.set_num_threads(1)
    cfg, inputs, node, base = compose_dolly(args.dolly, args.prompts, args.positions)
    model, tokenizer = inputs.loaded.model, inputs.loaded.tokenizer
    if args.prune is not None:
        node["prune"] = json.loads(args.prune)
    settings = sq.Settings.from_config(node)
    starts = [sq.public_prefix_length(tokenizer, p, inputs.workload.chat_template) for p in inputs.prompts]
    positions = sq.attack_positions(settings, [len(p) for p in inputs.prompts], starts)
    ranks = []
    with torch.no_grad():
        for prompt, pos in zip(inputs.prompts, positions):
            if not pos:
                continue
            prefill = sq.Prefill(model, prompt, pos)
            for p in pos:
                log_prior = prefill.at(p).log_prior
                ranks.append(int((log_prior > log_prior[int(prompt[p])]).sum()))
    n = len(ranks)
    rows = []
    width = None   # the narrowest prior width so far: a truth must be within it at every stage up to this one
    for stage in settings.prune or ():
        width = None if len(stage) < 3 else stage[2] if width is None else min(width, stage[2])
        if width is None:   # a stage without the prior's best: no floor from here on
            rows.append({"stage": list(stage), "prior_keep": None})
            continue
        k = sum(r < width for r in ranks)
        rows.append({"stage": list(stage), "prior_keep": width, "kept": k, "n_positions": n, "floor": k / n,
                     "clopper_pearson95": list(clopper_pearson(k, n))})
    a = np.asarray(ranks)
    quantiles = {str(q): int(np.quantile(a, q)) for q in (0.5, 0.9, 0.95, 0.97, 0.99)}
    header = {"command": " ".join(["python scripts/prior_rank_floor.py", *sys.argv[1:]]), "overrides": base,
              "prune": [list(s) for s in settings.prune or ()], "n_positions": n,
              "prior_rank_quantiles": quantiles, "ranks": ranks}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "prior_floor.json", (json.dumps({**header, "stages": rows}, indent=2) + "\n").encode())
    lines = [f"Teacher-forced pruning-recall floor from the prior alone, {n} positions ({args.prompts} Dolly prompts × "
             f"{args.positions} text tokens); the truth's prior rank quantiles {quantiles}.", "",
             "| stage | prior_keep | truths the prior ranks below it | floor [Clopper–Pearson 95%] |",
             "| --- | ---: | ---: | --- |"]
    for r in rows:
        if r["prior_keep"] is None:
            lines.append(f"| {r['stage']} | — | — | none (no prior at this stage) |")
        else:
            lo, hi = r["clopper_pearson95"]
            lines.append(f"| {r['stage']} | {r['prior_keep']} | {r['kept']} of {n} | {r['floor']:.3f} [{lo:.3f}, {hi:.3f}] |")
    atomic_write_bytes(args.out / "prior_floor.md", ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
