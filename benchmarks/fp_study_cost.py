"""Cost of the floating-point study at the paper's size (issue #4): 169 op instances × 1,000 trials.

Llama-3.2-3B's shapes (28 layers, d = 3072; q 3072, k/v 1024, o 3072, gate/up 8192 rows; the LM head's
128,256 rows; Down 8192 → 3072) with random weights and random RMSNorm-like inputs: the cost of a trial
depends on the shapes only. Only drawn rows enter the computation, so each matrix is represented by a
random sample of `--rows` of its rows (the LM head's 1.5 GB never has to exist).

Side by side in one run: the vectorised study (harness/splitee/numerics/study.run_study: every trial of an
instance at once, exact reference, bound, both kernels) against a per-trial implementation of the same
computations (Python loop over the dot product for the sequential kernel, math.fsum for the exact
reference), timed on a few trials and extrapolated. The ratio is the result; absolute times are this
machine's.

    python -m benchmarks.fp_study_cost                         # the paper's size, fp32; Down in fp32 and fp64
    python -m benchmarks.fp_study_cost --layers 4 --out docs/benchmarks/fp_study_cost.md
"""
from __future__ import annotations

import argparse
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.rounds import emit
from harness.splitee.numerics.bound import bound_from_sums
from harness.splitee.numerics.kernels import probe_accumulation
from harness.splitee.numerics.precisions import PRECISIONS
from harness.splitee.numerics.study import OpInstance, run_study

# Llama-3.2-3B-Instruct (hidden 3072, 24 heads of 128, 8 KV heads, intermediate 8192, vocab 128256).
SHAPES = {"q": (3072, 3072), "k": (1024, 3072), "v": (1024, 3072), "o": (3072, 3072), "gate": (8192, 3072),
          "up": (8192, 3072), "lm_head": (128256, 3072), "down": (3072, 8192)}


def instances(layers: int, rows: int, pool: int, sigma: float, seed: int, include_down: bool):
    """OpInstances built one at a time (a generator): random weight rows and RMSNorm-like inputs."""
    g = torch.Generator().manual_seed(seed)
    inputs = {d: torch.randn(pool, d, generator=g) for d in (3072, 8192)}
    sig = torch.full((pool,), sigma, dtype=torch.float64)
    for layer in range(layers):
        for op in ("q", "k", "v", "o", "gate", "up"):
            out, d = SHAPES[op]
            yield OpInstance(op, layer, torch.randn(min(rows, out), d, generator=g) * d ** -0.5, inputs[d], sig)
    out, d = SHAPES["lm_head"]
    yield OpInstance("lm_head", None, torch.randn(rows, d, generator=g) * d ** -0.5, inputs[d], sig)
    if include_down:
        for layer in range(layers):
            out, d = SHAPES["down"]
            yield OpInstance("down", layer, torch.randn(min(rows, out), d, generator=g) * d ** -0.5, inputs[d],
                             sig * 100, offloaded=False)


