"""Pruning recall and cost of the sequential attacker's schedules at small ε (issue 32 items 1 and 3;
docs/sequential_attack.md, "Pruning at small ε"; results in docs/results/sequential/prune_schedule/).

The runner's inputs (experiment=sequential_attack: SmolLM2-135M-Instruct, chat template, ep1) on --prompts Dolly
prompts are submitted once per ε and recorded; every schedule then attacks that same view (the same masks),
teacher-forced, MAP and likelihood together, no null view, the first --positions text tokens of each prompt,
with the exposures of --layers. Per schedule and ε: each scorer's pruning recall per stage (Wilson 95% over
positions, metrics/proportions.py), top-1 of both scorers and of the prior alone, seconds per position (wall
and process CPU) and candidates run through the model per position. A schedule is a JSON object of
attack.sequential keys (`prune`, `prune_union_prior`, `prune_prior`) over the YAML's.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 SPLITBENCH_CACHE=/tmp/sbcache-prune2 python scripts/prune_schedule.py \\
        --dolly ../shared/data/dolly/dolly_prompts.jsonl --epsilons 1 2 5 \\
        --out docs/results/sequential/prune_schedule
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEDULES = {
    "default": {},   # the YAML's: issue 32's until issue 52 (rows record their stages)
    "issue32": {"prune": [[0, 2048], [1, 256], [4, 32]]},
    "union2048": {"prune_union_prior": 2048},
    "wide0_8192": {"prune": [[0, 8192], [1, 256], [4, 32]]},
    "union2048_wide": {"prune": [[0, 2048], [1, 1024], [4, 128]], "prune_union_prior": 2048},
    # wide enough to read off (the truth's rank per stage) how wide each stage has to be
    "union8192_wider": {"prune": [[0, 8192], [1, 4096], [4, 1024]], "prune_union_prior": 8192},
    # issue 52: every stage keeps its own best ∪ the prior's best (the third element); the last stage's prior
    # width is the prior's 95th-percentile rank of the truth on the 10 × 32 Dolly positions (828)
    "prior1024": {"prune": [[0, 2048, 4096], [1, 256, 2048], [4, 64, 1024]]},
    "prior1536": {"prune": [[0, 2048, 4096], [1, 256, 2048], [4, 64, 1536]]},
    # prior1024 with wider own widths: on 2 prompts × 16 positions at ε = 15 MAP's truth needed 1,964 at stage 1
    # and 114 at stage 2
    "prior1024_wide": {"prune": [[0, 4096, 8192], [1, 1024, 2048], [4, 128, 1024]]},
    # the default since issue 52: the last stage holds the prior's 1,536 (its rank of the truth on the 10 × 32
    # positions: 97.2 % below 1,536, 95.3 % below 1,024)
    "issue52": {"prune": [[0, 4096, 8192], [1, 1024, 2048], [4, 128, 1536]]},
    # issue 52's reference point: MAP recall 1.0 at every stage, 15 s a position
    "wide12288": {"prune": [[1, 12288], [7, 2048], [15, 512]]},
}


def compose_dolly(dolly: Path, prompts: int, positions: int, extra: list[str] = ()) -> tuple:
    """(cfg, inputs, attack.sequential as a dict, the overrides) of the sequential attack on the first `prompts` Dolly prompts,
    `positions` attacked each, with `extra` overrides: the setting this script and prior_rank_floor.py read."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import harness.schema  # noqa: F401  (the sb.* resolvers)
    from runners.common import load_inputs

    base = ["experiment=sequential_attack", "configuration=ep1", "workload=dolly",
            f"workload.path={dolly.resolve()}", f"workload.n_prompts={prompts}",
            f"generation.batch_size={prompts}", f"attack.sequential.max_positions={positions}", *extra]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=base)
    node = OmegaConf.to_container(cfg.attack.sequential, resolve=True)
    assert isinstance(node, dict)
    return cfg, load_inputs(cfg), node, base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dolly", type=Path, required=True, help="dolly_prompts.jsonl")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--layers", default="0,1,2,3", help="comma-separated, or 'all'")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), help=f"names from {list(SCHEDULES)}")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", choices=["teacher_forced", "free_running"], default="teacher_forced")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch

    import harness.schema  # noqa: F401  (the sb.* resolvers)
    from attacks.splitee import sequential as sq
    from harness import configurations
    from harness.results import atomic_write_bytes
    from metrics.proportions import clopper_pearson, wilson

    torch.set_num_threads(args.threads)
    layers = "null" if args.layers == "all" else f"[{args.layers}]"
    cfg, inputs, node, base = compose_dolly(args.dolly, args.prompts, args.positions,
                                            ["attack.sequential.null_view=false", f"attack.sequential.layers={layers}",
                                             f"attack.sequential.mode={args.mode}"])
    model, tokenizer = inputs.loaded.model, inputs.loaded.tokenizer
    used = sq.check(sq.Settings.from_config(node), len(model.model.layers), list(cfg.engine.offload))
    keys = [(op, layer) for layer in used for op in node["ops"]]
    lengths = [len(p) for p in inputs.prompts]
    eps_lengths = inputs.epsilon_lengths(cfg.epn_n)
    engine_kw = dict(sigma_scale=float(cfg.engine.sigma_scale), sensitivity_rule=cfg.engine.sensitivity_rule)
    starts = [sq.public_prefix_length(tokenizer, p, inputs.workload.chat_template) for p in inputs.prompts]
    book = sq.layer0_codebook(model)
    rows_out = []
    for epsilon in args.epsilons:
        eps = configurations.effective_epsilon("ep1", epsilon)
        views, table = sq.record_view(model, inputs.prompts, configuration="ep1", epsilon=eps, seed=cfg.seed,
                                      offload=list(cfg.engine.offload), pad_token_id=inputs.pad,
                                      batch_size=args.prompts, epsilon_lengths=eps_lengths, **engine_kw)
        rows = sq.prompt_rows(views, lengths, args.prompts, keys)
        del views
        sigmas = sq.op_sigmas(model, "ep1", eps, eps_lengths, keys, table=table, **engine_kw)
        for name in args.schedules:
            settings = sq.Settings.from_config({**node, **SCHEDULES[name]})
            sq.check(settings, len(model.model.layers), list(cfg.engine.offload))
            wall, cpu = time.perf_counter(), time.process_time()
            out = sq.run(model, inputs.prompts, rows, sigmas, settings, keys, starts, book=book)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            # the decisive-miss check needs the true prefix (teacher-forced only)
            decisive = (sq.pruning_decisive(model, inputs.prompts, out, rows, sigmas, settings)
                        if args.mode == "teacher_forced" else {name: None for name in out.scorers})
            n = out.n_positions
            row = {"epsilon": epsilon, "schedule": name, "settings": SCHEDULES[name],
                   "stages": sq.record(out, settings, used)["stages"], "n_positions": n,
                   "seconds_per_position": wall / n, "cpu_seconds_per_position": cpu / n,
                   "candidates_per_position": sq.candidates_per_position(out),
                   "prior_top1": sum(sq._flat(out.prior_hits)) / n}
            for scorer, result in out.scorers.items():
                row[f"{scorer}_top1"] = sum(sq._flat(result.hits)) / n
                row[f"{scorer}_recall"] = [{"survived": k, "recall": k / n, "wilson95": list(wilson(k, n)),
                                            "clopper_pearson95": list(clopper_pearson(k, n))}
                                           for k in result.survived]
                # the width each stage needed to keep every truth that reached it (its rank + 1)
                row[f"{scorer}_ranks"] = result.ranks
                row[f"{scorer}_pruning_decisive"] = decisive[scorer]
                row[f"{scorer}_width_needed"] = [1 + max((x for x in r if x is not None), default=-1)
                                                 for r in result.ranks]
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    header = {"command": " ".join(["python scripts/prune_schedule.py", *sys.argv[1:]]), "layers_used": list(used),
              "prompts": args.prompts, "positions_per_prompt": args.positions, "threads": args.threads,
              "mode": node["mode"], "overrides": base}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "results.json", (json.dumps({**header, "rows": rows_out}, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "table.md", table_md(rows_out).encode())


def table_md(rows: list[dict]) -> str:
    def rec(r: dict, scorer: str) -> str:
        # Clopper–Pearson where the row has it (issue 52's rows), else Wilson (the rows of issue 32)
        return "; ".join(f"{s['recall']:.3f} [{lo:.3f}, {hi:.3f}]" for s in r[f"{scorer}_recall"]
                         for lo, hi in [s.get("clopper_pearson95", s["wilson95"])])

    lines = ["| ε | schedule | MAP recall per stage [95%: Clopper–Pearson, or Wilson in older rows] | likelihood recall per stage | MAP top-1 | likelihood top-1 | "
             "prior top-1 | MAP width needed per stage | MAP / likelihood pruning-decisive misses | s/position (wall) | "
             "CPU s/position | candidates/position |",
             "| ---: | --- | --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['epsilon']:g} | {r['schedule']} | {rec(r, 'map')} | {rec(r, 'likelihood')} | "
                     f"{100 * r['map_top1']:.1f}% | {100 * r['likelihood_top1']:.1f}% | {100 * r['prior_top1']:.1f}% | {r['map_width_needed']} | "
                     f"{r['map_pruning_decisive']} / {r['likelihood_pruning_decisive']} | "
                     f"{r['seconds_per_position']:.2f} | "
                     f"{r['cpu_seconds_per_position']:.2f} | {r['candidates_per_position']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
