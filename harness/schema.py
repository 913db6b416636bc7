"""The schema of the keys every system shares (conf/), registered in Hydra's ConfigStore with every system's own
schema, and the checks types can't say.

The values live in the YAML under conf/ only; the dataclasses here are their schema (hydra docs,
tutorials/structured_config/schema) and hold no defaults: every field is MISSING until a YAML file or the
command line sets it, so the schema and the YAML can never disagree, and a value no file supplies is
reported by `validate` ("no value given for ..."). conf/config.yaml lists `splitbench_schema` first in its
defaults, so every YAML value and every command-line override is merged onto a typed node. A wrong type
(`epsilon=abc`) or an unknown key fails at composition time, before any work starts. Ranges and choices
that a type cannot express (`epsilon=-1`, a runner or configuration name) are checked by `validate`, which
raises UserError (one line, exit code 2).

Each system's own keys are typed and checked by its module, named on its entry of the systems registry
(harness/systems.py `schema`: harness/NAME/config.py): a section's (sanitize, splitft, collab, grad_audit,
calibration) under its key, SpliTEE's at the top level, where its keys predate sections. Such a module holds
the dataclass and `check(section, cfg)`, and may add `check_files(section, cfg)` (the files the run reads,
checked after every value) and `tokenizer_pairs(section, cfg)` (models that must share the victim's token ids).

A model entry (conf/model/*.yaml, also `attack.decoder`) is typed by its kind: the file's defaults list
names the kind's schema (`- /schema/model/<kind>@_here_`, registered below from MODEL_SCHEMAS; the model and
workload schemas live in harness/group_schemas.py, which the loaders import too), so a random model cannot
be given a `hub_id`. Configuration names and what each one does come from the
configuration registry (harness/configurations.py); a configuration's YAML holds only its name and a
description. A run's identity (its config hash and its directory's name) is harness/run_identity.py.
"""
from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from types import ModuleType
from typing import List, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from harness import configurations, run_identity, systems
from harness.checks import check_choice, check_positive
from harness.errors import UserError
from harness.group_schemas import (  # noqa: F401  (the model and workload schemas are part of this one)
    MODEL_SCHEMAS,
    GgufPackageModelConfig,
    HubModelConfig,
    ModelConfig,
    RandomModelConfig,
    WorkloadConfig,
    check_model,
)
from harness.workloads import check_workload

WANDB_MODES = ("offline", "online", "disabled")
LOGGERS = ("none", "wandb")

@dataclass
class ConfigurationConfig:
    """One row of the paper's Table 1 (conf/configuration/*.yaml); what it does is its registry entry."""

    name: str = MISSING
    description: str = MISSING



@dataclass
class LoggerConfig:
    name: str = MISSING
    project: str = MISSING
    entity: Optional[str] = MISSING
    mode: str = MISSING
    group: Optional[str] = MISSING
    connect_timeout_s: float = MISSING  # online only: no TCP route to W&B within this -> offline mirror


@dataclass
class PathsConfig:
    output_dir: str = MISSING
    # The one cache root: generations, captures, attackers, the model and similarity-model caches.
    cache_dir: str = MISSING


@dataclass
class _SharedConfig:
    """The keys every system shares; SplitbenchConfig adds each system's own after `epsilon` (SpliTEE's top-level
    keys, then the sections)."""

    model: ModelConfig = MISSING
    configuration: ConfigurationConfig = MISSING
    workload: WorkloadConfig = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = MISSING

    runner: str = MISSING
    experiment_name: str = MISSING
    seed: int = MISSING
    epsilon: float = MISSING
    # The systems' own keys come here, from the systems registry (TOP_LEVEL and SYSTEM_SECTIONS below).
    semantic_model: Optional[str] = MISSING
    tags: List[str] = MISSING
    rerun: bool = MISSING


def _module(schema: str) -> ModuleType:
    return importlib.import_module(schema.partition(":")[0])


# The systems' sections and the modules that type and check them, from the systems registry
# (harness/systems.py): each entry's section, typed by its `module:Class` and checked by the module's check().
SYSTEM_SECTIONS = {section: _module(schema) for section, (_, schema) in systems.sections().items()}
# The systems whose keys sit at the top level (SpliTEE's), by name: their `module:Class` fields are top-level keys.
TOP_LEVEL = {name: _module(schema) for name, schema in systems.top_level().items()}


