"""Intervals for a proportion: the Wilson score interval, with a Bonferroni correction for m comparisons.

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
