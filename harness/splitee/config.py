"""The schema of SpliTEE's options (paper 000; conf/splitee/default.yaml): types only, every value in the YAML.

SpliTEE's keys predate per-system sections, so they sit at the top level of the config (engine.*, attack.*,
generation.*, ...): SpliteeConfig's fields are spliced into harness/schema.py's SplitbenchConfig beside the keys
every system shares, and `check(cfg, cfg)` gets the whole config as its "section". Every finished run keeps its
hash and every documented override its path.

Torch-free: harness/schema.py imports it to type the keys and calls `check` from its `validate`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig

from harness import configurations
from harness.checks import check_at_least, check_choice, check_per_item_bound, check_positive
from harness.errors import UserError
from harness.group_schemas import ModelConfig, check_model
from harness.text_corpus import paragraphs
from harness.workloads import read_text

BASELINES = ("auto", "cpu", "gpu")
BANK_POLICIES = ("refill", "error")
SENSITIVITY_RULES = ("paper", "per_head")
SLALOM_SCALINGS = ("per_token", "per_op", "fixed")   # harness/splitee/mechanisms.py
OFFLOADABLE = ("qkv", "o", "gate_up", "lm_head")
EPN_N = ("text", "input_ids")
TIMING_MODES = ("prefix", "separate")   # runners/splitee/timing.py


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
class SpliteeConfig:
    """SpliTEE's keys, at the top level of the config (harness/schema.py splices these fields in after `epsilon`)."""

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


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise UserError (one line) for the first of SpliTEE's values out of range; `section` is the whole config
    (SpliTEE's keys sit at its top level)."""
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
    _check_timing(cfg.timing)
    _check_fp_error(cfg)
    _check_attack(cfg.attack)
    if cfg.runner == "sequential_attack":   # the one runner that reads the null view
        _check_sequential_reference(cfg.attack.sequential)
    _check_privacy_audit(cfg.privacy_audit)
    _check_restore(cfg)


def check_files(section: DictConfig, cfg: DictConfig) -> None:
    """The attack runner's text corpus (missing, a directory, not UTF-8, empty), checked with the other files
    a run reads, before any model loads."""
    corpus = cfg.attack.corpus
    if cfg.runner != "attack" or corpus.source != "text":
        return
    if not corpus.path:
        raise UserError("attack.corpus.source=text needs attack.corpus.path=/path/to/file.txt")
    path = Path(str(corpus.path)).expanduser()
    text, _ = read_text(path, "attack.corpus.path")
    if not paragraphs(text):
        raise UserError(f"attack.corpus.path={path} holds no text (only blank lines, '#' comments or headings)")


def tokenizer_pairs(section: DictConfig, cfg: DictConfig) -> list[tuple[str, Any, str, str]]:
    """(key, model entry, whose tokenizer, why) for a model that must share the victim's token ids."""
    if cfg.runner == "attack" and cfg.attack.decoder is not None:
        return [("attack.decoder", cfg.attack.decoder, "the victim", "the attacker's decoder must use the "
                 "victim's token ids (choose a decoder of the same model family)")]
    return []


def _check_timing(timing: DictConfig) -> None:
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

