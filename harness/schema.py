"""Schemas of the experiment config (conf/), registered in Hydra's ConfigStore, and the checks types can't say.

The values live in the YAML under conf/ only; the dataclasses here are their schema (hydra docs,
tutorials/structured_config/schema) and hold no defaults: every field is MISSING until a YAML file or the
command line sets it, so the schema and the YAML can never disagree, and a value no file supplies is
reported by `validate` ("no value given for ..."). conf/config.yaml lists `splitbench_schema` first in its
defaults, so every YAML value and every command-line override is merged onto a typed node. A wrong type
(`epsilon=abc`) or an unknown key fails at composition time, before any work starts. Ranges and choices
that a type cannot express (`epsilon=-1`, `generation.max_new_tokens=0`, a runner or configuration name in
a list) are checked by `validate`, which raises UserError (one line, exit code 2).

A model entry (conf/model/*.yaml, also `attack.decoder`) is typed by its kind: the file's defaults list
names the kind's schema (`- /schema/model/<kind>@_here_`, registered below from MODEL_SCHEMAS; the model and
workload schemas live in harness/group_schemas.py, which the loaders import too), so a random model cannot
be given a `hub_id`. Configuration names and what each one does come from the
configuration registry (harness/configurations.py); a configuration's YAML holds only its name and a
description.

Importing this module also registers the `sb.*` resolvers used by conf/hydra/default.yaml to name run
directories (the layout is documented there).
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Any, List, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from harness import configurations, placement, systems
from harness.checks import check_at_least, check_choice, check_per_item_bound, check_positive
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
from harness.text_corpus import paragraphs
from harness.workloads import check_workload, read_text

BASELINES = ("auto", "cpu", "gpu")
WANDB_MODES = ("offline", "online", "disabled")
LOGGERS = ("none", "wandb")
BANK_POLICIES = ("refill", "error")
SENSITIVITY_RULES = ("paper", "per_head")
SLALOM_SCALINGS = ("per_token", "per_op", "fixed")   # harness/splitee/mechanisms.py
OFFLOADABLE = ("qkv", "o", "gate_up", "lm_head")
EPN_N = ("text", "input_ids")
TIMING_MODES = ("prefix", "separate")   # runners/splitee/timing.py


@dataclass
class ConfigurationConfig:
    """One row of the paper's Table 1 (conf/configuration/*.yaml); what it does is its registry entry."""

    name: str = MISSING
    description: str = MISSING


@dataclass
class GenerationConfig:
    max_new_tokens: int = MISSING
    batch_size: int = MISSING
    # The paper generates exactly max_new_tokens (greedy, no early stop), so fidelity compares equal lengths.
    stop_at_eos: bool = MISSING


@dataclass
class EngineConfig:
    """Arguments of harness.splitee.engine.EngineSettings; `configuration`, `epsilon` and `seed` are filled
    in by the runner (one run may drive several configurations)."""

    _target_: str = MISSING
    offload: List[str] = MISSING
    bank_on_exhaustion: str = MISSING
    bank_capacity: Optional[int] = MISSING
    bank_bytes: Optional[int] = MISSING     # harness/splitee/noise_bank.py: the memory bound
    record_view: bool = MISSING
    tee_threads: Optional[int] = MISSING
    allow_cpu_fallback: bool = MISSING
    slalom_frac_bits: int = MISSING
    slalom_scaling: str = MISSING          # SLALOM_SCALINGS
    sigma_scale: float = MISSING
    sensitivity_rule: str = MISSING


@dataclass
class TimingConfig:
    configurations: List[str] = MISSING
    max_new_tokens: List[int] = MISSING
    # One untimed short generation per configuration first, so one-off costs (allocator, kernel
    # selection, lazy imports) are not charged to whichever configuration happens to run first.
    warmup: bool = MISSING
    # `prefix`: one generation per batch to the largest limit, each limit's time read as the generation
    # passes it (greedy, no early stop: the first L steps are the L-token generation); `separate`: one
    # generation per limit, as a paper's protocol reads literally. Same quantity, prefix costs 800 steps not 1,500.
    mode: str = MISSING


