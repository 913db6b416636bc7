"""The configuration registry: every configuration splitbench can run, declared once (torch-free).

A configuration says where the model runs, whether it is split across the trust boundary, which masking
mechanism guards what crosses, whether it takes a privacy parameter, and how that parameter becomes the
per-row noise factor the mechanism multiplies each op's sensitivity Δ by (σ = Δ·factor). The engine, the
accounting, the floating-point study, the attack captures, the config schema and the reports all read this
table; none of them spells a configuration's rule out again.

Every configuration belongs to one system (SpliTEE's split inference, the token sanitisers, split
fine-tuning, cloud-edge decoding, the gradient audit): its `system` says which runners can run it
(runners/registry.py SYSTEMS) and which channel of the adversary view its attacks read. Each system
declares its configurations in its own tuple below; REGISTRY is their union, so names are unique across
systems.

Adding a configuration: one `Configuration(...)` entry in its system's tuple and one
conf/configuration/NAME.yaml (its name and a description). A SpliTEE mechanism that does not exist yet also
needs a class in harness/split/mechanisms.py, named by `mechanism`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import UserError

# Where the whole model (or, for split configurations, everything but the offloaded ops) runs.
HOST_CPU, ACCELERATOR, TEE = "host_cpu", "accelerator", "tee"
# How a privacy parameter becomes a per-row ε (the factor is then sigma_scale / ε):
CONSTANT = "constant"              # the `epsilon` knob itself, for every row (EP1)
INVERSE_SQRT_N = "inverse_sqrt_n"  # ε = 1/√n for a prompt of n tokens; no knob (EPN, paper §7.3.1)
# The knob is the mechanism's own privacy parameter, passed to it as it is (η of a dχ sanitiser, the ε of
# CusText+, a defence's strength); no Gaussian masks are derived from it here.
OWN_PARAMETER = "own_parameter"
# The unit of a dχ-privacy parameter η: the mechanism's guarantee scales with η·d(x, x').
DCHI = "dχ-privacy per unit of embedding distance"
# Systems (results.json `system`, adversary-view meta `system`).
SPLITEE, SANITIZE, SPLITFT, COLLAB, GRAD_AUDIT = "splitee", "sanitize", "splitft", "collab", "grad_audit"


@dataclass(frozen=True)
class Configuration:
    name: str
    runs_on: str                      # host_cpu | accelerator | tee; the other systems: clients | edge | local
    split: bool = False               # linear ops offloaded through the Boundary to the accelerator
    mechanism: str | None = None      # harness/split/mechanisms.py: plain | gaussian | slalom (split only)
    epsilon_rule: str | None = None   # CONSTANT | INVERSE_SQRT_N: Gaussian masks whose σ follows ε
    # The name the mechanism's own paper gives its privacy parameter, and what its value measures (results.json
    # `privacy_parameter`, beside `epsilon`: privacy_parameter below).
    parameter_name: str | None = None
    parameter_unit: str | None = None
    system: str = SPLITEE

    @property
    def uses_epsilon(self) -> bool:
        """Whether the `epsilon` knob changes what this configuration computes."""
        return self.epsilon_rule in (CONSTANT, OWN_PARAMETER)

    @property
    def gaussian(self) -> bool:
        """Whether what crosses carries SpliTEE's Gaussian masks calibrated to an ε (EP1, EPN)."""
        return self.epsilon_rule in (CONSTANT, INVERSE_SQRT_N)

    @property
    def in_tee(self) -> bool:
        """Whether part of the computation runs inside the TEE (so the TEE kind is detected and recorded)."""
        return self.runs_on == TEE


