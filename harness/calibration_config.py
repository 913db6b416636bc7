"""The schema of the `calibration` config section (issue 31: every system's verdict calibrated against
nulls, attacks/calibration.py): types only, every value in conf/calibration/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

from omegaconf import MISSING, DictConfig

from harness.checks import check_at_least
from harness.errors import UserError

SYSTEMS = ("collab", "sanitize", "splitft", "grad_audit", "splitee")   # attacks/calibration.REGISTRY's entries


@dataclass
class CalibrationCollabConfig:
    examples: int = MISSING        # built-in examples (the cloud's no-signal sets are computed once)
    steps: int = MISSING           # decoding steps of the signal
    k: int = MISSING               # the verdict's K (Token-ER@K)
    ids_per_step: int = MISSING    # the random-id null: uniform token ids a step
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING


@dataclass
class CalibrationTextConfig:
    examples: int = MISSING        # prompts (sanitize) or label rows (splitft) per trial
    tokens: int = MISSING          # tokens a row
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING


@dataclass
class CalibrationGradAuditConfig:
    rows: int = MISSING            # probe rows per split (train, test)
    top_k: int = MISSING
    l2: float = MISSING
    max_iter: int = MISSING
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING


@dataclass
class CalibrationSpliteeConfig:
    prompts: int = MISSING         # pool prompts of built-in text
    tokens: int = MISSING          # tokens a prompt (positions 1..tokens-1 are attacked)
    positions: int = MISSING       # positions per trial, drawn from the pool
    epsilon: float = MISSING       # ep1's ε of the masks
    dose_epsilon: float = MISSING  # ε of a dosed position's own exposure
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING


@dataclass
class CalibrationConfig:
    systems: List[str] = MISSING
    trials: int = MISSING          # null trials per system
    dosed_trials: int = MISSING    # trials per dose
    seed: int = MISSING
    threads: int = MISSING         # torch threads (the probe's small fits are far slower with more)
    collab: CalibrationCollabConfig = MISSING
    sanitize: CalibrationTextConfig = MISSING
    splitft: CalibrationTextConfig = MISSING
    grad_audit: CalibrationGradAuditConfig = MISSING
    splitee: CalibrationSpliteeConfig = MISSING


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range."""
    c = section
    systems = list(c.systems)
    if not systems or any(s not in SYSTEMS for s in systems) or len(set(systems)) != len(systems):
        raise UserError(f"calibration.systems must be distinct values from {', '.join(SYSTEMS)}, got {systems}")
    check_at_least("calibration.trials", c.trials, 1)
    check_at_least("calibration.dosed_trials", c.dosed_trials, 1)
    check_at_least("calibration.threads", c.threads, 1)
    for name in SYSTEMS:
        doses = [float(d) for d in c[name].doses_pp]
        if not doses or any(not (math.isfinite(d) and d > 0) for d in doses):
            raise UserError(f"calibration.{name}.doses_pp must be a non-empty list of numbers > 0, got {doses}")
        if float(c[name].gate_dose_pp) not in doses:
            raise UserError(f"calibration.{name}.gate_dose_pp must be one of its doses_pp {doses}, "
                            f"got {c[name].gate_dose_pp}")
    for name in ("sanitize", "splitft"):
        check_at_least(f"calibration.{name}.examples", c[name].examples, 2)
        check_at_least(f"calibration.{name}.tokens", c[name].tokens, 1)
    check_at_least("calibration.collab.examples", c.collab.examples, 2)
    check_at_least("calibration.collab.steps", c.collab.steps, 1)
    check_at_least("calibration.collab.k", c.collab.k, 1)
    check_at_least("calibration.collab.ids_per_step", c.collab.ids_per_step, 1)
    check_at_least("calibration.grad_audit.rows", c.grad_audit.rows, 10)
    check_at_least("calibration.grad_audit.top_k", c.grad_audit.top_k, 1)
    check_at_least("calibration.grad_audit.max_iter", c.grad_audit.max_iter, 1)
    check_at_least("calibration.splitee.prompts", c.splitee.prompts, 3)
    check_at_least("calibration.splitee.tokens", c.splitee.tokens, 2)
    check_at_least("calibration.splitee.positions", c.splitee.positions, 2)
    pool = int(c.splitee.prompts) * (int(c.splitee.tokens) - 1)
    if int(c.splitee.positions) > pool:
        raise UserError(f"calibration.splitee.positions={c.splitee.positions} exceeds the pool's {pool} positions "
                        "(prompts x (tokens - 1))")
    for key in ("epsilon", "dose_epsilon"):
        if not (math.isfinite(float(c.splitee[key])) and float(c.splitee[key]) > 0):
            raise UserError(f"calibration.splitee.{key} must be a number > 0, got {c.splitee[key]}")