def per_trial(inst: OpInstance, trials: int, precision: str, seed: int) -> float:
    """Seconds per trial of a straightforward per-trial implementation of the same computations."""
    dt = PRECISIONS[precision].dtype
    np_dt = {torch.float32: np.float32, torch.float64: np.float64}[dt]
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(trials):
        i = int(torch.randint(0, inst.inputs.shape[0], (1,), generator=g))
        j = int(torch.randint(0, inst.weight.shape[0], (1,), generator=g))
        x = inst.inputs[i].to(dt).numpy()
        w = inst.weight[j].to(dt).numpy()
        eta = (inst.sigma[i].item() * torch.randn(x.shape[0], generator=g, dtype=torch.float64)).to(dt).numpy()
        s = (x + eta).astype(np_dt)
        for kernel in ("library", "sequential"):
            if kernel == "library":
                a, b = np_dt(np.dot(s, w)), np_dt(np.dot(eta, w))
            else:
                a, b = np_dt(0), np_dt(0)
                for k in range(x.shape[0]):
                    a = np_dt(a + np_dt(s[k] * w[k]))
                    b = np_dt(b + np_dt(eta[k] * w[k]))
            r = np_dt(a - b)
            ref = math.fsum(float(p) for p in (x.astype(np.float64) * w.astype(np.float64)))
            s1 = math.fsum(abs(float(p)) for p in (w.astype(np.float64) * (x.astype(np.float64) + eta)))
            s2 = math.fsum(abs(float(p)) for p in (w.astype(np.float64) * eta))
            bound_from_sums(torch.tensor(s1), torch.tensor(s2), torch.tensor(abs(ref)), x.shape[0], precision)
            abs(float(r) - ref)
    return (time.perf_counter() - start) / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--rows-per-vector", type=int, default=25)
    parser.add_argument("--rows", type=int, default=512, help="sampled rows per weight matrix")
    parser.add_argument("--pool", type=int, default=320, help="captured input vectors per instance (20 prompts x 16)")
    parser.add_argument("--precisions", default="fp32")
    parser.add_argument("--kernels", default="library,sequential")
    parser.add_argument("--down-precisions", default="fp32,fp64", help="empty: no Down")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--naive-trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    precisions, kernels = args.precisions.split(","), args.kernels.split(",")
    down_precisions = [p for p in args.down_precisions.split(",") if p]
    probes = {p: probe_accumulation(p) for p in dict.fromkeys(precisions + down_precisions)}

    timings: dict[str, list[float]] = {}
    n_trials: dict[str, int] = {}
    started = time.perf_counter()
    for inst in instances(args.layers, args.rows, args.pool, 10.0, 0, bool(down_precisions)):
        group = "down" if not inst.offloaded else ("lm_head" if inst.op == "lm_head" else "layer ops")
        t0 = time.perf_counter()
        stats = run_study([inst], precisions=down_precisions if not inst.offloaded else precisions, kernels=kernels,
                          trials=args.trials, rows_per_vector=args.rows_per_vector, seed=0, probes=probes)
        timings.setdefault(group, []).append(time.perf_counter() - t0)
        n_trials[group] = n_trials.get(group, 0) + stats[0].n
        assert all(s.violations == 0 for s in stats if s.kernel == "sequential"), "the bound failed its own model"
    total = time.perf_counter() - started

    # The per-trial implementation, on a q and a down instance, extrapolated to the same trial counts.
    sample = list(instances(1, args.rows, args.pool, 10.0, 1, True))
    naive_layer = per_trial(sample[0], args.naive_trials, precisions[0], 0)
    naive_down = per_trial(sample[-1], max(1, args.naive_trials // 2), down_precisions[0], 0) if down_precisions else 0.0
    n_off = n_trials.get("layer ops", 0) + n_trials.get("lm_head", 0)
    naive_total = naive_layer * n_off * len(precisions) + naive_down * n_trials.get("down", 0) * len(down_precisions)

    n_instances = sum(len(v) for v in timings.values())
    lines = [
        "# Cost of the floating-point study at the paper's size",
        "",
        "Command: `" + shlex.join(["python", "-m", "benchmarks.fp_study_cost", *sys.argv[1:]]) + "`",
        "",
        f"Llama-3.2-3B shapes, {args.layers} layers: {6 * args.layers + 1} offloaded op instances"
        + (f" + {args.layers} Down" if down_precisions else "") + f", {args.trials} trials each "
        f"({-(-args.trials // args.rows_per_vector)} masked vectors × {args.rows_per_vector} rows), precisions "
        f"{', '.join(precisions)} (Down: {', '.join(down_precisions) or '—'}), kernels {', '.join(kernels)}; "
        f"{args.threads} torch thread(s) on {platform.processor() or platform.machine()}, torch {torch.__version__}.",
        "",
        "| part | instances | trials | seconds | seconds / instance |",
        "|:--|--:|--:|--:|--:|",
    ]
    for group, ts in timings.items():
        lines.append(f"| {group} | {len(ts)} | {n_trials[group]} | {sum(ts):.1f} | {sum(ts) / len(ts):.3f} |")
    lines += [f"| **total** | {n_instances} | {sum(n_trials.values())} | **{total:.1f}** | |", "",
              f"Per-trial implementation of the same computations (Python loop for the sequential kernel, "
              f"math.fsum reference), timed on {args.naive_trials} trials: {naive_layer * 1e3:.1f} ms per "
              f"trial at d = 3072" + (f", {naive_down * 1e3:.1f} ms at d = 8192 (Down)" if down_precisions else "")
              + f"; the same protocol would take about **{naive_total / 3600:.1f} h**, "
              f"{naive_total / total:.0f}× the vectorised study.", ""]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
