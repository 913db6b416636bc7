"""The schema of the `splitft` config section (split federated fine-tuning, paper 002): types only, every
value in conf/splitft/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig

from harness import placement as placement_check
from harness.checks import check_at_least, check_choice, check_local_file, check_per_item_bound, check_positive
from harness.errors import UserError
from harness.placement import Placement

DATA_SOURCES = ("builtin", "text", "jsonl", "hub")
PARTITIONS = ("iid", "dirichlet")
OPTIMIZERS = ("adamw", "sgd")
PRIVACY_TERMS = ("capped_ce", "entropy")       # harness/splitft/privpair.py
W2_LOSSES = ("mse", "mse_task")
W2_KINDS = ("learned", "identity")
COUPLINGS = ("relative", "absolute")
BISR_INITS = ("label", "sip", "random", "mean")       # attacks/splitft/bisr.py
BISR_WEIGHTS = ("client", "pretrained")
BISR_B_WEIGHTS = ("step", "round_start")  # attacks/splitft/bisr_backward.py: the step's C, or the round's global C
INVERTER_MODES = ("projection", "body", "full")  # attacks/inversion.py MODES, LAYOUTS, HEADS (torch-free copy)
INVERTER_LAYOUTS = ("prefix", "aligned")
INVERTER_HEADS = ("lm", "evidence")
RUNTIMES = ("simulation", "split_deployment")
# The configurations the split deployment (harness/splitft/split_deployment.py) runs, and why each other one
# cannot be split across processes: one line each, the reason `splitft.runtime=split_deployment` gives. The
# obfuscating defences' H and attack truth (B on the clean s_A) come from the deployment's measurement path,
# outside the adversary view (split_deployment.py `Evaluator`).
SPLIT_DEPLOYMENT_CONFIGURATIONS = ("splitft_none", "nopeek", "smashed_dp_gaussian", "smashed_dp_laplace", "embedding_dx",
                                   "privpair")
NOT_SPLIT = {
    "splitft_central": "it is the centralised reference: one party holds the whole model, nothing is split",
}


def split_deployment_refusal(configuration: str) -> str | None:
    """The one-line reason the split deployment refuses `configuration`, or None if it runs it."""
    if configuration in SPLIT_DEPLOYMENT_CONFIGURATIONS:
        return None
    reason = NOT_SPLIT.get(configuration, "it is not a split fine-tuning defence")
    return (f"splitft.runtime=split_deployment runs {', '.join(SPLIT_DEPLOYMENT_CONFIGURATIONS)}; {configuration} "
            f"cannot be split across processes: {reason} (use splitft.runtime=simulation)")


@dataclass
class SplitFtLoraConfig:
    enabled: bool = MISSING                 # false: A and C train fully; true: peft LoRA on A's and C's blocks
    r: int = MISSING
    alpha: float = MISSING
    target_modules: List[str] = MISSING


@dataclass
class SplitFtDataConfig:
    source: str = MISSING                   # DATA_SOURCES
    path: Optional[str] = MISSING           # text: a UTF-8 file (WikiText-2 raw); jsonl: one record a line
    text_field: str = MISSING               # jsonl / hub: the field holding the text (Dolly: output / response)
    hub_id: Optional[str] = MISSING
    hub_config: Optional[str] = MISSING
    split: str = MISSING
    seq_len: int = MISSING                  # tokens per training block
    n_train: int = MISSING                  # training blocks over all clients
    n_heldout: int = MISSING                # held-out blocks (utility)
    n_align: int = MISSING                  # D_align: public blocks for PrivPair's burst alignment
    partition: str = MISSING                # PARTITIONS
    dirichlet_alpha: float = MISSING
    n_topics: int = MISSING                 # contiguous stream slices the Dirichlet split deals out


@dataclass
class SplitFtPrivPairConfig:
    hidden: int = MISSING                   # width of W1's and W2's residual MLPs
    beta: float = MISSING                   # weight of W1's privacy term
    privacy_term: str = MISSING             # PRIVACY_TERMS
    coupling: str = MISSING                 # COUPLINGS: λ·‖δ_A‖²/‖s_A‖² or λ·‖δ_A‖²
    w2_loss: str = MISSING                  # W2_LOSSES
    w2: str = MISSING                       # W2_KINDS: the trained recovery, or ŝ_B = s'_B (the ablation)
    align_every: int = MISSING              # P: local steps between bursts
    align_steps: int = MISSING              # adapter steps per burst
    warmup_align_steps: int = MISSING       # the first burst, before the first private step
    align_lr: float = MISSING
    align_batch_size: int = MISSING


@dataclass
class SplitFtDpConfig:
    delta: float = MISSING                  # the Gaussian mechanism's δ
    clip_norm: Optional[float] = MISSING    # per-token clip of s_A; null: calibrated on D_align (public)


@dataclass
class SplitFtGradUpConfig:
    clip: Optional[float] = MISSING         # per-token ℓ2 clip of ∂L/∂s'_B; null: no guard
    noise_multiplier: float = MISSING       # N(0, (noise_multiplier·clip)² I) after the clip


@dataclass
class SplitFtNoPeekConfig:
    max_tokens: int = MISSING               # token rows the distance correlation is computed over


@dataclass
class SplitFtRecordConfig:
    last_rounds: int = MISSING              # the final rounds whose steps enter the adversary view
    steps_per_round: int = MISSING          # the last local steps of each such round, per client


@dataclass
class SplitFtEiaConfig:
    steps: int = MISSING
    lr: float = MISSING
    max_examples: int = MISSING


@dataclass
class SplitFtBisrConfig:
    enabled: bool = MISSING                 # BiSR's forward attack (attacks/splitft/bisr.py)
    steps: int = MISSING
    lr: float = MISSING
    max_examples: int = MISSING
    init: str = MISSING                     # BISR_INITS
    weights: str = MISSING                  # BISR_WEIGHTS: the client's recorded A, or the pretrained one
    backward_steps: int = MISSING           # BiSR(b) (attacks/splitft/bisr_backward.py); 0 = not run
    backward_lr: float = MISSING
    backward_beta: float = MISSING          # the gradient distance: β·L2² + (1 − β)·L1
    backward_temperature: float = MISSING   # the soft labels start at softmax(f_C(s'_B) / temperature)
    backward_prior: bool = MISSING          # under grad_up noise: MAP (likelihood + the decoding's prior)
    backward_weights: List[str] = MISSING   # BISR_B_WEIGHTS: the C each BiSR(b) reading differentiates


@dataclass
class SplitFtInverterConfig:
    enabled: bool = MISSING                 # the learned inverter on s'_A (attacks/splitft/inverter.py)
    mode: str = MISSING                     # attacks/inversion.py MODES
    layout: str = MISSING                   # LAYOUTS
    head: str = MISSING                     # HEADS
    max_steps: int = MISSING
    max_minutes: float = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    max_examples: int = MISSING
    negative_control: bool = MISSING        # also train on shuffled pairs (without it the verdict cannot leak)


@dataclass
class SplitFtAttackConfig:
    gate_margin_pp: float = MISSING
    positive_margin_pp: float = MISSING
    per_item_bound_pp: float = MISSING   # B of the earned interval at_chance reads (metrics/equivalence.py)
    eia: SplitFtEiaConfig = MISSING
    bisr: SplitFtBisrConfig = MISSING
    inverter: SplitFtInverterConfig = MISSING


@dataclass
class SplitFtConfig:
    """Fields with MISSING defaults; their values and comments live in conf/splitft/default.yaml."""

    k: int = MISSING
    m: int = MISSING
    n_clients: int = MISSING
    rounds: int = MISSING
    local_steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    optimizer: str = MISSING
    train_head: bool = MISSING              # false: A stays pretrained, only C trains, no gradient goes up
    threads: Optional[int] = MISSING
    ray_cpus: Optional[int] = MISSING
    save_view: bool = MISSING               # write the adversary view (view.pt) beside the results
    runtime: str = MISSING                  # RUNTIMES: B in each ClientApp, or in the ServerApp (split_deployment)
    placement: Placement = MISSING          # the model's device and dtype (harness/placement.py)
    lora: SplitFtLoraConfig = MISSING
    data: SplitFtDataConfig = MISSING
    privpair: SplitFtPrivPairConfig = MISSING
    dp: SplitFtDpConfig = MISSING
    grad_up: SplitFtGradUpConfig = MISSING
    nopeek: SplitFtNoPeekConfig = MISSING
    record: SplitFtRecordConfig = MISSING
    attack: SplitFtAttackConfig = MISSING


# The public data set each file source stands for, read through `datasets` instead of a local copy.
DATA_FROM_HUB = {
    "text": "splitft.data.source=hub splitft.data.hub_id=Salesforce/wikitext splitft.data.hub_config=wikitext-2-raw-v1 "
            "splitft.data.split=test splitft.data.text_field=text (WikiText-2)",
    "jsonl": "splitft.data.source=hub splitft.data.hub_id=databricks/databricks-dolly-15k "
             "splitft.data.text_field=response (Dolly)",
}


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range. The cut against
    the model's depth (m <= L) is checked by harness.partition.Partition once the model is loaded
    (any composed model may be paired with any cut, so composition alone cannot refuse it)."""
    s = section
    if not 1 <= s.k < s.m:
        raise UserError(f"splitft cut points must satisfy 1 <= k < m, got k={s.k}, m={s.m}")
    check_at_least("splitft.n_clients", s.n_clients, 1)
    check_at_least("splitft.rounds", s.rounds, 1)
    check_at_least("splitft.local_steps", s.local_steps, 1)
    check_at_least("splitft.batch_size", s.batch_size, 1)
    check_positive("splitft.lr", s.lr)
    check_choice("splitft.optimizer", s.optimizer, OPTIMIZERS)
    check_at_least("splitft.threads", s.threads, 1, nullable=True)
    placement_check.check("splitft.placement", s.placement, shardable=False)
    check_at_least("splitft.ray_cpus", s.ray_cpus, 1, nullable=True)
    check_choice("splitft.runtime", s.runtime, RUNTIMES)
    if s.runtime == "split_deployment" and (refusal := split_deployment_refusal(cfg.configuration.name)):
        raise UserError(refusal)
    if s.lora.enabled:
        check_at_least("splitft.lora.r", s.lora.r, 1)
        check_positive("splitft.lora.alpha", s.lora.alpha)
    d = s.data
    check_choice("splitft.data.source", d.source, DATA_SOURCES)
    if d.source in ("text", "jsonl") and not d.path:
        raise UserError(f"splitft.data.source={d.source} needs splitft.data.path=/path/to/file")
    if d.source == "hub" and not d.hub_id:
        raise UserError("splitft.data.source=hub needs splitft.data.hub_id (e.g. wikitext)")
    # Before any model loads, and with the way forward: experiment=splitft's default file is not in a clone.
    if cfg.runner == "splitft" and d.source in ("text", "jsonl"):
        check_local_file("splitft.data.path", d.path, DATA_FROM_HUB[d.source])
    check_at_least("splitft.data.seq_len", d.seq_len, 2)
    for key in ("n_train", "n_heldout", "n_align"):
        check_at_least(f"splitft.data.{key}", d[key], 1)
    if d.n_train < s.n_clients:
        raise UserError(f"splitft.data.n_train={d.n_train} gives some of the {s.n_clients} clients no data")
    check_choice("splitft.data.partition", d.partition, PARTITIONS)
    check_positive("splitft.data.dirichlet_alpha", d.dirichlet_alpha)
    check_at_least("splitft.data.n_topics", d.n_topics, 1)
    p = s.privpair
    check_at_least("splitft.privpair.hidden", p.hidden, 1)
    check_at_least("splitft.privpair.beta", p.beta, 0)
    check_choice("splitft.privpair.privacy_term", p.privacy_term, PRIVACY_TERMS)
    check_choice("splitft.privpair.coupling", p.coupling, COUPLINGS)
    check_choice("splitft.privpair.w2_loss", p.w2_loss, W2_LOSSES)
    check_choice("splitft.privpair.w2", p.w2, W2_KINDS)
    check_at_least("splitft.privpair.align_every", p.align_every, 1)
    check_at_least("splitft.privpair.align_steps", p.align_steps, 0)
    check_at_least("splitft.privpair.warmup_align_steps", p.warmup_align_steps, 0)
    check_positive("splitft.privpair.align_lr", p.align_lr)
    check_at_least("splitft.privpair.align_batch_size", p.align_batch_size, 1)
    if not 0 < s.dp.delta < 1:
        raise UserError(f"splitft.dp.delta must lie in (0, 1), got {s.dp.delta}")
    if s.dp.clip_norm is not None:
        check_positive("splitft.dp.clip_norm", s.dp.clip_norm)
    if not s.train_head:
        if s.grad_up.clip is not None:
            raise UserError("splitft.grad_up guards a gradient that is never sent with splitft.train_head=false "
                            "(A frozen: nothing goes back up); drop one of them")
        if cfg.configuration.name == "nopeek":
            raise UserError("nopeek regularises A, which splitft.train_head=false freezes; "
                            "use splitft.train_head=true or another configuration")
    if s.grad_up.clip is not None:
        if cfg.configuration.name == "splitft_central":
            raise UserError("splitft.grad_up guards a gradient that splitft_central never sends; "
                            "drop it or pick a split configuration")
        check_positive("splitft.grad_up.clip", s.grad_up.clip)
    check_at_least("splitft.grad_up.noise_multiplier", s.grad_up.noise_multiplier, 0)
    if s.grad_up.noise_multiplier > 0 and s.grad_up.clip is None:
        raise UserError("splitft.grad_up.noise_multiplier > 0 needs splitft.grad_up.clip "
                        "(the noise is a multiple of it)")
    check_at_least("splitft.nopeek.max_tokens", s.nopeek.max_tokens, 2)
    check_at_least("splitft.record.last_rounds", s.record.last_rounds, 1)
    check_at_least("splitft.record.steps_per_round", s.record.steps_per_round, 1)
    if s.record.steps_per_round > s.local_steps:
        raise UserError(f"splitft.record.steps_per_round={s.record.steps_per_round} exceeds "
                        f"splitft.local_steps={s.local_steps}")
    a = s.attack
    check_positive("splitft.attack.gate_margin_pp", a.gate_margin_pp)
    check_positive("splitft.attack.positive_margin_pp", a.positive_margin_pp)
    check_per_item_bound("splitft.attack.per_item_bound_pp", a.per_item_bound_pp)
    check_at_least("splitft.attack.eia.steps", a.eia.steps, 0)
    check_positive("splitft.attack.eia.lr", a.eia.lr)
    check_at_least("splitft.attack.eia.max_examples", a.eia.max_examples, 2)
    if a.bisr.enabled:
        check_at_least("splitft.attack.bisr.steps", a.bisr.steps, 0)
        check_positive("splitft.attack.bisr.lr", a.bisr.lr)
        check_at_least("splitft.attack.bisr.max_examples", a.bisr.max_examples, 2)
        check_choice("splitft.attack.bisr.init", a.bisr.init, BISR_INITS)
        check_choice("splitft.attack.bisr.weights", a.bisr.weights, BISR_WEIGHTS)
        for source in a.bisr.backward_weights:
            check_choice("splitft.attack.bisr.backward_weights", source, BISR_B_WEIGHTS)
        if a.bisr.init == "sip" and not (a.inverter.enabled and a.inverter.max_examples >= a.bisr.max_examples):
            raise UserError("splitft.attack.bisr.init=sip starts BiSR(f) from the learned inverter's guesses: it needs "
                            "splitft.attack.inverter.enabled=true and inverter.max_examples >= bisr.max_examples")
        check_at_least("splitft.attack.bisr.backward_steps", a.bisr.backward_steps, 0)
        if a.bisr.backward_steps:
            check_positive("splitft.attack.bisr.backward_lr", a.bisr.backward_lr)
            check_positive("splitft.attack.bisr.backward_temperature", a.bisr.backward_temperature)
            if not 0.0 <= float(a.bisr.backward_beta) <= 1.0:
                raise UserError(f"splitft.attack.bisr.backward_beta must lie in [0, 1], got {a.bisr.backward_beta}")
    if a.inverter.enabled:
        v = a.inverter
        check_choice("splitft.attack.inverter.mode", v.mode, INVERTER_MODES)
        check_choice("splitft.attack.inverter.layout", v.layout, INVERTER_LAYOUTS)
        check_choice("splitft.attack.inverter.head", v.head, INVERTER_HEADS)
        check_at_least("splitft.attack.inverter.max_steps", v.max_steps, 1)
        check_positive("splitft.attack.inverter.max_minutes", v.max_minutes)
        check_at_least("splitft.attack.inverter.batch_size", v.batch_size, 1)
        check_positive("splitft.attack.inverter.lr", v.lr)
        check_at_least("splitft.attack.inverter.max_examples", v.max_examples, 2)
        if s.data.n_align < 2:
            raise UserError("splitft.attack.inverter needs splitft.data.n_align >= 2 public blocks to train on")


