"""The sanitisers' verdict under calibration (issue 31; the driver, `calibrate`, is attacks/calibration.py): its
`entry` factory, named by `calibration` on its entry of harness/systems.py, and the schema (`Config`) and range
checks (`check`) of its part of the `calibration` section, calibration.sanitize.

Torch-free and light at import (harness/calibration_config.py imports it to type the section): the driver, torch
and the system's attackers are imported where a trial needs them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.calibration_config import CalibrationTextConfig, check_text

if TYPE_CHECKING:
    from attacks.calibration import Entry

Config = CalibrationTextConfig   # the text entries share one schema
MARGINS = ("sanitize",)   # runners/calibration.py: its reads, in the runner's hash, sit under system_margins


def check(c: Any, cfg: Any) -> None:
    check_text("sanitize", c)


def sanitize_entry(rows: list[list[int]], stream: Sequence[int], margin_pp: float, doses_pp: Sequence[float],
                   gate_dose_pp: float, planning: dict[str, float] | None = None,
                   per_item_bound_pp: float = 100.0) -> Entry:
    """Paper 001: the sanitisers' verdict (attacks/sanitize/scoring.score_attacker, the identity attacker that
    reads the sanitised tokens as its guess; at_chance on the earned interval at `per_item_bound_pp`). Null:
    every prompt sanitised independently of the truth (a fresh row of the corpus's token frequencies, `stream`,
    per prompt and trial); dose d: that row carrying d pp of the truth's token F1 (`attacks.calibration.dose_row`)."""
    import torch

    from attacks.calibration import Entry, Trial, dose_row, unigram_rows
    from attacks.sanitize import scoring

    length = len(rows[0])

    def identity(observed):
        return [torch.tensor(o, dtype=torch.long).view(-1, 1) for o in observed]

    def trial(observed: list[list[int]]) -> Trial:
        s, _ = scoring.score_attacker("identity", identity, rows, observed, 1, margin_pp, True,
                                      per_item_bound_pp=per_item_bound_pp)
        return Trial(s.verdict, s.f1.mean - s.reference, interval=(s.f1.lo - s.reference, s.f1.hi - s.reference),
                     certified_by=(s.earned[0] - s.reference, s.earned[1] - s.reference))

    def null(rng):
        return trial(unigram_rows(stream, len(rows), length, rng))

    def dosed(dose, rng):
        return trial([dose_row(t, o, dose, rng) for t, o in zip(rows, unigram_rows(stream, len(rows), length, rng))])

    return Entry("sanitize", "prompts sanitised independently of the truth (each prompt's tokens replaced by a "
                 "fresh row drawn from the corpus's token frequencies)",
                 "a verdict that calls the sanitiser's output a leak from the text's shared vocabulary alone",
                 "pp of token F1 the sanitised prompt carries from its truth (a perfect reader's gain)", null, dosed,
                 doses_pp, gate_dose_pp, margin_pp, len(rows), f"prompts of {length} tokens", "t", planning,
                 per_item_bound_pp=per_item_bound_pp)


def entry(cfg: Any, model: Any) -> Entry:
    from attacks.calibration import planning_of, published_of, truth_rows

    c = cfg.calibration.sanitize
    rows, stream = truth_rows(cfg, model, "sanitize")
    entry = sanitize_entry(rows, stream, float(cfg.sanitize.attack.gate_margin_pp), list(c.doses_pp),
                           float(c.gate_dose_pp), planning_of(c),
                           per_item_bound_pp=float(cfg.sanitize.attack.per_item_bound_pp))
    entry.published = published_of(c)
    return entry
