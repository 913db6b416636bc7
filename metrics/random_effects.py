"""A random-effects pool of per-seed effects: DerSimonian & Laird (1986).

Each seed s gives an effect y_s with sampling variance v_s (here: a probe's paired accuracy gain over the
constant guess, in pp, and its variance over rows). With w_s = 1/v_s, the fixed-effect mean is
ȳ = Σ w_s y_s / Σ w_s and Cochran's Q = Σ w_s (y_s − ȳ)². The between-seed variance is the method-of-moments

    τ² = max(0, (Q − (k − 1)) / (Σ w_s − Σ w_s² / Σ w_s)),

the random-effects weights are w*_s = 1/(v_s + τ²), the pooled effect μ = Σ w*_s y_s / Σ w*_s with standard
error 1/√Σ w*_s and a normal 95% interval μ ± 1.96·se. A seed with v_s = 0 (every row agrees) gets a tiny
floor variance so that the weights stay finite.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

_VARIANCE_FLOOR = 1e-12


@dataclass(frozen=True)
class Pooled:
    mean: float
    lo: float
    hi: float
    se: float
    tau2: float
    q: float
    k: int


def dersimonian_laird(effects: Sequence[float], variances: Sequence[float], confidence: float = 0.95) -> Pooled:
    """The DerSimonian–Laird random-effects pool of `effects` with sampling `variances` (module docstring)."""
    if len(effects) != len(variances) or not effects:
        raise ValueError(f"need one variance per effect and at least one, got {len(effects)} and {len(variances)}")
    if any(v < 0 or not math.isfinite(v) for v in variances):
        raise ValueError(f"variances must be finite and >= 0, got {list(variances)}")
    v = [max(float(x), _VARIANCE_FLOOR) for x in variances]
    y = [float(e) for e in effects]
    k = len(y)
    w = [1.0 / x for x in v]
    sw = sum(w)
    fixed = sum(wi * yi for wi, yi in zip(w, y)) / sw
    q = sum(wi * (yi - fixed) ** 2 for wi, yi in zip(w, y))
    denom = sw - sum(wi * wi for wi in w) / sw
    tau2 = max(0.0, (q - (k - 1)) / denom) if k > 1 and denom > 0 else 0.0
    ws = [1.0 / (x + tau2) for x in v]
    mean = sum(wi * yi for wi, yi in zip(ws, y)) / sum(ws)
    se = 1.0 / math.sqrt(sum(ws))
    z = float(stats.norm.ppf((1.0 + confidence) / 2.0))
    return Pooled(mean, mean - z * se, mean + z * se, se, tau2, q, k)
