"""Engine, masking and Slalom overheads on one model, measured side by side in one run (issue #2).

Ratios, not absolute times, are the result: each round runs every configuration once on the same batch,
in a rotated order, and we report the median over rounds of each round's ratio, with the min–max range.
Targets from the issue: t3/cpu ≤ 1.05 (engine overhead), ep1/t3 ≤ 1.03 (masking; the paper measured 1.08).
Peak memory of each configuration is measured in a fresh subprocess (ru_maxrss), so one configuration's
allocations cannot hide another's.

    python -m benchmarks.overhead --out docs/benchmarks/overhead_smollm2.md
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.rounds import median_range, round_ratios, run_rounds

ROOT = Path(__file__).resolve().parents[1]
# The configurations this benchmark times side by side (a subset of harness/configurations.py).
BENCHMARKED = ("cpu", "t3", "ep1", "slalom")


def load(model_name: str, batch: int):
    from harness.models import load_model
    from harness.workloads import load_workload

    loaded = load_model(OmegaConf.load(ROOT / "conf" / "model" / f"{model_name}.yaml"))
    workload_cfg = OmegaConf.load(ROOT / "conf" / "workload" / "builtin.yaml")
    workload_cfg.n_prompts = None
    workload = load_workload(workload_cfg, loaded.tokenizer, seed=0)
    # The paper's timing prompts average about 100 tokens: take the shortest ones of the built-in set.
    prompts = sorted(workload.prompts, key=lambda p: p.n_text_tokens)[:batch]
    return loaded, [list(p.input_ids) for p in prompts], prompts


def engine_for(model, configuration: str, epsilon: float, threads: int | None):
    from harness.configurations import effective_epsilon
    from harness.split.engine import EngineSettings, SplitEngine

    return SplitEngine(model, EngineSettings(configuration, epsilon=effective_epsilon(configuration, epsilon),
                                             tee_threads=threads))


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that over from the parent
    across fork + exec, so a child of a large benchmark process would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory_child(args) -> None:
    loaded, batch, _ = load(args.model, args.batch)
    engine = engine_for(loaded.model, args.child, args.epsilon, args.threads)
    engine.generate(batch, args.new_tokens, pad_token_id=loaded.tokenizer.pad_token_id)
    print(json.dumps({"maxrss_mib": peak_rss_mib()}))


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (uncommitted changes)" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=15)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return peak_memory_child(args)

    loaded, batch, prompts = load(args.model, args.batch)
    pad = loaded.tokenizer.pad_token_id
    engines = {c: engine_for(loaded.model, c, args.epsilon, args.threads) for c in BENCHMARKED}
    engines["cpu"].generate(batch[:2], 4, pad_token_id=pad)  # warm-up (allocator, thread pool)
    bank: dict[str, dict] = {}
    outputs: dict[str, list] = {}

    def arm(c: str):
        def generate() -> float:
            result = engines[c].generate(batch, args.new_tokens, pad_token_id=pad)
            bank[c] = result.timings | {"bank": result.bank}
            outputs[c] = result.output_ids
            return result.timings["total"]   # the engine's own clock: generation, not the bank precompute
        return generate

    times = run_rounds({c: arm(c) for c in BENCHMARKED}, args.rounds,
                       log=lambda r, c, s: print(f"round {r + 1}/{args.rounds} {c:7s} {s:7.2f} s", file=sys.stderr))

    generated = args.batch * args.new_tokens
    memory = {}
    for c in BENCHMARKED:
        child = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--child", c, "--model", args.model,
                                "--batch", str(args.batch), "--new-tokens", str(args.new_tokens),
                                "--epsilon", str(args.epsilon)] + (["--threads", str(args.threads)] if args.threads else []),
                               cwd=ROOT, capture_output=True, text=True, check=True)
        memory[c] = json.loads(child.stdout.strip().splitlines()[-1])["maxrss_mib"]

    lines = [
        f"# Overhead benchmark: {args.model}",
        "",
        f"Command: `python -m benchmarks.overhead --model {args.model} --batch {args.batch} --new-tokens {args.new_tokens}"
        f" --epsilon {args.epsilon} --rounds {args.rounds}" + (f" --threads {args.threads}" if args.threads else "") + "`",
        "",
        f"Batch of {args.batch} built-in prompts ({min(p.n_text_tokens for p in prompts)}–"
        f"{max(p.n_text_tokens for p in prompts)} text tokens, {statistics.mean(len(b) for b in batch):.0f} with the chat "
        f"template), {args.new_tokens} new tokens each, greedy. Device side: "
        f"{engines['t3'].describe()['accelerator']}; TEE: {engines['t3'].describe()['tee_kind']} "
        f"({engines['t3'].describe()['tee_device']}, {torch.get_num_threads()} threads). torch {torch.__version__}, "
        f"python {platform.python_version()}, {time.strftime('%Y-%m-%d')}, splitbench commit {git_commit()}.",
        "",
        "| ratio | median over rounds | min | max | target |",
        "|---|---|---|---|---|",
    ]
    for (a, b), target in ((("t3", "cpu"), "≤ 1.05"), (("ep1", "t3"), "≤ 1.03 (paper: 1.08)"), (("slalom", "t3"), "—"),
                           (("slalom", "ep1"), "—")):
        med, lo, hi = median_range(round_ratios(times, a, b))
        lines.append(f"| {a}/{b} | {med:.3f} | {lo:.3f} | {hi:.3f} | {target} |")
    lines += ["", "| configuration | median total (s) | tokens/s | bank precompute (s) | bank precompute per generated token (ms) "
                  "| bank bytes (MiB) | peak RSS (MiB) |", "|---|---|---|---|---|---|---|"]
    for c in BENCHMARKED:
        t = statistics.median(times[c])
        pre = bank[c]["bank_precompute"]
        lines.append(f"| {c} | {t:.2f} | {generated / t:.1f} | {pre:.2f} | {1000 * pre / generated:.2f} | "
                     f"{bank[c]['bank']['peak_bytes'] / 2**20:.0f} | {memory[c]:.0f} |")
    same = outputs["t3"] == outputs["cpu"]
    lines += ["", f"t3 generated exactly what cpu generated: {same}. Bank precompute happens before generation and is "
                  "not in the totals above (it is TEE work done ahead of time, paper §6.2); its cost per token is the "
                  "column beside it. Times are wall-clock on a shared machine: read the ratios, not the seconds."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
