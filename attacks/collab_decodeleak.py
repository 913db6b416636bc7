"""DecodeLeak (paper 003 §3) against the collaboration's adversary view, with a no-signal floor and a verdict.

The attacker is the honest-but-curious cloud. It reads only the view (harness/collab/engine.py channels)
plus what it owns: its model and x_pub (itself in the view, `public_query`).

- Exposure sets (eq. 5): cloud-side, the uploaded ids of each step ranked by uploaded probability;
  edge-side, TopK(p_L(· | y_<t, x_pub)) that the cloud computes from the synced tokens.
- Private evidence recall (metrics/evidence_recall.py) at every K.
- Private-context inversion (§3.3, Prompt D): the cloud model prompted with x_pub and the per-step top-k
  exposure sequence; ROUGE-1 recall and F1 of its output against x_priv.
- The no-signal floor (beyond the paper): the same metrics on what the cloud guesses with no signal at
  all, its own top-K along a cloud-only greedy generation. Leakage is reported as the excess over it, per
  example (paired), with a Student-t 95% interval over examples.
- The informed attacker (beyond the paper): the signal's sets united with the cloud's own no-signal
  guesses (the floor's sets). A sparse upload alone can score far *below* the floor (CoVeil uploads at most
  one id a step), which says nothing about privacy: the cloud still has its own model. The informed
  attacker's excess over the floor is ≥ 0 by construction and measures exactly what the signal adds.
- Verdict (attacks/controls.classify) on the informed attacker's excess Token-ER@report_k, reference 0, margin m:
  leak | at_chance | inconclusive. Positive control: the undefended collaboration of the same mode (the
  edge's full p_S uploaded, or the greedy fused token synced) must exceed the floor (lower bound ≥
  positive_margin_pp). Negative control: the undefended collaboration whose edge does not see x_priv must
  not (upper bound ≤ m): if it did, something other than the private context would carry the evidence.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attacks import controls
from harness.adversary_view import AdversaryView
from harness.collab import engine
from metrics.evidence_recall import Evidence, Vocabulary, first_rank, recall_curves
from metrics.intervals import Estimate, mean_ci

METRICS = ("token_er", "rouge1_er", "span_er", "auc")
INVERSION = ("inversion_rouge1_recall", "inversion_rouge1_f1")


def exposure_sets(view: AdversaryView, example_id: str, *, cloud: Any, vocab: int, top: int) -> list[list[int]]:
    """The per-step ranked exposure sets {E_t} of one example, read from the view only."""
    uploads = view.select(op=example_id, channel=engine.UPLOADED_PROBS)
    if uploads:
        return [e.tensor[:top, 0].long().tolist() for e in sorted(uploads, key=lambda e: e.step)]
    synced = sorted(view.select(op=example_id, channel=engine.SYNCED_TOKENS), key=lambda e: e.step)
    query = view.select(op=example_id, channel=engine.PUBLIC_QUERY)
    if not synced:
        return []
    return engine.cloud_topk_along(cloud, query[0].tensor.tolist(), [int(e.tensor[0]) for e in synced],
                                   vocab=vocab, top=top)


@dataclass
class Curves:
    """Per-example recall curves and inversion scores of one signal (the run, the floor, a control)."""

    rows: list[dict[str, dict[int, float]]] = field(default_factory=list)
    inversion: list[dict[str, float]] = field(default_factory=list)
    inversion_text: list[str] = field(default_factory=list)

    def values(self, metric: str, k: int) -> list[float]:
        return [r[metric][k] for r in self.rows]


def score_sets(all_sets: Sequence[Sequence[Sequence[int]]], evidence: Sequence[Evidence], vocab: Vocabulary,
               ks: Sequence[int], prior: Sequence[Sequence[Sequence[int]]] | None = None) -> Curves:
    """Recall curves of each example's exposure sets; with `prior` (the floor's sets), of the *informed*
    attacker that adds its own no-signal guesses: E^K = E^K_signal ∪ E^K_floor (merged best ranks)."""
    rows = []
    for i, (sets, ev) in enumerate(zip(all_sets, evidence)):
        ranks = first_rank(sets)
        if prior is not None:
            for token, r in first_rank(prior[i]).items():
                if r < ranks.get(token, r + 1):
                    ranks[token] = r
        rows.append(recall_curves(ranks, ev, vocab, ks))
    return Curves(rows)


@torch.no_grad()
def invert(cloud: Any, tokenizer: Any, prompt_ids: list[int], max_new_tokens: int) -> str:
    """Eq. 10: the cloud LLM's greedy reconstruction from an inversion prompt."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = cloud.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@functools.lru_cache(maxsize=1)
