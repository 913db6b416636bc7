"""Split fine-tuning's label attack's verdict under calibration (issue 31; the driver, `calibrate`, is
attacks/calibration.py): its `entry` factory, named by `calibration` on its entry of harness/systems.py, and the
schema (`Config`) and range checks (`check`) of its part of the `calibration` section, calibration.splitft.

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
MARGINS = ("splitft",)   # runners/calibration.py: its reads, in the runner's hash, sit under system_margins


def check(c: Any, cfg: Any) -> None:
    check_text("splitft", c)


def splitft_entry(rows: list[list[int]], stream: Sequence[int], margin_pp: float, positive_margin_pp: float,
                  doses_pp: Sequence[float], gate_dose_pp: float, planning: dict[str, float] | None = None,
                  per_item_bound_pp: float = 100.0) -> Entry:
    """Paper 002: the label attack's verdict (attacks/splitft/cell.assess, reference = the larger of the
    exposure-free reference and the constant most-frequent-label guess; at_chance on the earned interval at
    `per_item_bound_pp`). Null: shuffled labels (the guesses
    are a fresh row of the corpus's token frequencies per example and trial); dose d: guesses carrying d pp
    of the true labels' token F1 (`attacks.calibration.dose_row`)."""
    from attacks.calibration import Entry, Trial, dose_row, unigram_rows
    from attacks.labels import constant_guesses
    from attacks.splitft.cell import assess

    constant = constant_guesses(rows)
    length = len(rows[0])

    def trial(guesses: list[list[int]]) -> Trial:
        m = assess("label", rows, guesses, rows, rows, margin_pp, positive_margin_pp, prior_guesses=constant,
                   plain_prior_guesses=constant, per_item_bound_pp=per_item_bound_pp)
        ref = m["label_reference_token_f1"]
        return Trial(m["label_verdict"], m["label_token_f1"] - ref,
                     interval=(m["label_token_f1_ci_lo"] - ref, m["label_token_f1_ci_hi"] - ref),
                     certified_by=(m["label_token_f1_earned_ci_lo"] - ref, m["label_token_f1_earned_ci_hi"] - ref))

    def null(rng):
        return trial(unigram_rows(stream, len(rows), length, rng))

    def dosed(dose, rng):
        return trial([dose_row(t, o, dose, rng) for t, o in zip(rows, unigram_rows(stream, len(rows), length, rng))])

    return Entry("splitft", "shuffled labels (the label attack's guesses are labels drawn independently of the "
                 "truth, from the corpus's token frequencies)",
                 "a label verdict that reads the labels' common tokens as a leak",
                 "pp of token F1 the guesses carry from the true labels (a perfect reader's gain)", null, dosed,
                 doses_pp, gate_dose_pp, margin_pp, len(rows), f"label rows of {length} tokens", "t", planning,
                 per_item_bound_pp=per_item_bound_pp)


def entry(cfg: Any, model: Any) -> Entry:
    from attacks.calibration import planning_of, published_of, truth_rows

    c = cfg.calibration.splitft
    rows, stream = truth_rows(cfg, model, "splitft")
    entry = splitft_entry(rows, stream, float(cfg.splitft.attack.gate_margin_pp),
                          float(cfg.splitft.attack.positive_margin_pp), list(c.doses_pp), float(c.gate_dose_pp),
                          planning_of(c), per_item_bound_pp=float(cfg.splitft.attack.per_item_bound_pp))
    entry.published = published_of(c)
    return entry