@dataclass
class FpErrorConfig:
    """The floating-point study (runner fp_error, paper Table 4)."""

    precisions: List[str] = MISSING
    kernels: List[str] = MISSING
    trials: int = MISSING                 # output elements per op instance (the paper: 1,000)
    rows_per_vector: int = MISSING        # weight rows per masked input vector (trials = vectors × rows)
    vectors_per_prompt: int = MISSING     # captured token positions kept per prompt and op instance
    capture_new_tokens: int = MISSING     # greedy tokens generated while capturing (their inputs count too)
    capture_batch_size: int = MISSING
    include_down: bool = MISSING          # the Down projection as a non-offloaded reference
    down_precisions: List[str] = MISSING
    threads: Optional[int] = MISSING      # torch threads for the trials


@dataclass
class ControlledErrorConfig:
    """The controlled-error experiment (runner controlled_error, paper Table 5)."""

    # Target mean absolute errors; EP1's natural level and T3 (zero) are always run as well.
    levels: List[float] = MISSING


@dataclass
class AttackCorpusConfig:
    """The attacker's auxiliary corpus (attacks/corpus.py): public text it runs through its own model copy."""

    name: str = MISSING
    source: str = MISSING                 # builtin | text | hub | random
    path: Optional[str] = MISSING         # source=text: a local UTF-8 text file (e.g. WikiText-2 raw)
    hub_id: Optional[str] = MISSING       # source=hub: a `datasets` id, e.g. wikitext
    hub_config: Optional[str] = MISSING
    split: str = MISSING
    text_field: str = MISSING
    n_train: int = MISSING
    n_val: int = MISSING
    min_tokens: int = MISSING
    max_tokens: int = MISSING


@dataclass
class AttackCaptureConfig:
    batch_size: int = MISSING
    max_new_tokens: int = MISSING         # 1: prefill only (the prompt's exposures); more adds decode steps


@dataclass
class AttackTrainConfig:
    """attacks.inversion.TrainSettings."""

    mode: str = MISSING                   # projection | body | full
    layout: str = MISSING                 # prefix (GEIA) | aligned; the LM head is always read as a prefix
    head: str = MISSING                   # lm | evidence (position-wise components; attacks/inversion.py)
    evidence_scale: float = MISSING
    window: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    decoder_lr: float = MISSING
    max_steps: int = MISSING
    max_minutes: float = MISSING
    eval_every: int = MISSING
    val_windows: int = MISSING
    warmup_steps: int = MISSING
    projection_hidden: Optional[int] = MISSING
    max_target_tokens: int = MISSING
    gen_batch_size: int = MISSING
    threads: Optional[int] = MISSING      # torch threads while training/decoding; null = torch's default


@dataclass
class AttackBayesConfig:
    enabled: bool = MISSING
    k: List[int] = MISSING
    top_k: int = MISSING
    prior: str = MISSING                  # uniform (maximum likelihood) | corpus (MAP with a unigram prior)
    rows_per_chunk: int = MISSING
    vocab_per_chunk: int = MISSING


@dataclass
class AttackControlsConfig:
    gate_margin_pp: float = MISSING       # verdict margin m: leak if ci_lo > floor + m; at chance if the interval lies within floor ± m
    positive_margin_pp: float = MISSING   # positive control: lower 95% bound of T3 token F1 >= floor + this
    per_item_bound_pp: float = MISSING    # B of the earned interval at_chance reads (metrics/equivalence.py)


@dataclass
class SequentialAttackConfig:
    """The sequential all-exposure attacker (runner sequential_attack; attacks/splitee/sequential.py Settings)."""

    mode: str = MISSING                   # teacher_forced | free_running
    prior: str = MISSING                  # none (likelihood only) | model (also MAP with the model's prior)
    layers: Optional[List[int]] = MISSING   # whose exposures are used; null = every layer
    ops: List[str] = MISSING              # of qkv, o, gate_up
    prune: Optional[List[List[int]]] = MISSING   # [layers_upto, keep(, prior_keep)] per stage; 0 = codebook; null = none
    prune_prior: Optional[int] = MISSING  # a first stage keeping the prior's K best tokens; null = none
    prune_union_prior: Optional[int] = MISSING   # the first exposure stage also keeps the prior's K best; null = no
    positions: str = MISSING              # text (after the public chat-template header) | all (from position 1)
    max_positions: Optional[int] = MISSING
    null_view: bool = MISSING             # also attack each prompt with another prompt's view (the reference)
    map_reference: str = MISSING          # MAP's verdict against: prior | null_view (MAP on the null view)
    chunk: int = MISSING                  # candidates per forward pass
    min_pruning_recall: float = MISSING   # at_chance needs every stage's pruning recall at least this
    pruning_rule: str = MISSING           # recall (min_pruning_recall) | no_decisive_miss (teacher_forced only)


@dataclass
class AttackConfig:
    """The prompt-reconstruction attack (runner attack, paper §7.4 Table 6; attacks/)."""

    setting: str = MISSING                # noise_free (t3) | noise_oblivious | noise_aware (ep1, epn, slalom)
    component: str = MISSING              # qkv | o | gate_up | composite | lm_head
    layer: int = MISSING
    decoder: Optional[ModelConfig] = MISSING  # a conf/model entry (+model@attack.decoder=NAME); null = the victim
    corpus: AttackCorpusConfig = MISSING
    capture: AttackCaptureConfig = MISSING
    train: AttackTrainConfig = MISSING
    bayes: AttackBayesConfig = MISSING
    controls: AttackControlsConfig = MISSING
    sequential: SequentialAttackConfig = MISSING


@dataclass
class PrivacyAuditConfig:
    """The empirical privacy audit (runner privacy_audit; attacks/splitee/privacy_audit.py Settings)."""

    pairs: List[str] = MISSING            # of worst_case | typical: the neighbours B of the prompt A
    trials: int = MISSING                 # engine submissions per pair, a fair coin choosing A or B
    prompt: int = MISSING                 # which of the workload's prompts gives A
    position: int = MISSING               # the differing token: this many text tokens after the public header
    suffix: int = MISSING                 # prompt tokens kept after it
    candidates: int = MISSING             # worst case: the farthest tokens at layer 0 ranked by the whole submission
    null_game: bool = MISSING             # also the null game (A against A)
    fpr: List[float] = MISSING            # target false-positive rates of the audit's thresholds
    batch_size: int = MISSING             # trials per engine submission batch


@dataclass
class RestoreConfig:
    """Restoring attack reconstructions with an instruct model (runner restore, paper §7.4.4 Table 7)."""

    source: Optional[str] = MISSING       # a finished attack run directory (its results.json + samples.jsonl)
    attackers: List[str] = MISSING        # learned | bayes: whose reconstructions to restore
    instruction: str = MISSING            # the restoration model's system prompt
    max_new_tokens: int = MISSING
    batch_size: int = MISSING
    examples: int = MISSING               # prompts shown side by side in the report (Table 7)


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
    """The keys every system shares (and SpliTEE's, which predate sections); SplitbenchConfig adds each
    system's section after `restore`."""

    model: ModelConfig = MISSING
    configuration: ConfigurationConfig = MISSING
    workload: WorkloadConfig = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = MISSING

    runner: str = MISSING
    experiment_name: str = MISSING
    seed: int = MISSING
    epsilon: float = MISSING
    epn_n: str = MISSING                     # text | input_ids (EPN_N)
    mask_seeds: Optional[List[int]] = MISSING
    dp_delta: float = MISSING                # δ of the composed masks' (ε, δ)-DP (harness/splitee/accounting.py)
    baseline: str = MISSING
    generation: GenerationConfig = MISSING
    engine: EngineConfig = MISSING
    timing: TimingConfig = MISSING
    fp_error: FpErrorConfig = MISSING
    controlled_error: ControlledErrorConfig = MISSING
    attack: AttackConfig = MISSING
    privacy_audit: PrivacyAuditConfig = MISSING
    restore: RestoreConfig = MISSING
    # The systems' own sections come here, from the systems registry (SYSTEM_SECTIONS below).
    semantic_model: Optional[str] = MISSING
    tags: List[str] = MISSING
    rerun: bool = MISSING


# The systems' sections and the modules that type and check them, from the systems registry
# (harness/systems.py): each entry's section, typed by its `module:Class` and checked by the module's check().
SYSTEM_SECTIONS = {section: importlib.import_module(schema.partition(":")[0])
                   for section, (_, schema) in systems.sections().items()}
# The system each section belongs to (a cross-system entry's section: that entry's name).
SECTION_SYSTEMS = {section: system for section, (system, _) in systems.sections().items()}


def _splitbench_config() -> type:
    """The schema of the whole config: the shared keys with every system's section after `restore` (a
    section's key typed by its dataclass, MISSING until conf/SECTION/default.yaml sets it)."""
    shared = [(f.name, hint, field(default=MISSING)) for f, hint in
              zip(fields(_SharedConfig), get_type_hints(_SharedConfig).values())]
    at = next(i for i, f in enumerate(shared) if f[0] == "restore") + 1
    sections = [(section, getattr(SYSTEM_SECTIONS[section], schema.partition(":")[2]), field(default=MISSING))
                for section, (_, schema) in systems.sections().items()]
    node = make_dataclass("SplitbenchConfig", [*shared[:at], *sections, *shared[at:]])
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
    plain_dirname("experiment_name", cfg.experiment_name)
    check_choice("configuration.name", cfg.configuration.name, configurations.NAMES)
    _check_system(cfg, runners[cfg.runner])
    check_positive("epsilon", cfg.epsilon)
    check_choice("epn_n", cfg.epn_n, EPN_N)
    seeds = None if cfg.mask_seeds is None else list(cfg.mask_seeds)
    if seeds is not None and (not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds)):
        raise UserError(f"mask_seeds must be null or a non-empty list of distinct integers >= 0, got {seeds}")
    if not 0.0 < cfg.dp_delta < 1.0:
        raise UserError(f"dp_delta must lie in (0, 1), got {cfg.dp_delta}")
    check_at_least("generation.max_new_tokens", cfg.generation.max_new_tokens, 1)
    check_at_least("generation.batch_size", cfg.generation.batch_size, 1)
    check_choice("baseline", cfg.baseline, BASELINES)
    _check_engine(cfg.engine)
    timing = cfg.timing
    splitee = configurations.names()
    unknown = [c for c in timing.configurations if c not in splitee]
    if unknown or not timing.configurations:
        raise UserError(f"timing.configurations must be a non-empty list from {', '.join(splitee)}, got {list(timing.configurations)}")
    if not timing.max_new_tokens or min(timing.max_new_tokens) < 1:
        raise UserError(f"timing.max_new_tokens must be a non-empty list of integers >= 1, got {list(timing.max_new_tokens)}")
    for key in ("configurations", "max_new_tokens"):   # a repeat would time the same cell twice: duplicate rows
        values = list(timing[key])
        if len(set(values)) != len(values):
            raise UserError(f"timing.{key} must be a list of distinct values, got {values}")
    if timing.mode not in TIMING_MODES:
        raise UserError(f"timing.mode={timing.mode!r} is not one of {', '.join(TIMING_MODES)}")
    _check_fp_error(cfg)
    _check_attack(cfg.attack)
    if cfg.runner == "sequential_attack":   # the one runner that reads the null view
        _check_sequential_reference(cfg.attack.sequential)
    _check_privacy_audit(cfg.privacy_audit)
    _check_restore(cfg)
    for section, module in SYSTEM_SECTIONS.items():
        module.check(cfg[section], cfg)
    check_choice("logger.name", cfg.logger.name, LOGGERS)
    check_choice("logger.mode", cfg.logger.mode, WANDB_MODES)
    check_model("model", cfg.model)
    _check_unknown_keys(cfg, "")
    _check_environment(cfg)
    _check_devices(cfg)
    _check_input_files(cfg)
    _check_shared_tokenizers(cfg)


def _check_shared_tokenizers(cfg: DictConfig) -> None:
    """Two models that must read and write the same token ids (the attack's decoder and its victim, the
    collab edge and cloud) are compared by their tokenizers before either model's weights load: a mismatch
    found after loading cost minutes."""
    pairs = []
    if cfg.runner == "attack" and cfg.attack.decoder is not None:
        pairs.append(("attack.decoder", cfg.attack.decoder, "the victim", "the attacker's decoder must use the "
                      "victim's token ids (choose a decoder of the same model family)"))
    if cfg.runner == "collab" and cfg.collab.get("cloud") is not None:
        pairs.append(("collab.cloud", cfg.collab.cloud, "the edge model", "collaborative decoding fuses "
                      "distributions over one shared vocabulary"))
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
# none (the engine places its parts itself), and fidelity runs a sanitiser's mechanism only, never its model
# placement.
RUNNER_PLACEMENTS: dict[str, tuple[str, ...]] = {r.name: r.placements for _, r in systems.runners() if r.placements}


def placements(cfg: DictConfig) -> dict[str, DictConfig]:
    """The placement nodes this run's runner reads, by key (RUNNER_PLACEMENTS)."""
    return {key: OmegaConf.select(cfg, key) for key in RUNNER_PLACEMENTS.get(str(cfg.runner), ())}


def _check_devices(cfg: DictConfig) -> None:
    """A GPU the run asks for exists, before any model loads. Torch is imported only when a placement names
    a GPU, so composing and refusing configs stays torch-free otherwise."""
    wanted = {key: node for key, node in placements(cfg).items() if node.device != "cpu"}
    if wanted:
        from harness.devices import resolve_device

        for key, node in wanted.items():
            resolve_device(f"{key}.device", str(node.device))


def _check_input_files(cfg: DictConfig) -> None:
    """The files the run reads, checked before any model loads: the workload's JSONL and, for the attack
    runner, a text corpus (missing, a directory, not UTF-8, empty)."""
    check_workload(cfg.workload)
    corpus = cfg.attack.corpus
    if cfg.runner != "attack" or corpus.source != "text":
        return
    if not corpus.path:
        raise UserError("attack.corpus.source=text needs attack.corpus.path=/path/to/file.txt")
    path = Path(str(corpus.path)).expanduser()
    text, _ = read_text(path, "attack.corpus.path")
    if not paragraphs(text):
        raise UserError(f"attack.corpus.path={path} holds no text (only blank lines, '#' comments or headings)")


FP_PRECISIONS = ("fp64", "fp32", "fp16", "bf16")
FP_KERNELS = ("library", "sequential")


def _check_fp_error(cfg: DictConfig) -> None:
    fp = cfg.fp_error
    for key, allowed in (("precisions", FP_PRECISIONS), ("down_precisions", FP_PRECISIONS), ("kernels", FP_KERNELS)):
        values = list(fp[key])
        if (not values and key != "down_precisions") or any(v not in allowed for v in values) or len(set(values)) != len(values):
            raise UserError(f"fp_error.{key} must be a list of distinct values from {', '.join(allowed)}, got {values}")
    for key in ("trials", "rows_per_vector", "vectors_per_prompt", "capture_new_tokens", "capture_batch_size"):
        check_at_least(f"fp_error.{key}", fp[key], 1)
    check_at_least("fp_error.threads", fp.threads, 1, nullable=True)
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
               ("train.head", attack.train.head, ("lm", "evidence")),
               ("bayes.prior", attack.bayes.prior, ("uniform", "corpus")))
    for key, value, allowed in choices:
        check_choice(f"attack.{key}", value, allowed)
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
        check_at_least(f"attack.{key}", value, least)
    if attack.corpus.max_tokens < attack.corpus.min_tokens:
        raise UserError(f"attack.corpus.max_tokens={attack.corpus.max_tokens} is below min_tokens={attack.corpus.min_tokens}")
    for key in ("lr", "decoder_lr", "max_minutes", "evidence_scale"):
        check_positive(f"attack.train.{key}", attack.train[key])
    check_at_least("attack.train.threads", attack.train.threads, 1, nullable=True)
    check_at_least("attack.train.projection_hidden", attack.train.projection_hidden, 1, nullable=True)
    if not attack.bayes.k or min(attack.bayes.k) < 1:
        raise UserError(f"attack.bayes.k must be a non-empty list of integers >= 1, got {list(attack.bayes.k)}")
    for key in ("gate_margin_pp", "positive_margin_pp"):
        check_at_least(f"attack.controls.{key}", attack.controls[key], 0)
    check_per_item_bound("attack.controls.per_item_bound_pp", float(attack.controls.per_item_bound_pp))
    if attack.decoder is not None:
        check_model("attack.decoder", attack.decoder)
    _check_sequential(attack.sequential)


SEQUENTIAL_MODES = ("teacher_forced", "free_running")   # attacks/splitee/sequential.py
SEQUENTIAL_PRIORS = ("none", "model")
SEQUENTIAL_OPS = ("qkv", "o", "gate_up")
SEQUENTIAL_POSITIONS = ("text", "all")
SEQUENTIAL_MAP_REFERENCES = ("prior", "null_view")
SEQUENTIAL_PRUNING_RULES = ("recall", "no_decisive_miss")


def _check_sequential(seq: DictConfig) -> None:
    """What attack.sequential can be told without the model (its layers against the model: run time)."""
    check_choice("attack.sequential.mode", seq.mode, SEQUENTIAL_MODES)
    check_choice("attack.sequential.prior", seq.prior, SEQUENTIAL_PRIORS)
    check_choice("attack.sequential.positions", seq.positions, SEQUENTIAL_POSITIONS)
    check_choice("attack.sequential.map_reference", seq.map_reference, SEQUENTIAL_MAP_REFERENCES)
    check_choice("attack.sequential.pruning_rule", seq.pruning_rule, SEQUENTIAL_PRUNING_RULES)
    ops = list(seq.ops)
    if not ops or any(op not in SEQUENTIAL_OPS for op in ops) or len(set(ops)) != len(ops):
        raise UserError(f"attack.sequential.ops must be distinct ops from {', '.join(SEQUENTIAL_OPS)}, got {ops}")
    layers = None if seq.layers is None else list(seq.layers)
    if layers is not None and (not layers or min(layers) < 0 or len(set(layers)) != len(layers)):
        raise UserError(f"attack.sequential.layers must be null (all) or distinct layers >= 0, got {layers}")
    for stage in seq.prune or ():
        if len(stage) not in (2, 3):
            raise UserError("attack.sequential.prune: each stage is [layers_upto, keep] or [layers_upto, keep, "
                            f"prior_keep], got {list(stage)}")
        if min(stage[1:]) < 1:
            raise UserError(f"attack.sequential.prune: a stage keeps {list(stage)[1:]} candidates; a pruning width "
                            "must be >= 1")
        if stage[0] < 0:
            raise UserError(f"attack.sequential.prune: stage depth {stage[0]} must be >= 0")
    check_at_least("attack.sequential.prune_prior", seq.prune_prior, 1, nullable=True)
    check_at_least("attack.sequential.prune_union_prior", seq.prune_union_prior, 1, nullable=True)
    check_at_least("attack.sequential.max_positions", seq.max_positions, 1, nullable=True)
    check_at_least("attack.sequential.chunk", seq.chunk, 1)
    if not 0 < seq.min_pruning_recall <= 1:
        raise UserError(f"attack.sequential.min_pruning_recall must lie in (0, 1], got {seq.min_pruning_recall}")


def _check_sequential_reference(seq: DictConfig) -> None:
    """MAP judged against itself on a null view needs that view attacked, and the no-decisive-miss rule the
    true prefix (attacks/splitee/sequential.check)."""
    if seq.prior == "model" and seq.map_reference == "null_view" and not seq.null_view:
        raise UserError("attack.sequential.map_reference=null_view judges MAP against MAP on a null view, which "
                        "needs attack.sequential.null_view=true (or map_reference=prior)")
    if seq.pruning_rule == "no_decisive_miss" and seq.mode != "teacher_forced":
        raise UserError("attack.sequential.pruning_rule=no_decisive_miss scores the truth after the true prefix, "
                        "which needs attack.sequential.mode=teacher_forced")


AUDIT_PAIRS = ("worst_case", "typical")   # attacks/splitee/privacy_audit.py PAIRS


def _check_privacy_audit(audit: DictConfig) -> None:
    """What no audit can run with; the prompt's length is checked at run time (attacks/splitee/privacy_audit.py)."""
    pairs = list(audit.pairs)
    if not pairs or any(p not in AUDIT_PAIRS for p in pairs) or len(set(pairs)) != len(pairs):
        raise UserError(f"privacy_audit.pairs must be distinct values from {', '.join(AUDIT_PAIRS)}, got {pairs}")
    # each half of the audit (calibration, evaluation) needs trials of both labels
    check_at_least("privacy_audit.trials", audit.trials, 16)
    for key in ("prompt", "position", "suffix"):
        check_at_least(f"privacy_audit.{key}", audit[key], 0)
    for key in ("candidates", "batch_size"):
        check_at_least(f"privacy_audit.{key}", audit[key], 1)
    fpr = list(audit.fpr)
    if not fpr or any(not 0 < f < 1 for f in fpr) or len(set(fpr)) != len(fpr):
        raise UserError(f"privacy_audit.fpr must be distinct false-positive rates in (0, 1), got {fpr}")


RESTORE_ATTACKERS = ("learned", "bayes")


def _check_restore(cfg: DictConfig) -> None:
    """Ranges of the restore section; the source run itself is checked when the job reads it (its files)."""
    r = cfg.restore
    if not r.attackers or any(a not in RESTORE_ATTACKERS for a in r.attackers):
        raise UserError(f"restore.attackers must be a non-empty list from {', '.join(RESTORE_ATTACKERS)}, "
                        f"got {list(r.attackers)}")
    for key in ("max_new_tokens", "batch_size"):
        check_at_least(f"restore.{key}", r[key], 1)
    check_at_least("restore.examples", r.examples, 0)
    if not r.instruction.strip():
        raise UserError("restore.instruction must not be empty")


def _check_engine(engine: DictConfig) -> None:
    bad = [op for op in engine.offload if op not in OFFLOADABLE]
    if bad:
        raise UserError(f"engine.offload: unknown op(s) {bad}; choose from {', '.join(OFFLOADABLE)}")
    check_choice("engine.bank_on_exhaustion", engine.bank_on_exhaustion, BANK_POLICIES)
    check_at_least("engine.bank_capacity", engine.bank_capacity, 1, nullable=True)
    if engine.bank_bytes is not None and engine.bank_bytes < 1:
        raise UserError(f"engine.bank_bytes must be >= 1 (bytes) or null, got {engine.bank_bytes}")
    check_at_least("engine.tee_threads", engine.tee_threads, 1, nullable=True)
    if not 1 <= engine.slalom_frac_bits <= 16:
        raise UserError(f"engine.slalom_frac_bits must be in [1, 16], got {engine.slalom_frac_bits}")
    check_choice("engine.slalom_scaling", engine.slalom_scaling, SLALOM_SCALINGS)
    check_at_least("engine.sigma_scale", engine.sigma_scale, 0)
    check_choice("engine.sensitivity_rule", engine.sensitivity_rule, SENSITIVITY_RULES)


# (path, value, hashed as): a value the config hash takes in under an older spelling. The engine moved from
# harness/split/ into harness/splitee/ (issue 30); every SpliTEE run finished before the move hashed
# `engine._target_` as the old module path, so the new path is hashed as that string and those runs keep
# their config hash (runners/run.py skips them as complete, not stale). results.json records the path as run.
HASHED_AS: tuple[tuple[str, Any, Any], ...] = (
    ("engine._target_", "harness.splitee.engine.EngineSettings", "harness.split.engine.EngineSettings"),
)


def semantic_config(cfg: DictConfig, keys: Sequence[str], *, ignore: Sequence[str] = (),
                    unhashed: Sequence[tuple[str, Any]] = (), **replace: Any) -> dict[str, Any]:
    """The resolved config's `keys` (an allow-list: the keys the run reads, runners/identity.py; top-level or
    dotted, `engine.sigma_scale` keeping that part of `engine` only) less the `ignore` parts and the
    `unhashed` (path, value) pairs at their value, the HASHED_AS values under their older spelling, with
    `replace` applied: what the config hash of a run is computed over (runners normalise ε). A key the run
    does not read, a section added later included, never enters."""
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    out: dict[str, Any] = {}
    for key in keys:
        *parents, leaf = key.split(".")
        source: Any = resolved
        for part in parents:
            source = source[part]
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = source[leaf]
    for key in ignore:
        _pop_path(out, key)
    for key, value in unhashed:
        if _get_path(out, key) == value:
            _pop_path(out, key)
    for key, value, hashed_as in HASHED_AS:
        *parents, leaf = key.split(".")
        node = _get_path(out, ".".join(parents)) if parents else out
        if isinstance(node, dict) and node.get(leaf) == value:
            node[leaf] = hashed_as
    out.update(replace)
    _drop_placements(out, set(RUNNER_PLACEMENTS.get(str(resolved.get("runner")), ())))
    return out


def _get_path(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _pop_path(tree: dict[str, Any], key: str) -> None:
    *parents, leaf = key.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def _drop_placements(semantic: dict[str, Any], read: set[str]) -> None:
    """Leave out of the hash a placement the runner never reads, and one on the CPU in float32: what every run
    computed before placements existed, so those finished runs keep their hash. Any other placement changes
    the numbers (another device's kernels, another precision) and stays in."""
    for runner_keys in RUNNER_PLACEMENTS.values():
        for key in runner_keys:
            *parents, leaf = key.split(".")
            node: Any = semantic
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and isinstance(node.get(leaf), dict) and (
                    key not in read or placement.is_cpu_float32(node[leaf])):
                del node[leaf]
            if (isinstance(node, dict) and parents and parents[-1] == "placement" and not node
                    and isinstance(semantic.get(parents[0]), dict)):
                semantic[parents[0]].pop("placement", None)


# ---------------------------------------------------------------------------------------------------
# Resolvers naming run directories (used in conf/hydra/default.yaml and conf/experiment/timing*.yaml)
# ---------------------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+\-]")
_MAX_DIRNAME = 120
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def plain_dirname(key: Any, value: Any) -> str:
    """`value` as it is when it is one plain path component (letters, digits, '.', '_', '-', not starting with
    '.'), else a UserError: `experiment_name=../..` would put the runs outside paths.output_dir, and Hydra
    makes the directory from this name before any of splitbench's checks run."""
    text = str(value)
    if not _PLAIN_NAME.fullmatch(text) or len(text) > _MAX_DIRNAME:
        raise UserError(f"{key}={text!r} must be a plain name (letters, digits, '.', '_', '-'; it names a directory "
                        f"under paths.output_dir)")
    return text


def eps_dirname(configuration: Any, epsilon: Any) -> str:
    """`eps=<ε>` when the configuration uses ε (its registry entry says so), else `eps=na`, so an ε sweep
    over a configuration that ignores ε lands every job in one directory (and all but the first are
    skipped as complete). An unknown name gets `eps=na` here and is rejected by `validate` in one line."""
    entry = configurations.REGISTRY.get(str(configuration))
    return eps_label(epsilon) if entry is not None and entry.uses_epsilon else "eps=na"


def eps_label(epsilon: Any) -> str:
    """`eps=<ε>` with ε in its shortest form, so epsilon=1 and epsilon=1.0 name one directory."""
    return f"eps={float(epsilon):g}"


def overrides_dirname(override_dirname: Any, task_overrides: Any = ()) -> str:
    """The remaining semantic overrides as one safe path component ("default" when there are none).

    Characters that would nest or escape directories (`/`, spaces, ...) become `_`; names longer than
    120 characters keep a prefix and a short hash so distinct overrides never share a directory.
    `task_overrides` (hydra.overrides.task, the command line's overrides) adds a model chosen for another
    place (`+model@attack.decoder=NAME`, `model@collab.cloud=NAME`): Hydra leaves it out of override_dirname
    with the `model` group it belongs to, and its runs would share the default run's directory.
    """
    placed = sorted(str(o).lstrip("+~") for o in (task_overrides or ()) if str(o).lstrip("+~").startswith("model@"))
    text = ",".join(p for p in [str(override_dirname or ""), *placed] if p)
    if not text:
        return "default"
    safe = _UNSAFE.sub("_", text)
    if safe != text or len(safe) > _MAX_DIRNAME:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        safe = f"{safe[:_MAX_DIRNAME - 11]}-{digest}"
    return safe


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("sb.eps_dir", eps_dirname, replace=True)
    OmegaConf.register_new_resolver("sb.eps", eps_label, replace=True)
    OmegaConf.register_new_resolver("sb.overrides_dir", overrides_dirname, replace=True)
    OmegaConf.register_new_resolver("sb.plain", plain_dirname, replace=True)


register_configs()
register_resolvers()
