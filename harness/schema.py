"""Schemas of the experiment config (conf/), registered in Hydra's ConfigStore, and the checks types can't say.

The YAML under conf/ holds the options; the dataclasses here are their schema (hydra docs,
tutorials/structured_config/schema): conf/config.yaml lists `splitbench_schema` first in its defaults, so
every YAML value and every command-line override is merged onto a typed node. A wrong type
(`epsilon=abc`) or an unknown key fails at composition time, before any work starts. Ranges and choices
that a type cannot express (`epsilon=-1`, `generation.max_new_tokens=0`, a runner or configuration name in
a list) are checked by `validate`, which raises UserError (one line, exit code 2).

`model` and `workload` are left untyped (`Any`) on purpose: their options belong to harness/models.py and
harness/workloads.py, whose loaders validate their own fields.

Importing this module also registers the `sb.*` resolvers used by conf/hydra/default.yaml to name run
directories (the layout is documented there).
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from harness.errors import UserError

# The engine's configuration names (harness/split/engine.py CONFIGURATIONS); repeated here so that
# composing and validating a config never imports torch.
CONFIGURATIONS = ("cpu", "gpu", "tdx", "t3", "ep1", "epn", "slalom")
BASELINES = ("auto", "cpu", "gpu")
WANDB_MODES = ("offline", "online", "disabled")
LOGGERS = ("none", "wandb")
BANK_POLICIES = ("refill", "error")
SENSITIVITY_RULES = ("paper", "per_head")
OFFLOADABLE = ("qkv", "o", "gate_up", "lm_head")


@dataclass
class ConfigurationConfig:
    """One row of the paper's Table 1 (conf/configuration/*.yaml)."""

    name: str = MISSING
    description: str = MISSING
    # True only for ep1: the one configuration whose behaviour depends on the `epsilon` knob. epn derives
    # its ε from the prompt length (1/√n); the others add no noise.
    uses_epsilon: bool = False


@dataclass
class GenerationConfig:
    max_new_tokens: int = 200
    batch_size: int = 15
    # The paper generates exactly max_new_tokens (greedy, no early stop), so fidelity compares equal lengths.
    stop_at_eos: bool = False


@dataclass
class EngineConfig:
    """Arguments of harness.split.engine.EngineSettings; `configuration`, `epsilon` and `seed` are filled
    in by the runner (one run may drive several configurations)."""

    _target_: str = "harness.split.engine.EngineSettings"
    offload: List[str] = field(default_factory=lambda: list(OFFLOADABLE))
    bank_on_exhaustion: str = "refill"
    bank_capacity: Optional[int] = None
    record_view: bool = False
    tee_threads: Optional[int] = None
    allow_cpu_fallback: bool = False
    slalom_frac_bits: int = 8
    sigma_scale: float = 1.0
    sensitivity_rule: str = "paper"


@dataclass
class TimingConfig:
    configurations: List[str] = field(default_factory=lambda: list(CONFIGURATIONS))
    max_new_tokens: List[int] = field(default_factory=lambda: [100, 200, 400, 800])
    # One untimed short generation per configuration first, so one-off costs (allocator, kernel
    # selection, lazy imports) are not charged to whichever configuration happens to run first.
    warmup: bool = True


@dataclass
class LoggerConfig:
    name: str = "none"
    project: str = "splitbench"
    entity: Optional[str] = None
    mode: str = "offline"
    group: Optional[str] = None


@dataclass
class PathsConfig:
    output_dir: str = MISSING
    cache_dir: str = MISSING


@dataclass
class SplitbenchConfig:
    model: Any = MISSING
    configuration: ConfigurationConfig = MISSING
    workload: Any = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = MISSING

    runner: str = "fidelity"
    experiment_name: str = "fidelity"
    seed: int = 0
    epsilon: float = 1.0
    baseline: str = "auto"
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    semantic_model: Optional[str] = "all-mpnet-base-v2"
    tags: List[str] = field(default_factory=list)
    rerun: bool = False


def register_configs() -> None:
    ConfigStore.instance().store(name="splitbench_schema", node=SplitbenchConfig)


# ---------------------------------------------------------------------------------------------------
# Checks a type cannot express
# ---------------------------------------------------------------------------------------------------


