"""The one table of metric names: what a results.json `metrics` key (or a tradeoff block's `metric`) is called on
a chart's axis, its unit, the range its values can take and, for a proportion, the fixed axis it is drawn on.

Charts and tables read it (runners/report/): an axis label is `label(key)`, never the raw key; a percentage is
drawn on a fixed 0–100 axis (`axis(key)`), so a flat 100 % reads as 100 and not as an offset of 1e-6; an
interval's ends are clipped to `bounds(key)` (`clip`), since a t interval of a mean near an edge (or a mean over
mask seeds of such intervals) reaches past what the metric can take, e.g. an upper end of 100.77 %.
A key the table does not know is shown under its own name, unbounded and unclipped: results.json files
outlive this table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PERCENT = (0.0, 100.0)
POINTS = (-100.0, 100.0)    # a difference of two percentages, in percentage points


@dataclass(frozen=True)
class Metric:
    name: str                                  # "Exact match"
    unit: str = "%"                            # "%", "pp", "nats", "" (BLEU's 0–100 score has no unit)
    bounds: tuple[float | None, float | None] = PERCENT   # the values it can take; None: unbounded on that side
    axis: tuple[float, float] | None = PERCENT  # a fixed chart axis; None: the axis follows the data

    @property
    def label(self) -> str:
        return f"{self.name} ({self.unit})" if self.unit else self.name


def _count(name: str) -> Metric:
    """A metric with no fixed range (an error, a cross-entropy, a ratio that can pass 100)."""
    return Metric(name, "", (None, None), None)


NAMES: dict[str, Metric] = {
    # generation fidelity against the baseline (metrics/text.py)
    "exact_match": Metric("Exact match"),
    "token_match_rate": Metric("Token match"),
    "bleu": Metric("BLEU", ""),
    "rouge_l": Metric("ROUGE-L F1"),
    # mean cosine × 100: negative for opposed embeddings, so its range is ±100; drawn on 0–100 unless it dips
    "semantic_similarity": Metric("Semantic similarity", bounds=POINTS),
    # reconstruction attacks (metrics/privacy.py)
    "token_precision": Metric("Token precision"),
    "token_recall": Metric("Token recall"),
    "token_f1": Metric("Token F1"),
    "bayes_top1": Metric("Bayes top-1 token recovery"),
    "bayes_top5": Metric("Bayes top-5 token recovery"),
    "bayes_token_f1": Metric("Bayes token F1"),
    "sequential_top1": Metric("Top-1 recovery, likelihood attacker"),
    "sequential_map_top1": Metric("Top-1 recovery, MAP attacker"),
    "prior_top1": Metric("Top-1 recovery, prior alone"),
    "pr_at_5": Metric("Pr@5: tokens whose original is among the 5 nearest neighbours"),
    "inversion_rouge1_recall": Metric("Inversion ROUGE-1 recall"),
    "unchanged_rate": Metric("Tokens left unchanged"),
    "contextual_prior_gain": Metric("Contextual attacker's gain over the prior alone", "pp", POINTS, POINTS),
    "probe_accuracy_pct": Metric("Frequent-token probe accuracy"),
    # an attack's per-trial scores as a test, signal against its null (metrics/roc.py)
    "auc": Metric("ROC AUC of the attack's test", "", (0.0, 1.0), (0.0, 1.0)),
    "tpr_at_fpr": Metric("TPR at low FPR of the attack's test"),
    # task utility
    "accuracy": Metric("Accuracy"),
    "heldout_top1": Metric("Held-out next-token top-1"),
    "heldout_ce": Metric("Held-out cross-entropy", "nats", (0.0, None), None),
    # 100·exp(−ΔCE): above 100 when training lowered the cross-entropy
    "heldout_perplexity_ratio_pct": Metric("Held-out perplexity kept", "%", (0.0, None), None),
    "mean_true_error": _count("Mean absolute error per output element"),
    "mean_bound": _count("Mean of the proven error bound"),
}

# Families of keys: (pattern, name template, unit, bounds, axis); the template's {1}, {2} are the pattern's groups.
PATTERNS: tuple[tuple[re.Pattern[str], str, str, tuple, tuple | None], ...] = (
    (re.compile(r"(.+)_pp(?:_(.+))?"), "{1} ({2})", "pp", POINTS, POINTS),             # a difference of percentages
    (re.compile(r"token_er_at_(\d+)"), "Token-ER@{1}", "%", PERCENT, PERCENT),
    (re.compile(r"bayes_top1_k(\d+)"), "Bayes top-1 token recovery, k={1}", "%", PERCENT, PERCENT),
    (re.compile(r"accuracy_(.+)"), "Accuracy on {1}", "%", PERCENT, PERCENT),
    (re.compile(r"(.+)_top(\d+)"), "{1} top-{2} recovery", "%", PERCENT, PERCENT),
    (re.compile(r"(label|eia|bisr|positive_control|negative_control|chance_floor)_token_f1"), "Token F1, {1}", "%",
     PERCENT, PERCENT),
)


def lookup(key: str) -> Metric:
    """The entry of `key`: the table's, a family's, or the bare key (unbounded) for one neither knows."""
    if key in NAMES:
        return NAMES[key]
    for pattern, template, unit, bounds, axis in PATTERNS:
        m = pattern.fullmatch(key)
        if m:
            groups = [g.replace("_", " ") if g else "" for g in m.groups()]
            name = template.format(None, *groups).replace(" ()", "")
            return Metric(name[0].upper() + name[1:], unit, bounds, axis)
    return Metric(key.replace("_", " "), "", (None, None), None)


def label(key: str) -> str:
    """The axis label of `key`: "Exact match (%)"."""
    return lookup(key).label


def bounds(key: str) -> tuple[float | None, float | None]:
    return lookup(key).bounds


def axis(key: str) -> tuple[float, float] | None:
    """The fixed axis `key` is drawn on (0–100 for a proportion), or None where the axis follows the data."""
    return lookup(key).axis


def clip(key: str, lo: float | None, hi: float | None) -> tuple[float | None, float | None]:
    """An interval's ends clipped to the range of `key` (a missing end stays missing)."""
    low, high = bounds(key)
    if lo is not None and low is not None:
        lo = max(lo, low)
    if hi is not None and high is not None:
        hi = min(hi, high)
    return lo, hi
