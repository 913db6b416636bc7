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
class FpErrorConfig:
    """The floating-point study (runner fp_error, paper Table 4; harness/split/fp_error.py)."""

    precisions: List[str] = field(default_factory=lambda: ["fp32", "fp64", "bf16", "fp16"])
    kernels: List[str] = field(default_factory=lambda: ["library", "sequential"])
    trials: int = 1000                # output elements per op instance (the paper: 1,000)
    rows_per_vector: int = 25         # weight rows per masked input vector (trials = vectors × rows)
    vectors_per_prompt: int = 16      # captured token positions kept per prompt and op instance
    capture_new_tokens: int = 8       # greedy tokens generated while capturing (their inputs count too)
    capture_batch_size: int = 2
    include_down: bool = True         # the Down projection as a non-offloaded reference
    down_precisions: List[str] = field(default_factory=lambda: ["fp32", "fp64"])
    threads: Optional[int] = 1        # torch threads for the trials (elementwise work: 1 is fastest on a shared box)


@dataclass
class ControlledErrorConfig:
    """The controlled-error experiment (runner controlled_error, paper Table 5)."""

    # Target mean absolute errors; EP1's natural level and T3 (zero) are always run as well.
    levels: List[float] = field(default_factory=lambda: [1e-4, 1e-3, 1e-2, 1.4e-2, 1.6e-2, 2e-2, 3e-2])


@dataclass
class AttackCorpusConfig:
    """The attacker's auxiliary corpus (attacks/corpus.py): public text it runs through its own model copy."""

    name: str = "builtin"
    source: str = "builtin"           # builtin | text | hub | random
    path: Optional[str] = None        # source=text: a local UTF-8 text file (e.g. WikiText-2 raw)
    hub_id: Optional[str] = None      # source=hub: a `datasets` id, e.g. wikitext
    hub_config: Optional[str] = None
    split: str = "train"
    text_field: str = "text"
    n_train: int = 1800               # the paper: 1,800 training / 200 validation prompts
    n_val: int = 200
    min_tokens: int = 64
    max_tokens: int = 192


@dataclass
class AttackCaptureConfig:
    batch_size: int = 8
    max_new_tokens: int = 1           # 1: prefill only (the prompt's exposures); more adds decode steps


@dataclass
class AttackTrainConfig:
    """attacks.inversion.TrainSettings."""

    mode: str = "projection"          # projection | body | full
    layout: str = "prefix"            # prefix (GEIA) | aligned; the LM head is always read as a prefix
    window: int = 32
    batch_size: int = 8
    lr: float = 1e-3
    decoder_lr: float = 1e-4
    max_steps: int = 2000
    max_minutes: float = 30.0
    eval_every: int = 100
    val_windows: int = 64
    warmup_steps: int = 20
    projection_hidden: Optional[int] = None
    max_target_tokens: int = 256
    gen_batch_size: int = 32
    threads: Optional[int] = None     # torch threads while training/decoding; null = torch's default


@dataclass
class AttackBayesConfig:
    enabled: bool = True
    k: List[int] = field(default_factory=lambda: [1, 2, 4, 16, 64])
    top_k: int = 5
    prior: str = "uniform"            # uniform (maximum likelihood) | corpus (MAP with a unigram prior)
    rows_per_chunk: int = 1024
    vocab_per_chunk: int = 16384


@dataclass
class AttackControlsConfig:
    gate_margin_pp: float = 1.0       # gate: upper 95% bound of token F1 <= chance floor + this
    positive_margin_pp: float = 10.0  # positive control: lower 95% bound of T3 token F1 >= floor + this


