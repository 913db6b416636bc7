"""The schema of the `grad_audit` config section (the returned-gradient audit, paper 004): types only, every
value in conf/grad_audit/default.yaml (docs/grad_audit.md explains each choice).

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

from omegaconf import MISSING, DictConfig

from harness import placement as placement_check
from harness.checks import check_at_least, check_choice, check_local_file, check_per_item_bound, check_positive
from harness.errors import UserError
from harness.placement import Placement

CORPUS_SOURCES = ("builtin", "text", "hub")
PROBE_TARGETS = ("current", "next")
TRAIN_INITS = ("random", "least_squares")
PROBE_ARMS = ("forward", "gradient", "joint")


@dataclass
class GradAuditCorpusConfig:
    source: str = MISSING              # builtin (attacks/data/builtin_corpus.txt) | text (a local file) | hub
    path: Optional[str] = MISSING      # source=text: e.g. ../shared/data/wikitext2/wiki.test.raw
    hub_id: Optional[str] = MISSING    # source=hub: a `datasets` id (network needed)
    hub_config: Optional[str] = MISSING
    split: str = MISSING
    text_field: str = MISSING


@dataclass
class GradAuditTrainConfig:
    frames: int = MISSING              # training steps; each step sends one frame (the audited record)
    lr: float = MISSING
    init: str = MISSING                # random | least_squares: how the bottleneck and up-projection start
    init_blocks: int = MISSING         # least_squares: training blocks the start is fitted on
    heldout_blocks: int = MISSING      # blocks kept out of training for the utility gate
    curve_points: int = MISSING        # held-out CE measured at this many evenly spaced frame counts
    flat_nats: float = MISSING         # converged: the CE fell by at most this over the curve's last segment
    threads: Optional[int] = MISSING


@dataclass
class GradAuditMitigationConfig:
    grad_clip: Optional[float] = MISSING  # a fixed per-position clip of the returned gradient (paper: C = 0.01)
    clip_quantile: Optional[float] = MISSING  # or the clip set per frame at this quantile of the real rows'
                                              # per-position gradient norms (issue 31: C = 0.01 never binds)
    noise_multiplier: float = MISSING  # its Gaussian σ = noise_multiplier · the frame's clip


@dataclass
class GradAuditProbeConfig:
    top_k: int = MISSING               # the frequent tokens the probe predicts among
    target: str = MISSING              # PROBE_TARGETS: the row position's own token or the next one
    arms: List[str] = MISSING          # PROBE_ARMS
    l2_grid: List[float] = MISSING     # probe regularisation, chosen on the explore seeds
    max_iter: int = MISSING
    max_rows: int = MISSING            # rows per probe fit (subsampled, seeded)


@dataclass
class GradAuditBisrConfig:
    enabled: bool = MISSING            # BiSR's backward stage on the returned gradient (attacks/grad_audit/bisr_backward.py)
    frames: int = MISSING              # the last this many frames of each scored seed are attacked
    steps: int = MISSING               # gradient-matching steps (AdamW on the soft labels' logits)
    lr: float = MISSING
    beta: float = MISSING              # the plain distance's weight of ‖Δ‖² against ‖Δ‖₁
    temperature: float = MISSING       # the soft labels start at the cloud's decoding / temperature
    prior: bool = MISSING              # under the mitigation's noise: MAP (noise likelihood + decoding prior)


@dataclass
class GradAuditSeedsConfig:
    explore: List[int] = MISSING
    replicate: List[int] = MISSING
    test: List[int] = MISSING


@dataclass
class GradAuditGatesConfig:
    probe_margin_pp: float = MISSING   # privacy gate: Bonferroni-Wilson UB ≤ constant guess + this
    partition_margin_pp: float = MISSING  # the partition attacker's verdict margin around its chance agreement
    alpha: float = MISSING             # family-wise error of the Bonferroni-Wilson bounds
    utility_max_nats: float = MISSING  # utility gate: held-out CE increase ≤ this
    injected_doses_pp: List[float] = MISSING  # positive control: gains (pp) a perfect reader of the injected code gets
    positive_margin_pp: float = MISSING
    per_item_bound_pp: float = MISSING  # B of the earned interval at_chance reads (metrics/equivalence.py)


@dataclass
class GradAuditConfig:
    """Fields with MISSING defaults; their values and comments live in conf/grad_audit/default.yaml."""

    cut_after: int = MISSING           # a: the local node runs blocks 1..a
    resume_at: int = MISSING           # b: the cloud runs blocks a+1..b, the local node b+1..L
    latent_dim: int = MISSING          # D, the bottleneck width of what crosses
    real_rows: int = MISSING
    decoy_rows: int = MISSING
    block_tokens: int = MISSING        # tokens per row (fixed-width blocks of the corpus stream)
    clip: float = MISSING              # forward per-row clip C
    noise_ratio: float = MISSING       # forward σ = noise_ratio · C
    placement: Placement = MISSING     # the LM's device and dtype (harness/placement.py)
    corpus: GradAuditCorpusConfig = MISSING
    train: GradAuditTrainConfig = MISSING
    mitigation: GradAuditMitigationConfig = MISSING
    probe: GradAuditProbeConfig = MISSING
    bisr_backward: GradAuditBisrConfig = MISSING
    seeds: GradAuditSeedsConfig = MISSING
    gates: GradAuditGatesConfig = MISSING


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range."""
    g = section
    if not 0 < g.cut_after < g.resume_at:
        raise UserError(f"grad_audit needs 0 < cut_after < resume_at (the cloud runs blocks a+1..b), "
                        f"got cut_after={g.cut_after}, resume_at={g.resume_at}")
    check_at_least("grad_audit.latent_dim (D)", g.latent_dim, 1)
    check_at_least("grad_audit.real_rows", g.real_rows, 1)
    check_at_least("grad_audit.decoy_rows", g.decoy_rows, 0)
    if g.block_tokens < 2:
        raise UserError(f"grad_audit.block_tokens must be >= 2 (a row needs a next-token target), got {g.block_tokens}")
    check_positive("grad_audit.clip (C)", g.clip)
    check_at_least("grad_audit.noise_ratio", float(g.noise_ratio), 0.0)
    placement_check.check("grad_audit.placement", g.placement, shardable=False)
    check_choice("grad_audit.corpus.source", g.corpus.source, CORPUS_SOURCES)
    if g.corpus.source == "text" and not g.corpus.path:
        raise UserError("grad_audit.corpus.source=text needs grad_audit.corpus.path=/path/to/file.txt")
    # Before any model loads, and with the way forward: grad_audit_2core's default file is not in a clone.
    if cfg.runner == "grad_audit" and g.corpus.source == "text":
        check_local_file("grad_audit.corpus.path", g.corpus.path,
                         "grad_audit.corpus.source=hub grad_audit.corpus.hub_id=Salesforce/wikitext "
                         "grad_audit.corpus.hub_config=wikitext-2-raw-v1 grad_audit.corpus.split=test (WikiText-2)")
    if g.corpus.source == "hub" and not g.corpus.hub_id:
        raise UserError("grad_audit.corpus.source=hub needs grad_audit.corpus.hub_id (e.g. wikitext)")
    t = g.train
    if t.frames < 4:
        raise UserError(f"grad_audit.train.frames must be >= 4 (the probe trains and tests on disjoint frames), got {t.frames}")
    check_positive("grad_audit.train.lr", t.lr)
    check_choice("grad_audit.train.init", t.init, TRAIN_INITS)
    check_at_least("grad_audit.train.init_blocks", t.init_blocks, 1)
    check_at_least("grad_audit.train.heldout_blocks", t.heldout_blocks, 2)
    check_at_least("grad_audit.train.threads", t.threads, 1, nullable=True)
    check_at_least("grad_audit.train.curve_points", t.curve_points, 2)
    check_at_least("grad_audit.train.flat_nats", float(t.flat_nats), 0.0)
    m = g.mitigation
    if m.grad_clip is not None:
        check_positive("grad_audit.mitigation.grad_clip", m.grad_clip)
    if m.clip_quantile is not None and not 0.0 < float(m.clip_quantile) <= 1.0:
        raise UserError(f"grad_audit.mitigation.clip_quantile must lie in (0, 1] or be null, got {m.clip_quantile}")
    if (m.grad_clip is None) == (m.clip_quantile is None):
        raise UserError("grad_audit.mitigation needs exactly one of grad_clip (a fixed clip) and clip_quantile "
                        f"(a clip from the measured norms), got grad_clip={m.grad_clip}, "
                        f"clip_quantile={m.clip_quantile}")
    check_at_least("grad_audit.mitigation.noise_multiplier", float(m.noise_multiplier), 0.0)
    p = g.probe
    check_at_least("grad_audit.probe.top_k", p.top_k, 1)
    check_choice("grad_audit.probe.target", p.target, PROBE_TARGETS)
    arms = list(p.arms)
    if not arms or any(a not in PROBE_ARMS for a in arms) or len(set(arms)) != len(arms):
        raise UserError(f"grad_audit.probe.arms must be distinct values from {', '.join(PROBE_ARMS)}, got {arms}")
    grid = list(p.l2_grid)
    if not grid or any(not (math.isfinite(v) and v >= 0) for v in grid):
        raise UserError(f"grad_audit.probe.l2_grid must be a non-empty list of numbers >= 0, got {grid}")
    if p.max_iter < 1 or p.max_rows < 2:
        raise UserError(f"grad_audit.probe needs max_iter >= 1 and max_rows >= 2, got {p.max_iter}, {p.max_rows}")
    b = g.bisr_backward
    if b.enabled:
        check_at_least("grad_audit.bisr_backward.steps", b.steps, 1)
        check_at_least("grad_audit.bisr_backward.frames", b.frames, 1)
        if b.frames > t.frames:
            raise UserError(f"grad_audit.bisr_backward.frames must be <= grad_audit.train.frames ({t.frames}), "
                            f"got {b.frames}")
        check_positive("grad_audit.bisr_backward.lr", b.lr)
        check_positive("grad_audit.bisr_backward.temperature", b.temperature)
        if not 0.0 <= float(b.beta) <= 1.0:
            raise UserError(f"grad_audit.bisr_backward.beta must lie in [0, 1], got {b.beta}")
    s = g.seeds
    explore, scored = list(s.explore), list(s.replicate) + list(s.test)
    if not explore or not scored:
        raise UserError("grad_audit.seeds needs at least one explore seed and one replicate or test seed")
    every = explore + scored
    if len(set(every)) != len(every) or min(every) < 0:
        raise UserError(f"grad_audit.seeds must be distinct integers >= 0 across explore/replicate/test, got {every}")
    q = g.gates
    for key in ("probe_margin_pp", "partition_margin_pp", "utility_max_nats", "positive_margin_pp"):
        check_at_least(f"grad_audit.gates.{key}", float(q[key]), 0.0)
    check_per_item_bound("grad_audit.gates.per_item_bound_pp", float(q.per_item_bound_pp))
    if not 0 < q.alpha < 1:
        raise UserError(f"grad_audit.gates.alpha must lie in (0, 1), got {q.alpha}")
    doses = list(q.injected_doses_pp)
    if not doses or any(not (math.isfinite(float(d)) and float(d) > 0) for d in doses):
        raise UserError(f"grad_audit.gates.injected_doses_pp must be a non-empty list of numbers > 0, got {doses}")
