"""The gradient audit's frequent-token probe's verdict under calibration (issue 31; the driver, `calibrate`, is
attacks/calibration.py): its `entry` factory, named by `calibration` on its entry of harness/systems.py, and the
schema (`Config`) and range checks (`check`) of its part of the `calibration` section, calibration.grad_audit.

Torch-free and light at import (harness/calibration_config.py imports it to type the section): the driver, torch
and the system's attackers are imported where a trial needs them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional

import numpy as np
from omegaconf import MISSING

from harness.calibration_config import CalibrationMeanPlanning
from harness.checks import check_at_least
from harness.errors import UserError

if TYPE_CHECKING:
    from attacks.calibration import Entry

MARGINS = ("grad_audit",)   # runners/calibration.py: its reads, in the runner's hash, sit under system_margins


@dataclass
class CalibrationGradAuditConfig:
    rows: int = MISSING            # probe rows per split (train, test)
    code_strength: float = MISSING # the dose's token code, in feature spreads
    top_k: int = MISSING
    l2: float = MISSING
    max_iter: int = MISSING
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING
    planning: CalibrationMeanPlanning = MISSING
    published_n: Optional[int] = MISSING
    published: Optional[str] = MISSING


Config = CalibrationGradAuditConfig


def check(c: Any, cfg: Any) -> None:
    check_at_least("calibration.grad_audit.rows", c.rows, 10)
    check_at_least("calibration.grad_audit.top_k", c.top_k, 1)
    check_at_least("calibration.grad_audit.max_iter", c.max_iter, 1)
    if not (math.isfinite(float(c.code_strength)) and float(c.code_strength) > 0):
        raise UserError(f"calibration.grad_audit.code_strength must be a number > 0, got {c.code_strength}")


def grad_audit_entry(rows: int, margin_pp: float, doses_pp: Sequence[float], gate_dose_pp: float, *,
                     top_k: int, l2: float, max_iter: int, code_strength: float,
                     planning: dict[str, float] | None = None) -> Entry:
    """Paper 004: the frequent-token probe's verdict (attacks/controls.classify of one cell's effect interval
    against the gate's moved reference, min(0, the shuffled-label probe's effect)). Features: 8 Gaussian
    features carrying a fixed code of each row's token (5 tokens, 30/20/20/15/15 %), the probe's unit test's
    data. Null: shuffled labels (the feature rows permuted against the labels, `probe.floor_arm`); dose d:
    `probe.dosed_control`, a code worth d pp to a perfect reader injected into the floor arm."""
    import torch

    from attacks import controls
    from attacks.calibration import Entry, Trial
    from attacks.grad_audit import probe

    def features(n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.as_tensor(rng.choice(5, size=n, p=[0.3, 0.2, 0.2, 0.15, 0.15]) + 100)
        codes = torch.as_tensor(np.random.default_rng(99).standard_normal((5, 8)))
        x = torch.as_tensor(rng.standard_normal((n, 8))) + 3.0 * codes[y - 100]
        return x, y

    kw = dict(top_k=top_k, l2=l2, max_iter=max_iter, max_rows=rows)

    def read(train, test, cell, seed: int) -> Trial:
        neg = probe.run_probe(train, test, shuffle_labels=True, seed=seed, **kw)
        reference = min(0.0, neg.effect_pp)
        lo, hi = cell.ci_pp
        v = controls.classify(lo, hi, reference, margin_pp, positive_passed=True,
                              negative_passed=neg.ci_pp[1] <= margin_pp, certify=cell.earned_ci_pp)
        e_lo, e_hi = cell.earned_ci_pp
        return Trial(v, cell.effect_pp - reference, interval=(lo - reference, hi - reference),
                     certified_by=(e_lo - reference, e_hi - reference))

    def null(rng):
        seed = int(rng.integers(1 << 30))
        train, test = probe.floor_arm(features(rows, rng), seed + 3), probe.floor_arm(features(rows, rng), seed + 4)
        return read(train, test, probe.run_probe(train, test, seed=seed, **kw), seed)

    def dosed(dose, rng):
        seed = int(rng.integers(1 << 30))
        train, test = features(rows, rng), features(rows, rng)
        cell, _ = probe.dosed_control(train, test, dose_pp=dose, seed=seed, strength=code_strength, **kw)
        floor = probe.floor_arm(train, seed + 3), probe.floor_arm(test, seed + 4)
        return read(*floor, cell, seed)

    return Entry("grad_audit", "shuffled labels (the probe's feature rows permuted against their tokens)",
                 "a probe verdict that reads the probe's own bias or the token frequencies as a leak",
                 "pp a perfect reader of an injected token code gains over the constant guess",
                 null, dosed, doses_pp, gate_dose_pp, margin_pp, rows, "probe rows (test split)", "z", planning,
                 per_item_bound_pp=100.0)    # the B of CellScore.earned_ci_pp, which the verdict reads


def entry(cfg: Any, model: Any) -> Entry:
    from attacks.calibration import planning_of, published_of

    c = cfg.calibration.grad_audit
    entry = grad_audit_entry(int(c.rows), float(cfg.grad_audit.gates.probe_margin_pp), list(c.doses_pp),
                             float(c.gate_dose_pp), top_k=int(c.top_k), l2=float(c.l2), max_iter=int(c.max_iter),
                             code_strength=float(c.code_strength), planning=planning_of(c))
    entry.published = published_of(c)
    return entry
