"""Seconds per recovered position of the sequential attacker (attacks/splitee/sequential.py) against the fraction of
the vocabulary it runs through the model, for several pruning schedules, on one recorded view; with --baseline,
the same against the attacker as it was at an earlier commit, side by side.

The built-in prompts (chat template on) are submitted once under ep1 at --epsilon and recorded; each schedule
then attacks the same view, teacher-forced, MAP and likelihood together (no null view), the first
--positions text tokens of --prompts prompts, every layer. Reported per schedule: seconds per position
(wall), candidates run through the model per position (the codebook stage scores the whole vocabulary
without a forward pass and is not counted) and that as a fraction of the vocabulary, the matrix products'
GFLOP per position (torch's FlopCounterMode, one extra untimed run) and their GFLOP/s as a fraction of the
machine's float32 matmul peak (benchmarks/ceiling.py `matmul_gflops`, where it is in the checkout), top-1 of
both attackers and the lowest pruning recall of MAP's stages.

--baseline REV [REV ...] also runs attacks/splitee/sequential.py as committed at each REV (e.g. the commit
before a change to the attacker, and one between two changes), imported beside the current one, on the same
view and settings. Every arm (schedule × code) runs once a round, in an order rotated by the round
(benchmarks/rounds.py), over --rounds rounds; per schedule and REV the table gives now/REV as the geometric
mean of the per-round ratios with its 95% paired interval, and whether every guess, hit, pruning survival,
rank, prior guess and candidate count is identical. The seconds are the median over rounds. The load average
at the start is printed in the header: on a shared machine the wall clock measures the other tenants too.

    python -m benchmarks.sequential_attack --prompts 2 --positions 4 --rounds 1 --out docs/benchmarks/sequential_attack_smollm2-135m.md
    python -m benchmarks.sequential_attack --baseline 35e157f 0d84d9d --schedules '[[0,2048],[1,256],[4,32]]' --prompts 2 --positions 8 --rounds 5
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
# issue 32's default, two widths around it, and issue 52's default (a stage's third element: the prior's best)
SCHEDULES = ("[[0,512],[1,64],[4,16]]", "[[0,2048],[1,256],[4,32]]", "[[0,8192],[1,1024],[4,128]]",
             "[[0,4096,8192],[1,1024,2048],[4,128,1536]]")
NOW = "now"
# Modules moved to the shared floor since earlier revisions (issue 53's first moves): an older attacker's imports
# of them resolve to where they live now, so --baseline keeps working across the move.
MOVED = {"harness.splitee.architectures": "harness.architectures", "harness.splitft.partition": "harness.partition",
         "harness.sanitize.embeddings": "harness.token_embeddings"}


def attacker_at(rev: str):
    """attacks/splitee/sequential.py as committed at `rev`, imported as a module of its own (the current one is
    left as it is). A revision git cannot show ends the benchmark with one line and exit code 2."""
    path = "attacks/splitee/sequential.py"
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
    if shown.returncode != 0:
        print(f"benchmarks: error: --baseline {rev}: git cannot show {path} there "
              f"({shown.stderr.strip().splitlines()[-1] if shown.stderr.strip() else 'no output'})", file=sys.stderr)
        raise SystemExit(2)
    name = f"_sequential_at_{rev.replace('-', '_').replace('.', '_').replace('/', '_')}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    sys.modules[name] = module   # dataclasses resolve the module's annotations through sys.modules
    for old, new in MOVED.items():
        sys.modules.setdefault(old, importlib.import_module(new))
    exec(compile(shown.stdout, f"{rev}:{path}", "exec"), module.__dict__)
    return module


def discrete(outcome) -> dict:
    """Everything an attack decided (results.json and samples.jsonl are made of these): per scorer its guesses,
    hits, per-stage survivals and ranks; the prior's guesses; the candidates forwarded."""
    return {"prior": outcome.prior_guesses, "forwarded": outcome.forward_candidates,
            **{name: (r.guesses, r.hits, r.survived, r.ranks) for name, r in outcome.scorers.items()}}