# SpliTEE (paper 000): split inference between a TEE and an untrusted accelerator.
SPLITEE_CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration("cpu", HOST_CPU),
    Configuration("gpu", ACCELERATOR),
    Configuration("tdx", TEE),
    Configuration("t3", TEE, split=True, mechanism="plain"),
    Configuration("ep1", TEE, split=True, mechanism="gaussian", epsilon_rule=CONSTANT, parameter_name="epsilon",
                  parameter_unit="ε-GDP per exposure"),
    Configuration("epn", TEE, split=True, mechanism="gaussian", epsilon_rule=INVERSE_SQRT_N),
    Configuration("slalom", TEE, split=True, mechanism="slalom"),
)
# Token-level prompt sanitisers (paper 001; harness/sanitize/).
# The prompt is sanitised on the client/TEE side, then runs on the accelerator as `gpu` does; the name
# is the mechanism's (harness/sanitize/mechanisms.py). Stencil is deterministic: no privacy parameter.
SANITIZE_CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration("stencil", ACCELERATOR, system=SANITIZE),
    Configuration("dx_noise", ACCELERATOR, epsilon_rule=OWN_PARAMETER, parameter_name="eta",
                  parameter_unit=DCHI, system=SANITIZE),
    Configuration("dx_stencil", ACCELERATOR, epsilon_rule=OWN_PARAMETER, parameter_name="eta",
                  parameter_unit=DCHI, system=SANITIZE),
    Configuration("custext_plus", ACCELERATOR, epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="ε-DP per token (exponential mechanism)", system=SANITIZE),
)
# Split federated fine-tuning and its defences (paper 002; harness/splitft/).
# The knob of each defence is its own strength (harness/splitft/defences.py); splitft_central is the
# centralised (unsplit, unfederated) fine-tuning reference, splitft_none split FL without a defence.
SPLITFT_CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration("splitft_central", "clients", system=SPLITFT),
    Configuration("splitft_none", "clients", system=SPLITFT),
    Configuration("privpair", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="lambda",
                  parameter_unit="coupling weight (no DP claim)", system=SPLITFT),
    Configuration("smashed_dp_gaussian", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="(ε, δ)-DP per token and exposure, δ = splitft.dp.delta", system=SPLITFT),
    Configuration("smashed_dp_laplace", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="ε-DP per token and exposure", system=SPLITFT),
    Configuration("embedding_dx", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="eta",
                  parameter_unit=DCHI, system=SPLITFT),
    Configuration("nopeek", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="alpha",
                  parameter_unit="weight of the dCor loss (no DP claim)", system=SPLITFT),
)
# Cloud-edge collaborative decoding and its defences (paper 003; harness/collab/).
COLLAB_CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration("collab_none", "edge", system=COLLAB),
    Configuration("coveil", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="lambda",
                  parameter_unit="penalty weight of the privacy term (no DP claim)", system=COLLAB),
    Configuration("collab_cogenesis", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="B",
                  parameter_unit="probabilities uploaded per step (no DP claim)", system=COLLAB),
    Configuration("collab_dp_logit", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="(ε, δ)-DP per step, δ = collab.dp_delta", system=COLLAB),
    Configuration("collab_dp_fusion", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="Rényi divergence bound per step, order collab.renyi_order", system=COLLAB),
    Configuration("collab_custext", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="ε-DP per token (exponential mechanism)", system=COLLAB),
    Configuration("collab_ldp_sampler", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="ε-LDP per token", system=COLLAB),
    # Its unit follows collab.invisibleink.accounting (runners/collab.py): this one is `sequence`'s.
    Configuration("collab_invisibleink", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                  parameter_unit="(ε, δ)-DP per answer, δ = collab.dp_delta", system=COLLAB),
)
# The returned-gradient audit's trainer and its mitigation (paper 004; harness/grad_audit/).
GRAD_AUDIT_CONFIGURATIONS: tuple[Configuration, ...] = (
    # The trainer as audited: the returned gradient goes back as it is (exactly zero on the decoys).
    Configuration("decoy_trainer", "local", system=GRAD_AUDIT),
    # The mitigation: the returned gradient clipped per row and noised (grad_audit.mitigation, not ε).
    # Its σ is grad_audit.mitigation.noise_multiplier, not the `epsilon` knob (runners/grad_audit.py records it).
    Configuration("decoy_mitigated", "local", parameter_name="sigma",
                  parameter_unit="noise std per unit of the row clip (no DP claim)", system=GRAD_AUDIT),
)

REGISTRY: dict[str, Configuration] = {}
for _c in (SPLITEE_CONFIGURATIONS + SANITIZE_CONFIGURATIONS + SPLITFT_CONFIGURATIONS + COLLAB_CONFIGURATIONS
           + GRAD_AUDIT_CONFIGURATIONS):
    assert _c.name not in REGISTRY, f"configuration {_c.name!r} declared twice"
    REGISTRY[_c.name] = _c
NAMES: tuple[str, ...] = tuple(REGISTRY)
SYSTEMS: tuple[str, ...] = (SPLITEE, SANITIZE, SPLITFT, COLLAB, GRAD_AUDIT)


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
