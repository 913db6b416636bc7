"""Intervals for a proportion: the Wilson score interval, with a Bonferroni correction for m comparisons,
and the exact Clopper–Pearson interval.

Wilson (1927): for k successes in n trials, p̂ = k/n and z the two-sided normal quantile,

    centre = (p̂ + z²/2n) / (1 + z²/n),   half = z·√(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n).

It stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal interval does not. With m
comparisons tested under one family-wise α (Bonferroni), each interval is built at level 1 − α/m.

`proportion_ci` is the interval of every rate the harness reports per prompt (exact match, token match
rate, top-1/top-k recovery, task accuracy): Wilson over prompts when each prompt's rate sits at 0 or 100 %,
and the bootstrap interval of metrics/intervals.mean_ci otherwise.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from metrics.equivalence import earned_half_width, zero_spread_bound
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


def newcombe_paired(a: int, b: int, c: int, d: int, alpha: float = 0.05) -> tuple[float, float, float]:
    """The difference p₁ − p₂ of two proportions measured on the same n = a+b+c+d units, with Newcombe's
    interval (Newcombe 1998, Stat. Med. 17:2635, method 10: Wilson score intervals of the two margins
    combined with the φ correlation of the paired table, no continuity correction).

    a: both successes, b: success in 1 only, c: success in 2 only, d: neither. p₁ = (a+b)/n, p₂ = (a+c)/n,
    θ̂ = (b−c)/n; with (l_i, u_i) the Wilson intervals of p_i and φ = (ad − bc)/√((a+b)(c+d)(a+c)(b+d))
    (0 when a margin is empty),

        L = θ̂ − √((p₁−l₁)² − 2φ(p₁−l₁)(u₂−p₂) + (u₂−p₂)²),
        U = θ̂ + √((p₂−l₂)² − 2φ(p₂−l₂)(u₁−p₁) + (u₁−p₁)²).

    With b = c = 0 and a, d > 0, φ = 1 and the two Wilson margins cancel: (a, 0, 0, a) gave [0, 0], and one
    discordant pair against the direction then *raised* U (issue 51). So the interval is never narrower than
    θ̂ ± CP_U(0, n) (metrics.equivalence.zero_spread_bound at B = 1: 0.92 % at n = 400), the most n units
    that all agree can rule out; that makes its ends monotone in the discordant counts. What a certification
    reads is wider still near the corner: `newcombe_earned`.

    Returns (θ̂, L, U) as fractions."""
    n = a + b + c + d
    if min(a, b, c, d) < 0 or n < 1:
        raise ValueError(f"need counts >= 0 with a positive total, got {(a, b, c, d)}")
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, alpha)
    l2, u2 = wilson(a + c, n, alpha)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(margins) if margins > 0 else 0.0
    theta = (b - c) / n
    lo = theta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = theta + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    h0 = zero_spread_bound(n, 1.0, 1 - alpha)
    return theta, max(-1.0, min(lo, theta - h0)), min(1.0, max(hi, theta + h0))


def newcombe_earned(a: int, b: int, c: int, d: int, alpha: float = 0.05) -> tuple[float, float]:
    """The interval of θ = p₁ − p₂ that the paired table earned (metrics/equivalence.py, issue 51), what an
    at_chance reads: `newcombe_paired`'s widened to θ̂ ± earned_half_width with per-unit differences in
    {−1, 0, 1} (B = 1) and the normal critical value. With few discordant pairs the count sets the width:
    (a, 1, 0, d) of 400 reaches 1.40 %, the exact bound CP_U(1, 400) being 1.39 %, where Newcombe's own
    interval stops at 0.74 % for a = d."""
    theta, lo, hi = newcombe_paired(a, b, c, d, alpha)
    n, k = a + b + c + d, b + c
    sd = math.sqrt(max(0.0, k / n - theta * theta) * n / (n - 1)) if n > 1 else 0.0
    half = earned_half_width(n, k, theta, sd, float(k), 1.0, critical=float(stats.norm.ppf(1 - alpha / 2)),
                             confidence=1 - alpha)
    return max(-1.0, min(lo, theta - half)), min(1.0, max(hi, theta + half))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: the discordant pairs b (success in 1 only) and c (in 2 only) under
    H₀ are Binomial(b + c, ½); 1.0 without discordant pairs."""
    if b < 0 or c < 0:
        raise ValueError(f"need b, c >= 0, got {b}, {c}")
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(b, b + c, 0.5).pvalue)


def paired_table(first: list[bool], second: list[bool]) -> tuple[int, int, int, int]:
    """(a, b, c, d) of two outcomes on the same units: both, first only, second only, neither."""
    if len(first) != len(second):
        raise ValueError(f"paired outcomes need the same units: {len(first)} vs {len(second)}")
    a = sum(1 for x, y in zip(first, second) if x and y)
    b = sum(1 for x, y in zip(first, second) if x and not y)
    c = sum(1 for x, y in zip(first, second) if y and not x)
    return a, b, c, len(first) - a - b - c


def rate_record(hits: Sequence[bool], name: str) -> dict[str, float]:
    """results.json keys of a rate pooled over positions: `name` (%) and its Wilson 95% interval."""
    k, n = sum(bool(h) for h in hits), len(hits)
    lo, hi = wilson(k, n)
    return {name: 100.0 * k / n, f"{name}_ci_lo": 100.0 * lo, f"{name}_ci_hi": 100.0 * hi}


def paired_difference_record(first: Sequence[bool], second: Sequence[bool], name: str) -> dict[str, float]:
    """results.json keys of first − second (pp) on the same positions: Newcombe's paired 95% interval, the
    interval the table earned (`_earned_ci_lo/_hi`, what an at_chance reads), the exact McNemar p and the
    discordant counts."""
    a, b, c, d = paired_table(list(first), list(second))
    theta, lo, hi = newcombe_paired(a, b, c, d)
    e_lo, e_hi = newcombe_earned(a, b, c, d)
    return {name: 100.0 * theta, f"{name}_ci_lo": 100.0 * lo, f"{name}_ci_hi": 100.0 * hi,
            f"{name}_earned_ci_lo": 100.0 * e_lo, f"{name}_earned_ci_hi": 100.0 * e_hi,
            f"{name}_mcnemar_p": mcnemar_exact(b, c), f"{name}_first_only": b, f"{name}_second_only": c}


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


def proportion_ci(values: Sequence[float], scale: float = 100.0, confidence: float = 0.95) -> Estimate:
    """Mean of per-prompt rates in [0, scale] with a 95% interval that respects 0 and `scale`.

    When every prompt's rate is 0 or `scale` (exact match always; any rate whose prompts all sit at one
    edge), the mean is k/n·scale for the k prompts at `scale`, and the interval is Wilson's on k of n.
    For a rate over positions that is also a valid, conservative interval: the mean rate is at least
    scale·P(a prompt scores `scale`), and Wilson bounds that probability. So 15 prompts at 100 % report
    [79.6, 100], not a zero-width interval. Otherwise the rates differ between prompts and `mean_ci`'s
    percentile bootstrap over prompts applies (inside [0, scale] by construction).
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
    return mean_ci(a, confidence)
