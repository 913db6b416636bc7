"""Scoring the attackers on sanitised tokens, their controls and the verdict (attacks/controls.py's rule).

Per attacker, over the text positions of each prompt (macro over prompts, 95% intervals: proportion_ci for the
rates, Student t for the token F1 the verdict reads):
- top1, top{k}: % of positions whose original token is the attacker's first guess / among its first k
  (for the neighbour attacker top{k} is the paper's Pr@k);
- token_f1: multiset token F1 of the sequence of first guesses against the prompt's text tokens, the
  metric the verdict and the cross-system chart use.
Controls and verdict (attacks/controls.py `classify`, margin m):
- reference: the F1 of each prompt's guesses against the *other* prompts (controls.exposure_free_f1):
  what the attacker's guessing scores without the right exposure;
- positive control (shared by the attackers of a run): the neighbour attacker on the unsanitised text
  (the identity mechanism) must reach reference + positive margin (lower bound), i.e. the scoring sees a
  channel that carries the prompt;
- negative control (per attacker): the attacker run on a deranged view (prompt i scored on the sanitised
  tokens of prompt i+1) must not score significantly above the reference: its lower bound ≤ reference + m.
  (Its guesses are the reference's own pairs, so an upper-bound rule, hi ≤ reference + m, would fail by
  sampling noise alone; what this control catches is an attacker that reads anything but the view.)
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attacks import controls
from metrics import roc
from metrics.intervals import Estimate, mean_t_ci
from metrics.privacy import token_prf
from metrics.proportions import proportion_ci

Attacker = Callable[[Sequence[Sequence[int]]], list[torch.Tensor]]


@dataclass
class AttackScore:
    name: str
    top1: Estimate
    topk: Estimate
    f1: Estimate
    reference: float
    negative: Estimate
    negative_passed: bool
    verdict: str
    rows: list[dict[str, float]]
    # Cost as data (issue 32 item 5): the attack's wall time on the view (its controls excluded), the positions
    # it read, and the candidate originals it scores per position (None where it searches no explicit set).
    seconds: float = 0.0
    positions: int = 0
    candidates: int | None = None
    roc: dict[str, Any] | None = None     # the per-prompt F1 as a membership-style test (`f1_test`)
    # the interval the prompts earned for the token F1 (controls.earned, issue 51): what at_chance read, with its B;
    # None where the verdict reads another statistic (the contextual attacker's prior gain: its own keys)
    earned: tuple[float, float] | None = None
    per_item_bound_pp: float | None = None

    def flat(self, k: int) -> dict[str, Any]:
        n = self.name
        return {**({} if self.roc is None else roc.flat(self.roc, f"{n}_")), **self.top1.flat(f"{n}_top1"), **self.topk.flat(f"{n}_top{k}"), **self.f1.flat(f"{n}_token_f1"),
                f"{n}_token_f1_chance": self.reference, **self.negative.flat(f"{n}_negative_control_token_f1"),
                f"{n}_negative_control_pass": self.negative_passed, f"{n}_verdict": self.verdict,
                f"{n}_seconds": self.seconds,
                f"{n}_seconds_per_position": self.seconds / self.positions if self.positions else None,
                f"{n}_candidates_per_position": self.candidates,
                **({} if self.earned is None else
                   controls.earned_flat(f"{n}_token_f1", self.earned, self.per_item_bound_pp))}


def timed(attacker: Attacker, observed: Sequence[Sequence[int]]) -> tuple[list[torch.Tensor], float, int]:
    """The attacker's guesses on the view, its wall time and the number of positions it read."""
    start = time.perf_counter()
    guesses = attacker(observed)
    return guesses, time.perf_counter() - start, sum(len(s) for s in observed)


