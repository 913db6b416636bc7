"""Which "at chance" margin a number of examples can certify, and how many examples a margin needs.

The verdict (attacks/controls.classify) says at_chance when the whole 95% Student-t interval of a mean
per-example statistic lies within reference ± m: an equivalence test (TOST at 2.5 % per side). With
per-example standard deviation σ, n examples and the true mean at the reference, the estimate is about
N(ref, σ²/n) and the interval's half-width t·σ/√n (t = t_{0.975, n−1}), so the call is made when
|mean − ref| ≤ m − t·σ/√n. It is made with probability at least `power` when

    m ≥ (σ/√n)·(t_{0.975, n−1} + z_{(1+power)/2}),

which `certifiable_margin` returns, and `examples_needed` inverts (the smallest n that satisfies it). The
normal approximation of the mean is the same one the Student-t interval makes; σ comes from a pilot run
(or a calibration experiment's null trials). A margin below t·σ/√n can never be certified at that n.
"""
from __future__ import annotations

import math

from scipy import stats


def certifiable_margin(sd: float, n: int, power: float = 0.8, confidence: float = 0.95) -> float:
    """The smallest margin m that n examples of per-example spread `sd` certify (at_chance) with probability
    ≥ `power` when the true mean sits at the reference."""
    if n < 2:
        raise ValueError(f"need n >= 2 examples, got {n}")
    if sd < 0 or not 0 < power < 1 or not 0 < confidence < 1:
        raise ValueError(f"need sd >= 0 and power, confidence in (0, 1), got {sd}, {power}, {confidence}")
    t = float(stats.t.ppf((1 + confidence) / 2, n - 1))
    z = float(stats.norm.ppf((1 + power) / 2))
    return sd / math.sqrt(n) * (t + z)


def examples_needed(sd: float, margin: float, power: float = 0.8, confidence: float = 0.95,
                    limit: int = 10_000_000) -> int:
    """The smallest n ≥ 2 whose `certifiable_margin` is at most `margin` (ValueError past `limit`)."""
    if margin <= 0:
        raise ValueError(f"need a margin > 0, got {margin}")
    if certifiable_margin(sd, 2, power, confidence) <= margin:
        return 2
    lo, hi = 2, 4
    while certifiable_margin(sd, hi, power, confidence) > margin:
        lo, hi = hi, hi * 2
        if hi > limit:
            raise ValueError(f"more than {limit} examples needed for margin {margin} at sd {sd}")
    while hi - lo > 1:       # the margin falls with n: bisect for the first n that meets it
        mid = (lo + hi) // 2
        if certifiable_margin(sd, mid, power, confidence) <= margin:
            hi = mid
        else:
            lo = mid
    return hi
