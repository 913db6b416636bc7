"""The schema of the `collab` config section (cloud-edge collaborative decoding, paper 003): types only,
every value in conf/collab/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig

from harness import placement as placement_check
from harness.checks import check_at_least, check_choice, check_positive
from harness.errors import UserError
from harness.group_schemas import check_model
from harness.placement import Placement

FUSION_MODES = ("cloud", "edge")
BENCHMARKS = ("builtin", "pubmedqa", "dolly")
# Which fusion mode each defence protects (paper §5.1 "Comparison methods"); coveil and the undefended
# point run in both. Configuration names: harness/configurations.py COLLAB_CONFIGURATIONS.
MODES_OF = {
    "collab_none": FUSION_MODES, "coveil": FUSION_MODES, "collab_dp_fusion": FUSION_MODES,
    "collab_cogenesis": ("cloud",), "collab_dp_logit": ("cloud",),
    "collab_custext": ("edge",), "collab_ldp_sampler": ("edge",), "collab_invisibleink": ("edge",),
}
OPTION_SCORING = ("stated", "likelihood")
RNG_MODES = ("per_example", "shared")     # harness/collab/protocol.py (torch-free here)
INVISIBLEINK_ACCOUNTING = ("sequence", "token")
CUSTEXT_SELECT_FROM = ("fused", "private")
STEP_MATCHING = ("matched", "per_step", "none")   # attacks/collab/decodeleak.py, "Steps"
# The defences whose swept parameter may be 0 (the appendix grids: CoVeil λ = 0, DP-Fusion ε = 0) are
# reached with collab.parameter_zero=true, since the global `epsilon` knob must be > 0.
ZERO_ALLOWED = ("coveil", "collab_dp_fusion")


@dataclass
class CollabBenchmarkConfig:
    name: str = MISSING                 # BENCHMARKS
    path: Optional[str] = MISSING       # local file (pubmedqa: ori_pqal.json; dolly: JSONL); builtin: null
    hub_id: Optional[str] = MISSING     # loads through `datasets` where path is null (network needed)
    n_examples: Optional[int] = MISSING
    max_context_words: Optional[int] = MISSING
    answer_critical: bool = MISSING     # keep examples the edge answers with the evidence but not without


@dataclass
class CollabEvidenceConfig:
    leading_space: bool = MISSING       # tokenise each span as " span" (as it stands inside text)


@dataclass
class CollabMetricsConfig:
    ks: List[int] = MISSING
    report_k: int = MISSING


@dataclass
class CollabInversionConfig:
    enabled: bool = MISSING
    k: int = MISSING                    # exposure-set size written into the prompt per step
    max_steps: int = MISSING            # decoding steps of the exposure sequence shown
    max_new_tokens: int = MISSING


@dataclass
class CollabCusTextConfig:
    k: int = MISSING                    # output-set size (the k most similar tokens, itself included)
    distance: str = MISSING             # euclidean | cosine
    embeddings: str = MISSING           # victim (the edge model's input embeddings) | a .pt/.npy table
    select_from: str = MISSING          # fused | private: the token CusText sanitises is argmax of this


@dataclass
class CollabLDPSamplerConfig:
    gamma: float = MISSING              # the neighbourhood N_γ(p_L) the sampler is optimal for (>= 1)
    fuse: bool = MISSING                # draw from α·p_L + (1−α)·Q (true) or from Q alone


@dataclass
class CollabInvisibleInkConfig:
    accounting: str = MISSING           # sequence | token: what epsilon budgets
    temperature: float = MISSING
    top_k: Optional[int] = MISSING      # Top-k+ over the public logits; null = the full vocabulary


@dataclass
class CollabControlsConfig:
    gate_margin_pp: float = MISSING
    positive_margin_pp: float = MISSING
    per_item_bound_pp: float = MISSING  # B of the earned interval at_chance reads (metrics/equivalence.py)
    step_matching: str = MISSING        # matched | per_step | none: how the verdict pairs signal and null steps


@dataclass
class CollabPlacementConfig:
    edge: Placement = MISSING           # the edge model's device and dtype (harness/placement.py)
    cloud: Placement = MISSING          # the cloud model's


@dataclass
class CollabConfig:
    """Fields with MISSING defaults; their values and comments live in conf/collab/default.yaml."""

    fusion: str = MISSING
    alpha: float = MISSING
    max_new_tokens: int = MISSING
    cloud: Optional[Any] = MISSING      # a conf/model entry (+model@collab.cloud=NAME); null = cfg.model
    parameter_zero: bool = MISSING
    candidates: int = MISSING           # CoVeil's |C_t| = TopK pool size (paper Table A1)
    dp_delta: float = MISSING
    renyi_order: float = MISSING
    custext: CollabCusTextConfig = MISSING
    ldp_sampler: CollabLDPSamplerConfig = MISSING
    invisibleink: CollabInvisibleInkConfig = MISSING
    option_scoring: str = MISSING       # stated | likelihood (option benchmarks)
    view_top: int = MISSING
    threads: Optional[int] = MISSING    # torch threads for the run; null = torch's default
    batch_size: Optional[int] = MISSING  # examples decoded together; null = protocol.AUTO_BATCH
    rng: str = MISSING                  # per_example | shared (protocol.RNG_MODES)
    placement: CollabPlacementConfig = MISSING
    benchmark: CollabBenchmarkConfig = MISSING
    evidence: CollabEvidenceConfig = MISSING
    metrics: CollabMetricsConfig = MISSING
    inversion: CollabInversionConfig = MISSING
    controls: CollabControlsConfig = MISSING


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range."""
    c = section
    check_choice("collab.fusion", c.fusion, FUSION_MODES)
    if not (math.isfinite(c.alpha) and 0.0 <= c.alpha <= 1.0):
        raise UserError(f"collab.alpha must lie in [0, 1], got {c.alpha}")
    check_at_least("collab.threads", c.threads, 1, nullable=True)
    check_at_least("collab.batch_size", c.batch_size, 1, nullable=True)
    check_choice("collab.rng", c.rng, RNG_MODES)
    for party in ("edge", "cloud"):
        placement_check.check(f"collab.placement.{party}", c.placement[party])
    for key in ("max_new_tokens", "candidates", "view_top"):
        check_at_least(f"collab.{key}", c[key], 1)
    if not 0.0 < c.dp_delta < 1.0:
        raise UserError(f"collab.dp_delta must lie in (0, 1), got {c.dp_delta}")
    if not c.renyi_order > 1.0:
        raise UserError(f"collab.renyi_order must be > 1, got {c.renyi_order}")
    _check_baselines(c)
    check_choice("collab.option_scoring", c.option_scoring, OPTION_SCORING)
    if c.option_scoring == "likelihood" and c.benchmark.name == "dolly":
        raise UserError("collab.option_scoring=likelihood needs an option benchmark (builtin, pubmedqa); dolly has "
                        "reference responses")
    ks = list(c.metrics.ks)
    if not ks or min(ks) < 1:
        raise UserError(f"collab.metrics.ks must be a non-empty list of K >= 1, got {ks}")
    if c.metrics.report_k < 1 or c.metrics.report_k not in ks:
        raise UserError(f"collab.metrics.report_k must be >= 1 and one of collab.metrics.ks {ks}, got {c.metrics.report_k}")
    if max(ks) > c.view_top:
        raise UserError(f"collab.metrics.ks goes up to {max(ks)} but the view keeps collab.view_top={c.view_top} "
                        "entries per step; raise view_top")
    inv = c.inversion
    for key in ("k", "max_steps", "max_new_tokens"):
        check_at_least(f"collab.inversion.{key}", inv[key], 1)
    b = c.benchmark
    check_choice("collab.benchmark.name", b.name, BENCHMARKS)
    check_at_least("collab.benchmark.n_examples", b.n_examples, 1, nullable=True)
    check_at_least("collab.benchmark.max_context_words", b.max_context_words, 1, nullable=True)
    if b.path is not None and not Path(str(b.path)).expanduser().is_file():
        raise UserError(f"collab.benchmark.path={b.path} is not a file: give your copy's path, or with network "
                        "collab.benchmark.path=null loads the benchmark through datasets (docs/collab.md)")
    for key in ("gate_margin_pp", "positive_margin_pp"):
        check_at_least(f"collab.controls.{key}", c.controls[key], 0)
    if not 0 < float(c.controls.per_item_bound_pp) <= 100:
        raise UserError(f"collab.controls.per_item_bound_pp={c.controls.per_item_bound_pp}: a Token-ER difference "
                        "per example lies in (0, 100] pp")
    check_choice("collab.controls.step_matching", c.controls.step_matching, STEP_MATCHING)
    if cfg.runner != "collab":
        return
    name = cfg.configuration.name
    modes = MODES_OF.get(name, FUSION_MODES)
    if c.fusion not in modes:
        raise UserError(f"configuration={name} defends {'/'.join(modes)}-side fusion only; set collab.fusion={modes[0]}")
    if c.parameter_zero and name not in ZERO_ALLOWED:
        raise UserError(f"collab.parameter_zero=true: configuration={name} has no parameter value 0 "
                        f"(only {', '.join(ZERO_ALLOWED)})")
    if name == "collab_cogenesis" and float(cfg.epsilon) != int(cfg.epsilon):
        raise UserError(f"configuration=collab_cogenesis takes its top-B as epsilon: a whole number >= 1, got {cfg.epsilon}")
    if c.cloud is not None:
        check_model("collab.cloud", c.cloud)


