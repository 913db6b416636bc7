"""Seconds per recovered position of the sequential attacker (attacks/splitee/sequential.py) against the fraction of
the vocabulary it runs through the model, for several pruning schedules, on one recorded view.

The built-in prompts (chat template on) are submitted once under ep1 at --epsilon and recorded; each schedule
then attacks the same view, teacher-forced, MAP and likelihood together (no null view), the first
--positions text tokens of --prompts prompts, every layer. Reported per schedule: seconds per position
(wall), candidates run through the model per position (the codebook stage scores the whole vocabulary
without a forward pass and is not counted) and that as a fraction of the vocabulary, top-1 of both
attackers and the lowest pruning recall of MAP's stages. The schedules run in rotated order over --rounds
rounds; the seconds are the median over rounds. The load average at the start is printed in the header:
on a shared machine the wall clock measures the other tenants too.

    python -m benchmarks.sequential_attack --prompts 2 --positions 4 --rounds 1 --out docs/benchmarks/sequential_attack_smollm2-135m.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ("[[0,512],[1,64],[4,16]]", "[[0,2048],[1,256],[4,32]]", "[[0,8192],[1,1024],[4,128]]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epsilon", type=float, default=15.0)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--positions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), help="JSON [[layers_upto, keep], ...]")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from attacks.splitee import sequential as sq
    from benchmarks.models import load_named_model
    from harness.workloads import load_workload

    loaded = load_named_model(args.model)
    model = loaded.model
    wl = OmegaConf.load(ROOT / "conf" / "workload" / "builtin.yaml")
    wl.n_prompts = args.prompts
    workload = load_workload(wl, loaded.tokenizer, seed=0)
    prompts = [list(p.input_ids) for p in workload.prompts]
    lengths = [len(p) for p in prompts]
    n_layers = len(model.model.layers)
    keys = [(op, layer) for layer in range(n_layers) for op in sq.OPS]
    ops = ("qkv", "o", "gate_up")
    views, table = sq.record_view(model, prompts, configuration="ep1", epsilon=args.epsilon, seed=0, offload=ops,
                                  sigma_scale=1.0, sensitivity_rule="paper",
                                  pad_token_id=loaded.tokenizer.pad_token_id, batch_size=len(prompts))
    rows = sq.prompt_rows(views, lengths, len(prompts), keys)
    sigmas = sq.op_sigmas(model, "ep1", args.epsilon, lengths, keys, sigma_scale=1.0, sensitivity_rule="paper",
                          table=table)
    starts = [sq.public_prefix_length(loaded.tokenizer, p, workload.chat_template) for p in prompts]
    book = sq.layer0_codebook(model)
    # Warm-up: the first forward passes allocate what every later one reuses; not any schedule's cost.
    # The attacker's settings are the YAML's (conf/splitee/default.yaml attack.sequential) with what the benchmark
    # varies replaced, so an option added to the attacker never breaks the benchmark.
    base = replace(sq.Settings.from_config(OmegaConf.load(ROOT / "conf" / "splitee" / "default.yaml").attack.sequential),
                   mode="teacher_forced", prior="model", layers=None, ops=ops, positions="text", null_view=False,
                   chunk=args.chunk, map_reference="prior")
    warm = replace(base, prune=((0, 64), (1, 8)), prune_prior=None, prune_union_prior=None, max_positions=1)
    sq.run(model, prompts[:1], rows[:1], sigmas[:1], warm, keys, starts[:1], book=book)
    load = os.getloadavg()[0]
    seconds: dict[str, list[float]] = {s: [] for s in args.schedules}
    cpu: dict[str, list[float]] = {s: [] for s in args.schedules}
    last: dict[str, dict] = {}
    for r in range(args.rounds):
        order = args.schedules[r % len(args.schedules):] + args.schedules[:r % len(args.schedules)]
        for schedule in order:
            settings = replace(base, prune=tuple(tuple(s) for s in json.loads(schedule)), prune_prior=None,
                               prune_union_prior=None, max_positions=args.positions)
            start, start_cpu = time.perf_counter(), time.process_time()
            out = sq.run(model, prompts, rows, sigmas, settings, keys, starts, book=book)
            seconds[schedule].append((time.perf_counter() - start) / out.n_positions)
            cpu[schedule].append((time.process_time() - start_cpu) / out.n_positions)
            m = sq.summarise(out, settings, 1.0)
            last[schedule] = m
    lines = [f"# Sequential attacker: seconds per position against the vocabulary fraction scored ({args.model})", "",
             f"`python -m benchmarks.sequential_attack --prompts {args.prompts} --positions {args.positions} "
             f"--rounds {args.rounds} --epsilon {args.epsilon:g} --threads {args.threads}`", "",
             f"ep1 at ε = {args.epsilon:g}, every layer's QKV, O and Gate/Up exposures ({len(keys)} per position), "
             f"teacher-forced, MAP and likelihood scored together on one recorded view; {args.prompts} built-in "
             f"prompts × {args.positions} text positions = {sum(len(range(s, min(n, s + args.positions))) for s, n in zip(starts, lengths))} "
             f"positions. {platform.processor() or platform.machine()}, {args.threads} torch threads, load average "
             f"{load:.2f} at the start; seconds are the median over {args.rounds} round(s). CPU s is the process's CPU "
             f"time (all threads): on a shared machine the wall clock also measures the other tenants.", "",
             "| schedule [layers_upto, keep] | s / position | CPU s / position | candidates forwarded / position | "
             "fraction of vocabulary | likelihood top-1 % | MAP top-1 % | prior top-1 % | MAP min. pruning recall |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for schedule in args.schedules:
        m = last[schedule]
        lines.append(f"| `{schedule}` | {statistics.median(seconds[schedule]):.2f} | "
                     f"{statistics.median(cpu[schedule]):.2f} | {m['candidates_per_position']:.0f} | "
                     f"{m['vocab_fraction_forward']:.4f} | {m['sequential_top1']:.1f} | {m['sequential_map_top1']:.1f} | "
                     f"{m['prior_top1']:.1f} | {m['sequential_map_pruning_recall_min']:.3f} |")
    lines += ["", "Top-1 and recall over this handful of positions are a sanity check, not a measurement (see "
              "docs/results/sequential/ for the run with intervals)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
