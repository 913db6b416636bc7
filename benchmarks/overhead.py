"""Engine, masking and Slalom overheads on one model, measured side by side in one run (issues #2, #10).

Ratios, not absolute times, are the result: each round runs every configuration once on the same batch,
in a rotated order (benchmarks/rounds.py), and we report the median over rounds of each round's ratio,
with the min–max range, for the prefill and the decode separately and for the whole generation.

Two readings of a masked configuration's time:
- *online*: the generation without the noise bank's work. The paper precomputes masks and corrections
  offline (§6.2), and a TEE beside a real accelerator makes them while the device computes; this is the
  cost of masking's own arithmetic (mask, send, unmask), and what the issue's targets are set on
  (ep1/t3 ≤ 1.03, slalom/t3 ≤ 1.5).
- *with refills*: everything, the bounded bank's refills inside the generation included
  (engine.bank_bytes; docs/noise_bank.md). On a CPU-only machine the TEE has no idle time to hide them
  in: a correction W·η costs what the offloaded product W·x costs.

Verdicts: the paired log-ratio of each round (a round runs the arms back to back on the same batch, so what
slows the machine slows both and cancels) gives the geometric-mean ratio with its 95% Student-t interval, for
the prefill and the decode apart; against each target it is "met" (upper bound ≤ target), "not met" (lower
bound > target) or "cannot tell" (benchmarks/rounds.py verdict). `--clock cpu` times each generation by this
process's CPU time (time.process_time, with --threads 1) instead of the wall clock, so other processes on a
shared machine do not count, and precomputes every mask before the clock starts (engine.bank_bytes=null: no
refills inside the generation, online = total).

Where the time goes: each configuration's seconds by component (the engine's own clock), prefill and
decode apart, and each component's excess over t3. Peak memory of each configuration is measured in a
fresh subprocess (VmHWM), so one configuration's allocations cannot hide another's.

    python -m benchmarks.overhead --threads 1 --out docs/benchmarks/overhead_smollm2-135m.md
    python -m benchmarks.overhead --threads 1 --prompts main --out docs/benchmarks/overhead_smollm2-135m_main.md
    python -m benchmarks.overhead --clock cpu --threads 1 --batch 8 --new-tokens 32 --rounds 12 --no-memory \
        --out docs/benchmarks/overhead_smollm2-135m_paired_cpu.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.bank_memory import peak_rss_mib
from benchmarks.rounds import commit_label, emit, median_range, paired_log_ratio, run_rounds, verdict
from harness.splitee.mechanisms import INT8_MAX_ROWS, native_int8_dot
from harness.splitee.offload import CATEGORY

ROOT = Path(__file__).resolve().parents[1]
# The configurations this benchmark times side by side (a subset of harness/configurations.py).
BENCHMARKED = ("cpu", "t3", "ep1", "epn", "slalom")
RATIOS = ((("t3", "cpu"), "≤ 1.05"), (("ep1", "t3"), "≤ 1.03 (paper: 1.08)"), (("epn", "t3"), "≤ 1.03"),
          (("slalom", "t3"), "≤ 1.5"))
TARGETS = {("t3", "cpu"): 1.05, ("ep1", "t3"): 1.03, ("epn", "t3"): 1.03, ("slalom", "t3"): 1.5}
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
COMPONENTS = ("attention_proj", "ffn_proj", "down_proj", "lm_head", "masking", "crossing", "bank_refill", "other")
PROMPT_SETS = {
    # The paper's timing prompts average about 100 tokens: the shortest of the built-in set.
    "shortest": "the 15 shortest built-in prompts",
    # The main job's workload: its 15 built-in prompts (100–250 text tokens).
    "main": "the main job's built-in prompts",
}


def load(model_name: str, batch: int, prompt_set: str = "shortest"):
    from benchmarks.models import load_named_model
    from harness.workloads import load_workload

    loaded = load_named_model(model_name)
    workload_cfg = OmegaConf.load(ROOT / "conf" / "workload" / "builtin.yaml")
    if prompt_set == "shortest":
        workload_cfg.n_prompts = None
    # The main job's draw: builtin.yaml's n_prompts with conf/config.yaml's seed.
    seed = int(OmegaConf.load(ROOT / "conf" / "config.yaml").seed)
    workload = load_workload(workload_cfg, loaded.tokenizer, seed=seed)
    prompts = list(workload.prompts)
    if prompt_set == "shortest":
        prompts = sorted(prompts, key=lambda p: p.n_text_tokens)
    prompts = prompts[:batch]
    return loaded, [list(p.input_ids) for p in prompts], prompts


def engine_for(model, configuration: str, epsilon: float, threads: int | None, precompute: bool = False):
    """`precompute`: every mask and correction made before the generation's clock starts (an unbounded bank)."""
    from harness.configurations import effective_epsilon
    from harness.splitee.engine import EngineSettings, SplitEngine

    bank = {"bank_bytes": None} if precompute else {}
    return SplitEngine(model, EngineSettings(configuration, epsilon=effective_epsilon(configuration, epsilon),
                                             tee_threads=threads, **bank))