def validate(cfg: DictConfig, runners: tuple[str, ...]) -> None:
    """Raise UserError (one line) for the first value out of range; `runners` are the known runner names."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"no value given for {', '.join(missing)} (set it on the command line: key=value)")
    if cfg.runner not in runners:
        raise UserError(f"runner={cfg.runner!r} is not one of {', '.join(runners)}")
    if cfg.configuration.name not in CONFIGURATIONS:
        raise UserError(f"configuration.name={cfg.configuration.name!r} is not one of {', '.join(CONFIGURATIONS)}")
    if not (math.isfinite(cfg.epsilon) and cfg.epsilon > 0):
        raise UserError(f"epsilon must be a finite number > 0, got {cfg.epsilon}")
    gen = cfg.generation
    if gen.max_new_tokens < 1:
        raise UserError(f"generation.max_new_tokens must be >= 1, got {gen.max_new_tokens}")
    if gen.batch_size < 1:
        raise UserError(f"generation.batch_size must be >= 1, got {gen.batch_size}")
    if cfg.baseline not in BASELINES:
        raise UserError(f"baseline={cfg.baseline!r} is not one of {', '.join(BASELINES)}")
    _check_engine(cfg.engine)
    timing = cfg.timing
    unknown = [c for c in timing.configurations if c not in CONFIGURATIONS]
    if unknown or not timing.configurations:
        raise UserError(f"timing.configurations must be a non-empty list from {', '.join(CONFIGURATIONS)}, got {list(timing.configurations)}")
    if not timing.max_new_tokens or min(timing.max_new_tokens) < 1:
        raise UserError(f"timing.max_new_tokens must be a non-empty list of integers >= 1, got {list(timing.max_new_tokens)}")
    if cfg.logger.name not in LOGGERS:
        raise UserError(f"logger.name={cfg.logger.name!r} is not one of {', '.join(LOGGERS)}")
    if cfg.logger.mode not in WANDB_MODES:
        raise UserError(f"logger.mode={cfg.logger.mode!r} is not one of {', '.join(WANDB_MODES)}")
    if not isinstance(cfg.model, DictConfig) or not cfg.model.get("name"):
        raise UserError("the model config has no `name` (pick one with model=<option>)")


def _check_engine(engine: DictConfig) -> None:
    bad = [op for op in engine.offload if op not in OFFLOADABLE]
    if bad:
        raise UserError(f"engine.offload: unknown op(s) {bad}; choose from {', '.join(OFFLOADABLE)}")
    if engine.bank_on_exhaustion not in BANK_POLICIES:
        raise UserError(f"engine.bank_on_exhaustion={engine.bank_on_exhaustion!r} is not one of {', '.join(BANK_POLICIES)}")
    if engine.bank_capacity is not None and engine.bank_capacity < 1:
        raise UserError(f"engine.bank_capacity must be >= 1 or null, got {engine.bank_capacity}")
    if engine.tee_threads is not None and engine.tee_threads < 1:
        raise UserError(f"engine.tee_threads must be >= 1 or null, got {engine.tee_threads}")
    if not 1 <= engine.slalom_frac_bits <= 16:
        raise UserError(f"engine.slalom_frac_bits must be in [1, 16], got {engine.slalom_frac_bits}")
    if not (math.isfinite(engine.sigma_scale) and engine.sigma_scale >= 0):
        raise UserError(f"engine.sigma_scale must be a finite number >= 0, got {engine.sigma_scale}")
    if engine.sensitivity_rule not in SENSITIVITY_RULES:
        raise UserError(f"engine.sensitivity_rule={engine.sensitivity_rule!r} is not one of {', '.join(SENSITIVITY_RULES)}")


# Keys that label or route a run but never change what it computes: left out of the config hash.
NON_SEMANTIC_KEYS = ("logger", "paths", "tags", "experiment_name", "rerun")


def semantic_config(cfg: DictConfig, drop: tuple[str, ...] = (), **replace: Any) -> dict[str, Any]:
    """The resolved config without NON_SEMANTIC_KEYS and `drop`, with `replace` applied: what the config
    hash of a run is computed over (runners drop what they ignore and normalise ε)."""
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    out = {k: v for k, v in resolved.items() if k not in NON_SEMANTIC_KEYS and k not in drop and k != "hydra"}
    out.update(replace)
    return out


def effective_epsilon(configuration: str, epsilon: float) -> float | None:
    """The ε a configuration actually uses: the knob for ep1, None for every other configuration (epn
    derives its own per prompt, the rest add no noise)."""
    return float(epsilon) if configuration == "ep1" else None


# ---------------------------------------------------------------------------------------------------
# Resolvers naming run directories (used in conf/hydra/default.yaml and conf/experiment/timing*.yaml)
# ---------------------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+\-]")
_MAX_DIRNAME = 120


def eps_dirname(uses_epsilon: Any, epsilon: Any) -> str:
    """`eps=<ε>` when the configuration uses ε, else `eps=na`, so an ε sweep over a configuration that
    ignores ε lands every job in one directory (and all but the first are skipped as complete)."""
    if not _as_bool(uses_epsilon):
        return "eps=na"
    return f"eps={float(epsilon):g}"


def overrides_dirname(override_dirname: Any) -> str:
    """The remaining semantic overrides as one safe path component ("default" when there are none).

    Characters that would nest or escape directories (`/`, spaces, ...) become `_`; names longer than
    120 characters keep a prefix and a short hash so distinct overrides never share a directory.
    """
    text = str(override_dirname or "")
    if not text:
        return "default"
    safe = _UNSAFE.sub("_", text)
    if safe != text or len(safe) > _MAX_DIRNAME:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        safe = f"{safe[:_MAX_DIRNAME - 11]}-{digest}"
    return safe


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("sb.eps_dir", eps_dirname, replace=True)
    OmegaConf.register_new_resolver("sb.overrides_dir", overrides_dirname, replace=True)


register_configs()
register_resolvers()
