"""Scoring reconstructions, the chance floor, the positive and negative controls, and the verdict.

An attack measurement means something only if it can fail and can succeed:
- chance floor: the token F1 an *unrelated* real prompt scores against each evaluation prompt (mean over
  all pairs of distinct evaluation prompts, metrics.privacy.chance_floor; the paper: about 21-22% on
  Dolly). Shared function words and punctuation put it well above 0.
- positive control: the same attack pipeline (component, decoder, training recipe) trained and evaluated
  without masks (T3) must reconstruct far above the floor: the lower 95% bound of its token F1 at least
  `positive_margin_pp` above the floor. Otherwise the attack is broken and a low score under noise says
  nothing.
- negative control: the pipeline trained on shuffled (exposure, prompt) pairs must not rise above the
  floor (upper 95% bound ≤ floor + margin); if it does, something other than the exposures carries the
  prompt (a leak in the pipeline), and neither a high nor a low score is evidence about the exposures.
- verdict (`classify`), with m = `gate_margin_pp` (default 1.0 percentage point, fixed before the run), the
  attack's token F1 interval [lo, hi] and its reference r (the chance floor for the learned attacker):

      leak          lo > r + m and the negative control passed
      at_chance     r − m ≤ lo and hi ≤ r + m for the interval the sample earned (`earned`: never narrower
                    than ± B·CP_U(0, n), B the per-item bound each system's config states, metrics/equivalence.py),
                    and both controls passed
      inconclusive  everything else: lo < r − m (below chance: the attacker failed, which says nothing
                    about the masks), an interval reaching past r ± m so that neither holds, or a failed
                    (or missing) control.

  A leak needs no positive control: the reconstruction itself shows the attack works. It does need the
  negative one, since a pipeline that reconstructs without exposures would score high anyway. Badness
  orders the verdicts leak > inconclusive > at_chance; a configuration's verdict is the worst over the
  attackers run against it (`worst`). `attack_gate` (kept from the two-way gate) is true exactly when the
  verdict is at_chance.
- the Bayes attacker (attacks/splitee/bayes.py) gets the same rule on its token F1 (`bayes_verdict`), with its own
  reference: `exposure_free_f1`, the F1 its guess for prompt j scores against prompt i ≠ j (mean over
  ordered pairs). Its guesses are not text — under heavy noise they are tokens drawn across the whole
  vocabulary — so the real-prompt floor is not what it scores without information (it scores far below
  it), while a guess made from another prompt's exposures is. Its negative control holds by construction
  (nothing is trained: its guesses are a function of the exposure and the public codebook alone); its
  positive control is the same attacker on T3 exposures, lower bound ≥ its reference + positive margin.

Results from before the three-way verdict (`attack_verdict` pass | fail | invalid, no `bayes_verdict`)
are read by `recompute` (the same rule on the interval, floor, margin and control flags those results
hold too; pass | fail | invalid → at_chance | leak | inconclusive, `LEGACY`, where one is missing) and
`recompute_bayes`; the report shows what they give, so an old below-floor "pass" reads inconclusive.

Token precision / recall / F1 here are multiset (a token counts as often as it occurs) and macro-averaged
over prompts (per-prompt scores averaged; F1's interval Student t, as the verdict's calibration assumes,
P's and R's the bootstrap), the same definitions as the chance floor; the text metrics (exact match, BLEU,
ROUGE-L, semantic similarity) are metrics.text's, with the decoded prompt as reference and the decoded
reconstruction as hypothesis.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metrics.equivalence import earned_interval
from metrics.intervals import Estimate
from metrics.privacy import chance_floor, corpus_token_prf, pairwise_f1, token_prf

PRF_MODE, PRF_AVERAGE = "multiset", "macro"
_DROP = ("mean_first_divergence", "n_diverging", "token_match_rate", "token_match_rate_ci_lo", "token_match_rate_ci_hi")


def floor(prompts: Sequence[Sequence[int]]) -> float:
    """Chance floor (token F1, %) over all pairs of distinct evaluation prompts."""
    return _floor(_rows(prompts))


# The floors are cached by content (the last few inputs, every token in the key): a calibration scores the same
# truths against themselves in every one of its trials (attacks/calibration.py, splitft's positive-control arm).
def _rows(rows: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(map(int, row)) for row in rows)


@functools.lru_cache(maxsize=4)
def _floor(prompts: tuple[tuple[int, ...], ...]) -> float:
    return chance_floor(prompts, mode=PRF_MODE)


@functools.lru_cache(maxsize=4)
def _exposure_free_f1(prompts: tuple[tuple[int, ...], ...], guesses: tuple[tuple[int, ...], ...]) -> float:
    f1 = pairwise_f1(prompts, guesses, PRF_MODE)
    f1s = f1[~np.eye(len(prompts), dtype=bool)].tolist()
    return sum(f1s) / len(f1s)


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


LEAK, AT_CHANCE, INCONCLUSIVE = "leak", "at_chance", "inconclusive"
VERDICTS = (AT_CHANCE, INCONCLUSIVE, LEAK)          # from best to worst
LEGACY = {"pass": AT_CHANCE, "fail": LEAK, "invalid": INCONCLUSIVE}   # the two-way gate's attack_verdict


def gate(f1: Estimate, floor_f1: float, margin_pp: float) -> bool:
    """The upper 95% bound of the token F1 is at most floor + margin (`attack_at_floor`; one-sided, so it
    also holds far below the floor: not a verdict by itself)."""
    return f1.hi <= floor_f1 + margin_pp


def classify(lo: float, hi: float, reference: float, margin_pp: float, *, positive_passed: bool,
             negative_passed: bool, certify: tuple[float, float] | None = None) -> str:
    """The three-way verdict of a token-F1 interval [lo, hi] against `reference` (module docstring):
    leak if lo > reference + margin and the negative control passed; at_chance if the interval the sample
    earned, `certify` (`earned`, metrics.equivalence.earned_interval), lies within reference ± margin and
    both controls passed; otherwise inconclusive. Every runner and the calibration pass `certify` (issue 51;
    tests/test_earned_everywhere.py checks each call): a sample without spread earns its bound from its size
    only. Without it (results from before the rule, `recompute`) [lo, hi] is read, and a zero-width interval
    never certifies."""
    if lo > reference + margin_pp:
        return LEAK if negative_passed else INCONCLUSIVE
    c_lo, c_hi = (lo, hi) if certify is None else certify
    if (positive_passed and negative_passed and c_hi > c_lo
            and reference - margin_pp <= c_lo and c_hi <= reference + margin_pp):
        return AT_CHANCE
    return INCONCLUSIVE


def earned(values: Sequence[float], reference: float, lo: float, hi: float, per_item_bound_pp: float
           ) -> tuple[float, float]:
    """The interval a mean of per-item `values` (its data interval [lo, hi]) earned against `reference`, in the
    values' units: metrics.equivalence.earned_interval of the differences values − reference, shifted back. The
    one rule every at_chance reads (issue 51): `classify(..., certify=earned(...))`. For a reference computed
    from the same items (a chance floor, an exposure-free F1) the differences are taken against it as a
    constant, as the data interval does."""
    d = np.asarray(values, dtype=float) - reference
    e_lo, e_hi = earned_interval(d, lo - reference, hi - reference, per_item_bound_pp)
    return e_lo + reference, e_hi + reference


def earned_flat(prefix: str, interval: tuple[float, float], per_item_bound_pp: float) -> dict[str, float]:
    """The results.json keys of an earned interval beside the verdict that read it: `<prefix>_earned_ci_lo/hi`
    and `<prefix>_per_item_bound_pp`."""
    return {f"{prefix}_earned_ci_lo": interval[0], f"{prefix}_earned_ci_hi": interval[1],
            f"{prefix}_per_item_bound_pp": per_item_bound_pp}


def interval_case(lo: float, hi: float, reference: float, margin: float) -> str:
    """Why an interval [lo, hi] neither calls a leak (lo > reference + m) nor sits within reference ± m:
    "below" (wholly under reference − m: the attacker failed), "above" (it excludes the reference from above
    but not reference + m: a real excess the interval cannot place against the margin, which more samples
    or a smaller margin would settle) or "wide" (it straddles the reference and reaches past ± m)."""
    if hi < reference - margin:
        return "below"
    if lo > reference:
        return "above"
    return "wide"


def strength(score: float, floor: float | None) -> float:
    """What decides the strongest attacker wherever one is picked (a run's `tradeoff` block among its attackers,
    the cross-system chart among runs): its score's excess over its own no-signal floor, the score itself
    without a floor. Attackers differ in what nothing scores, so the highest score could crown one that read
    nothing."""
    return score if floor is None else score - floor


def worst(verdicts: Sequence[str | None]) -> str | None:
    """The worst verdict (leak > inconclusive > at_chance) of those given; None when none is."""
    known = [v for v in verdicts if v is not None]
    unknown = [v for v in known if v not in VERDICTS]
    if unknown:
        raise ValueError(f"unknown verdicts {unknown}; expected {VERDICTS}")
    return max(known, key=VERDICTS.index) if known else None


def verdict(f1: Estimate, floor_f1: float, margin_pp: float, positive: ControlResult | None,
            negative: ControlResult | None, certify: tuple[float, float] | None = None) -> dict[str, Any]:
    """The learned attacker's results.json keys: `attack_verdict` (leak | at_chance | inconclusive, by
    `classify` against the chance floor, its at_chance on `certify`, the interval the prompts earned),
    `attack_gate` (verdict is at_chance), `attack_valid` (both controls were run and passed) and
    `attack_at_floor` (`gate`). A control that was not run failed."""
    pos = positive is not None and positive.passed
    neg = negative is not None and negative.passed
    v = classify(f1.lo, f1.hi, floor_f1, margin_pp, positive_passed=pos, negative_passed=neg, certify=certify)
    return {"attack_verdict": v, "attack_gate": v == AT_CHANCE, "attack_valid": bool(pos and neg),
            "attack_at_floor": bool(gate(f1, floor_f1, margin_pp))}


def exposure_free_f1(prompts: Sequence[Sequence[int]], guesses: Sequence[Sequence[int]]) -> float:
    """Token F1 (%) of the guesses made for the *other* prompts: mean over ordered pairs i ≠ j of
    F1(prompt i, guess j). What an attacker's own guessing scores when it is given the wrong exposures,
    the Bayes attacker's reference (module docstring). For guesses equal to the prompts it is the chance
    floor."""
    if len(prompts) != len(guesses) or len(prompts) < 2:
        raise ValueError(f"need at least 2 prompts and one guess each, got {len(prompts)} and {len(guesses)}")
    return _exposure_free_f1(_rows(prompts), _rows(guesses))


def recompute(m: dict[str, Any]) -> str | None:
    """The learned attacker's verdict from a results.json `metrics` dict, old or new: a three-way
    `attack_verdict` as it is; an old two-way one (pass | fail | invalid) by `classify` on the interval,
    floor, margin and control flags the old results hold too, or through LEGACY where one is missing;
    None when there is none."""
    v = m.get("attack_verdict")
    if v is None or v in VERDICTS:
        return v
    need = ("token_f1_ci_lo", "token_f1_ci_hi", "chance_floor_token_f1", "gate_margin_pp")
    if all(isinstance(m.get(k), (int, float)) for k in need):
        return classify(float(m["token_f1_ci_lo"]), float(m["token_f1_ci_hi"]), float(m["chance_floor_token_f1"]),
                        float(m["gate_margin_pp"]), positive_passed=bool(m.get("positive_control_pass")),
                        negative_passed=bool(m.get("negative_control_pass")))
    return LEGACY.get(v, INCONCLUSIVE)


def recompute_bayes(m: dict[str, Any]) -> str | None:
    """The Bayes attacker's verdict from a results.json `metrics` dict: `bayes_verdict` where it is there;
    in results from before it, leak when the lower bound of top-1 exceeds the top-1 of truth-independent
    guesses (`bayes_top1_chance`) by more than the margin, else inconclusive (no Bayes positive control
    was recorded then, so at_chance cannot be shown); None without a Bayes attacker."""
    if "bayes_verdict" in m:
        v = m["bayes_verdict"]
        return v if v is None or v in VERDICTS else INCONCLUSIVE
    lo, chance, margin = m.get("bayes_top1_ci_lo"), m.get("bayes_top1_chance"), m.get("gate_margin_pp", 1.0)
    if not all(isinstance(x, (int, float)) for x in (lo, chance, margin)):
        return None
    return LEAK if lo > chance + margin else INCONCLUSIVE


def repeat_leak_k(m: dict[str, Any]) -> int | None:
    """The fewest repeated submissions k after which the Bayes attacker's averaged exposures leak: the
    smallest k of the stored curve (`bayes_top1_k{k}`) whose top-1 lower bound exceeds the top-1 of
    truth-independent guesses (`bayes_top1_chance`) by more than the margin; None when none does. This is
    another threat model (one prompt sent k times with fresh masks) and not part of `verdict`."""
    chance, margin = m.get("bayes_top1_chance"), m.get("gate_margin_pp", 1.0)
    if not isinstance(chance, (int, float)):
        return None
    prefix, suffix = "bayes_top1_k", "_ci_lo"
    ks = sorted(int(key[len(prefix):-len(suffix)]) for key in m
                if key.startswith(prefix) and key.endswith(suffix) and key[len(prefix):-len(suffix)].isdigit())
    return next((k for k in ks if m[f"bayes_top1_k{k}_ci_lo"] > chance + margin), None)


def sequential_verdict(lo_pp: float, hi_pp: float, margin_pp: float, *, teacher_forced: bool,
                       pruning_recall: Sequence[float] | None, min_recall: float, reference: str,
                       decisive_misses: int | None = None, certify: tuple[float, float] | None = None
                       ) -> tuple[str, str]:
    """The verdict of a sequential attacker (attacks/splitee/sequential.py) and why, from the 95% interval
    [lo, hi] (percentage points) of its paired top-1 difference against its `reference` on the same
    positions (MAP: the prior alone; likelihood: the same attacker on a null view), with m = margin_pp:

        leak          lo > m
        at_chance     −m ≤ lo and hi ≤ m, the attacker teacher-forced (an upper bound of its family, so
                      that its failure speaks for every prefix), and no pruning or every stage's pruning
                      recall ≥ min_recall (the truth was still among the candidates when the masks decided)
                      or, where `decisive_misses` is given (attack.sequential.pruning_rule=no_decisive_miss),
                      0 decisive misses in place of the recall condition
        inconclusive  everything else, with the reason: an interval past ±m, one above 0 but not +m
                      (a leak the interval cannot size), below the reference, a free-running attacker,
                      a pruning stage that lost the truth too often, a decisive miss.

    A decisive miss (sequential.pruning_decisive) is a missed position whose truth, scored with every used
    exposure, scores at least as high as the guess. With none, the unpruned attacker hits only where the
    pruned one does, position by position, so the pruned hits bound the unpruned ones from above: the side an
    at_chance claim needs (docs/sequential_attack.md, "Pruning at small ε").

    A leak needs neither teacher forcing nor full recall: what was recovered was recovered. The at_chance
    condition on the interval reads `certify` where given (the interval the table earned,
    metrics.proportions.newcombe_earned, issue 51), [lo, hi] otherwise; a zero-width one never certifies."""
    if lo_pp > margin_pp:
        return LEAK, f"paired difference against {reference} [{lo_pp:.2f}, {hi_pp:.2f}] pp lies above +{margin_pp:g} pp"
    reasons = []
    if certify is not None:      # the certification's interval, not the data's (issue 51)
        lo_pp, hi_pp = certify
    case = interval_case(lo_pp, hi_pp, 0.0, margin_pp)
    if case == "below":
        reasons.append(f"below {reference}: [{lo_pp:.2f}, {hi_pp:.2f}] pp (the attacker failed, which says "
                       "nothing about the masks)")
    elif case == "above":
        reasons.append(f"interval [{lo_pp:.2f}, {hi_pp:.2f}] pp against {reference} excludes 0 but not "
                       f"+{margin_pp:g} pp: a leak, of a size the interval cannot place against the margin")
    elif not (-margin_pp <= lo_pp and hi_pp <= margin_pp):
        reasons.append(f"interval [{lo_pp:.2f}, {hi_pp:.2f}] pp against {reference} is wider than ±{margin_pp:g} pp")
    elif hi_pp <= lo_pp:     # a zero-width interval (results from before newcombe_paired earned its bound)
        reasons.append(f"interval [{lo_pp:.2f}, {hi_pp:.2f}] pp against {reference} has zero width: no spread "
                       "to certify from")
    if not teacher_forced:
        reasons.append("free-running mode cannot certify at_chance (teacher-forced is the family's upper bound)")
    if decisive_misses is not None:
        if decisive_misses > 0:
            reasons.append(f"{decisive_misses} decisive miss{'' if decisive_misses == 1 else 'es'}: pruning may "
                           "have cost hits")
    else:
        low = [r for r in (pruning_recall or ()) if r < min_recall]
        if low:
            reasons.append(f"pruning recall {min(low):.3f} < {min_recall:g}")
    if reasons:
        return INCONCLUSIVE, "; ".join(reasons)
    why = f"paired difference against {reference} [{lo_pp:.2f}, {hi_pp:.2f}] pp lies within ±{margin_pp:g} pp"
    return AT_CHANCE, why if decisive_misses is None else f"{why}; 0 decisive misses (pruning cost no hit)"
