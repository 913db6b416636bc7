"""Scoring the server's attacks on split FL, with the chance floor, controls and the verdict of
attacks/controls.py (paper 004 Table 6 style).

For each attacker (label inference, EIA, BiSR(f), the learned inverter) and each recorded example (a row
of a recorded step):
- token F1 (multiset, %) of its guess against the truth (the labels; the input tokens), macro over
  examples with a Student-t interval (the one the verdict's calibration assumes), and position-wise top-1
  accuracy (%);
- reference r: `exposure_free_f1`, what its guess for example j scores against example i ≠ j. For an
  untrained attacker a guess that ignores the exposure (a decoder that always says "the") scores
  exactly r: the verdict asks whether the exposure adds anything beyond it. The real-text chance floor
  (`controls.floor`, unrelated true texts against each other) is reported beside it;
- positive control: the same attacker on the undefended crossings of the same batches and weights
  (the plain s_A and s_B the evaluator kept): lower bound ≥ its own reference + positive margin;
- negative control: for the untrained attackers it holds by construction (nothing is trained on
  (exposure, truth) pairs, so nothing but the exposure links a guess to its example), as for the Bayes
  attacker of attacks/controls.py; the learned inverter's is run: the same inverter trained on shuffled
  pairs must score at most its own reference + margin;
- verdict: `controls.classify` of the F1 interval against r with margin m; the run's verdict is the worst
  over the attackers run (`controls.worst`).

A set attacker (`kind="set"`: the weights attacker, attacks/splitft/weights_label.py, guesses the distinct
label tokens of a whole step) is scored the same way on sorted lists of distinct tokens, where the multiset
F1 is the set F1; it has no positions, so no top-1, and reports token precision and recall beside F1.
Its `prior_guesses` are a second exposure-free guess per example (the most frequent public tokens, as many
as it guessed): their mean F1 is reported (`<name>_prior_token_f1`) and the reference is the larger of the
two, so the verdict asks for more than what the vocabulary's frequencies give (the exposure-free reference
alone is `<name>_exposure_free_token_f1` then).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attacks import controls
from attacks.labels import top1
from metrics.intervals import mean_ci, mean_t_ci
from metrics.privacy import repaired_test, token_prf
from metrics.proportions import proportion_ci


def _mean_f1(refs: list[list[int]], guesses: list[list[int]]) -> float:
    return sum(token_prf(r, g, mode=controls.PRF_MODE)[2] for r, g in zip(refs, guesses)) / len(refs)


def assess(name: str, refs: list[list[int]], guesses: list[list[int]], plain_refs: list[list[int]],
           plain_guesses: list[list[int]], margin_pp: float, positive_margin_pp: float,
           negative_guesses: list[list[int]] | None = None, kind: str = "sequence",
           prior_guesses: list[list[int]] | None = None,
           plain_prior_guesses: list[list[int]] | None = None, per_item_bound_pp: float = 100.0) -> dict[str, Any]:
    """The flat metrics of one attacker, prefixed `name`: token F1 and top-1 with intervals, reference,
    chance floor, controls and verdict. `negative_guesses`: a trained attacker's guesses for `refs` after
    training on shuffled pairs (its negative control: upper bound ≤ their own reference + margin); without
    them the control holds by construction (an untrained attacker). `kind="set"`: distinct-token guesses
    (module docstring), with `prior_guesses` / `plain_prior_guesses` for `guesses` / `plain_guesses`. The
    verdict's at_chance reads the interval the examples earned at per-example bound `per_item_bound_pp`
    (controls.earned, issue 51), written as `<name>_token_f1_earned_ci_lo/hi`."""
    if len(refs) < 2:
        raise ValueError(f"{name}: need at least 2 recorded examples, got {len(refs)}")
    if kind not in ("sequence", "set"):
        raise ValueError(f"{name}: kind must be 'sequence' or 'set', got {kind!r}")
    if kind == "set" and any(len(set(x)) != len(x) for x in [*refs, *guesses, *plain_refs, *plain_guesses]):
        raise ValueError(f"{name}: a set attacker's truths and guesses must hold distinct tokens")
    prf = [token_prf(r, g, mode=controls.PRF_MODE) for r, g in zip(refs, guesses)]
    values = [f for *_, f in prf]
    f1 = mean_t_ci(values, bounds=(0, 100))
    reference = controls.exposure_free_f1(refs, guesses)
    plain_f1 = mean_t_ci([token_prf(r, g, mode=controls.PRF_MODE)[2] for r, g in zip(plain_refs, plain_guesses)],
                       bounds=(0, 100))
    plain_reference = controls.exposure_free_f1(plain_refs, plain_guesses)
    extra: dict[str, Any] = {}
    if kind == "sequence":
        extra = proportion_ci([top1(r, g) for r, g in zip(refs, guesses)]).flat(f"{name}_top1")
    else:
        extra = {**mean_ci([p for p, _, _ in prf]).flat(f"{name}_token_precision"),
                 **mean_ci([r for _, r, _ in prf]).flat(f"{name}_token_recall"),
                 f"{name}_exposure_free_token_f1": reference}
    if prior_guesses is not None:
        prior = _mean_f1(refs, prior_guesses)
        reference = max(reference, prior)
        extra[f"{name}_prior_token_f1"] = prior
    if plain_prior_guesses is not None:
        plain_reference = max(plain_reference, _mean_f1(plain_refs, plain_prior_guesses))
    positive = controls.positive_control(plain_f1, plain_reference, positive_margin_pp)
    negative: dict[str, Any] = {}
    negative_passed = True
    if negative_guesses is not None:
        neg_f1 = mean_t_ci([token_prf(r, g, mode=controls.PRF_MODE)[2] for r, g in zip(refs, negative_guesses)],
                         bounds=(0, 100))
        neg_reference = controls.exposure_free_f1(refs, negative_guesses)
        negative_passed = controls.negative_control(neg_f1, neg_reference, margin_pp).passed
        negative = {**neg_f1.flat(f"{name}_negative_control_token_f1"),
                    f"{name}_negative_control_reference": neg_reference}
    earned = controls.earned(values, reference, f1.lo, f1.hi, per_item_bound_pp)
    verdict = controls.classify(f1.lo, f1.hi, reference, margin_pp, positive_passed=positive.passed,
                                negative_passed=negative_passed, certify=earned)
    return {**f1.flat(f"{name}_token_f1"), **controls.earned_flat(f"{name}_token_f1", earned, per_item_bound_pp),
            **extra,
            f"{name}_reference_token_f1": reference, f"{name}_chance_floor_token_f1": controls.floor(refs),
            **plain_f1.flat(f"{name}_positive_control_token_f1"),
            f"{name}_positive_control_reference": plain_reference,
            f"{name}_positive_control_pass": positive.passed, **negative,
            f"{name}_negative_control_pass": negative_passed,
            f"{name}_verdict": verdict, f"{name}_n_examples": len(refs)}


def tests(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each attacker's per-example token F1 as a membership-style test, every guess against its own example's truth
    and against the next example's (metrics.privacy.repaired_test), for every attacker with at least two
    examples in `rows` (attacks/splitft/suite.py's sample rows: attacker, guess_ids, truth_ids)."""
    by: dict[str, tuple[list, list]] = {}
    for row in rows:
        refs, guesses = by.setdefault(row["attacker"], ([], []))
        refs.append(row["truth_ids"])
        guesses.append(row["guess_ids"])
    return {name: repaired_test(refs, guesses, controls.PRF_MODE)
            for name, (refs, guesses) in by.items() if len(refs) >= 2}
