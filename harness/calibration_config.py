"""The schema of the `calibration` config section (issue 31: every system's verdict calibrated against
nulls, attacks/calibration.py): types only, every value in conf/calibration/default.yaml (the shared keys) and
conf/NAME/calibration.yaml (calibration.NAME).

The shared keys and the planning types are here; each system's part (calibration.NAME) is typed and checked by
the module of its calibration entry (attacks/NAME/calibration.py `Config`, `check`), the one its entry of
harness/systems.py names, so a new system takes part without an edit here.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, fields, make_dataclass
from types import ModuleType
from typing import Any, List, Optional, get_type_hints

from omegaconf import MISSING, DictConfig

from harness import systems as systems_registry
from harness.checks import check_at_least
from harness.errors import UserError

# system → its calibration entry, `module:function` (harness/systems.py), for every system that names one
CALIBRATIONS = {s.name: s.calibration for s in systems_registry.SYSTEMS if s.calibration is not None}
SYSTEMS = tuple(CALIBRATIONS)


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
class CalibrationTextConfig:
    examples: int = MISSING        # prompts (sanitize) or label rows (splitft) per trial
    tokens: int = MISSING          # tokens a row
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING
    planning: CalibrationMeanPlanning = MISSING
    published_n: Optional[int] = MISSING   # the n the system's committed runs use (null: not stated)
    published: Optional[str] = MISSING     # where that n comes from


def check_text(name: str, c: DictConfig) -> None:
    """The text entries' own checks (sanitize, splitft: attacks/NAME/calibration.py check)."""
    check_at_least(f"calibration.{name}.examples", c.examples, 2)
    check_at_least(f"calibration.{name}.tokens", c.tokens, 1)


@dataclass
class _CalibrationShared:
    systems: List[str] = MISSING
    trials: int = MISSING          # null trials per system
    dosed_trials: int = MISSING    # trials per dose
    seed: int = MISSING
    threads: int = MISSING         # torch threads (the probe's small fits are far slower with more)
    plan_target: float = MISSING   # the probability each system's n is sized for (certify and power at the gate dose)


def module(system: str) -> ModuleType:
    """The module of a system's calibration entry (its `calibration`, `module:function`, in harness/systems.py)."""
    return importlib.import_module(CALIBRATIONS[system].partition(":")[0])


def _calibration_config() -> type:
    """The section's schema: the shared keys, then each system's own part (calibration.NAME), typed by the
    `Config` of its calibration module, in the registry's order."""
    shared = [(f.name, hint, field(default=MISSING)) for f, hint in
              zip(fields(_CalibrationShared), get_type_hints(_CalibrationShared).values())]
    parts = [(name, module(name).Config, field(default=MISSING)) for name in SYSTEMS]
    node = make_dataclass("CalibrationConfig", [*shared, *parts])
    node.__module__ = __name__
    return node


def __getattr__(name: str) -> Any:
    # Built on first use, not at import: a system's calibration module imports the shared types above, so it
    # can be imported first (tests, the runner) without a cycle.
    if name == "CalibrationConfig":
        globals()[name] = _calibration_config()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    for name in SYSTEMS:
        part = c[name]
        if "sd_null_pp" in part.planning:   # a mean's planning values (splitee plans a paired proportion)
            for key in ("sd_null_pp", "sd_dosed_pp", "gate_shift_pp", "spread_null_pp", "spread_dosed_pp"):
                v = float(part.planning[key])
                if not (math.isfinite(v) and v >= 0):
                    raise UserError(f"calibration.{name}.planning.{key} must be a number >= 0, got {v}")
        if "published_n" in part:
            check_at_least(f"calibration.{name}.published_n", part.get("published_n"), 2, nullable=True)
        module(name).check(part, cfg)