def peak_memory_child(args) -> None:
    loaded, batch, _ = load(args.model, args.batch, args.prompts)
    engine = engine_for(loaded.model, args.child, args.epsilon, args.threads)
    engine.generate(batch, args.new_tokens, pad_token_id=loaded.tokenizer.pad_token_id)
    print(json.dumps({"maxrss_mib": peak_rss_mib()}))


def phases(timings: dict, prefill: dict) -> dict[str, dict[str, float]]:
    """One generation's seconds by component for the prefill, the decode and the whole, each with its
    `online` total (without the bank's refills) and its total."""
    whole = {c: timings.get(c, 0.0) for c in COMPONENTS} | {"total": timings["total"]}
    first = {c: prefill.get(c, 0.0) for c in COMPONENTS} | {"total": prefill["total"]}
    rest = {c: whole[c] - first[c] for c in whole}
    for part in (whole, first, rest):
        part["online"] = part["total"] - part["bank_refill"]
    return {"prefill": first, "decode": rest, "generation": whole}


def verdict_rows(record: dict[str, list[dict]], rounds: int) -> list[str]:
    """One table row per target ratio: the paired interval and verdict of the prefill and of the decode."""
    rows = []
    for (a, b), target in TARGETS.items():
        if a not in record or b not in record:
            continue
        cells = []
        for phase in ("prefill", "decode"):
            if rounds < 2:
                cells += ["— (one round)", "cannot tell"]
                continue
            r = paired_log_ratio([x[phase]["online"] for x in record[a]], [y[phase]["online"] for y in record[b]])
            cells += [f"**{r.ratio:.3f}** [{r.lo:.3f}, {r.hi:.3f}]", verdict(r.lo, r.hi, target)]
        rows.append(f"| {a}/{b} | ≤ {target:g} | " + " | ".join(cells) + " |")
    return rows


