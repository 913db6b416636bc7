"""The schema of the `calibration` config section (issue 31: every system's verdict calibrated against
nulls, attacks/calibration.py): types only, every value in conf/calibration/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from omegaconf import MISSING, DictConfig

from harness import systems as systems_registry
from harness.checks import check_at_least
from harness.errors import UserError
from harness.workloads import read_text

# every system of the systems registry has a calibration entry (attacks/calibration.REGISTRY)
SYSTEMS = systems_registry.NAMES


@dataclass
class CalibrationMeanPlanning:
    """Per-unit spreads (pp) the sizing rule chose n with (metrics/equivalence.mean_plan)."""

    sd_null_pp: float = MISSING    # of the verdict's per-unit statistic on the null
    sd_dosed_pp: float = MISSING   # at the gate's dose
    gate_shift_pp: float = MISSING # the statistic's shift at the gate's dose (the dose, for an attacker that reads all of it)
    spread_null_pp: float = MISSING   # the estimate's own per-unit spread (≤ sd where the reference shares the units)
    spread_dosed_pp: float = MISSING


@dataclass
class CalibrationPairedPlanning:
    """A paired proportion's rates the sizing rule chose n with (metrics/equivalence.paired_plan)."""

    base: float = MISSING          # the reference's hit rate (SpliTEE: the prior alone)
    discordance: float = MISSING   # share of units where the two disagree on the null


@dataclass
class CalibrationCollabEngineConfig:
    """Collab's nulls built through the engine, at the n its committed reports use (issue 51 items 2, 4)."""

    n_examples: int = MISSING      # units (the built-in examples in turn): the n30 runs' 30
    max_new_tokens: int = MISSING  # tokens decoded (the n30 runs' 48)
    trials: int = MISSING          # trials per engine null, and at the gate's dose


@dataclass
class CalibrationCollabConfig:
    examples: int = MISSING        # built-in examples (the cloud's no-signal sets are computed once)
    units: int = MISSING           # the verdict's n: the examples in turn, each unit its own random signal
    steps: int = MISSING           # decoding steps of the signal
    k: int = MISSING               # the verdict's K (Token-ER@K)
    ids_per_step: int = MISSING    # the random-id null: uniform token ids a step
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING
    planning: CalibrationMeanPlanning = MISSING
    engine: CalibrationCollabEngineConfig = MISSING


@dataclass
class CalibrationTextConfig:
    examples: int = MISSING        # prompts (sanitize) or label rows (splitft) per trial
    tokens: int = MISSING          # tokens a row
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING
    planning: CalibrationMeanPlanning = MISSING
    published_n: Optional[int] = MISSING   # the n the system's committed runs use (null: not stated)
    published: Optional[str] = MISSING     # where that n comes from


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


@dataclass
class CalibrationSpliteeConfig:
    prompts: int = MISSING         # pool prompts, cut in order from real text
    tokens: int = MISSING          # tokens a prompt (positions 1..tokens-1 are attacked)
    pool_path: Optional[str] = MISSING   # a UTF-8 text file the pool is cut from; null = the built-in corpus
    positions: int = MISSING       # positions per trial, drawn from the pool
    epsilon: float = MISSING       # ep1's ε of the masks
    dose_epsilon: float = MISSING  # ε of a dosed position's own exposure
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING
    planning: CalibrationPairedPlanning = MISSING
    published_n: Optional[int] = MISSING
    published: Optional[str] = MISSING


@dataclass
class CalibrationConfig:
    systems: List[str] = MISSING
    trials: int = MISSING          # null trials per system
    dosed_trials: int = MISSING    # trials per dose
    seed: int = MISSING
    threads: int = MISSING         # torch threads (the probe's small fits are far slower with more)
    plan_target: float = MISSING   # the probability each system's n is sized for (certify and power at the gate dose)
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
    if not 0 < float(c.plan_target) < 1:
        raise UserError(f"calibration.plan_target must lie strictly between 0 and 1, got {c.plan_target}")
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
    check_at_least("calibration.collab.units", c.collab.units, 2)
    for name in ("collab", "sanitize", "splitft", "grad_audit"):
        for key in ("sd_null_pp", "sd_dosed_pp", "gate_shift_pp", "spread_null_pp", "spread_dosed_pp"):
            v = float(c[name].planning[key])
            if not (math.isfinite(v) and v >= 0):
                raise UserError(f"calibration.{name}.planning.{key} must be a number >= 0, got {v}")
    base, disc = float(c.splitee.planning.base), float(c.splitee.planning.discordance)
    if not (0 <= base <= 1 and 0 <= disc <= 2 * min(base, 1 - base)):
        raise UserError(f"calibration.splitee.planning needs base in [0, 1] and 0 <= discordance <= "
                        f"2·min(base, 1 − base), got base={base}, discordance={disc}")
    check_at_least("calibration.collab.steps", c.collab.steps, 1)
    check_at_least("calibration.collab.k", c.collab.k, 1)
    check_at_least("calibration.collab.ids_per_step", c.collab.ids_per_step, 1)
    check_at_least("calibration.collab.engine.n_examples", c.collab.engine.n_examples, 2)
    check_at_least("calibration.collab.engine.max_new_tokens", c.collab.engine.max_new_tokens, 1)
    check_at_least("calibration.collab.engine.trials", c.collab.engine.trials, 1)
    for name in ("sanitize", "splitft", "grad_audit", "splitee"):
        check_at_least(f"calibration.{name}.published_n", c[name].get("published_n"), 2, nullable=True)
    check_at_least("calibration.grad_audit.rows", c.grad_audit.rows, 10)
    check_at_least("calibration.grad_audit.top_k", c.grad_audit.top_k, 1)
    check_at_least("calibration.grad_audit.max_iter", c.grad_audit.max_iter, 1)
    if not (math.isfinite(float(c.grad_audit.code_strength)) and float(c.grad_audit.code_strength) > 0):
        raise UserError(f"calibration.grad_audit.code_strength must be a number > 0, got {c.grad_audit.code_strength}")
    check_at_least("calibration.splitee.prompts", c.splitee.prompts, 3)
    check_at_least("calibration.splitee.tokens", c.splitee.tokens, 2)
    check_at_least("calibration.splitee.positions", c.splitee.positions, 2)
    pool = int(c.splitee.prompts) * (int(c.splitee.tokens) - 1)
    if int(c.splitee.positions) > pool:
        raise UserError(f"calibration.splitee.positions={c.splitee.positions} exceeds the pool's {pool} positions "
                        "(prompts x (tokens - 1))")
    if c.splitee.get("pool_path") is not None and "splitee" in systems:
        read_text(Path(str(c.splitee.pool_path)), "calibration.splitee.pool_path")   # before anything is written
    for key in ("epsilon", "dose_epsilon"):
        if not (math.isfinite(float(c.splitee[key])) and float(c.splitee[key]) > 0):
            raise UserError(f"calibration.splitee.{key} must be a number > 0, got {c.splitee[key]}")
