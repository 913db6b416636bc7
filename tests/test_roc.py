"""metrics/roc.py: the ROC record every scoring attack reports (issue 52 item 4), on known distributions and hand
examples."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from metrics import roc


@pytest.mark.parametrize("d", [0.5, 1.0, 2.0])
def test_auc_of_two_gaussians_is_phi_of_d_over_root_two(d):
    """Positives N(d, 1), negatives N(0, 1): AUC = P(X − Y > 0) = Φ(d/√2), inside the interval."""
    rng = np.random.default_rng(int(10 * d))
    record = roc.roc(rng.normal(d, 1.0, 2000), rng.normal(0.0, 1.0, 2000))
    lo, hi = record["auc_ci"]
    truth = float(stats.norm.cdf(d / math.sqrt(2)))
    assert lo <= truth <= hi
    assert hi - lo < 0.06                       # DeLong's width at n = 2000 each, not a vacuous interval


def test_intervals_cover_at_their_level():
    """Over 400 draws of 200 + 200 trials (d = 1): DeLong's AUC interval and the Clopper–Pearson interval of TPR
    at 10 % FPR (at the threshold each draw chose: the Gaussians' TPR there) each hold the truth in 95 % ± 3.3 pp
    of draws (3 binomial standard deviations of a 95 % rate)."""
    rng = np.random.default_rng(11)
    d, truth = 1.0, float(stats.norm.cdf(1.0 / math.sqrt(2)))
    auc_hits, tpr_hits = 0, 0
    for _ in range(400):
        record = roc.roc(rng.normal(d, 1.0, 200), rng.normal(0.0, 1.0, 200))
        auc_hits += record["auc_ci"][0] <= truth <= record["auc_ci"][1]
        row = record["tpr_at_fpr"][2]
        at = 100 * float(stats.norm.sf(row["threshold"] - d))
        tpr_hits += row["tpr_ci_pct"][0] <= at <= row["tpr_ci_pct"][1]
    assert 0.917 <= auc_hits / 400 <= 0.983
    assert 0.917 <= tpr_hits / 400 <= 1.0        # Clopper–Pearson is conservative: above 95 % is allowed


def test_identical_distributions_hold_one_half():
    rng = np.random.default_rng(7)
    record = roc.roc(rng.normal(size=1500), rng.normal(size=1500))
    assert record["auc_ci"][0] <= 0.5 <= record["auc_ci"][1]
    row = record["tpr_at_fpr"][1]               # 1 %: with no signal the TPR is the FPR
    assert row["tpr_ci_pct"][0] <= 1.0 <= row["tpr_ci_pct"][1]


def test_auc_counts_ties_one_half_and_matches_mann_whitney():
    pos, neg = [0.9, 0.8, 0.3], [0.8, 0.1]
    record = roc.roc(pos, neg)
    # pairs: 0.9 beats both, 0.8 ties 0.8 and beats 0.1, 0.3 beats 0.1 only: (2 + 1.5 + 1) / 6
    assert record["auc"] == pytest.approx(4.5 / 6)
    u = stats.mannwhitneyu(pos, neg).statistic
    assert record["auc"] == pytest.approx(u / 6)


def test_perfect_separation_earns_the_exact_pairs_bound_not_a_point():
    """DeLong's variance is 0 when no pair is misordered; m disjoint pairs bound AUC below by (α/2)^(1/m)."""
    record = roc.roc(np.arange(10, 20), np.arange(0, 30) - 100)
    assert record["auc"] == 1.0
    assert record["auc_ci"] == pytest.approx([0.025 ** (1 / 10), 1.0])
    assert roc.roc([1.0, 1.0], [1.0, 1.0])["auc_ci"][0] < 0.5 < roc.roc([1.0, 1.0], [1.0, 1.0])["auc_ci"][1]


def test_tpr_at_fpr_reads_the_threshold_and_refuses_what_the_negatives_cannot_resolve():
    neg = np.arange(100.0)                       # 100 negatives: FPR resolves to 1 % and no lower
    pos = np.array([50.5, 98.5, 99.5, 200.0])
    rows = {r["fpr_target_pct"]: r for r in roc.roc(pos, neg)["tpr_at_fpr"]}
    assert rows[0.1]["tpr_pct"] is None and rows[0.1]["tpr_ci_pct"] is None
    assert "100 negatives resolve FPR ≥ 1 % only" in rows[0.1]["reason"]
    # 1 %: at most one negative above the threshold, the second largest (98); 98.5, 99.5 and 200 are above it
    assert rows[1.0]["threshold"] == 98.0 and rows[1.0]["fp"] == 1 and rows[1.0]["tp"] == 3
    assert rows[1.0]["tpr_pct"] == 75.0
    lo, hi = stats.binomtest(3, 4).proportion_ci(0.95, method="exact")
    assert rows[1.0]["tpr_ci_pct"] == pytest.approx([100 * lo, 100 * hi])
    assert rows[10.0]["threshold"] == 89.0 and rows[10.0]["tp"] == 3 and rows[10.0]["fpr_pct"] == 10.0
    assert roc.roc(pos, neg)["min_fpr_pct"] == 1.0


def test_curve_is_thinned_with_both_ends_and_flat_metrics_for_the_export():
    rng = np.random.default_rng(1)
    record = roc.roc(rng.normal(1, 1, 4000), rng.normal(0, 1, 4000), positive="signal", negative="null")
    assert len(record["fpr_pct"]) <= roc.CURVE_POINTS == 200
    assert record["fpr_pct"][0] == record["tpr_pct"][0] == 0.0
    assert record["fpr_pct"][-1] == record["tpr_pct"][-1] == 100.0
    assert np.all(np.diff(record["fpr_pct"]) >= 0) and np.all(np.diff(record["tpr_pct"]) >= 0)
    assert record["positive"] == "signal" and record["negative"] == "null"
    flat = roc.flat(record, "bayes_")
    assert flat["bayes_auc"] == record["auc"] and [flat["bayes_auc_ci_lo"], flat["bayes_auc_ci_hi"]] == record["auc_ci"]
    assert set(flat["bayes_tpr_at_fpr"]) == {"0.1", "1", "10"}
    assert flat["bayes_tpr_at_fpr_ci"]["1"] == record["tpr_at_fpr"][1]["tpr_ci_pct"]


def test_bad_scores_raise():
    with pytest.raises(ValueError, match="a trial of each kind"):
        roc.roc([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        roc.roc([math.nan], [1.0])