def _check_baselines(c: DictConfig) -> None:
    ct, ldp, ink = c.custext, c.ldp_sampler, c.invisibleink
    check_at_least("collab.custext.k", ct.k, 1)
    check_choice("collab.custext.distance", ct.distance, ("euclidean", "cosine"))
    if ct.embeddings != "victim" and not Path(str(ct.embeddings)).expanduser().is_file():
        raise UserError(f"collab.custext.embeddings={ct.embeddings} is neither 'victim' nor an existing .pt/.npy file")
    check_choice("collab.custext.select_from", ct.select_from, CUSTEXT_SELECT_FROM)
    check_at_least("collab.ldp_sampler.gamma", ldp.gamma, 1)
    check_choice("collab.invisibleink.accounting", ink.accounting, INVISIBLEINK_ACCOUNTING)
    check_positive("collab.invisibleink.temperature", ink.temperature)
    check_at_least("collab.invisibleink.top_k", ink.top_k, 1, nullable=True)


def tokenizer_pairs(section: DictConfig, cfg: DictConfig) -> list[tuple[str, Any, str, str]]:
    """(key, model entry, whose tokenizer, why): the cloud model must share the edge model's token ids
    (harness/schema.py compares them before either model loads)."""
    if cfg.runner == "collab" and section.get("cloud") is not None:
        return [("collab.cloud", section.cloud, "the edge model", "collaborative decoding fuses "
                 "distributions over one shared vocabulary")]
    return []


def tradeoff_setting(benchmark: str, fusion: str, alpha: float | None, edge: str, cloud: str | None) -> str:
    """What a collab point on the cross-system privacy–utility chart is measured under (runners/common.tradeoff
    `setting`): one run measures both halves on one benchmark, in one fusion mode, at one fusion weight α, so
    runs that differ in any of them never join (Dolly's leakage is no partner for PubMedQA's accuracy). The
    cloud model is named where it is not the edge model."""
    parts = [str(benchmark), f"{fusion}-side"] + ([] if alpha is None else [f"α={float(alpha):g}"])
    if cloud is not None and cloud != edge:
        parts.append(f"cloud {cloud}")
    return " · ".join(parts)


def tradeoff_point(configuration: str, candidates: int | None, per_token: bool) -> str | None:
    """What else tells one defence's runs at one parameter apart (runners/common.tradeoff `point`): CoVeil's
    candidate pool |C| (paper Table A1) and InvisibleInk's per-token accounting (its ε then measures another
    thing)."""
    parts = ([f"|C|={int(candidates)}"] if configuration == "coveil" and candidates is not None else []) + \
            (["ε per token"] if configuration == "collab_invisibleink" and per_token else [])
    return " ".join(parts) or None
