"""How much of a prompt an attack recovered: token precision / recall / F1 of a reconstruction.

The reference is the true prompt, the hypothesis the attacker's reconstruction, both as sequences of
tokens (token ids from the model's tokenizer, or strings; anything hashable). Order is ignored: these
are bag-of-tokens scores, as in the paper's attack evaluation (§7.4). All values are percentages.

Set vs multiset (`mode`):
- "multiset": a token counts as many times as it occurs. overlap = Σ_t min(c_ref(t), c_hyp(t)),
  precision = overlap / len(hyp), recall = overlap / len(ref). Guessing "the" ten times earns credit
  for "the" only as often as the prompt contains it.
- "set": duplicates are dropped first. overlap = |set(ref) ∩ set(hyp)|, precision = overlap /
  |set(hyp)|, recall = overlap / |set(ref)|. Measures which distinct tokens leaked.
F1 = 2PR / (P + R), and 0 when P + R = 0.

Edge cases (same in both modes): both empty → (100, 100, 100), an exact reconstruction of nothing,
so that an identical pair always scores 100; exactly one empty → (0, 0, 0).

Micro vs macro (`average`, over prompts):
- "macro": the per-prompt P, R and F1 are averaged over prompts (F1 is the mean of per-prompt F1s,
  not the F1 of mean P and R). Every prompt weighs the same. Interval: P and R the bootstrap of
  metrics/intervals.mean_ci; F1, which the attack verdicts read (attacks/controls.py), Student t
  (`mean_t_ci`) clipped to [0, 100], as their calibration assumes.
- "micro": overlaps and lengths are summed over prompts first, then P = Σoverlap / Σ|hyp|,
  R = Σoverlap / Σ|ref|, F1 from those. Long prompts weigh more. Interval: bootstrap over prompts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import numpy as np

from metrics.intervals import Estimate, bootstrap_ci, mean_ci, mean_t_ci

Mode = Literal["multiset", "set"]
Average = Literal["macro", "micro"]


def _bag(tokens: Sequence[Hashable], mode: Mode) -> Counter:
    if mode == "multiset":
        return Counter(tokens)
    if mode == "set":
        return Counter(set(tokens))
    raise ValueError(f"mode must be 'multiset' or 'set', got {mode!r}")


def _overlap_stats(ref: Counter, hyp: Counter) -> tuple[int, int, int]:
    """(overlap, hypothesis size, reference size) of two bags."""
    overlap = sum(min(c, hyp[t]) for t, c in ref.items() if t in hyp)   # Σ min: (ref & hyp) without its Counter
    return overlap, sum(hyp.values()), sum(ref.values())


def _prf_from_counts(overlap: float, hyp_size: float, ref_size: float) -> tuple[float, float, float]:
    if hyp_size == 0 and ref_size == 0:
        return 100.0, 100.0, 100.0
    if hyp_size == 0 or ref_size == 0:
        return 0.0, 0.0, 0.0
    p = overlap / hyp_size
    r = overlap / ref_size
    f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return 100.0 * p, 100.0 * r, 100.0 * f1


def token_prf(
    ref_tokens: Sequence[Hashable], hyp_tokens: Sequence[Hashable], mode: Mode = "multiset"
) -> tuple[float, float, float]:
    """(precision, recall, F1) in % of reconstruction `hyp_tokens` against prompt `ref_tokens`.

    See the module docstring for set vs multiset and for the empty-input conventions.
    """
    return _prf_from_counts(*_overlap_stats(_bag(ref_tokens, mode), _bag(hyp_tokens, mode)))


@dataclass(frozen=True)
class CorpusPRF:
    """Token precision / recall / F1 over a set of prompts, each with its 95% interval."""

    precision: Estimate
    recall: Estimate
    f1: Estimate
    mode: Mode
    average: Average

    def summary(self) -> dict[str, float | str]:
        """Flat results.json keys: token_precision, token_recall, token_f1 (+ `_ci_lo`/`_ci_hi`), and
        the definitions used (token_prf_mode, token_prf_average)."""
        out: dict[str, float | str] = {}
        out.update(self.precision.flat("token_precision"))
        out.update(self.recall.flat("token_recall"))
        out.update(self.f1.flat("token_f1"))
        out["token_prf_mode"] = self.mode
        out["token_prf_average"] = self.average
        return out


def corpus_token_prf(
    refs: Sequence[Sequence[Hashable]],
    hyps: Sequence[Sequence[Hashable]],
    mode: Mode = "multiset",
    average: Average = "macro",
    n_boot: int = 2000,
    seed: int = 0,
) -> CorpusPRF:
    """Token P/R/F1 of reconstructions `hyps` against prompts `refs`, averaged over prompts.

    "macro" averages per-prompt scores (bootstrap interval for P and R, Student t for the verdicts' F1);
    "micro" pools overlaps and lengths before
    dividing (bootstrap interval over prompts). See the module docstring.
    """
    if len(refs) != len(hyps):
        raise ValueError(f"refs and hyps must be aligned by prompt, got {len(refs)} and {len(hyps)}")
    if not refs:
        raise ValueError("corpus_token_prf needs at least one prompt")
    counts = np.asarray(
        [_overlap_stats(_bag(r, mode), _bag(h, mode)) for r, h in zip(refs, hyps)], dtype=float
    )
    if average == "macro":
        per_prompt = np.asarray([_prf_from_counts(*row) for row in counts])
        p, r = mean_ci(per_prompt[:, 0]), mean_ci(per_prompt[:, 1])
        f = mean_t_ci(per_prompt[:, 2], bounds=(0.0, 100.0))
    elif average == "micro":
        p, r, f = (
            bootstrap_ci(counts, lambda rows, j=j: _prf_from_counts(*rows.sum(axis=0))[j], n_boot, seed)
            for j in range(3)
        )
    else:
        raise ValueError(f"average must be 'macro' or 'micro', got {average!r}")
    return CorpusPRF(p, r, f, mode, average)


def chance_floor(prompts_tokens: Sequence[Sequence[Hashable]], mode: Mode = "multiset") -> float:
    """Token F1 (%) an unrelated guess reaches: the mean F1 over all ordered pairs (i, j), i ≠ j, of
    the workload's prompts, scoring prompt j as a "reconstruction" of prompt i.

    Pairs are distinct by index, so duplicate prompts in the workload count as matches. F1 is symmetric
    in its arguments, so the mean over ordered pairs equals the mean over unordered pairs (computed
    once each). An attack is informative only where its token F1 clearly exceeds this floor: shared
    function words, punctuation and chat-template tokens alone lift it well above 0.
    """
    if len(prompts_tokens) < 2:
        raise ValueError(f"chance_floor needs at least 2 prompts, got {len(prompts_tokens)}")
    f1 = pairwise_f1(prompts_tokens, prompts_tokens, mode)
    return float(np.mean(f1[np.triu_indices(len(prompts_tokens), k=1)]))


def pairwise_f1(refs: Sequence[Sequence[Hashable]], hyps: Sequence[Sequence[Hashable]],
                mode: Mode = "multiset") -> np.ndarray:
    """F1 (%) of every (reference i, hypothesis j) pair, [len(refs), len(hyps)], exactly as `token_prf`
    computes it (the same counts and arithmetic, from sparse token-count matrices: the all-pairs floors score
    n² pairs, thousands in the calibration's trials, over a vocabulary far larger than any row)."""
    from scipy import sparse

    if mode not in ("multiset", "set"):
        raise ValueError(f"mode must be 'multiset' or 'set', got {mode!r}")
    ids = {t: k for k, t in enumerate(dict.fromkeys(chain.from_iterable([*refs, *hyps])))}
    width = max(1, len(ids))

    def counts(rows: Sequence[Sequence[Hashable]]) -> tuple[sparse.csr_array, np.ndarray, np.ndarray]:
        """[row, token] → its count in the row (1 in set mode), each row's size and each token's largest count."""
        lengths = [len(row) for row in rows]
        col = np.fromiter(map(ids.__getitem__, chain.from_iterable(rows)), np.int64, sum(lengths))
        row = np.repeat(np.arange(len(rows)), lengths)
        m = sparse.coo_array((np.ones(len(col), np.int64), (row, col)), shape=(len(rows), width)).tocsr()
        m.sum_duplicates()
        if mode == "set":
            m.data[:] = 1
        top = np.zeros(width, np.int64)
        np.maximum.at(top, m.indices, m.data)
        return m, m.sum(axis=1).astype(float), top

    (r, ref_size, r_top), (h, hyp_size, h_top) = counts(refs), counts(hyps)
    # Σ_v min(r_v, h_v) = Σ_{t ≥ 1} Σ_v [r_v ≥ t]·[h_v ≥ t]. Level 1 is one sparse integer product over every
    # token; the levels above it only over the few tokens both sides hold twice somewhere, as small dense
    # float32 products of 0/1 (exact below 2²⁴).
    overlap = ((r > 0).astype(np.int64) @ (h > 0).astype(np.int64).T).toarray().astype(float)
    cols = np.flatnonzero((r_top >= 2) & (h_top >= 2))
    if len(cols):
        r2, h2 = r[:, cols].toarray(), h[:, cols].toarray()
        for t in range(2, int(min(r_top[cols].max(), h_top[cols].max())) + 1):
            overlap += (r2 >= t).astype(np.float32) @ (h2 >= t).astype(np.float32).T
    ref_size, hyp_size = ref_size[:, None], hyp_size[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        p = overlap / hyp_size
        rec = overlap / ref_size
        f1 = np.where(p + rec > 0, 2 * p * rec / (p + rec), 0.0)
    f1 = np.where((hyp_size == 0) | (ref_size == 0), 0.0, f1)
    f1 = np.where((hyp_size == 0) & (ref_size == 0), 1.0, f1)
    return 100.0 * f1


def repaired_f1(refs: Sequence[Sequence[Hashable]], guesses: Sequence[Sequence[Hashable]], mode: Mode = "multiset"
                ) -> tuple[list[float], list[float]]:
    """A reconstruction attack's per-example token F1 as the two sides of a membership-style test (metrics/roc.py):
    each guess against its own example (own) and against the next example, re-paired by a cyclic shift (other:
    a truth the guess carries nothing of, one of the pairs i ≠ j that the chance floor and the exposure-free
    reference average). One negative per example, so the negatives are as independent as the examples."""
    n = len(refs)
    if n < 2 or len(guesses) != n:
        raise ValueError(f"need at least 2 examples and one guess each, got {n} and {len(guesses)}")
    own = [token_prf(r, g, mode)[2] for r, g in zip(refs, guesses)]
    other = [token_prf(refs[(i + 1) % n], g, mode)[2] for i, g in enumerate(guesses)]
    return own, other


REPAIRED_POSITIVE = "token F1 of each guess against its own example"
REPAIRED_NEGATIVE = "token F1 of each guess against the next example (re-paired)"


def repaired_test(refs: Sequence[Sequence[Hashable]], guesses: Sequence[Sequence[Hashable]],
                  mode: Mode = "multiset") -> dict:
    """The ROC record (metrics/roc.py) of `repaired_f1`."""
    from metrics import roc

    return roc.roc(*repaired_f1(refs, guesses, mode), positive=REPAIRED_POSITIVE, negative=REPAIRED_NEGATIVE)
