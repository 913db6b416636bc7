"""Intervals for a proportion: the Wilson score interval, with a Bonferroni correction for m comparisons,
and the exact Clopper–Pearson interval.

Wilson (1927): for k successes in n trials, p̂ = k/n and z the two-sided normal quantile,

    centre = (p̂ + z²/2n) / (1 + z²/n),   half = z·√(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n).

It stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal interval does not. With m
comparisons tested under one family-wise α (Bonferroni), each interval is built at level 1 − α/m.
"""
from __future__ import annotations

import math

from scipy import stats


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
    return max(0.0, centre - half), min(1.0, centre + half)


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The exact (Clopper–Pearson 1934) two-sided interval of k/n: the Beta quantiles
    lo = B(α/2; k, n−k+1) (0 when k = 0), hi = B(1−α/2; k+1, n−k) (1 when k = n). It covers at least 1 − α
    for every p; 0 of 36 gives an upper bound of 9.7 %, 0 of 30 of 11.6 %."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0 < alpha < 1:
        raise ValueError(f"need 0 < alpha < 1, got alpha={alpha}")
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi
