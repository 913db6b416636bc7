"""The schema of the `sanitize` config section (token-level prompt sanitisers, paper 001): types only, every
value in conf/sanitize/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`. The
privacy parameter itself is the top-level `epsilon` knob (η of dχ Noise / dχ-Stencil, ε of CusText+;
harness/configurations.py), so its range is checked with it, once, by harness/schema.py validate.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from omegaconf import MISSING, DictConfig

from harness import checks
from harness import placement as placement_check
from harness.errors import UserError
from harness.placement import Placement

DISTANCES = ("euclidean", "cosine")
EMBEDDINGS = ("victim",)           # or a path to a .pt / .npy table of shape (vocab, d)
TASKS = ("sst2", "qnli", "mmlu", "commonsense_qa")


@dataclass
class SanitizeAttackConfig:
    """The attacks on the sanitised tokens (attacks/sanitize/)."""

    top_k: int = MISSING                  # Pr@k and Bayes top-k (the paper: 5)
    bayes_candidates: int = MISSING       # original tokens considered per position (nearest to the output)
    bayes_samples: int = MISSING          # mechanism draws per candidate (dχ mechanisms), pooled over the candidates
    bayes_local_vocab: int = MISSING      # the simulation's prefilter before the full-vocabulary search (exact)
    contextual_beam: int = MISSING        # beams of the contextual reconstruction (0: not run)
    learned_corpus_tokens: int = MISSING  # training tokens of the learned inverter (0: not run)
    corpus_path: Optional[str] = MISSING  # public text the trained attackers learn from; null: the built-in corpus
    decoder_steps: int = MISSING          # the learned decoder's training steps at most (0: not run)
    decoder_minutes: float = MISSING      # its training budget in minutes
    decoder_corpus_tokens: int = MISSING  # its public training tokens (the built-in corpus)
    decoder_window: int = MISSING         # positions per decoded window
    decoder_evidence_scale: float = MISSING  # the evidence head's starting scale s
    gate_margin_pp: float = MISSING       # verdict margin m (attacks/controls.py)
    positive_margin_pp: float = MISSING   # positive control: lower bound >= reference + this
    per_item_bound_pp: float = MISSING    # B of the earned interval at_chance reads (metrics/equivalence.py)


@dataclass
class SanitizeTaskPaths:
    """Where each lm-eval task's examples come from (harness/sanitize/tasks.py): a local file, or null for the
    small SST-2 file the repo ships (sst2) or the hub (the others)."""

    sst2: Optional[str] = MISSING
    qnli: Optional[str] = MISSING
    mmlu: Optional[str] = MISSING
    commonsense_qa: Optional[str] = MISSING


@dataclass
class SanitizeConfig:
    """Fields with MISSING defaults; their values and comments live in conf/sanitize/default.yaml."""

    window: int = MISSING                 # Stencil's L
    sigma: float = MISSING                # Gaussian std of the window weights
    distance: str = MISSING               # euclidean | cosine
    embeddings: str = MISSING             # victim | /path/to/table.pt|.npy
    vocab_filter: Optional[str] = MISSING  # regex a candidate token's text must match; null = every non-special token
    dx_stencil_may_return_original: bool = MISSING
    custext_k: int = MISSING              # CusText's output-set size
    stopwords: List[str] = MISSING        # CusText+ leaves these unchanged
    chunk: int = MISSING                  # positions per nearest-token search (memory bound)
    threads: Optional[int] = MISSING      # torch threads; null = torch's default
    placement: Placement = MISSING        # the model's device and dtype (harness/placement.py)
    tasks: List[str] = MISSING            # lm-eval tasks scored on sanitised inputs (TASKS)
    task_paths: SanitizeTaskPaths = MISSING
    task_limit: Optional[int] = MISSING   # examples per task (seeded sample); null = all
    eval_batch_size: int = MISSING
    attack: SanitizeAttackConfig = MISSING


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range."""

    checks.check_at_least("sanitize.window (Stencil's L)", section.window, 1)
    checks.check_positive("sanitize.sigma", section.sigma)
    checks.check_choice("sanitize.distance", section.distance, DISTANCES)
    checks.check_at_least("sanitize.custext_k", section.custext_k, 1)
    checks.check_at_least("sanitize.chunk", section.chunk, 1)
    checks.check_at_least("sanitize.threads", section.threads, 1, nullable=True)
    placement_check.check("sanitize.placement", section.placement)
    checks.check_at_least("sanitize.eval_batch_size", section.eval_batch_size, 1)
    if section.vocab_filter is not None:
        try:
            re.compile(section.vocab_filter)
        except re.error as e:
            raise UserError(f"sanitize.vocab_filter={section.vocab_filter!r} is not a regular expression ({e})") from None
    bad = [t for t in section.tasks if t not in TASKS]
    if bad or len(set(section.tasks)) != len(section.tasks):
        raise UserError(f"sanitize.tasks must be distinct names from {', '.join(TASKS)}, got {list(section.tasks)}")
    checks.check_at_least("sanitize.task_limit", section.task_limit, 1, nullable=True)
    a = section.attack
    for key in ("top_k", "bayes_candidates", "bayes_samples", "bayes_local_vocab"):
        checks.check_at_least(f"sanitize.attack.{key}", a[key], 1)
    checks.check_at_least("sanitize.attack.contextual_beam", a.contextual_beam, 0)
    checks.check_at_least("sanitize.attack.learned_corpus_tokens", a.learned_corpus_tokens, 0)
    if a.corpus_path is not None and not Path(a.corpus_path).expanduser().is_file():
        raise UserError(f"sanitize.attack.corpus_path={a.corpus_path}: no such file (a UTF-8 text file, e.g. "
                        "WikiText-2's wiki.train.raw; null for the built-in corpus)")
    checks.check_at_least("sanitize.attack.decoder_steps", a.decoder_steps, 0)
    if a.decoder_steps > 0:
        checks.check_positive("sanitize.attack.decoder_minutes", a.decoder_minutes)
        # Two pieces of 64 tokens at least: one to train on, one to validate on.
        checks.check_at_least("sanitize.attack.decoder_corpus_tokens", a.decoder_corpus_tokens, 128)
        checks.check_at_least("sanitize.attack.decoder_window", a.decoder_window, 1)
        checks.check_positive("sanitize.attack.decoder_evidence_scale", a.decoder_evidence_scale)
    for key in ("gate_margin_pp", "positive_margin_pp"):
        checks.check_at_least(f"sanitize.attack.{key}", float(a[key]), 0.0)
    checks.check_per_item_bound("sanitize.attack.per_item_bound_pp", float(a.per_item_bound_pp))


def tradeoff_setting(tasks: Iterable[str]) -> str:
    """What a sanitiser run's point on the privacy–utility chart is measured on (runners/common.tradeoff
    `setting`): its accuracy pools the lm-eval tasks it ran, so runs on other task sets never join."""
    return "tasks " + ", ".join(tasks)