def decode_bytes_per_step(engine_t3, engine_ep1, batch: int) -> tuple[float, float]:
    """(weight bytes a decode step reads, the bank bytes ep1 adds to it): every linear weight once
    (fp32), against one mask and its corrections per offloaded op and prompt (noise_bank.row_bytes).
    Where decoding a small batch is bound by memory traffic, their ratio is the floor of ep1/t3."""
    from harness.splitee.noise_bank import row_bytes

    weights = sum(m.weight.numel() * m.weight.element_size() for m in engine_t3.model.modules()
                  if isinstance(m, torch.nn.Linear))
    bank = batch * sum(row_bytes(op.tee_weights) for op in engine_ep1.ops if op.bank is not None)
    return float(weights), float(bank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=15)
    parser.add_argument("--prompts", choices=tuple(PROMPT_SETS), default="shortest")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS subprocesses")
    parser.add_argument("--configurations", nargs="+", choices=BENCHMARKED, default=list(BENCHMARKED),
                        help="the arms to time (t3 always; fewer arms, more rounds in the same time)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="cpu: this process's CPU time (needs --threads 1) and every mask precomputed")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return peak_memory_child(args)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu needs --threads 1 (process CPU time sums every thread, spinning ones included)")
    timer, precompute = CLOCKS[args.clock], args.clock == "cpu"
    arms = [c for c in BENCHMARKED if c in set(args.configurations) | {"t3"}]

    load_before = os.getloadavg()
    commit = commit_label()   # at the start: the code the rounds run, not what was committed meanwhile
    loaded, batch, prompts = load(args.model, args.batch, args.prompts)
    pad = loaded.tokenizer.pad_token_id
    engines = {c: engine_for(loaded.model, c, args.epsilon, args.threads, precompute) for c in arms}
    engines[arms[0]].generate(batch[:2], 4, pad_token_id=pad)  # warm-up (allocator, thread pool)
    record: dict[str, list[dict]] = {c: [] for c in arms}
    outputs: dict[str, list] = {}
    banks: dict[str, dict] = {}

    def arm(c: str):
        def generate() -> float:
            result = engines[c].generate(batch, args.new_tokens, pad_token_id=pad, timer=timer)
            record[c].append(phases(result.timings, result.prefill_timings))
            banks[c] = result.bank | {"precompute": result.timings["bank_precompute"]}
            outputs[c] = result.output_ids
            return result.timings["total"]
        return generate

    run_rounds({c: arm(c) for c in arms}, args.rounds,
               log=lambda r, c, s: print(f"round {r + 1}/{args.rounds} {c:7s} {s:7.2f} s", file=sys.stderr))
    load_after = os.getloadavg()

    memory = {}
    if not args.no_memory:
        for c in arms:
            child = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--child", c, "--model", args.model,
                                    "--batch", str(args.batch), "--prompts", args.prompts,
                                    "--new-tokens", str(args.new_tokens), "--epsilon", str(args.epsilon)]
                                   + (["--threads", str(args.threads)] if args.threads else []),
                                   cwd=ROOT, capture_output=True, text=True, check=True)
            memory[c] = json.loads(child.stdout.strip().splitlines()[-1])["maxrss_mib"]

    def ratio(a: str, b: str, phase: str, key: str) -> tuple[float, float, float]:
        return median_range([x[phase][key] / y[phase][key] for x, y in zip(record[a], record[b], strict=True)])

    def median(c: str, phase: str, key: str) -> float:
        return statistics.median(r[phase][key] for r in record[c])

    def excess(c: str, phase: str, key: str) -> float:
        """c's seconds over t3's in this component, the median of the rounds' differences."""
        return statistics.median(x[phase][key] - y[phase][key] for x, y in zip(record[c], record["t3"], strict=True))

    text_tokens = [p.n_text_tokens for p in prompts]
    description = engines["t3"].describe()
    slalom_kernel = (f"int8 digit GEMMs up to {INT8_MAX_ROWS} rows, float64 beyond" if native_int8_dot()
                     else "float64 only, no int8 dot-product instructions")
    command = (f"python -m benchmarks.overhead --model {args.model} --batch {args.batch} --prompts {args.prompts} "
               f"--new-tokens {args.new_tokens} --epsilon {args.epsilon} --rounds {args.rounds}"
               + (f" --threads {args.threads}" if args.threads else "") + (" --no-memory" if args.no_memory else "")
               + (f" --clock {args.clock}" if args.clock != "wall" else ""))
    lines = [
        f"# Overhead benchmark: {args.model}, {PROMPT_SETS[args.prompts]}",
        "",
        f"Command: `{command}`",
        "",
        f"Batch of {args.batch} prompts ({PROMPT_SETS[args.prompts]}: {min(text_tokens)}–{max(text_tokens)} text "
        f"tokens, {statistics.mean(len(b) for b in batch):.0f} on average with the chat template), "
        f"{args.new_tokens} new tokens each, greedy. Device side: {description['accelerator']}; TEE: "
        f"{description['tee_kind']} ({description['tee_device']}, {torch.get_num_threads()} thread(s); Slalom's "
        f"exact products: {slalom_kernel}). torch "
        f"{torch.__version__}, python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, splitbench "
        f"commit {commit}. Load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f}. Clock: "
        + ("this process's CPU time (time.process_time), every mask precomputed before it starts (no refills inside "
           "the generation)." if args.clock == "cpu" else "wall (time.perf_counter)."),
        "",
        f"## Verdicts (paired log-ratio over {args.rounds} rounds, geometric mean and 95% interval, online)",
        "",
        "A round runs every configuration once on the same batch, back to back in a rotated order; each round's "
        "log(a/b) is one pair. Met: the upper bound ≤ target; not met: the lower bound > target; else cannot tell.",
        "",
        "| ratio | target | prefill [95% CI] | verdict | decode [95% CI] | verdict |",
        "|---|---|---|---|---|---|",
        *verdict_rows(record, args.rounds),
        *([] if set(arms) == set(BENCHMARKED) else ["", f"Configurations timed: {', '.join(arms)}."]),
        "",
        f"## Ratios (median over {args.rounds} rotated rounds, min–max)",
        "",
        "*Online* leaves out the noise bank's refills (the paper's offline precompute); *with refills* counts "
        "them as TEE time inside the generation.",
        "",
        "| ratio | prefill, online | decode, online | generation, online | generation, with refills | target (online) |",
        "|---|---|---|---|---|---|",
    ]
    for (a, b), target in RATIOS:
        if a not in record or b not in record:
            continue
        cells = [ratio(a, b, phase, "online") for phase in ("prefill", "decode", "generation")]
        cells.append(ratio(a, b, "generation", "total"))
        lines.append(f"| {a}/{b} | " + " | ".join(f"**{m:.3f}** ({lo:.3f}–{hi:.3f})" for m, lo, hi in cells)
                     + f" | {target} |")
    lines += ["", "## Where the time goes (median seconds per generation of the batch)", ""]
    header = "| configuration | phase | " + " | ".join(COMPONENTS) + " | online | total |"
    lines += [header, "|---|---|" + "---|" * (len(COMPONENTS) + 2)]
    for c in arms:
        for phase in ("prefill", "decode"):
            lines.append(f"| {c} | {phase} | " + " | ".join(f"{median(c, phase, k):.3f}" for k in COMPONENTS)
                         + f" | {median(c, phase, 'online'):.3f} | {median(c, phase, 'total'):.3f} |")
    lines += ["", "Excess over t3 by component (median of the rounds' differences, seconds):", "",
              "| configuration | phase | " + " | ".join(COMPONENTS) + " | online |",
              "|---|---|" + "---|" * (len(COMPONENTS) + 1)]
    for c in (c for c in ("ep1", "epn", "slalom") if c in record):
        for phase in ("prefill", "decode"):
            lines.append(f"| {c} | {phase} | " + " | ".join(f"{excess(c, phase, k):+.3f}" for k in COMPONENTS)
                         + f" | {excess(c, phase, 'online'):+.3f} |")
    weights, bank = decode_bytes_per_step(engines["t3"], engines["ep1"] if "ep1" in engines else engines["t3"],
                                          len(batch))
    projection_s = sum(median("t3", "decode", k) for k in set(CATEGORY.values()))
    lines += ["", f"A decode step reads every linear weight once, {weights / 2**20:.0f} MiB in fp32; ep1 adds "
                  f"{bank / 2**20:.1f} MiB of masks and corrections for the {len(batch)} prompts "
                  f"({100 * bank / weights:.1f} %). Where a decode is bound by memory traffic, about "
                  f"{1 + bank / weights:.3f} is the floor of ep1/t3 before any arithmetic; t3's decode read its "
                  f"weights at {weights * (args.new_tokens - 1) / projection_s / 1e9:.1f} GB/s here (the weight "
                  "bytes of its decode steps over the median seconds of its projections), which says how near that "
                  "bound this machine's decode was."]
    generated = len(batch) * args.new_tokens
    lines += ["", "## Throughput, bank and memory", "",
              "| configuration | tokens/s, online | tokens/s, with refills | bank precompute before the generation (s) "
              "| bank refills inside it (s) | bank peak (MiB) | peak RSS (MiB) | × t3 |", "|---|---|---|---|---|---|---|---|"]
    for c in arms:
        b = banks[c]
        rss = memory.get(c)
        rss_cells = f"{rss:.0f} | {rss / memory['t3']:.2f}" if rss is not None else "— | —"
        lines.append(f"| {c} | {generated / median(c, 'generation', 'online'):.1f} | "
                     f"{generated / median(c, 'generation', 'total'):.1f} | {b['precompute']:.2f} | "
                     f"{median(c, 'generation', 'bank_refill'):.2f} | {b.get('peak_bytes', 0) / 2**20:.0f} | {rss_cells} |")
    same = outputs["t3"] == outputs["cpu"] if "cpu" in outputs else "not timed"
    clock = "this process's CPU time" if args.clock == "cpu" else "wall-clock"
    lines += ["", f"t3 generated exactly what cpu generated: {same}. Times are {clock} "
                  "on a shared machine: read the ratios, not the seconds. Peak RSS: one generation of the same batch "
                  "in a fresh process per configuration."]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
