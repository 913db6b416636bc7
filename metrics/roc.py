"""The ROC of a membership-style test from its per-trial scores: the curve, its AUC with a 95 % interval and TPR
at low FPR with Clopper–Pearson intervals (the convention of ML Privacy Meter and of the auditing literature:
Carlini et al. 2022, "Membership inference attacks from first principles", report TPR at FPR 0.1 % and 1 %).

A test scores every trial, higher meaning "the private signal is there". Positives are trials that carry it
(the signal, the real labels, A in a distinguishing game), negatives trials that cannot (the null signal,
permuted labels, B). Decision: score > threshold ⇒ positive.

- AUC = P(score of a positive > score of a negative), ties counting one half (the Mann–Whitney statistic over
  n_pos·n_neg pairs). Its interval is DeLong's (DeLong, DeLong & Clarke-Pearson 1988; midranks as in Sun & Xu
  2014), normal, clipped to [0, 1], and never narrower than ±h₀ = 1 − (α/2)^(1/m), m = min(n_pos, n_neg): m
  disjoint (positive, negative) pairs are all ordered with probability AUC^m, so a sample without a single
  misordered pair bounds AUC below by (α/2)^(1/m) = 1 − h₀ and no more (DeLong's variance is 0 there).
- TPR at a target FPR: the threshold that at most ⌊target·n_neg⌋ negatives exceed (the ROC curve read at the
  largest FPR ≤ target), TPR = the share of positives above it with its Clopper–Pearson interval. The positives
  do not choose the threshold, so the interval holds for the TPR of the test at that threshold; the FPR beside
  it is the one measured on the negatives that chose it. n_neg negatives resolve FPR ≥ 1/n_neg only: a target
  below that is reported as not measurable (None and the reason), never as the TPR at FPR 0 that the data
  cannot show.
- The curve: every distinct threshold from (0, 0) to (1, 1), thinned to at most `CURVE_POINTS` vertices for
  results.json (evenly in log FPR, where the low-FPR end that TPR at low FPR reads is kept).

metrics/auditing.py's privacy audit reads TPR at low FPR differently, on held-out trials, because its μ bound
needs an upper bound on the threshold's FPR too.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from metrics.proportions import clopper_pearson

FPR_TARGETS = (0.001, 0.01, 0.1)
CURVE_POINTS = 200      # the ROC curve kept in results.json: at most this many vertices


def roc_curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) at every distinct threshold, from (0, 0) to (1, 1) (decision: score ≥ threshold ⇒ 1)."""
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(s)), y.size - 1]     # the last trial of each run of equal scores
    tps, fps = np.cumsum(y)[last], np.cumsum(1 - y)[last]
    return np.r_[0.0, fps / max(1, (1 - y).sum())], np.r_[0.0, tps / max(1, y.sum())]


def thin(fpr: np.ndarray, tpr: np.ndarray, points: int = CURVE_POINTS) -> tuple[list[float], list[float]]:
    """At most `points` vertices of a ROC curve, evenly spaced in log FPR where it is long (the low-FPR end is
    what TPR at low FPR reads), with both ends kept."""
    if fpr.size <= points:
        return fpr.tolist(), tpr.tolist()
    grid = np.unique(np.r_[0, np.geomspace(max(fpr[fpr > 0].min(), 1e-6), 1.0, points - 3)])
    # the highest-TPR vertex at or below each grid FPR (the curve is a step function)
    at = np.searchsorted(fpr, grid, side="right") - 1
    keep = np.unique(np.r_[0, at, fpr.size - 1])
    return fpr[keep].tolist(), tpr[keep].tolist()