def matmul_peak(threads: int) -> float | None:
    """This machine's float32 matmul GFLOP/s at `threads` threads (benchmarks/ceiling.py, issue 50 item 1), or
    None where that module is not in the checkout."""
    try:
        from benchmarks.ceiling import matmul_gflops
    except ImportError:
        return None
    return float(matmul_gflops(threads=threads))


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
    parser.add_argument("--baseline", nargs="+", default=[], metavar="REV",
                        help="also time the attacker as committed at these git revisions, side by side")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from torch.utils.flop_counter import FlopCounterMode

    from attacks.splitee import sequential as sq
    from benchmarks.models import load_named_model
    from benchmarks.rounds import commit_label, emit, paired_log_ratio, run_rounds
    from harness.workloads import load_workload

    codes = {NOW: sq, **{rev: attacker_at(rev) for rev in args.baseline}}
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
    # The attacker's settings are the YAML's (conf/splitee/default.yaml attack.sequential) with what the benchmark
    # varies replaced, so an option added to the attacker never breaks the benchmark.
    base = replace(sq.Settings.from_config(OmegaConf.load(ROOT / "conf" / "splitee" / "default.yaml").attack.sequential),
                   mode="teacher_forced", prior="model", layers=None, ops=ops, positions="text", null_view=False,
                   chunk=args.chunk, map_reference="prior")
    # Warm-up: the first forward passes allocate what every later one reuses; not any arm's cost.
    warm = replace(base, prune=((0, 64), (1, 8)), prune_prior=None, prune_union_prior=None, max_positions=1)
    for code in codes.values():
        code.run(model, prompts[:1], rows[:1], sigmas[:1], warm, keys, starts[:1], book=book)
    load = os.getloadavg()[0]
    settings = {s: replace(base, prune=tuple(tuple(x) for x in json.loads(s)), prune_prior=None,
                           prune_union_prior=None, max_positions=args.positions) for s in args.schedules}
    cpu: dict[tuple[str, str], list[float]] = {}
    last: dict[tuple[str, str], object] = {}

    def arm(schedule: str, code: str):
        def timed() -> float:
            start, start_cpu = time.perf_counter(), time.process_time()
            out = codes[code].run(model, prompts, rows, sigmas, settings[schedule], keys, starts, book=book)
            seconds = (time.perf_counter() - start) / out.n_positions
            cpu.setdefault((schedule, code), []).append((time.process_time() - start_cpu) / out.n_positions)
            last[(schedule, code)] = out
            return seconds
        return timed

    arms = {(s, c): arm(s, c) for s in args.schedules for c in codes}
    seconds = run_rounds(arms, args.rounds)
    # The attack's work, counted once per schedule on the current code (untimed): the same results at every
    # revision, so each arm's GFLOP/s is this work over its own seconds (work an older revision wasted, such as
    # scores of pairs of candidates, is not counted as speed; torch counts no CPU SDPA kernel anyway).
    gflop: dict[str, float] = {}
    for schedule in args.schedules:
        with FlopCounterMode(display=False) as counter:
            out = sq.run(model, prompts, rows, sigmas, settings[schedule], keys, starts, book=book)
        gflop[schedule] = counter.get_total_flops() / 1e9 / out.n_positions
    peak = matmul_peak(args.threads)

    def speed(key: tuple[str, str]) -> str:
        rate = gflop[key[0]] / statistics.median(seconds[key])
        return f"{rate:.1f} | " + ("n/a" if peak is None else f"{rate / peak:.0%}")

    n_positions = sum(len(range(s, min(n, s + args.positions))) for s, n in zip(starts, lengths))
    command = (f"python -m benchmarks.sequential_attack --model {args.model} --prompts {args.prompts} "
               f"--positions {args.positions} "
               f"--rounds {args.rounds} --epsilon {args.epsilon:g} --threads {args.threads} --chunk {args.chunk} "
               f"--schedules {' '.join(repr(s) for s in args.schedules)}"
               + (f" --baseline {' '.join(args.baseline)}" if args.baseline else ""))
    lines = [f"# Sequential attacker: seconds per position against the vocabulary fraction scored ({args.model})", "",
             f"`{command}` at {commit_label()}", "",
             f"ep1 at ε = {args.epsilon:g}, every layer's QKV, O and Gate/Up exposures ({len(keys)} per position), "
             f"teacher-forced, MAP and likelihood scored together on one recorded view; {args.prompts} built-in "
             f"prompts × {args.positions} text positions = {n_positions} positions. "
             f"{platform.processor() or platform.machine()}, {args.threads} torch threads, load average "
             f"{load:.2f} at the start; seconds are the median over {args.rounds} round(s). CPU s is the process's CPU "
             f"time (all threads): on a shared machine the wall clock also measures the other tenants. GFLOP counts "
             f"the matrix products of the current code's attack (torch FlopCounterMode: the linear layers and "
             f"attention over the prefix); GFLOP/s is that over the wall seconds; the float32 matmul peak "
             + (f"is {peak:.1f} GFLOP/s (benchmarks/ceiling.py)." if peak is not None else
                "is not in this checkout (benchmarks/ceiling.py), so no fraction of it is given."), "",
             "| schedule [layers_upto, keep(, prior_keep)] | s / position | CPU s / position | candidates forwarded / position | "
             "fraction of vocabulary | likelihood top-1 % | MAP top-1 % | prior top-1 % | MAP min. pruning recall | "
             "GFLOP / position | GFLOP/s | of matmul peak |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for schedule in args.schedules:
        key = (schedule, NOW)
        m = sq.summarise(last[key], settings[schedule], 1.0)
        lines.append(f"| `{schedule}` | {statistics.median(seconds[key]):.2f} | "
                     f"{statistics.median(cpu[key]):.2f} | {m['candidates_per_position']:.0f} | "
                     f"{m['vocab_fraction_forward']:.4f} | {m['sequential_top1']:.1f} | {m['sequential_map_top1']:.1f} | "
                     f"{m['prior_top1']:.1f} | {m['sequential_map_pruning_recall_min']:.3f} | {gflop[schedule]:.2f} | "
                     f"{speed(key)} |")
    lines += ["", "Top-1 and recall over this handful of positions are a sanity check, not a measurement (see "
              "docs/results/sequential/ for the run with intervals)."]
    for rev in args.baseline:
        lines += ["", f"## Against the attacker at {rev}", "",
                  f"Both in every round, order rotated; now/{rev} is the geometric mean of the {args.rounds} per-round "
                  "ratios of seconds per position, wall and process CPU (the CPU ratio is the steadier where other "
                  "tenants take cores), with its 95% paired t interval (benchmarks/rounds.py paired_log_ratio; one "
                  "round gives no interval). Identical: every guess, hit, pruning survival, rank, prior guess and "
                  "candidate count of the two runs.", "",
                  f"| schedule | s / position at {rev} | s / position now | now / {rev} [95% interval] | "
                  f"CPU s / position at {rev} | CPU s / position now | CPU now / {rev} [95% interval] | "
                  f"GFLOP/s at {rev} | of matmul peak at {rev} | identical |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for schedule in args.schedules:
            before, now = (schedule, rev), (schedule, NOW)
            ratio = paired_log_ratio(seconds[now], seconds[before])
            cpu_ratio = paired_log_ratio(cpu[now], cpu[before])
            same = discrete(last[now]) == discrete(last[before])
            lines.append(f"| `{schedule}` | {statistics.median(seconds[before]):.2f} | "
                         f"{statistics.median(seconds[now]):.2f} | {ratio.ratio:.3f} [{ratio.lo:.3f}, {ratio.hi:.3f}] | "
                         f"{statistics.median(cpu[before]):.2f} | {statistics.median(cpu[now]):.2f} | "
                         f"{cpu_ratio.ratio:.3f} [{cpu_ratio.lo:.3f}, {cpu_ratio.hi:.3f}] | "
                         f"{speed(before)} | {'yes' if same else 'NO'} |")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
