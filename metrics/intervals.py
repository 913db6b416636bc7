"""95% intervals over prompts for every number the harness reports.

Two estimators, chosen by the shape of the statistic:

- `mean_ci` — Student-t interval of a mean of per-prompt values. Used for the averages over prompts
  that are not rates: sentence BLEU, ROUGE-L, semantic similarity (metrics/text.py) and macro-averaged
  token precision/recall/F1 (metrics/privacy.py). Rates (exact match, token match rate, top-1, accuracy)
  take `metrics.proportions.proportion_ci`, which uses Wilson's interval where the t interval would
  collapse at 0 or 100 %.
- `bootstrap_ci` — percentile bootstrap, resampling prompts with replacement. Used for corpus-level
  statistics that are ratios of sums and not means of per-prompt values: corpus BLEU (metrics/text.py)
  and micro-averaged token precision/recall/F1 (metrics/privacy.py).

Both treat the prompt as the unit of sampling: the interval says how much the number would move on
another draw of prompts of the same kind, not how much it moves between runs on the same prompts.
With a handful of prompts (n < ~10) either interval is a rough guide only; the percentile bootstrap in
particular is too narrow for tiny n.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a two-sided interval over `n` prompts.

    `mean` is the point estimate: the sample mean for `mean_ci`, and the statistic on the full sample
    (not the mean of the bootstrap replicates) for `bootstrap_ci`.
    """

    mean: float
    lo: float
    hi: float
    n: int

    def flat(self, name: str) -> dict[str, float]:
        """`{name: mean, name_ci_lo: lo, name_ci_hi: hi}`, the layout of results.json `metrics`."""
        return {name: self.mean, f"{name}_ci_lo": self.lo, f"{name}_ci_hi": self.hi}


def mean_ci(
    values: Sequence[float], confidence: float = 0.95, bounds: tuple[float, float] | None = None
) -> Estimate:
    """Mean of per-prompt values with a Student-t interval: mean ± t_{(1+c)/2, n-1} · s / √n.

    `s` is the sample standard deviation (ddof=1). With one value, or when all values are equal, the
    interval collapses to the mean (lo = hi = mean) instead of being undefined. `bounds` clips the
    interval to the metric's range (e.g. (0, 100) for a percentage): the t interval of a skewed
    0/100 metric such as exact match otherwise reaches past 100.
    """
    a = np.asarray(values, dtype=float).ravel()
    n = int(a.size)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    _check_confidence(confidence)
    if n == 1 or np.ptp(a) == 0:
        # Exact, so that "all prompts identical" reports e.g. 100.0 and not 99.99999999999999.
        m = float(a[0])
        return Estimate(m, m, m, n)
    m = float(a.mean())
    half = float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1)) * float(a.std(ddof=1)) / math.sqrt(n)
    lo, hi = m - half, m + half
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return Estimate(m, lo, hi, n)


def paired_difference_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Estimate:
    """mean_ci of a[i] − b[i]: the same units (prompts, blocks) scored twice, so the spread between units
    cancels and a small difference can be told from zero where the two intervals overlap."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference_ci needs the same units: {len(a)} vs {len(b)}")
    return mean_ci([x - y for x, y in zip(a, b)], confidence)


def bootstrap_ci(
    values: Sequence[Any] | np.ndarray,
    stat_fn: Callable[[np.ndarray], float],
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Estimate:
    """Percentile bootstrap interval of a corpus-level statistic, resampling prompts with replacement.

    `values` holds one entry per prompt (first axis = prompts), typically a row of sufficient
    statistics such as BLEU's n-gram counts and lengths. `stat_fn` receives an array of such rows (a
    resample, or the full sample for the point estimate) and returns the statistic. The interval is
    the (α/2, 1-α/2) quantile pair of `n_boot` replicates, α = 1 - confidence; `seed` makes it
    reproducible. With one prompt, or when every replicate is equal, lo = hi = the point estimate.
    """
    a = np.asarray(values)
    n = int(a.shape[0]) if a.ndim else 0
    if n == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if n_boot < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    _check_confidence(confidence)
    point = float(stat_fn(a))
    if n == 1:
        return Estimate(point, point, point, n)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    reps = np.fromiter((stat_fn(a[row]) for row in idx), dtype=float, count=n_boot)
    if np.ptp(reps) == 0:
        return Estimate(point, point, point, n)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(reps, [alpha / 2.0, 1.0 - alpha / 2.0])
    return Estimate(point, float(lo), float(hi), n)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
