"""Side-by-side timing in rounds, the way every benchmark here measures a ratio: each round runs every arm
once, on the same input, in an order rotated by the round, so no arm is always first (after a warm-up,
a cold cache, a clock boost or a noisy neighbour favours whichever runs first). The result is per-round
ratios, whose median and min–max are reported: a shared machine slows both arms of one round alike,
so the ratio of a round is steadier than either time.

`emit` is the tail every benchmark ends with: the report on stdout and, with --out, in a file.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.provenance import git_state
from harness.results import atomic_write_bytes
from harness.splitee.rotation import rotated


def wall_seconds(fn: Callable[[], object]) -> Callable[[], float]:
    """An arm timed by the wall clock around `fn()`."""
    def arm() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return arm


def run_rounds(arms: Mapping[str, Callable[[], float]], rounds: int,
               log: Callable[[int, str, float], None] | None = None) -> dict[str, list[float]]:
    """Each arm's seconds in each round (arm() returns them: `wall_seconds`, or a clock of its own such as
    the engine's timings["total"]); `log(round, name, seconds)` after every arm, e.g. to show progress."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in rotated(list(arms), r):
            seconds = arms[name]()
            times[name].append(seconds)
            if log is not None:
                log(r, name, seconds)
    return times


def round_ratios(times: Mapping[str, Sequence[float]], a: str, b: str) -> list[float]:
    """a's time over b's, round by round."""
    return [x / y for x, y in zip(times[a], times[b], strict=True)]


def median_range(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max): what the benchmark tables report of the per-round ratios."""
    return statistics.median(values), min(values), max(values)


@dataclass(frozen=True)
class PairedRatio:
    """The geometric mean of paired ratios a/b and its 95% interval: exp of the mean log-ratio ± Student t."""

    ratio: float
    lo: float
    hi: float
    n: int


def paired_log_ratio(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedRatio:
    """a's times over b's, paired by round (each pair ran back to back on the same batch, so what slows the
    machine slows both and cancels in log(a/b)): exp(mean ± t_{(1+c)/2, n-1}·s/√n) of the log-ratios."""
    from metrics.intervals import mean_t_ci

    if len(a) != len(b) or not a:
        raise ValueError(f"paired_log_ratio needs the same non-empty rounds: {len(a)} vs {len(b)}")
    est = mean_t_ci([math.log(x / y) for x, y in zip(a, b)], confidence)
    return PairedRatio(math.exp(est.mean), math.exp(est.lo), math.exp(est.hi), len(a))


def verdict(lo: float, hi: float, target: float) -> str:
    """Against an upper target (ratio ≤ target): "met" when the whole interval lies at or below it, "not met"
    when the whole interval lies above it, else "cannot tell" (the interval straddles the target)."""
    if not lo <= hi:
        raise ValueError(f"an interval needs lo <= hi, got [{lo}, {hi}]")
    if hi <= target:
        return "met"
    if lo > target:
        return "not met"
    return "cannot tell"


def emit(text: str, out: Path | None) -> None:
    """Print the report `text`; with `out`, also write it there as is (atomically, parents made), so an
    interrupted benchmark never leaves half a report under docs/benchmarks/."""
    print(text)
    if out is not None:
        atomic_write_bytes(Path(out), text.encode())


def commit_label() -> str:
    """The checkout's commit for a benchmark's header, marked where the tree has uncommitted changes."""
    state = git_state(Path(__file__).resolve().parents[1])
    if state["commit"] is None:
        return "unknown"
    return state["commit"][:12] + (" (uncommitted changes)" if state["dirty"] else "")
