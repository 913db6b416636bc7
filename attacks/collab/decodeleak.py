"""DecodeLeak (paper 003 §3) against the collaboration's adversary view, with a no-signal floor and a verdict.

The attacker is the honest-but-curious cloud. It reads only the view (harness/collab/engine.py channels)
plus what it owns: its model and x_pub (itself in the view, `public_query`).

- Exposure sets (eq. 5): cloud-side, the uploaded ids of each step ranked by uploaded probability;
  edge-side, TopK(p_L(· | y_<t, x_pub)) that the cloud computes from the synced tokens.
- Private evidence recall (attacks/collab/evidence_recall.py) at every K.
- Private-context inversion (§3.3, Prompt D): the cloud model prompted with x_pub and the per-step top-k
  exposure sequence; ROUGE-1 recall and F1 of its output against x_priv.
- The no-signal floor (beyond the paper): the same metrics on what the cloud guesses with no signal at
  all, its own top-K along a cloud-only greedy generation. Leakage is reported as the excess over it, per
  example (paired), with a bootstrap 95% interval over examples (metrics/intervals.mean_ci).
- The informed attacker (beyond the paper): the signal's sets united with the cloud's own no-signal
  guesses (the floor's sets). A sparse upload alone can score far *below* the floor (CoVeil uploads at most
  one id a step), which says nothing about privacy: the cloud still has its own model.
- The verdict's statistic (beyond the paper): the informed attacker on the signal minus the informed
  attacker on the **null signal**, per example (paired), Student-t 95% interval. The null signal is the same
  defence at the same parameter and seed with an edge that does not hold x_priv (protocol.collaborate_all,
  private=False): the same mechanism, the same number of ids, the same randomness, no private context. The
  informed attacker's excess over the *floor* is not a leak statistic: uniting sets credits any extra
  coverage, so 100 uniformly random ids a step, or DP-Fusion at ε = 0 (tokens sampled from the cloud's own
  distribution), read as leaks against the floor (issue 31). Against the null signal both are exactly 0.
- Verdict (attacks/controls.classify) on that statistic at report_k, reference 0, margin m:
  leak | at_chance | inconclusive. Positive control: the undefended collaboration of the same mode against
  its own null (the undefended edge without x_priv) must show a lower bound ≥ positive_margin_pp: the
  statistic can see the private context when it is there. Negative control: the statistic between two
  signals without private information, a second null signal (seed + 1) against the null, must not read
  leak (lower bound ≤ m). For a deterministic defence the two are identical and it reads 0; for a randomised
  one it shows the mechanism's noise. Its pass rule is not the learned attacker's (upper bound ≤ m): a noisy
  mechanism's null-against-null interval is wide at tens of examples, and that rule would block every leak
  call on it, while what this control must catch is a statistic that reads a leak without information.
  (Evidence rotated between examples was tried and dropped: the built-in contexts share clinical words, so
  a real leak of one context covers its neighbour's evidence, and the control failed on the injected leak.)
- Earned bound (issue 51): at_chance reads the interval the sample earned (metrics/equivalence.earned_interval,
  B = collab.controls.per_item_bound_pp), never the t interval alone: 30 examples whose signal and null agree
  exactly have a t interval [0, 0] but bound the mean only by B·CP_U(0, 30) = 11.6 pp at B = 100. The null
  draws at its own seed (harness/collab/experiment.NULL_SEED_OFFSET), so a drawing mechanism that ignores
  x_priv shows its noise; a deterministic one still reproduces its null bit for bit, and the earned bound is
  what keeps that zero from certifying. A leak reads the t interval.
- Steps (issue 51): Token-ER is a coverage over the union of the steps' sets, so a signal that decodes more
  steps than its null covers more with no content at all (random ids gain about 0.14 pp a step). With
  collab.controls.step_matching=matched (the default) each example's signal and null are cut to the shorter's
  step count before scoring (`match_steps`): like is compared with like, in the paper's own unit. per_step
  rescales each side's scores to the null's step count instead: it keeps every step, but coverage saturates
  (concave in the steps), so dividing by steps penalises the longer side and is neutral only where coverage
  grows linearly. none keeps every step as decoded (the statistic before issue 51).
- The headline stays the paper's metric minus the floor (`excess_*`).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attacks import controls
from attacks.collab.evidence_recall import Evidence, Vocabulary, first_rank, recall_curves
from harness.adversary_view import AdversaryView
from harness.collab import engine
from metrics.equivalence import earned_interval
from metrics.intervals import Estimate, mean_ci, paired_difference_ci, paired_difference_t_ci

METRICS = ("token_er", "rouge1_er", "span_er", "auc")
INVERSION = ("inversion_rouge1_recall", "inversion_rouge1_f1")


def exposure_sets(view: AdversaryView, example_id: str, *, cloud: Any, vocab: int, top: int,
                  memo: dict[Any, list[list[int]]] | None = None) -> list[list[int]]:
    """The per-step ranked exposure sets {E_t} of one example, read from the view only. Edge-side they are a
    forward of the cloud model over the public query and the synced tokens: `memo` keeps them by those ids, so
    two decodes that synced the same tokens (a deterministic defence's null and the undefended null, often)
    cost one forward."""
    uploads = view.select(op=example_id, channel=engine.UPLOADED_PROBS)
    if uploads:
        return [e.tensor[:top, 0].long().tolist() for e in sorted(uploads, key=lambda e: e.step)]
    synced = sorted(view.select(op=example_id, channel=engine.SYNCED_TOKENS), key=lambda e: e.step)
    query = view.select(op=example_id, channel=engine.PUBLIC_QUERY)
    if not synced:
        return []
    ids = (tuple(query[0].tensor.tolist()), tuple(int(e.tensor[0]) for e in synced), top)
    if memo is not None and ids in memo:
        return memo[ids]
    sets = engine.cloud_topk_along(cloud, list(ids[0]), list(ids[1]), vocab=vocab, top=top)
    if memo is not None:
        memo[ids] = sets
    return sets


@dataclass
class Curves:
    """Per-example recall curves and inversion scores of one signal (the run, the floor, a control)."""

    rows: list[dict[str, dict[int, float]]] = field(default_factory=list)
    inversion: list[dict[str, float]] = field(default_factory=list)
    inversion_text: list[str] = field(default_factory=list)

    def values(self, metric: str, k: int) -> list[float]:
        return [r[metric][k] for r in self.rows]


def score_sets(all_sets: Sequence[Sequence[Sequence[int]]], evidence: Sequence[Evidence], vocab: Vocabulary,
               ks: Sequence[int], prior: Sequence[Sequence[Sequence[int]]] | None = None,
               metrics: Sequence[str] = METRICS) -> Curves:
    """Recall curves (`metrics`, all by default; the verdict reads token_er) of each example's exposure sets;
    with `prior` (the floor's sets), of the *informed* attacker that adds its own no-signal guesses:
    E^K = E^K_signal ∪ E^K_floor (merged best ranks)."""
    # the informed attacker's best rank of an id: its best over the signal's steps and the floor's together
    return Curves([recall_curves(first_rank(sets if prior is None else [*sets, *prior[i]]), ev, vocab, ks, metrics)
                   for i, (sets, ev) in enumerate(zip(all_sets, evidence))])


def invert(cloud: Any, tokenizer: Any, prompt_ids: list[int], max_new_tokens: int) -> str:
    """Eq. 10: the cloud LLM's greedy reconstruction from an inversion prompt (transformers' generate at batch
    1: the argmax of the raw logits, up to the generation config's EOS)."""
    return invert_all(cloud, tokenizer, [prompt_ids], max_new_tokens, batch_size=1, min_rows=1)[0]


def invert_all(cloud: Any, tokenizer: Any, prompts: Sequence[list[int]], max_new_tokens: int, *, batch_size: int,
               min_rows: int) -> list[str]:
    """`invert` of every prompt, `batch_size` at a time (engine.greedy_batch: each the same as alone)."""
    eos = cloud.generation_config.eos_token_id
    stop = set() if eos is None else set(eos) if isinstance(eos, (list, tuple)) else {eos}
    texts = []
    for at in range(0, len(prompts), max(1, batch_size)):
        for ids, _ in engine.greedy_batch(cloud, prompts[at:at + batch_size], max_new_tokens=max_new_tokens,
                                          vocab=None, stop=stop, min_rows=min_rows):
            texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return texts


@functools.lru_cache(maxsize=1)
def _rouge1_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)


def rouge1(reference: str, hypothesis: str) -> dict[str, float]:
    """ROUGE-1 recall and F1 (%) of a reconstruction against the private context (rouge-score, stemmed)."""
    s = _rouge1_scorer().score(reference, hypothesis)["rouge1"]
    return {"inversion_rouge1_recall": 100.0 * s.recall, "inversion_rouge1_f1": 100.0 * s.fmeasure}


def paired_excess(values: Sequence[float], floor: Sequence[float]) -> Estimate:
    """The mean per-example excess over the floor with its paired bootstrap 95% interval (reported; no verdict
    reads it)."""
    return paired_difference_ci(values, floor)


def summarise(run: Curves, floor: Curves, ks: Sequence[int]) -> dict[str, Any]:
    """The results.json curves: `<metric>_at_k`, `floor_<metric>_at_k` and `excess_<metric>_at_k`
    ({K: value}, with `_ci` twins holding [lo, hi]); the inversion scores with their floors and excess."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        for prefix, curves in (("", run), ("floor_", floor)):
            ests = {k: mean_ci(curves.values(metric, k)) for k in ks}
            out[f"{prefix}{metric}_at_k"] = {str(k): e.mean for k, e in ests.items()}
            out[f"{prefix}{metric}_at_k_ci"] = {str(k): [e.lo, e.hi] for k, e in ests.items()}
        exc = {k: paired_excess(run.values(metric, k), floor.values(metric, k)) for k in ks}
        out[f"excess_{metric}_at_k"] = {str(k): e.mean for k, e in exc.items()}
        out[f"excess_{metric}_at_k_ci"] = {str(k): [e.lo, e.hi] for k, e in exc.items()}
    if run.inversion:
        for key in INVERSION:
            vals, fl = [r[key] for r in run.inversion], [r[key] for r in floor.inversion]
            e, f, x = mean_ci(vals), mean_ci(fl), paired_excess(vals, fl)
            out[key], out[f"{key}_ci"] = e.mean, [e.lo, e.hi]
            out[f"floor_{key}"], out[f"floor_{key}_ci"] = f.mean, [f.lo, f.hi]
            out[f"excess_{key}"], out[f"excess_{key}_ci"] = x.mean, [x.lo, x.hi]
    return out


STEP_MATCHING = ("matched", "per_step", "none")


def match_steps(signal: Sequence[Sequence[Sequence[int]]], null: Sequence[Sequence[Sequence[int]]]
                ) -> tuple[list[list[list[int]]], list[list[list[int]]]]:
    """Each example's signal and null sets cut to the shorter's step count (module docstring, "Steps")."""
    if len(signal) != len(null):
        raise ValueError(f"signal and null need the same examples: {len(signal)} vs {len(null)}")
    cut = [min(len(a), len(b)) for a, b in zip(signal, null)]
    return ([list(a[:c]) for a, c in zip(signal, cut)], [list(b[:c]) for b, c in zip(null, cut)])


def paired_scores(signal: Sequence[Sequence[Sequence[int]]], null: Sequence[Sequence[Sequence[int]]],
                  evidence: Sequence[Evidence], vocab: Vocabulary, ks: Sequence[int], *,
                  prior: Sequence[Sequence[Sequence[int]]] | None, step_matching: str = "matched",
                  metrics: Sequence[str] = METRICS) -> tuple[Curves, Curves]:
    """The informed attacker's curves on a signal and on the null it is read against, with their steps paired
    by `step_matching` (module docstring, "Steps")."""
    if step_matching not in STEP_MATCHING:
        raise ValueError(f"step_matching must be one of {STEP_MATCHING}, got {step_matching!r}")
    if step_matching == "matched":
        signal, null = match_steps(signal, null)
    a = score_sets(signal, evidence, vocab, ks, prior=prior, metrics=metrics)
    b = score_sets(null, evidence, vocab, ks, prior=prior, metrics=metrics)
    if step_matching == "per_step":
        for row, s, t in zip(a.rows, signal, null):
            scale = len(t) / len(s) if len(s) else 0.0
            for curve in row.values():
                for kk in curve:
                    curve[kk] *= scale
    return a, b


def null_excess(run: Curves, null: Curves, k: int) -> Estimate:
    """The verdict's statistic: per example Token-ER@k of the signal minus that of the null signal, mean with
    its paired Student-t 95% interval (module docstring)."""
    # Student t, not the bootstrap: the calibration (attacks/calibration.py) sizes this verdict by it.
    return paired_difference_t_ci(run.values("token_er", k), null.values("token_er", k))


def verdict(run: Curves, null: Curves, positive: tuple[Curves, Curves] | None, negative: tuple[Curves, Curves],
            k: int, margin_pp: float, positive_margin_pp: float, per_item_bound_pp: float = 100.0
            ) -> dict[str, Any]:
    """The three-way verdict on the signal's excess Token-ER@k over its null signal (module docstring) and the
    controls' numbers. `positive`: (undefended, undefended without x_priv), None when the run is itself the
    undefended collaboration (its own positive control); `negative`: (a second null signal, the null).
    at_chance reads the interval the sample earned with per-example bound `per_item_bound_pp`
    (`null_excess_token_er_earned_ci`), a leak the t interval."""
    exc = null_excess(run, null, k)
    pos = exc if positive is None else null_excess(*positive, k)
    pos_ok = pos.lo >= positive_margin_pp
    neg = null_excess(*negative, k)
    neg_ok = neg.lo <= margin_pp
    diffs = [a - b for a, b in zip(run.values("token_er", k), null.values("token_er", k))]
    earned = earned_interval(diffs, exc.lo, exc.hi, per_item_bound_pp)
    v = controls.classify(exc.lo, exc.hi, 0.0, margin_pp, positive_passed=pos_ok, negative_passed=neg_ok,
                          certify=earned)
    return {"verdict": v, "verdict_k": k, "verdict_statistic": "null_excess_token_er",
            "gate_margin_pp": margin_pp, "positive_margin_pp": positive_margin_pp,
            "per_item_bound_pp": per_item_bound_pp,
            "null_excess_token_er": exc.mean, "null_excess_token_er_ci": [exc.lo, exc.hi],
            "null_excess_token_er_earned_ci": list(earned),
            "zero_spread": bool(exc.hi <= exc.lo),
            "positive_control_excess_token_er": pos.mean, "positive_control_excess_token_er_ci": [pos.lo, pos.hi],
            "positive_control_pass": bool(pos_ok),
            "negative_control_excess_token_er": neg.mean,
            "negative_control_excess_token_er_ci": [neg.lo, neg.hi],
            "negative_control_pass": bool(neg_ok)}

