"""The configuration registry: every configuration splitbench can run, declared once (torch-free).

A configuration says where the model runs, whether it is split across the trust boundary, which masking
mechanism guards what crosses, whether it takes a privacy parameter, and how that parameter becomes the
per-row noise factor the mechanism multiplies each op's sensitivity Δ by (σ = Δ·factor). The engine, the
accounting, the floating-point study, the attack captures, the config schema and the reports all read this
table; none of them spells a configuration's rule out again.

Every configuration belongs to one system (SpliTEE's split inference, the token sanitisers, split
fine-tuning, cloud-edge decoding, the gradient audit): its `system` says which runners can run it
(runners/registry.py SYSTEMS) and which channel of the adversary view its attacks read. Each system
declares its configurations in its entry of the systems registry (harness/systems.py); REGISTRY here is
their union, so names are unique across systems.

Adding a configuration: one `Configuration(...)` in its system's entry of harness/systems.py and one
conf/configuration/NAME.yaml (its name and a description). A SpliTEE mechanism that does not exist yet also
needs a class in harness/splitee/mechanisms.py, named by `mechanism`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness import systems
from harness.errors import UserError

# The types and rule names are the systems registry's (harness/systems.py), where every configuration is declared.
from harness.systems import (  # noqa: F401  (re-exported: every reader names them through this module)
    ACCELERATOR,
    COLLAB,
    CONSTANT,
    DCHI,
    GRAD_AUDIT,
    HOST_CPU,
    INVERSE_SQRT_N,
    OWN_PARAMETER,
    SANITIZE,
    SPLITEE,
    SPLITFT,
    TEE,
    Configuration,
)

# Built from the systems registry: every system's configurations, in its entries' order; names are unique
# across systems.
REGISTRY: dict[str, Configuration] = {}
for _s in systems.SYSTEMS:
    for _c in _s.configurations:
        assert _c.name not in REGISTRY, f"configuration {_c.name!r} declared twice"
        assert _c.system == _s.name, f"configuration {_c.name!r} declared under {_s.name} with system={_c.system!r}"
        REGISTRY[_c.name] = _c
NAMES: tuple[str, ...] = tuple(REGISTRY)
SYSTEMS: tuple[str, ...] = systems.NAMES


def get(name: str) -> Configuration:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown configuration {name!r}; choose one of {', '.join(NAMES)}") from None


def names(*, split: bool | None = None, gaussian: bool | None = None, system: str | None = SPLITEE
          ) -> tuple[str, ...]:
    """Registered names in registry order: of one system (SpliTEE's by default; None: every system),
    optionally only the split and/or the Gaussian ones."""
    return tuple(c.name for c in REGISTRY.values()
                 if (system is None or c.system == system) and (split is None or c.split == split)
                 and (gaussian is None or c.gaussian == gaussian))


# How a privacy parameter's name is written in tables and terminal lines.
SYMBOLS = {"epsilon": "ε", "eta": "η", "lambda": "λ", "alpha": "α", "sigma": "σ"}


def parameter_label(name: str, epsilon: float | None) -> str:
    """"ε=1", "η=150", "λ=4": the configuration's privacy parameter by its own name; "" without one."""
    value = effective_epsilon(name, epsilon)
    if value is None:
        return ""
    parameter = get(name).parameter_name or "epsilon"
    return f"{SYMBOLS.get(parameter, parameter)}={value:g}"


def privacy_parameter(name: str | None, value: float | None, *, unit: str | None = None) -> dict[str, Any]:
    """results.json `privacy_parameter`: the configuration's privacy parameter by its own name (epsilon, eta,
    lambda, B, alpha, sigma), the value the run used (`value`, as the runner recorded it: its `epsilon` for
    the knob) and what that value measures (`unit`: the entry's, unless the run's settings change it). All
    three None for a configuration without one (cpu, t3, epn's per-prompt ε, stencil) or no configuration."""
    entry = REGISTRY.get(name) if name is not None else None
    if entry is None or entry.parameter_name is None:
        return {"name": None, "value": None, "unit": None}
    return {"name": entry.parameter_name, "value": None if value is None else float(value),
            "unit": unit or entry.parameter_unit}


def effective_epsilon(name: str, epsilon: float | None) -> float | None:
    """The knob's value where the configuration uses it, else None (recorded as results.json `epsilon`)."""
    return float(epsilon) if get(name).uses_epsilon and epsilon is not None else None


def mask_epsilons(name: str, epsilon: float | None, prompt_lengths: Sequence[int]) -> list[float | None]:
    """The per-token ε each prompt row is masked at (before sigma_scale): EP1 the knob, EPN 1/√n, None for
    configurations without Gaussian masks. The one place this rule is written."""
    rule = get(name).epsilon_rule
    if rule is None or rule == OWN_PARAMETER:
        return [None] * len(prompt_lengths)
    if rule == CONSTANT:
        # ε's positivity is checked once, where the config is validated (harness/schema.py validate: the user's
        # one-line error); a library caller that gets here with another ε has a bug
        assert epsilon is not None and math.isfinite(float(epsilon)) and float(epsilon) > 0, \
            f"epsilon must be a positive number for {name}, got {epsilon!r}"
        return [float(epsilon)] * len(prompt_lengths)
    if rule == INVERSE_SQRT_N:
        return [1.0 / math.sqrt(n) for n in prompt_lengths]
    raise AssertionError(f"configuration {name}: unknown epsilon_rule {rule!r}")


def noise_factors(name: str, epsilon: float | None, prompt_lengths: Sequence[int],
                  sigma_scale: float = 1.0) -> list[float]:
    """Per-row σ/Δ: sigma_scale/ε for Gaussian configurations, 0 where nothing is masked with noise."""
    return [0.0 if e is None else sigma_scale / e for e in mask_epsilons(name, epsilon, prompt_lengths)]


def exposure_epsilons(name: str, epsilon: float | None, prompt_lengths: Sequence[int],
                      sigma_scale: float = 1.0) -> list[float | None]:
    """The ε each exposure really gets once sigma_scale is applied (1/factor; inf for sigma_scale = 0);
    None without Gaussian masks. What the privacy accounting composes."""
    # ε/sigma_scale rather than 1/noise_factor: the same number the accounting has always reported, to the bit.
    return [None if e is None else (math.inf if sigma_scale == 0 else e / sigma_scale)
            for e in mask_epsilons(name, epsilon, prompt_lengths)]
