"""The configuration registry: every configuration splitbench can run, declared once (torch-free).

A configuration says where the model runs, whether it is split across the trust boundary, which masking
mechanism guards what crosses, whether it takes a privacy parameter, and how that parameter becomes the
per-row noise factor the mechanism multiplies each op's sensitivity Δ by (σ = Δ·factor). The engine, the
accounting, the floating-point study, the attack captures, the config schema and the reports all read this
table; none of them spells a configuration's rule out again.

Adding a configuration: one `Configuration(...)` entry in REGISTRY and one conf/configuration/NAME.yaml
(its name and a description). A mechanism that does not exist yet also needs a class in
harness/split/mechanisms.py, named by `mechanism`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import UserError

# Where the whole model (or, for split configurations, everything but the offloaded ops) runs.
HOST_CPU, ACCELERATOR, TEE = "host_cpu", "accelerator", "tee"
# How a privacy parameter becomes a per-row ε (the factor is then sigma_scale / ε):
CONSTANT = "constant"              # the `epsilon` knob itself, for every row (EP1)
INVERSE_SQRT_N = "inverse_sqrt_n"  # ε = 1/√n for a prompt of n tokens; no knob (EPN, paper §7.3.1)


@dataclass(frozen=True)
class Configuration:
    name: str
    runs_on: str                      # host_cpu | accelerator | tee
    split: bool = False               # linear ops offloaded through the Boundary to the accelerator
    mechanism: str | None = None      # harness/split/mechanisms.py: plain | gaussian | slalom (split only)
    epsilon_rule: str | None = None   # CONSTANT | INVERSE_SQRT_N: Gaussian masks whose σ follows ε
    # The name the mechanism's own paper gives its privacy parameter (recorded beside `epsilon`).
    parameter_name: str | None = None

    @property
    def uses_epsilon(self) -> bool:
        """Whether the `epsilon` knob changes what this configuration computes."""
        return self.epsilon_rule == CONSTANT

    @property
    def gaussian(self) -> bool:
        """Whether what crosses carries Gaussian noise calibrated to an ε (the DP configurations)."""
        return self.epsilon_rule is not None

    @property
    def in_tee(self) -> bool:
        """Whether part of the computation runs inside the TEE (so the TEE kind is detected and recorded)."""
        return self.runs_on == TEE


REGISTRY: dict[str, Configuration] = {c.name: c for c in (
    Configuration("cpu", HOST_CPU),
    Configuration("gpu", ACCELERATOR),
    Configuration("tdx", TEE),
    Configuration("t3", TEE, split=True, mechanism="plain"),
    Configuration("ep1", TEE, split=True, mechanism="gaussian", epsilon_rule=CONSTANT, parameter_name="epsilon"),
    Configuration("epn", TEE, split=True, mechanism="gaussian", epsilon_rule=INVERSE_SQRT_N),
    Configuration("slalom", TEE, split=True, mechanism="slalom"),
)}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def get(name: str) -> Configuration:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown configuration {name!r}; choose one of {', '.join(NAMES)}") from None


def names(*, split: bool | None = None, gaussian: bool | None = None) -> tuple[str, ...]:
    """Registered names in registry order, optionally only the split and/or the Gaussian ones."""
    return tuple(c.name for c in REGISTRY.values()
                 if (split is None or c.split == split) and (gaussian is None or c.gaussian == gaussian))


def effective_epsilon(name: str, epsilon: float | None) -> float | None:
    """The knob's value where the configuration uses it, else None (recorded as results.json `epsilon`)."""
    return float(epsilon) if get(name).uses_epsilon and epsilon is not None else None


def mask_epsilons(name: str, epsilon: float | None, prompt_lengths: Sequence[int]) -> list[float | None]:
    """The per-token ε each prompt row is masked at (before sigma_scale): EP1 the knob, EPN 1/√n, None for
    configurations without Gaussian masks. The one place this rule is written."""
    rule = get(name).epsilon_rule
    if rule is None:
        return [None] * len(prompt_lengths)
    if rule == CONSTANT:
        if epsilon is None or not math.isfinite(float(epsilon)) or float(epsilon) <= 0:
            raise UserError(f"epsilon must be a positive number for {name}, got {epsilon!r}")
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