def _rouge1_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)


def rouge1(reference: str, hypothesis: str) -> dict[str, float]:
    """ROUGE-1 recall and F1 (%) of a reconstruction against the private context (rouge-score, stemmed)."""
    s = _rouge1_scorer().score(reference, hypothesis)["rouge1"]
    return {"inversion_rouge1_recall": 100.0 * s.recall, "inversion_rouge1_f1": 100.0 * s.fmeasure}


def paired_excess(values: Sequence[float], floor: Sequence[float]) -> Estimate:
    """The mean per-example excess over the floor with its paired Student-t 95% interval."""
    return mean_ci([a - b for a, b in zip(values, floor)])


def summarise(run: Curves, floor: Curves, ks: Sequence[int]) -> dict[str, Any]:
    """The results.json curves: `<metric>_at_k`, `floor_<metric>_at_k` and `excess_<metric>_at_k`
    ({K: value}, with `_ci` twins holding [lo, hi]); the inversion scores with their floors and excess."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        for prefix, curves in (("", run), ("floor_", floor)):
            ests = {k: mean_ci(curves.values(metric, k), bounds=(0.0, 100.0)) for k in ks}
            out[f"{prefix}{metric}_at_k"] = {str(k): e.mean for k, e in ests.items()}
            out[f"{prefix}{metric}_at_k_ci"] = {str(k): [e.lo, e.hi] for k, e in ests.items()}
        exc = {k: paired_excess(run.values(metric, k), floor.values(metric, k)) for k in ks}
        out[f"excess_{metric}_at_k"] = {str(k): e.mean for k, e in exc.items()}
        out[f"excess_{metric}_at_k_ci"] = {str(k): [e.lo, e.hi] for k, e in exc.items()}
    if run.inversion:
        for key in INVERSION:
            vals, fl = [r[key] for r in run.inversion], [r[key] for r in floor.inversion]
            e, f, x = mean_ci(vals, bounds=(0.0, 100.0)), mean_ci(fl, bounds=(0.0, 100.0)), paired_excess(vals, fl)
            out[key], out[f"{key}_ci"] = e.mean, [e.lo, e.hi]
            out[f"floor_{key}"], out[f"floor_{key}_ci"] = f.mean, [f.lo, f.hi]
            out[f"excess_{key}"], out[f"excess_{key}_ci"] = x.mean, [x.lo, x.hi]
    return out


def verdict(run: Curves, floor: Curves, positive: Curves | None, negative: Curves | None, k: int,
            margin_pp: float, positive_margin_pp: float) -> dict[str, Any]:
    """The three-way verdict on the excess Token-ER@k (module docstring) and the controls' numbers.
    `positive` None: the run is itself the undefended collaboration (its own positive control)."""
    exc = paired_excess(run.values("token_er", k), floor.values("token_er", k))
    pos = exc if positive is None else paired_excess(positive.values("token_er", k), floor.values("token_er", k))
    pos_ok = pos.lo >= positive_margin_pp
    neg = None if negative is None else paired_excess(negative.values("token_er", k), floor.values("token_er", k))
    neg_ok = neg is not None and neg.hi <= margin_pp
    v = controls.classify(exc.lo, exc.hi, 0.0, margin_pp, positive_passed=pos_ok, negative_passed=neg_ok)
    return {"verdict": v, "verdict_k": k, "gate_margin_pp": margin_pp, "positive_margin_pp": positive_margin_pp,
            "excess_token_er": exc.mean, "excess_token_er_ci": [exc.lo, exc.hi],
            "positive_control_excess_token_er": pos.mean, "positive_control_excess_token_er_ci": [pos.lo, pos.hi],
            "positive_control_pass": bool(pos_ok),
            "negative_control_excess_token_er": None if neg is None else neg.mean,
            "negative_control_excess_token_er_ci": None if neg is None else [neg.lo, neg.hi],
            "negative_control_pass": bool(neg_ok)}
