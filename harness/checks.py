"""Range checks for config values that a type cannot express, one wording for every section.

Each raises harness.errors.UserError with one line naming the full key and the bad value
(`splitft.n_clients must be >= 1, got 0`), so the CLI can print it and exit with code 2. Torch-free: the
config schemas (harness/schema.py, harness/<system>/config.py) call them from their `check`/`validate`.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from harness.errors import UserError


def check_choice(name: str, value: Any, choices: Collection[Any]) -> None:
    """`value` is one of `choices`."""
    if value not in choices:
        raise UserError(f"{name}={value!r} is not one of {', '.join(map(str, choices))}")


def check_at_least(name: str, value: float | None, low: float, *, nullable: bool = False) -> None:
    """`value` >= `low` (and, for a float, finite); with `nullable`, None is allowed too."""
    if nullable and value is None:
        return
    # `not (v >= low)` refuses nan as well; inf passes that test, so floats are also checked finite.
    if not (value >= low) or (isinstance(value, float) and not math.isfinite(value)):
        what = "a finite number " if isinstance(value, float) else ""
        raise UserError(f"{name} must be {what}>= {low}{' or null' if nullable else ''}, got {value}")


def check_positive(name: str, value: float) -> None:
    """`value` is a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{name} must be a finite number > 0, got {value}")


def check_per_item_bound(name: str, value: float) -> None:
    """`value` is a per-item bound B of the earned interval (metrics/equivalence.py): in (0, 100] pp, since no
    item's difference of two rates in percent can exceed 100 pp."""
    if not (math.isfinite(value) and 0 < value <= 100):
        raise UserError(f"{name}={value}: a per-item bound of the earned interval lies in (0, 100] pp")


# The wording of check_local_file's refusal (tests/test_configs.py reads it back).
MISSING_FILE = "does not exist: give your copy's path"


def check_local_file(name: str, path: Any, with_network: str) -> None:
    """A local data file a run reads, checked before any model loads: missing, one line that names the
    overrides reading the same data through `datasets` (`with_network`), since a clone has no ../shared/data."""
    if not Path(str(path)).expanduser().exists():
        raise UserError(f"{name}={path} {MISSING_FILE}, or with network {with_network}")
