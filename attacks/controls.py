"""Scoring reconstructions, the chance floor, the positive and negative controls, and the gate.

An attack measurement means something only if it can fail and can succeed:
- chance floor: the token F1 an *unrelated* real prompt scores against each evaluation prompt (mean over
  all pairs of distinct evaluation prompts, metrics.privacy.chance_floor; the paper: about 21-22% on
  Dolly). Shared function words and punctuation put it well above 0.
- positive control: the same attack pipeline (component, decoder, training recipe) trained and evaluated
  without masks (T3) must reconstruct far above the floor: the lower 95% bound of its token F1 at least
  `positive_margin_pp` above the floor. Otherwise the attack is broken and a low score under noise says
  nothing: the run is reported `invalid`, never as private.
- negative control: the pipeline trained on shuffled (exposure, prompt) pairs must not rise above the
  floor (upper 95% bound ≤ floor + gate margin); if it does, something other than the exposures carries
  the prompt (a leak in the pipeline) and the run is `invalid` as well.
- gate: `attack_gate` passes when the upper 95% bound of the attack's token F1 is at most floor +
  `gate_margin_pp` (default 1.0 percentage point, fixed before the run) and both controls passed.

Token precision / recall / F1 here are multiset (a token counts as often as it occurs) and macro-averaged
over prompts (per-prompt scores averaged, Student-t interval), the same definitions as the chance floor;
the text metrics (exact match, BLEU, ROUGE-L, semantic similarity) are metrics.text's, with the decoded
prompt as reference and the decoded reconstruction as hypothesis.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from metrics.intervals import Estimate
from metrics.privacy import chance_floor, corpus_token_prf, token_prf

PRF_MODE, PRF_AVERAGE = "multiset", "macro"
_DROP = ("mean_first_divergence", "n_diverging", "token_match_rate", "token_match_rate_ci_lo", "token_match_rate_ci_hi")


def floor(prompts: Sequence[Sequence[int]]) -> float:
    """Chance floor (token F1, %) over all pairs of distinct evaluation prompts."""
    return chance_floor(prompts, mode=PRF_MODE)


@dataclass
class Scores:
    """Corpus metrics (flat results.json keys) and one row per prompt."""

    metrics: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def f1(self) -> Estimate:
        m = self.metrics
        return Estimate(m["token_f1"], m["token_f1_ci_lo"], m["token_f1_ci_hi"], len(self.rows))


def score(prompts: Sequence[Sequence[int]], reconstructions: Sequence[Sequence[int]], decode,
          semantic_model: Any = None, text_metrics: bool = True) -> Scores:
    """Token P/R/F1 (+ 95% intervals) of each reconstruction against its prompt, and with `text_metrics`
    exact match, corpus BLEU, ROUGE-L and semantic similarity of the decoded texts (metrics.text)."""
    from metrics.text import compare_generations

    prf = corpus_token_prf(prompts, reconstructions, mode=PRF_MODE, average=PRF_AVERAGE)
    metrics: dict[str, Any] = dict(prf.summary())
    rows = []
    for ref, hyp in zip(prompts, reconstructions):
        p, r, f = token_prf(ref, hyp, mode=PRF_MODE)
        rows.append({"token_precision": p, "token_recall": r, "token_f1": f})
    if text_metrics:
        refs = [decode(list(p)) for p in prompts]
        hyps = [decode(list(h)) for h in reconstructions]
        fid = compare_generations(refs, hyps, [list(p) for p in prompts], [list(h) for h in reconstructions],
                                  semantic_model=semantic_model)
        metrics.update({k: v for k, v in fid.summary().items() if k not in _DROP})
        for row, extra, h in zip(rows, fid.rows, hyps):
            row.update({k: v for k, v in extra.items() if k in ("exact_match", "bleu", "rouge_l", "semantic_similarity")})
            row["output_text"] = h
    return Scores(metrics, rows)


@dataclass(frozen=True)
class ControlResult:
    """One control: its token F1 with interval, and whether it passed."""

    f1: Estimate
    passed: bool


def positive_control(f1: Estimate, floor_f1: float, margin_pp: float) -> ControlResult:
    """Passed when the lower 95% bound of the unmasked (T3) reconstruction's token F1 ≥ floor + margin."""
    return ControlResult(f1, f1.lo >= floor_f1 + margin_pp)


def negative_control(f1: Estimate, floor_f1: float, margin_pp: float) -> ControlResult:
    """Passed when the shuffled-pairs attacker's upper 95% bound ≤ floor + margin (at or below the floor)."""
    return ControlResult(f1, f1.hi <= floor_f1 + margin_pp)


def gate(f1: Estimate, floor_f1: float, margin_pp: float) -> bool:
    """The attack is at chance: upper 95% bound of its token F1 ≤ floor + margin."""
    return f1.hi <= floor_f1 + margin_pp


def verdict(f1: Estimate, floor_f1: float, margin_pp: float, positive: ControlResult | None,
            negative: ControlResult | None) -> dict[str, Any]:
    """`attack_gate` (bool), `attack_verdict` ("pass" | "fail" | "invalid") and `attack_valid`.

    A run whose positive or negative control failed (or was not run) is `invalid` and its gate is False:
    a measurement that could not have succeeded, or that leaks without exposures, certifies nothing.
    """
    valid = positive is not None and positive.passed and negative is not None and negative.passed
    at_floor = gate(f1, floor_f1, margin_pp)
    return {"attack_gate": bool(valid and at_floor), "attack_valid": bool(valid),
            "attack_verdict": "invalid" if not valid else ("pass" if at_floor else "fail"),
            "attack_at_floor": bool(at_floor)}