def grad_guard(section: Any) -> dict[str, float] | None:
    """The guard on `grad_up` as the protocol publishes it (the server knows the mechanism, not the noise
    drawn), or None without one; `section`: the resolved `splitft` section."""
    g = section["grad_up"]
    if g["clip"] is None:
        return None
    return {"clip": float(g["clip"]), "noise_multiplier": float(g["noise_multiplier"])}


def guard_label(guard: dict[str, float] | None) -> str | None:
    """That guard in a row or point label ("∇clip 1e-05 z=1"), None without one."""
    if not guard:
        return None
    return f"∇clip {guard['clip']:.3g} z={guard['noise_multiplier']:.3g}"


def variant_label(guard: dict[str, float] | None, train_head: bool = True) -> str | None:
    """What sets a run apart beyond its configuration and strength, for row and point labels: a frozen A
    ("A frozen") and the guard on `grad_up`; None for neither. Runs from before `train_head` existed
    trained A."""
    parts = ([] if train_head else ["A frozen"]) + ([guard_label(guard)] if guard else [])
    return " · ".join(parts) or None


def tradeoff_setting(workload: str, split: dict[str, Any]) -> str:
    """What a split fine-tuning point on the privacy–utility chart is measured on (runners/common.tradeoff
    `setting`): one run trains, attacks and scores held-out text of one data set at one split (k, m), client
    count and adapter choice, so runs differing in any of them never join (the groups of
    runners/report/splitft.py)."""
    lora = " · LoRA" if split.get("lora") else ""
    return f"{workload} · k={split.get('k')} m={split.get('m')} · {split.get('n_clients')} clients{lora}"