@dataclass
class AttackConfig:
    """The prompt-reconstruction attack (runner attack, paper §7.4 Table 6; attacks/)."""

    setting: str = "noise_aware"      # noise_free (t3) | noise_oblivious | noise_aware (ep1, epn)
    component: str = "qkv"            # qkv | o | gate_up | composite | lm_head
    layer: int = 0
    decoder: Any = None               # a conf/model entry (+model@attack.decoder=NAME); null = the victim
    corpus: AttackCorpusConfig = field(default_factory=AttackCorpusConfig)
    capture: AttackCaptureConfig = field(default_factory=AttackCaptureConfig)
    train: AttackTrainConfig = field(default_factory=AttackTrainConfig)
    bayes: AttackBayesConfig = field(default_factory=AttackBayesConfig)
    controls: AttackControlsConfig = field(default_factory=AttackControlsConfig)


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
    fp_error: FpErrorConfig = field(default_factory=FpErrorConfig)
    controlled_error: ControlledErrorConfig = field(default_factory=ControlledErrorConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
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
    _check_fp_error(cfg)
    _check_attack(cfg.attack)
    if cfg.logger.name not in LOGGERS:
        raise UserError(f"logger.name={cfg.logger.name!r} is not one of {', '.join(LOGGERS)}")
    if cfg.logger.mode not in WANDB_MODES:
        raise UserError(f"logger.mode={cfg.logger.mode!r} is not one of {', '.join(WANDB_MODES)}")
    if not isinstance(cfg.model, DictConfig) or not cfg.model.get("name"):
        raise UserError("the model config has no `name` (pick one with model=<option>)")


FP_PRECISIONS = ("fp64", "fp32", "fp16", "bf16")
FP_KERNELS = ("library", "sequential")


def _check_fp_error(cfg: DictConfig) -> None:
    fp = cfg.fp_error
    for key, allowed in (("precisions", FP_PRECISIONS), ("down_precisions", FP_PRECISIONS), ("kernels", FP_KERNELS)):
        values = list(fp[key])
        if (not values and key != "down_precisions") or any(v not in allowed for v in values) or len(set(values)) != len(values):
            raise UserError(f"fp_error.{key} must be a list of distinct values from {', '.join(allowed)}, got {values}")
    for key in ("trials", "rows_per_vector", "vectors_per_prompt", "capture_new_tokens", "capture_batch_size"):
        if fp[key] < 1:
            raise UserError(f"fp_error.{key} must be >= 1, got {fp[key]}")
    if fp.threads is not None and fp.threads < 1:
        raise UserError(f"fp_error.threads must be >= 1 or null, got {fp.threads}")
    levels = list(cfg.controlled_error.levels)
    if not levels or any(not (math.isfinite(v) and v > 0) for v in levels):
        raise UserError(f"controlled_error.levels must be a non-empty list of numbers > 0, got {levels}")


ATTACK_SETTINGS = ("noise_free", "noise_oblivious", "noise_aware")
ATTACK_COMPONENTS = ("qkv", "o", "gate_up", "composite", "lm_head")
ATTACK_CORPUS_SOURCES = ("builtin", "text", "hub", "random")


def _check_attack(attack: DictConfig) -> None:
    """Ranges of the attack section; which configuration a setting needs is the attack runner's check."""
    choices = (("setting", attack.setting, ATTACK_SETTINGS), ("component", attack.component, ATTACK_COMPONENTS),
               ("corpus.source", attack.corpus.source, ATTACK_CORPUS_SOURCES),
               ("train.mode", attack.train.mode, ("projection", "body", "full")),
               ("train.layout", attack.train.layout, ("aligned", "prefix")),
               ("bayes.prior", attack.bayes.prior, ("uniform", "corpus")))
    for key, value, allowed in choices:
        if value not in allowed:
            raise UserError(f"attack.{key}={value!r} is not one of {', '.join(allowed)}")
    positive = (("layer", attack.layer, 0), ("corpus.n_train", attack.corpus.n_train, 1),
                ("corpus.n_val", attack.corpus.n_val, 1), ("corpus.min_tokens", attack.corpus.min_tokens, 1),
                ("capture.batch_size", attack.capture.batch_size, 1),
                ("capture.max_new_tokens", attack.capture.max_new_tokens, 1),
                ("train.window", attack.train.window, 1), ("train.batch_size", attack.train.batch_size, 1),
                ("train.max_steps", attack.train.max_steps, 1), ("train.eval_every", attack.train.eval_every, 1),
                ("train.val_windows", attack.train.val_windows, 1), ("train.warmup_steps", attack.train.warmup_steps, 1),
                ("train.max_target_tokens", attack.train.max_target_tokens, 1),
                ("train.gen_batch_size", attack.train.gen_batch_size, 1), ("bayes.top_k", attack.bayes.top_k, 1),
                ("bayes.rows_per_chunk", attack.bayes.rows_per_chunk, 1),
                ("bayes.vocab_per_chunk", attack.bayes.vocab_per_chunk, 1))
    for key, value, least in positive:
        if value < least:
            raise UserError(f"attack.{key} must be >= {least}, got {value}")
    if attack.corpus.max_tokens < attack.corpus.min_tokens:
        raise UserError(f"attack.corpus.max_tokens={attack.corpus.max_tokens} is below min_tokens={attack.corpus.min_tokens}")
    for key in ("lr", "decoder_lr", "max_minutes"):
        if not (math.isfinite(attack.train[key]) and attack.train[key] > 0):
            raise UserError(f"attack.train.{key} must be a number > 0, got {attack.train[key]}")
    if attack.train.threads is not None and attack.train.threads < 1:
        raise UserError(f"attack.train.threads must be >= 1 or null, got {attack.train.threads}")
    if attack.train.projection_hidden is not None and attack.train.projection_hidden < 1:
        raise UserError(f"attack.train.projection_hidden must be >= 1 or null, got {attack.train.projection_hidden}")
    if not attack.bayes.k or min(attack.bayes.k) < 1:
        raise UserError(f"attack.bayes.k must be a non-empty list of integers >= 1, got {list(attack.bayes.k)}")
    for key in ("gate_margin_pp", "positive_margin_pp"):
        if not (math.isfinite(attack.controls[key]) and attack.controls[key] >= 0):
            raise UserError(f"attack.controls.{key} must be a number >= 0, got {attack.controls[key]}")
    if attack.decoder is not None and not (isinstance(attack.decoder, DictConfig) and attack.decoder.get("name")):
        raise UserError("attack.decoder must be a conf/model entry (+model@attack.decoder=NAME) or null")


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
# Config sections read by one runner only (section → runner): left out of every other runner's hash, so
# adding a runner and its section never turns another runner's finished runs stale.
RUNNER_SECTIONS = {"timing": "timing", "fp_error": "fp_error", "controlled_error": "controlled_error",
                   "attack": "attack"}


def semantic_config(cfg: DictConfig, drop: tuple[str, ...] = (), **replace: Any) -> dict[str, Any]:
    """The resolved config without NON_SEMANTIC_KEYS, other runners' sections (RUNNER_SECTIONS) and
    `drop`, with `replace` applied: what the config hash of a run is computed over (runners drop what they
    ignore and normalise ε)."""
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    foreign = {section for section, owner in RUNNER_SECTIONS.items() if owner != resolved.get("runner")}
    out = {k: v for k, v in resolved.items()
           if k not in NON_SEMANTIC_KEYS and k not in drop and k not in foreign and k != "hydra"}
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
