"""95% intervals over prompts for every number the harness reports.

Three estimators, chosen by the shape of the statistic and by who reads the interval (docs/design.md,
Metrics, states the rule):

- `mean_ci` — percentile bootstrap of a mean of per-prompt values, resampling prompts with replacement.
  The reported interval of the averages over prompts that are not 0/100 rates: sentence BLEU, ROUGE-L,
  semantic similarity (metrics/text.py), macro token precision/recall (metrics/privacy.py), held-out CE
  over blocks, and the rates between the edges (`metrics.proportions.proportion_ci`, which uses Wilson's
  interval when every prompt sits at 0 or 100 %). A resample's mean lies within the sample's range, so
  the interval lies within the metric's range without clipping. `paired_difference_ci` is `mean_ci` of
  the differences of the same units scored twice.
- `mean_t_ci` — Student-t interval of a mean, for the intervals a calibrated decision reads: the attack
  verdicts, their controls and the gains they classify (attacks/controls.classify; metrics/equivalence.py
  sizes n and the margin from the t critical value and attacks/calibration.py reads the per-unit spread
  back from t half-widths), and the timing benchmarks' met / not met over a few rounds.
  `paired_difference_t_ci` is its paired form. A leak reads it as it is; an at_chance reads it widened to
  the bound the sample earned (metrics/equivalence.earned_interval, issue 51), never its zero width when
  every value is equal.
- `bootstrap_ci` — percentile bootstrap of any statistic. Used for corpus-level statistics that are
  ratios of sums and not means of per-prompt values: corpus BLEU (metrics/text.py) and micro-averaged
  token precision/recall/F1 (metrics/privacy.py).

The fidelity metrics (metrics/text.py: BLEU, ROUGE-L, semantic similarity) pass their range (`metric_range`): a
bootstrap over items that all sit at 100 is [100, 100], which no sample can show, so the interval is widened to
what the sample earned (`earned_range`, issue 51): at most CP_U(0, n) of such items could differ, each by at
most the metric's range, which puts the lower end of 30 prompts at 100 at 88.4 (0–100 metrics).

All treat the prompt as the unit of sampling: the interval says how much the number would move on
another draw of prompts of the same kind, not how much it moves between runs on the same prompts.
With a handful of prompts (n < ~10) any of them is a rough guide only; the percentile bootstrap in
particular is too narrow for tiny n (with n prompts its spread is the plug-in sd·√((n−1)/n) and its
quantiles normal ones, not t's).
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

    `mean` is the point estimate: the sample mean for `mean_ci` and `mean_t_ci`, and the statistic on the
    full sample (not the mean of the bootstrap replicates) for `bootstrap_ci`.
    """

    mean: float
    lo: float
    hi: float
    n: int

    def flat(self, name: str) -> dict[str, float]:
        """`{name: mean, name_ci_lo: lo, name_ci_hi: hi}`, the layout of results.json `metrics`."""
        return {name: self.mean, f"{name}_ci_lo": self.lo, f"{name}_ci_hi": self.hi}


def mean_ci(values: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int = 0,
            metric_range: tuple[float, float] | None = None) -> Estimate:
    """Mean of per-prompt values with a percentile bootstrap interval over prompts.

    `n_boot` resamples of the n values with replacement (seeded by `seed`, so the interval is
    reproducible); the interval is the (α/2, 1−α/2) quantile pair of the resamples' means, α = 1 −
    confidence. Each resample's mean lies between the smallest and the largest value, so the interval
    stays inside the metric's range (0–100 for a percentage) with no clipping, and follows a skewed
    metric's asymmetry where mean ± t·s/√n would not. With one value, or when all values are equal, the
    bootstrap collapses to the mean (lo = hi = mean); with the metric's range (`metric_range`: it widens, never
    clips) the interval is widened to
    at least what the sample earned (`earned_range`), so 30 prompts all at 100 read [88.4, 100], not [100, 100].
    """
    a = _values(values, "mean_ci")
    n = int(a.size)
    _check_confidence(confidence)
    if n_boot < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    if n == 1 or np.ptp(a) == 0:
        # Exact, so that "all prompts identical" reports e.g. 100.0 and not 99.99999999999999.
        m = float(a[0])
        return _earned(Estimate(m, m, m, n), metric_range, confidence)
    reps = np.concatenate([a[idx].mean(axis=1) for idx in _resamples(n, n_boot, seed)])
    alpha = 1.0 - confidence
    lo, hi = np.quantile(reps, [alpha / 2.0, 1.0 - alpha / 2.0])
    # min/max absorb only the last bit of a resample sum's rounding (0.1 + 0.1 + 0.1 > 0.3): the mean of
    # values that all lie in [a.min(), a.max()] lies there too.
    est = Estimate(float(a.mean()), max(float(lo), float(a.min())), min(float(hi), float(a.max())), n)
    return _earned(est, metric_range, confidence)