def hit_rates(originals: Sequence[Sequence[int]], guesses: Sequence[torch.Tensor], k: int
              ) -> tuple[list[float], list[float]]:
    """Per prompt: % of positions whose original is guess 1, and % among the first k guesses."""
    top1, topk = [], []
    for orig, g in zip(originals, guesses):
        if len(orig) == 0:
            continue
        t = torch.tensor(list(orig), dtype=torch.long).unsqueeze(1)
        hits = g[:, :k] == t
        top1.append(100.0 * hits[:, 0].float().mean().item())
        topk.append(100.0 * hits.any(1).float().mean().item())
    return top1, topk


def f1_values(originals: Sequence[Sequence[int]], firsts: Sequence[Sequence[int]]) -> list[float]:
    return [token_prf(list(o), list(g), mode=controls.PRF_MODE)[2] for o, g in zip(originals, firsts)]


def f1_test(originals: Sequence[Sequence[int]], firsts: Sequence[Sequence[int]],
            shuffled: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The attacker's per-prompt token F1 as a membership-style test (metrics/roc.py): each prompt's F1 of the
    guesses from its own sanitised tokens (positives) against its F1 of the guesses from the next prompt's, the
    negative control's deranged view (negatives: guesses that carry nothing of this prompt)."""
    return roc.roc(f1_values(originals, firsts), f1_values(originals, shuffled),
                   positive="token F1 of a prompt's guesses from its own sanitised tokens",
                   negative="token F1 against the prompt of the guesses from the next prompt's (the deranged view)")


def first_guesses(guesses: Sequence[torch.Tensor]) -> list[list[int]]:
    return [g[:, 0].tolist() for g in guesses]


def derange(items: Sequence[Any]) -> list[Any]:
    """Item i+1 for item i (a cyclic shift: no item keeps its place when there are at least two)."""
    return [items[(i + 1) % len(items)] for i in range(len(items))]


def score_attacker(name: str, attacker: Attacker, originals: Sequence[Sequence[int]],
                   observed: Sequence[Sequence[int]], k: int, margin_pp: float, positive_passed: bool,
                   candidates: int | None = None, per_item_bound_pp: float = 100.0
                   ) -> tuple[AttackScore, list[torch.Tensor]]:
    """Run one attacker on the view and on its deranged copy, and classify it (at_chance on the interval the
    prompts earned at per-prompt bound `per_item_bound_pp`, sanitize.attack.per_item_bound_pp). `candidates`: the
    originals it scores per position, recorded with its wall time."""
    if len(originals) < 2:
        raise ValueError("the controls need at least two prompts")
    guesses, seconds, positions = timed(attacker, observed)
    top1, topk = hit_rates(originals, guesses, k)
    firsts = first_guesses(guesses)
    values = f1_values(originals, firsts)
    f1 = mean_t_ci(values, bounds=(0, 100))
    reference = controls.exposure_free_f1(originals, firsts)
    shuffled = first_guesses(attacker(derange(observed)))
    negative = mean_t_ci(f1_values(originals, shuffled), bounds=(0, 100))
    negative_passed = negative.lo <= reference + margin_pp
    earned = controls.earned(values, reference, f1.lo, f1.hi, per_item_bound_pp)
    verdict = controls.classify(f1.lo, f1.hi, reference, margin_pp, positive_passed=positive_passed,
                                negative_passed=negative_passed, certify=earned)
    rows = [{"top1": a, f"top{k}": b} for a, b in zip(top1, topk)]
    return AttackScore(name, proportion_ci(top1), proportion_ci(topk), f1, reference, negative,
                       negative_passed, verdict, rows, seconds, positions, candidates,
                       f1_test(originals, firsts, shuffled), earned=earned,
                       per_item_bound_pp=per_item_bound_pp), guesses


def positive_control(originals: Sequence[Sequence[int]], identity_guesses: Sequence[torch.Tensor],
                     margin_pp: float) -> tuple[Estimate, float, bool]:
    """The neighbour attacker on the unsanitised text: (its F1, its reference, passed)."""
    firsts = first_guesses(identity_guesses)
    f1 = mean_t_ci(f1_values(originals, firsts), bounds=(0, 100))
    reference = controls.exposure_free_f1(originals, firsts)
    return f1, reference, f1.lo >= reference + margin_pp
