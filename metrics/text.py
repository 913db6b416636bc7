"""Fidelity of a generation to a baseline generation, per prompt and over the workload.

The reference is what the unprotected baseline (e.g. the CPU/GPU configuration) generated for a
prompt, the hypothesis what the configuration under test generated for the same prompt with the same
generation settings. Every number is a percentage on a 0–100 scale.

- Token level, on the *generated* token ids only (prompt ids excluded): `exact_match`,
  `token_match_rate`, `first_divergence`.
- Text level, on the decoded generations: sentence BLEU (sacrebleu, effective order), corpus BLEU
  (sacrebleu defaults, the same computation as `sacrebleu.corpus_bleu`, signature logged), ROUGE-L F
  (rouge-score with the Porter stemmer) and, when a model is given, semantic similarity
  (metrics/semantic.py).

Intervals: exact match and token match rate are rates (metrics/proportions.py: Wilson over prompts when
every prompt sits at 0 or 100 %), the other per-prompt metrics a percentile bootstrap of their mean over
prompts, corpus BLEU a bootstrap over prompts (see metrics/intervals.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from metrics.intervals import Estimate, bootstrap_ci, mean_ci
from metrics.proportions import proportion_ci

# ---------------------------------------------------------------------------------------------------
# Token level
# ---------------------------------------------------------------------------------------------------


def exact_match(ref_ids: Sequence[int], hyp_ids: Sequence[int]) -> float:
    """100.0 if the two generated id sequences are identical (same length, same ids), else 0.0."""
    return 100.0 if list(ref_ids) == list(hyp_ids) else 0.0


def token_match_rate(ref_ids: Sequence[int], hyp_ids: Sequence[int]) -> float:
    """Position-wise agreement of two generated id sequences, in %.

    Let L = max(len(ref_ids), len(hyp_ids)). The rate is 100 · |{i < L : i < len(ref_ids),
    i < len(hyp_ids), ref_ids[i] == hyp_ids[i]}| / L: positions are compared index by index with no
    alignment, and a position that only the longer sequence has counts as a mismatch. So ref [1,2,3,4]
    vs hyp [1,2,9] scores 2/4 = 50, and a hypothesis that is a strict prefix of the reference is
    penalised by the missing tokens. One early divergence in greedy decoding usually shifts everything
    after it, so this rate drops sharply after `first_divergence`. Two empty sequences score 100.
    """
    ref, hyp = list(ref_ids), list(hyp_ids)
    length = max(len(ref), len(hyp))
    if length == 0:
        return 100.0
    same = sum(1 for r, h in zip(ref, hyp) if r == h)
    return 100.0 * same / length


def first_divergence(ref_ids: Sequence[int], hyp_ids: Sequence[int]) -> int | None:
    """Index of the first generated position where the sequences differ, None if identical.

    If one sequence is a strict prefix of the other, the answer is the length of the shorter one (the
    first position only one of them has).
    """
    ref, hyp = list(ref_ids), list(hyp_ids)
    for i, (r, h) in enumerate(zip(ref, hyp)):
        if r != h:
            return i
    return None if len(ref) == len(hyp) else min(len(ref), len(hyp))


# ---------------------------------------------------------------------------------------------------
# Text level
# ---------------------------------------------------------------------------------------------------


@functools.cache
def _sentence_bleu_metric() -> BLEU:
    # Effective order: without it any sentence shorter than 4 tokens, or with no 4-gram match, scores
    # 0 regardless of its content (sacrebleu's own recommendation for sentence-level BLEU).
    return BLEU(effective_order=True)


@functools.cache
def _corpus_bleu_metric() -> BLEU:
    # The defaults of sacrebleu.corpus_bleu (13a tokenizer, exp smoothing, mixed case, no effective
    # order); the object form is used because only it exposes the signature.
    return BLEU()


@functools.cache
def _rouge() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def sentence_bleu(ref: str, hyp: str) -> float:
    """sacrebleu sentence BLEU (13a tokenizer, exp smoothing, effective order) of `hyp` against `ref`.

    Identical strings score 100 by definition: sacrebleu returns 0 when there are no tokens at all
    (e.g. both generations empty), which would count a perfectly reproduced empty answer as a total
    failure. Values are capped at 100 (sacrebleu can return 100.00000000000004 from rounding).
    """
    if ref == hyp:
        return 100.0
    return min(100.0, _sentence_bleu_metric().sentence_score(hyp, [ref]).score)


def rouge_l(ref: str, hyp: str) -> float:
    """ROUGE-L F-measure × 100 (rouge-score, `use_stemmer=True`) of `hyp` against `ref`.

    rouge-score's default tokenizer lowercases and keeps only ASCII letters and digits, so text in
    other scripts has no tokens and scores 0 against anything; identical strings are therefore scored
    100 by definition here, and ROUGE-L is only meaningful for Latin-script output.
    """
    if ref == hyp:
        return 100.0
    return 100.0 * _rouge().score(ref, hyp)["rougeL"].fmeasure


@dataclass(frozen=True)
class CorpusBleu:
    """Corpus BLEU with its bootstrap interval over prompts and the sacrebleu signature."""

    estimate: Estimate
    signature: str


def corpus_bleu(refs: Sequence[str], hyps: Sequence[str], n_boot: int = 2000, seed: int = 0) -> CorpusBleu:
    """Corpus BLEU (sacrebleu defaults, one reference per prompt) with a bootstrap interval.

    The point estimate is sacrebleu's own `corpus_score`. For the interval the prompts are resampled
    with replacement and BLEU is recomputed from the summed per-prompt sufficient statistics (n-gram
    matches and totals, hypothesis and reference lengths) with sacrebleu's `BLEU.compute_bleu`, which
    is how sacrebleu's own paired bootstrap works; no text is re-tokenised per replicate.
    """
    _check_lengths(refs=refs, hyps=hyps)
    metric = _corpus_bleu_metric()
    score = metric.corpus_score(list(hyps), [list(refs)])
    signature = str(metric.get_signature())
    # Per-prompt statistics come from the sentence metric: same tokenizer and casing as the corpus
    # metric, and effective order does not change the counts (test_metrics checks the sums agree).
    sentence = _sentence_bleu_metric()
    rows = []
    for ref, hyp in zip(refs, hyps):
        s = sentence.sentence_score(hyp, [ref])
        rows.append([s.sys_len, s.ref_len, *s.counts, *s.totals])
    stats = np.asarray(rows, dtype=np.int64)
    point = min(100.0, score.score)
    # BLEU's range: with every prompt's n-grams matching, the bootstrap is [100, 100] (issue 51). A share π
    # of prompts (of equal length) whose n-grams all missed would scale every precision by 1 − π, so BLEU by 1 − π:
    # intervals.earned_range's lower end.
    interval = bootstrap_ci(stats, _bleu_from_stats, n_boot=n_boot, seed=seed, metric_range=(0.0, 100.0))
    return CorpusBleu(Estimate(point, interval.lo, interval.hi, interval.n), signature)


def _bleu_from_stats(rows: np.ndarray) -> float:
    """Corpus BLEU, with the corpus metric's settings, from per-prompt rows
    [sys_len, ref_len, matches_1..k, totals_1..k]."""
    metric = _corpus_bleu_metric()
    k = metric.max_ngram_order
    total = [int(x) for x in rows.sum(axis=0)]
    score = BLEU.compute_bleu(
        correct=total[2 : 2 + k],
        total=total[2 + k : 2 + 2 * k],
        sys_len=total[0],
        ref_len=total[1],
        smooth_method=metric.smooth_method,
        smooth_value=metric.smooth_value,
        effective_order=metric.effective_order,
        max_ngram_order=k,
    )
    return min(100.0, score.score)


# ---------------------------------------------------------------------------------------------------
# Whole workload
# ---------------------------------------------------------------------------------------------------

_MEAN_METRICS = ("exact_match", "token_match_rate", "bleu_sentence_mean", "rouge_l", "semantic_similarity")
_RATES = ("exact_match", "token_match_rate")   # per-prompt proportions: proportion_ci
# each mean metric's range (pp): mean_ci widens its interval to what the prompts earned there (issue 51);
# the similarity is a cosine × 100
_RANGES = {"bleu_sentence_mean": (0.0, 100.0), "rouge_l": (0.0, 100.0), "semantic_similarity": (-100.0, 100.0)}


@dataclass
class FidelityScores:
    """Per-prompt fidelity rows plus corpus BLEU; `summary()` gives the flat results.json metrics.

    Each row holds exact_match, token_match_rate, bleu (sentence BLEU), rouge_l, first_divergence and,
    when a semantic model was given, semantic_similarity.
    """

    rows: list[dict[str, Any]]
    corpus_bleu: CorpusBleu
    has_semantic: bool = False

    def summary(self) -> dict[str, Any]:
        """Flat snake_case dict: each metric with `_ci_lo`/`_ci_hi`, plus bleu_signature, n_prompts,
        mean_first_divergence (over diverging prompts only; None if none diverge) and n_diverging.

        Intervals are 95%. Exact match and token match rate get `proportion_ci` (Wilson at the edges), `bleu`
        is corpus BLEU (bootstrap interval), `bleu_sentence_mean` the mean sentence BLEU, and ROUGE-L and
        semantic similarity their means, each with `mean_ci`'s bootstrap interval over prompts (inside the
        metric's range by construction), widened to what the prompts earned in that range (never zero-width:
        intervals.earned_range, issue 51). Without a semantic model the
        semantic_similarity keys are present and None.
        """
        out: dict[str, Any] = {}
        for name in _MEAN_METRICS:
            column = "bleu" if name == "bleu_sentence_mean" else name
            if name == "semantic_similarity" and not self.has_semantic:
                out.update({name: None, f"{name}_ci_lo": None, f"{name}_ci_hi": None})
                continue
            values = [r[column] for r in self.rows]
            if name in _RATES:
                out.update(proportion_ci(values).flat(name))
                continue
            out.update(mean_ci(values, metric_range=_RANGES[name]).flat(name))
        out.update(self.corpus_bleu.estimate.flat("bleu"))
        out["bleu_signature"] = self.corpus_bleu.signature
        diverged = [r["first_divergence"] for r in self.rows if r["first_divergence"] is not None]
        out["mean_first_divergence"] = float(np.mean(diverged)) if diverged else None
        out["n_diverging"] = len(diverged)
        out["n_prompts"] = len(self.rows)
        return out


def compare_generations(
    refs: list[str],
    hyps: list[str],
    ref_ids: list[list[int]],
    hyp_ids: list[list[int]],
    semantic_model: Any = None,
) -> FidelityScores:
    """Score each hypothesis generation against the baseline generation of the same prompt.

    `refs`/`hyps` are the decoded generations, `ref_ids`/`hyp_ids` the generated token ids (without
    the prompt), all aligned by prompt. `semantic_model` is a sentence-transformers model from
    `metrics.semantic.load_semantic_model`, or None to skip semantic similarity.
    """
    _check_lengths(refs=refs, hyps=hyps, ref_ids=ref_ids, hyp_ids=hyp_ids)
    if not refs:
        raise ValueError("compare_generations needs at least one prompt")
    rows: list[dict[str, Any]] = []
    for ref, hyp, rid, hid in zip(refs, hyps, ref_ids, hyp_ids):
        rows.append(
            {
                "exact_match": exact_match(rid, hid),
                "token_match_rate": token_match_rate(rid, hid),
                "bleu": sentence_bleu(ref, hyp),
                "rouge_l": rouge_l(ref, hyp),
                "first_divergence": first_divergence(rid, hid),
            }
        )
    if semantic_model is not None:
        from metrics.semantic import semantic_similarity

        for row, sim in zip(rows, semantic_similarity(semantic_model, refs, hyps)):
            row["semantic_similarity"] = sim
    return FidelityScores(rows, corpus_bleu(refs, hyps), has_semantic=semantic_model is not None)


def _check_lengths(**seqs: Sequence[Any]) -> None:
    lengths = {name: len(s) for name, s in seqs.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"inputs must be aligned by prompt, got lengths {lengths}")