def earned_range(mean: float, lo: float, hi: float, n: int, metric_range: tuple[float, float],
                 confidence: float = 0.95) -> tuple[float, float]:
    """[lo, hi] widened to at least [mean − π₀·(mean − a), mean + π₀·(b − mean)], π₀ = CP_U(0, n) (issue 51,
    metrics/equivalence.zero_spread_bound): a sample of n items in [a, b] cannot rule out that a share π₀ of
    such items would lie anywhere in the range, so a mean over items that all agree (or all sit at a bound)
    moves by up to π₀ of the room on each side. The descriptive counterpart of the verdicts' earned interval:
    never zero-width, and one more item away from the bound never raises the lower end above the all-at-the-
    bound sample's (both ends of a bootstrap over fixed resamples only move outward then)."""
    from metrics.equivalence import zero_spread_bound

    a, b = metric_range
    if not a < b:
        raise ValueError(f"metric_range must be (low, high) with low < high, got {metric_range}")
    share = zero_spread_bound(n, 1.0, confidence)
    return min(lo, mean - share * (mean - a)), max(hi, mean + share * (b - mean))


def _earned(est: Estimate, metric_range: tuple[float, float] | None, confidence: float) -> Estimate:
    if metric_range is None:
        return est
    lo, hi = earned_range(est.mean, est.lo, est.hi, est.n, metric_range, confidence)
    return Estimate(est.mean, lo, hi, est.n)


def mean_t_ci(
    values: Sequence[float], confidence: float = 0.95, bounds: tuple[float, float] | None = None
) -> Estimate:
    """Mean of per-unit values with a Student-t interval: mean ± t_{(1+c)/2, n-1} · s / √n.

    For the intervals a calibrated decision reads (module docstring), not for reporting a mean. `s` is the
    sample standard deviation (ddof=1). With one value, or when all values are equal, the interval
    collapses to the mean (lo = hi = mean) instead of being undefined. `bounds` clips the interval to the
    statistic's range (e.g. (0, 100) for a token F1): the t interval of a skewed metric otherwise reaches
    past it.
    """
    a = _values(values, "mean_t_ci")
    n = int(a.size)
    _check_confidence(confidence)
    if n == 1 or np.ptp(a) == 0:
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
    cancels and a small difference can be told from zero where the two intervals overlap. Resampling
    the differences resamples units, so the pairing is kept."""
    return mean_ci(_differences(a, b, "paired_difference_ci"), confidence)


def paired_difference_t_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Estimate:
    """mean_t_ci of a[i] − b[i], for a paired difference a calibrated verdict reads (module docstring)."""
    return mean_t_ci(_differences(a, b, "paired_difference_t_ci"), confidence)


def bootstrap_ci(
    values: Sequence[Any] | np.ndarray,
    stat_fn: Callable[[np.ndarray], float],
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    metric_range: tuple[float, float] | None = None,
) -> Estimate:
    """Percentile bootstrap interval of a corpus-level statistic, resampling prompts with replacement.

    `values` holds one entry per prompt (first axis = prompts), typically a row of sufficient
    statistics such as BLEU's n-gram counts and lengths. `stat_fn` receives an array of such rows (a
    resample, or the full sample for the point estimate) and returns the statistic. The interval is
    the (α/2, 1-α/2) quantile pair of `n_boot` replicates, α = 1 - confidence; `seed` makes it
    reproducible. With one prompt, or when every replicate is equal, lo = hi = the point estimate; with the
    statistic's `metric_range` the interval is widened to what the sample earned (`earned_range`).
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
        return _earned(Estimate(point, point, point, n), metric_range, confidence)
    reps = np.fromiter((stat_fn(a[row]) for idx in _resamples(n, n_boot, seed) for row in idx), dtype=float,
                       count=n_boot)
    if np.ptp(reps) == 0:
        return _earned(Estimate(point, point, point, n), metric_range, confidence)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(reps, [alpha / 2.0, 1.0 - alpha / 2.0])
    return _earned(Estimate(point, float(lo), float(hi), n), metric_range, confidence)


# Index cells per block of resamples (int64: 32 MiB), so 2000 resamples of 10⁵ units do not build a 1.6 GB
# index array at once.
_RESAMPLE_CELLS = 1 << 22


def _resamples(n: int, n_boot: int, seed: int):
    """The bootstrap's `n_boot` resamples of n units with replacement, as index arrays in blocks of at most
    _RESAMPLE_CELLS cells. One generator is consumed in order, so the draws are the same whatever the block
    size: `mean_ci` and `bootstrap_ci(values, np.mean)` resample alike."""
    rng = np.random.default_rng(seed)
    rows = max(1, _RESAMPLE_CELLS // n)
    for start in range(0, n_boot, rows):
        yield rng.integers(0, n, size=(min(rows, n_boot - start), n))


def _values(values: Sequence[float], name: str) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0:
        raise ValueError(f"{name} needs at least one value")
    return a


def _differences(a: Sequence[float], b: Sequence[float], name: str) -> list[float]:
    if len(a) != len(b):
        raise ValueError(f"{name} needs the same units: {len(a)} vs {len(b)}")
    return [x - y for x, y in zip(a, b)]


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