def auc(positives: np.ndarray, negatives: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """AUC and its 1 − α interval (module docstring): DeLong's, at least ±(1 − (α/2)^(1/m)) wide."""
    n1, n0 = positives.size, negatives.size
    ranks = stats.rankdata(np.r_[positives, negatives])          # midranks: a tie counts one half
    # placement values: each positive's share of negatives below it, each negative's of positives above it
    v10 = (ranks[:n1] - stats.rankdata(positives)) / n0
    v01 = 1.0 - (ranks[n1:] - stats.rankdata(negatives)) / n1
    a = float(v10.mean())
    var = (v10.var(ddof=1) / n1 if n1 > 1 else 0.0) + (v01.var(ddof=1) / n0 if n0 > 1 else 0.0)
    half = float(stats.norm.ppf(1 - alpha / 2)) * math.sqrt(var)
    h0 = 1.0 - (alpha / 2) ** (1.0 / min(n1, n0))
    return a, max(0.0, a - max(half, h0)), min(1.0, a + max(half, h0))


def tpr_at_fpr(positives: np.ndarray, negatives: np.ndarray, target: float, alpha: float = 0.05) -> dict:
    """TPR at `target` FPR with its Clopper–Pearson interval, in %; not measurable below 1/n_neg (module
    docstring)."""
    n1, n0 = positives.size, negatives.size
    row: dict = {"fpr_target_pct": 100.0 * target}
    k = int(math.floor(target * n0 + 1e-9))     # the negatives allowed above the threshold (1e-9: 0.01·100 = 1)
    if k == 0:
        return {**row, "tpr_pct": None, "tpr_ci_pct": None,
                "reason": f"{n0} negatives resolve FPR ≥ {100.0 / n0:.3g} % only"}
    threshold = float(np.sort(negatives)[n0 - k - 1])
    tp, fp = int((positives > threshold).sum()), int((negatives > threshold).sum())
    lo, hi = clopper_pearson(tp, n1, alpha)
    return {**row, "tpr_pct": 100.0 * tp / n1, "tpr_ci_pct": [100.0 * lo, 100.0 * hi], "fpr_pct": 100.0 * fp / n0,
            "threshold": threshold, "tp": tp, "fp": fp}


def roc(positives: Sequence[float], negatives: Sequence[float], *, targets: Sequence[float] = FPR_TARGETS,
        alpha: float = 0.05, positive: str | None = None, negative: str | None = None) -> dict:
    """The ROC record of one test (results.json `roc`): trial counts, AUC with its interval, the smallest FPR
    the negatives resolve, TPR at each target FPR and the thinned curve; rates in %. `positive` and `negative`
    say what the trials are."""
    pos, neg = np.asarray(positives, dtype=np.float64), np.asarray(negatives, dtype=np.float64)
    if pos.ndim != 1 or neg.ndim != 1 or not pos.size or not neg.size:
        raise ValueError(f"need one score per trial and a trial of each kind, got {pos.shape} and {neg.shape}")
    if not (np.isfinite(pos).all() and np.isfinite(neg).all()):
        raise ValueError("scores must be finite")
    if not targets or not all(0 < t < 1 for t in targets):
        raise ValueError(f"target FPRs must lie in (0, 1), got {list(targets)}")
    a, lo, hi = auc(pos, neg, alpha)
    fpr, tpr = thin(*roc_curve(np.r_[pos, neg], np.r_[np.ones(pos.size, dtype=np.int64),
                                                      np.zeros(neg.size, dtype=np.int64)]))
    record = {"positives": int(pos.size), "negatives": int(neg.size), "auc": a, "auc_ci": [lo, hi],
              "min_fpr_pct": 100.0 / neg.size, "tpr_at_fpr": [tpr_at_fpr(pos, neg, t, alpha) for t in targets],
              "fpr_pct": [100.0 * v for v in fpr], "tpr_pct": [100.0 * v for v in tpr]}
    if positive is not None or negative is not None:
        record = {"positive": positive, "negative": negative, **record}
    return record


def flat(record: dict, prefix: str = "") -> dict:
    """results.json `metrics` of one test's record: `auc` with `_ci_lo`/`_ci_hi`, and TPR (%) at each target FPR
    keyed by the target in % (`tpr_at_fpr`: {"0.1": None, "1": 12.5, "10": 40.0}) with its interval
    (`tpr_at_fpr_ci`); None where not measurable. The export makes them rows `auc`, `tpr_at_fpr[1]`, …"""
    lo, hi = record["auc_ci"]
    return {f"{prefix}auc": record["auc"], f"{prefix}auc_ci_lo": lo, f"{prefix}auc_ci_hi": hi,
            f"{prefix}tpr_at_fpr": {f"{p['fpr_target_pct']:g}": p["tpr_pct"] for p in record["tpr_at_fpr"]},
            f"{prefix}tpr_at_fpr_ci": {f"{p['fpr_target_pct']:g}": p["tpr_ci_pct"] for p in record["tpr_at_fpr"]}}
