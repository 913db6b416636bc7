"""Empirical privacy auditing from a distinguishing test's scores: the ROC curve, TPR at low FPR with
Clopper–Pearson intervals, and the lower bound on μ of Gaussian differential privacy they imply.

The game (Jagielski et al. 2020; Nasr et al. 2023, "Tight auditing of differentially private machine
learning", arXiv:2302.07956): a mechanism runs on one of two neighbouring inputs, A (label 1) or B (label 0),
a fair coin choosing; the auditor sees its output and computes a score, higher meaning "A". A mechanism that is
μ-GDP (Dong, Roth & Su 2022) keeps every test's trade-off above the one between N(0, 1) and N(μ, 1): for every
threshold, TPR ≤ Φ(Φ⁻¹(FPR) + μ), i.e. μ ≥ Φ⁻¹(TPR) − Φ⁻¹(FPR). With TPR's lower and FPR's upper
Clopper–Pearson bound (each one-sided at 1 − α/2, so both hold at once with probability ≥ 1 − α), the trials
certify μ ≥ Φ⁻¹(TPR_lo) − Φ⁻¹(FPR_hi) at confidence 1 − α.

Thresholds. Choosing a threshold on the trials that then measure it would overstate TPR at a small FPR (the
largest negative score decides the threshold and then lies just below it), so the trials are split in two,
stratified by label and seeded: the calibration half sets, per target FPR, the threshold that at most that
fraction of its negatives exceed; the evaluation half measures TPR and FPR at it. The three targets are three
tests fixed before the evaluation half is read; the headline bound is the largest of the three, each from
intervals at 1 − α/3 (Bonferroni), so that the largest holds at 1 − α. Each target's own row shows the 1 − α
intervals.

The ROC curve (every threshold, all trials) and its AUC are descriptive (metrics/roc.py, shared with every
other attack that scores trials). `separation` estimates μ for a test whose
scores are Gaussian with a common variance (the log-likelihood ratio of a Gaussian mechanism is: N(±μ²/2, μ²)):
the standardised difference of the two labels' means, with the large-sample interval of Hedges & Olkin
(1985); it is an estimate, not a bound.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from metrics.proportions import clopper_pearson
from metrics.roc import FPR_TARGETS, roc_curve  # noqa: F401 (roc_curve: the audit's name for the shared curve)
from metrics.roc import roc as roc_record


@dataclass(frozen=True)
class OperatingPoint:
    """One threshold chosen on the calibration half for `target` FPR, measured on the evaluation half."""

    target: float
    threshold: float
    tp: int
    positives: int
    fp: int
    negatives: int
    tpr_ci: tuple[float, float]       # Clopper–Pearson at 1 − α
    fpr_ci: tuple[float, float]
    mu_lower: float | None            # Φ⁻¹(TPR_lo) − Φ⁻¹(FPR_hi) at 1 − α; None where TPR_lo = 0 (−∞)
    mu_lower_joint: float | None      # the same at 1 − α/m (m targets): what the headline takes the max of

    @property
    def tpr(self) -> float:
        return self.tp / self.positives

    @property
    def fpr(self) -> float:
        return self.fp / self.negatives

    def record(self) -> dict:
        """results.json: rates in %, the bound in units of μ."""
        return {"fpr_target_pct": 100.0 * self.target, "threshold": self.threshold,
                "tpr_pct": 100.0 * self.tpr, "tpr_ci_pct": [100.0 * v for v in self.tpr_ci],
                "fpr_pct": 100.0 * self.fpr, "fpr_ci_pct": [100.0 * v for v in self.fpr_ci],
                "tp": self.tp, "positives": self.positives, "fp": self.fp, "negatives": self.negatives,
                "mu_lower": self.mu_lower, "mu_lower_joint": self.mu_lower_joint}


def gdp_mu_lower(tpr_lo: float, fpr_hi: float) -> float | None:
    """μ ≥ Φ⁻¹(TPR_lo) − Φ⁻¹(FPR_hi) (μ-GDP's trade-off, Dong et al. 2022 Def. 2.5); None where TPR_lo = 0."""
    if tpr_lo <= 0.0:
        return None
    return float(stats.norm.ppf(tpr_lo) - stats.norm.ppf(fpr_hi))


def _mu_lower(tp: int, pos: int, fp: int, neg: int, alpha: float) -> tuple[tuple, tuple, float | None]:
    tpr_ci, fpr_ci = clopper_pearson(tp, pos, alpha), clopper_pearson(fp, neg, alpha)
    return tpr_ci, fpr_ci, gdp_mu_lower(tpr_ci[0], fpr_ci[1])


def split_halves(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (calibration, evaluation): each label's trials shuffled by `seed` and halved."""
    rng = np.random.default_rng(seed)
    calibration = np.zeros(labels.shape, dtype=bool)
    for value in (0, 1):
        idx = np.flatnonzero(labels == value)
        calibration[rng.permutation(idx)[: idx.size // 2]] = True
    return calibration, ~calibration


def threshold_at(negatives: np.ndarray, target: float) -> float:
    """The threshold that at most ⌊target·n⌋ of `negatives` exceed (decision: score > threshold ⇒ label 1)."""
    ordered = np.sort(negatives)
    k = int(math.floor(target * ordered.size))
    return float(ordered[ordered.size - k - 1])


def separation(scores: np.ndarray, labels: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """The standardised difference of means (label 1 − label 0, pooled variance) and its large-sample
    interval (Hedges & Olkin 1985): μ of the Gaussian trade-off the scores fit; not a bound."""
    a, b = scores[labels == 1], scores[labels == 0]
    n1, n0 = a.size, b.size
    pooled = math.sqrt(((n1 - 1) * a.var(ddof=1) + (n0 - 1) * b.var(ddof=1)) / (n1 + n0 - 2))
    d = float((a.mean() - b.mean()) / pooled) if pooled > 0 else (0.0 if a.mean() == b.mean() else math.inf)
    se = math.sqrt(1 / n1 + 1 / n0 + d * d / (2 * (n1 + n0))) if math.isfinite(d) else 0.0
    z = float(stats.norm.ppf(1 - alpha / 2))
    return d, d - z * se, d + z * se


@dataclass(frozen=True)
class Audit:
    """What one game's trials show (`audit`)."""

    n_trials: int
    points: list[OperatingPoint]
    mu_lower: float                   # the headline: max over targets at 1 − α jointly, clamped at 0
    mu_cap: float                     # the largest headline these trial counts can give (a perfect test)
    separation: tuple[float, float, float]
    roc: dict                         # metrics/roc.py's record of all trials: the curve, AUC, TPR read off it

    def record(self) -> dict:
        d, lo, hi = self.separation
        return {"n_trials": self.n_trials, "empirical_mu_lower": self.mu_lower, "mu_cap": self.mu_cap,
                "mu_estimate": d, "mu_estimate_ci": [lo, hi],
                "tpr_at_fpr": [p.record() for p in self.points],
                "roc": self.roc}


def audit(scores: Sequence[float], labels: Sequence[int], *, targets: Sequence[float] = FPR_TARGETS,
          alpha: float = 0.05, seed: int = 0) -> Audit:
    """The audit of one game (module docstring): labels 1 = A, 0 = B; scores higher for A."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores and labels must be one value per trial, got {s.shape} and {y.shape}")
    if min((y == 1).sum(), (y == 0).sum()) < 4:
        raise ValueError("the audit needs at least 4 trials of each label (2 per half)")
    if not targets or not all(0 < t < 1 for t in targets):
        raise ValueError(f"target FPRs must lie in (0, 1), got {list(targets)}")
    cal, ev = split_halves(y, seed)
    negatives_cal = s[cal & (y == 0)]
    pos, neg = s[ev & (y == 1)], s[ev & (y == 0)]
    points = []
    for target in targets:
        t = threshold_at(negatives_cal, target)
        tp, fp = int((pos > t).sum()), int((neg > t).sum())
        tpr_ci, fpr_ci, mu = _mu_lower(tp, pos.size, fp, neg.size, alpha)
        joint = _mu_lower(tp, pos.size, fp, neg.size, alpha / len(targets))[2]
        points.append(OperatingPoint(float(target), t, tp, pos.size, fp, neg.size, tpr_ci, fpr_ci, mu, joint))
    lower = max([p.mu_lower_joint for p in points if p.mu_lower_joint is not None], default=0.0)
    # a test that separates the evaluation half perfectly: every positive above, no negative
    cap = _mu_lower(pos.size, pos.size, 0, neg.size, alpha / len(targets))[2]
    return Audit(int(s.size), points, max(0.0, lower), float(cap), separation(s, y, alpha),
                 roc_record(s[y == 1], s[y == 0], targets=targets, alpha=alpha))