def _splitbench_config() -> type:
    """The schema of the whole config: the shared keys with every system's own after `epsilon` (a top-level
    system's fields, then each section's key typed by its dataclass, MISSING until conf/SECTION/default.yaml
    sets it)."""
    def typed(cls: type) -> list[tuple[str, type, object]]:
        return [(f.name, hint, field(default=MISSING)) for f, hint in zip(fields(cls), get_type_hints(cls).values())]

    shared = typed(_SharedConfig)
    at = next(i for i, f in enumerate(shared) if f[0] == "epsilon") + 1
    top = [f for name, schema in systems.top_level().items()
           for f in typed(getattr(TOP_LEVEL[name], schema.partition(":")[2]))]
    sections = [(section, getattr(SYSTEM_SECTIONS[section], schema.partition(":")[2]), field(default=MISSING))
                for section, (_, schema) in systems.sections().items()]
    node = make_dataclass("SplitbenchConfig", [*shared[:at], *top, *sections, *shared[at:]])
    node.__module__ = __name__
    return node


SplitbenchConfig = _splitbench_config()


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="splitbench_schema", node=SplitbenchConfig)
    # Each section's defaults (conf/SECTION/default.yaml) and each calibrated system's part of the calibration
    # section (conf/NAME/calibration.yaml, at calibration.NAME), composed where conf/config.yaml names this node:
    # built from the registry, so a new system joins without an edit there or in conf/calibration/.
    store.store(name="system_sections", node={"defaults": [
        *({section: "default"} for section in systems.sections()),
        *({f"{s.name}@calibration.{s.name}": "calibration"} for s in systems.SYSTEMS if s.calibration is not None)]})
    for kind, node in MODEL_SCHEMAS.items():
        store.store(group="schema/model", name=kind, node=node)


# ---------------------------------------------------------------------------------------------------
# Checks a type cannot express
# ---------------------------------------------------------------------------------------------------



