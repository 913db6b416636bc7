"""Intervals for a proportion: the Wilson score interval, with a Bonferroni correction for m comparisons.

Wilson (1927): for k successes in n trials, p̂ = k/n and z the two-sided normal quantile,

    centre = (p̂ + z²/2n) / (1 + z²/n),   half = z·√(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n).

It stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal interval does not. With m
comparisons tested under one family-wise α (Bonferroni), each interval is built at level 1 − α/m.

`proportion_ci` is the interval of every rate the harness reports per prompt (exact match, token match
rate, top-1/top-k recovery, task accuracy): Wilson over prompts when each prompt's rate sits at 0 or 100 %,
and the clipped Student-t interval of metrics/intervals.py otherwise.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from metrics.intervals import Estimate, mean_ci


def wilson(k: int, n: int, alpha: float = 0.05, m: int = 1) -> tuple[float, float]:
    """The Wilson interval (lo, hi) of k/n at level 1 − alpha/m (two-sided)."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0 < alpha < 1 or m < 1:
        raise ValueError(f"need 0 < alpha < 1 and m >= 1, got alpha={alpha}, m={m}")
    z = float(stats.norm.ppf(1.0 - alpha / (2.0 * m)))
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At k = 0 or k = n one end is 0 or 1 in exact arithmetic; say so exactly, not 0.9999999999999999.
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def proportion_ci(values: Sequence[float], scale: float = 100.0, confidence: float = 0.95) -> Estimate:
    """Mean of per-prompt rates in [0, scale] with a 95% interval that respects 0 and `scale`.

    When every prompt's rate is 0 or `scale` (exact match always; any rate whose prompts all sit at one
    edge), the mean is k/n·scale for the k prompts at `scale`, and the interval is Wilson's on k of n.
    For a rate over positions that is also a valid, conservative interval: the mean rate is at least
    scale·P(a prompt scores `scale`), and Wilson bounds that probability. So 15 prompts at 100 % report
    [79.6, 100], not the t interval's zero width. Otherwise the rates differ between prompts and the
    Student-t interval of `mean_ci`, clipped to [0, scale], applies.
    """
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0:
        raise ValueError("proportion_ci needs at least one value")
    if np.any((a < 0) | (a > scale)):
        raise ValueError(f"proportion_ci takes rates in [0, {scale}], got {a.min()}..{a.max()}")
    at_top = a == scale
    if np.all(at_top | (a == 0)):
        k, n = int(at_top.sum()), int(a.size)
        lo, hi = wilson(k, n, alpha=1.0 - confidence)
        return Estimate(scale * k / n, scale * lo, scale * hi, n)
    return mean_ci(a, confidence, bounds=(0.0, scale))