def validate(cfg: DictConfig, runners: dict[str, tuple[str, ...]]) -> None:
    """Raise UserError (one line) for the first value out of range; `runners` maps each known runner to the
    systems whose configurations it runs (runners.registry.runner_systems())."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"no value given for {', '.join(missing)} (set it on the command line: key=value)")
    check_choice("runner", cfg.runner, runners)
    run_identity.plain_dirname("experiment_name", cfg.experiment_name)
    check_choice("configuration.name", cfg.configuration.name, configurations.NAMES)
    _check_system(cfg, runners[cfg.runner])
    check_positive("epsilon", cfg.epsilon)   # the one check of ε: the engine and the registry assert it
    for section, module in _systems(cfg):
        module.check(section, cfg)
    check_choice("logger.name", cfg.logger.name, LOGGERS)
    check_choice("logger.mode", cfg.logger.mode, WANDB_MODES)
    check_model("model", cfg.model)
    _check_unknown_keys(cfg, "")
    _check_environment(cfg)
    _check_devices(cfg)
    _check_input_files(cfg)
    _check_shared_tokenizers(cfg)


def _systems(cfg: DictConfig) -> list[tuple[DictConfig, ModuleType]]:
    """Each system's keys with the module that checks them, in the registry's order: a top-level system's
    "section" is the whole config."""
    return [*((cfg, module) for module in TOP_LEVEL.values()),
            *((cfg[section], module) for section, module in SYSTEM_SECTIONS.items())]


def _check_shared_tokenizers(cfg: DictConfig) -> None:
    """Two models that must read and write the same token ids (the attack's decoder and its victim, the
    collab edge and cloud: each system's tokenizer_pairs) are compared by their tokenizers before either
    model's weights load: a mismatch found after loading cost minutes."""
    pairs = [pair for section, module in _systems(cfg) if hasattr(module, "tokenizer_pairs")
             for pair in module.tokenizer_pairs(section, cfg)]
    pairs = [p for p in pairs if p[1].name != cfg.model.name]
    if not pairs:
        return
    from harness.models import first_token_difference, load_tokenizer  # transformers: only when needed

    ours = load_tokenizer(cfg.model, cache_dir=cfg.paths.cache_dir)
    for key, other, role, why in pairs:
        difference = first_token_difference(ours, load_tokenizer(other, cache_dir=cfg.paths.cache_dir))
        if difference is not None:
            raise UserError(f"{key}={other.name} does not share the tokenizer of {role} {cfg.model.name} "
                            f"({difference}); {why}")


def _check_system(cfg: DictConfig, allowed: tuple[str, ...]) -> None:
    """The configuration belongs to a system the runner runs (runners/registry.py SYSTEMS)."""
    system = configurations.get(cfg.configuration.name).system
    if system not in allowed:
        fits = ", ".join(n for s in allowed for n in configurations.names(system=s))
        raise UserError(f"configuration={cfg.configuration.name} belongs to the {system} system, which runner="
                        f"{cfg.runner} does not run; choose one of {fits}")


def _check_unknown_keys(node: DictConfig, key: str) -> None:
    """No key past the schema. Hydra's append override (`+KEY=VALUE`) adds keys even to a typed node, so a
    misspelt `+generation.max_new_token=5` would otherwise be ignored without a word."""
    schema = OmegaConf.get_type(node)
    if not (isinstance(schema, type) and is_dataclass(schema)):
        return  # a free-form mapping (model.hf_config): its keys are the model library's business
    known = [f.name for f in fields(schema)]
    unknown = sorted(set(map(str, node.keys())) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        where = key.rstrip(".") or "the top level"
        hint = f"did you mean {key}{close[0]}?" if close else f"{where} has: {', '.join(known)}"
        raise UserError(f"unknown option {key}{unknown[0]} (not in the schema; {hint})")
    for name in known:
        child = node[name]  # never missing here: validate refused missing values first
        if isinstance(child, DictConfig):
            _check_unknown_keys(child, f"{key}{name}.")


# WANDB_MODE values wandb itself accepts (wandb.sdk.wandb_settings.Settings.mode); logger.mode is stricter.
WANDB_ENV_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")


def _check_environment(cfg: DictConfig) -> None:
    """What the environment makes impossible, found before any work: a W&B mode wandb refuses, a cache
    root that is a file. (A hub model that HF_HUB_OFFLINE=1 cannot load is harness.models' one-line error:
    whether a config can run offline is not a property of the config.)"""
    env_mode = os.environ.get("WANDB_MODE")
    if cfg.logger.name == "wandb" and env_mode and env_mode not in WANDB_ENV_MODES:
        raise UserError(f"the environment sets WANDB_MODE={env_mode!r}, which is not one of "
                        f"{', '.join(WANDB_ENV_MODES)}; unset it (logger.mode then applies) or fix it")
    cache = Path(str(cfg.paths.cache_dir)).expanduser()
    blocker = next((p for p in (cache, *cache.parents) if p.exists()), None)
    given = f"paths.cache_dir={cfg.paths.cache_dir}"
    if os.environ.get("SPLITBENCH_CACHE") == str(cfg.paths.cache_dir):
        given += " (from $SPLITBENCH_CACHE)"
    if blocker is not None and not blocker.is_dir():
        why = "is a file, not a directory" if blocker == cache else f"cannot be created: {blocker} is a file"
        raise UserError(f"{given} {why}")
    # access(2) answers EROFS for a read-only filesystem even to root, and EACCES for a folder the user may not
    # write: either way the first cache write would fail deep inside a model load.
    if blocker is not None and not os.access(blocker, os.W_OK | os.X_OK):
        where = "is" if blocker == cache else f"cannot be created: {blocker} is"
        raise UserError(f"{given} {where} not writable (a read-only filesystem or no permission); "
                        "set SPLITBENCH_CACHE to a writable folder")


# The placement nodes each runner reads (harness/placement.py), from the systems registry; SpliTEE's runners read


def _check_devices(cfg: DictConfig) -> None:
    """A GPU the run asks for exists, before any model loads. Torch is imported only when a placement names
    a GPU, so composing and refusing configs stays torch-free otherwise."""
    wanted = {key: node for key, node in run_identity.placements(cfg).items() if node.device != "cpu"}
    if wanted:
        from harness.devices import resolve_device

        for key, node in wanted.items():
            resolve_device(f"{key}.device", str(node.device))


def _check_input_files(cfg: DictConfig) -> None:
    """The files the run reads, checked before any model loads: the workload's JSONL and each system's
    (check_files: the attack runner's text corpus)."""
    check_workload(cfg.workload)
    for section, module in _systems(cfg):
        if hasattr(module, "check_files"):
            module.check_files(section, cfg)


register_configs()
