"""The embedding table a sanitiser and its attackers share, the candidate vocabulary, and nearest-token search.

Paper 001 replaces each token by the vocabulary token nearest to a perturbed embedding,
argmin_{t_j ∈ V} dist(E[t_j], φ̃). Its E is GloVe; offline we take the victim model's own input
embeddings by default (any (vocab × d) table saved with torch.save or numpy.save is an option). The
candidate vocabulary V is every token but the tokenizer's special ones, optionally only those whose text
matches a regex; a token outside V (the paper's out-of-vocabulary case) is left as it is by every mechanism.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.devices import cpu_has_any
from harness.errors import UserError

EUCLIDEAN, COSINE = "euclidean", "cosine"
SHORTLIST_MIN_VOCAB, SHORTLIST_EXTRA = 4096, 32


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (cpuinfo flags avx512_bf16 or amx_bf16)."""
    return cpu_has_any("avx512_bf16", "amx_bf16")


@dataclass
class Table:
    """E (vocab × d, float32) with the candidate output tokens and the distance both sides use."""

    vectors: torch.Tensor          # (V, d): E[t] for every token id the tokenizer has
    candidates: torch.Tensor       # (C,) int64: ids a mechanism may output, ascending
    distance: str = EUCLIDEAN
    memo: dict = field(default_factory=dict, repr=False)   # results that depend on the table only

    def __post_init__(self) -> None:
        if self.distance not in (EUCLIDEAN, COSINE):
            raise ValueError(f"unknown distance {self.distance!r}")
        if self.candidates.numel() == 0:
            raise UserError("the candidate vocabulary is empty after filtering (sanitize.vocab_filter matches no "
                            "token); widen the filter or set it to null")
        self.vectors = self.vectors.float().contiguous()
        self.is_candidate = torch.zeros(self.vectors.shape[0], dtype=torch.bool)
        self.is_candidate[self.candidates] = True
        cand = self.vectors[self.candidates]
        # What a nearest-token search compares against: unit rows for cosine; ‖e‖² for euclidean, so that
        # argmin ‖q − e‖² = argmin (‖e‖² − 2 q·e) is one matrix product.
        self._cand = torch.nn.functional.normalize(cand, dim=1) if self.distance == COSINE else cand
        self._sq = (cand * cand).sum(1)
        # position of each token id in `candidates` (-1: not a candidate)
        self._slot = torch.full((self.vectors.shape[0],), -1, dtype=torch.long)
        self._slot[self.candidates] = torch.arange(self.candidates.numel())
        # A bf16 copy shortlists candidates about 3x faster than fp32 on CPUs with bf16 dot products
        # (AVX-512 BF16, AMX); the shortlist is then ranked again exactly in fp32 (`nearest`), so only a
        # true nearest token outside the bf16 top (k + SHORTLIST_EXTRA) could be missed. Without them
        # (e.g. AVX2 only) bf16 products are emulated and 3.5x *slower* than fp32: score in fp32 throughout.
        shortlist = self.candidates.numel() > SHORTLIST_MIN_VOCAB and native_bf16()
        self._cand_bf16 = self._cand.to(torch.bfloat16) if shortlist else None

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def scores(self, queries: torch.Tensor) -> torch.Tensor:
        """(n, C) dissimilarity of each query to each candidate (smaller is nearer): ‖e‖² − 2 q·e for
        euclidean (‖q‖² dropped: it does not change a row's order), −cos(q, e) for cosine."""
        if self.distance == COSINE:
            return -(torch.nn.functional.normalize(queries, dim=1) @ self._cand.T)
        return self._sq.unsqueeze(0) - 2.0 * (queries @ self._cand.T)

    def nearest(self, queries: torch.Tensor, k: int = 1, exclude: torch.Tensor | None = None,
                chunk: int = 256) -> torch.Tensor:
        """(n, k) token ids of the k candidates nearest each query, nearest first; `exclude` (n,) a token id per
        query that may not be returned (Stencil's "different than the original one"), or -1 for none."""
        k = min(k, int(self.candidates.numel()) - (0 if exclude is None else 1))
        if k < 1:
            raise UserError("the candidate vocabulary holds no token other than the original one")
        out = []
        for start in range(0, queries.shape[0], chunk):
            q = queries[start:start + chunk]
            if self._cand_bf16 is None:
                s = self.scores(q)
                cols = None
            else:  # shortlist in bf16, then exact fp32 scores of the shortlist only
                qb = (torch.nn.functional.normalize(q, dim=1) if self.distance == COSINE else q).to(torch.bfloat16)
                rough = (qb @ self._cand_bf16.T).float()
                rough = -rough if self.distance == COSINE else self._sq.unsqueeze(0) - 2.0 * rough
                cols = rough.topk(min(k + SHORTLIST_EXTRA, rough.shape[1]), dim=1, largest=False).indices
                s = self._exact(q, cols)
            if exclude is not None:
                slots = self._slot[exclude[start:start + chunk]]
                hit = (cols == slots.unsqueeze(1)) if cols is not None else None
                if hit is None:
                    rows = torch.nonzero(slots >= 0).squeeze(1)
                    s[rows, slots[rows]] = float("inf")
                else:
                    s[hit] = float("inf")
            top = s.topk(k, dim=1, largest=False).indices
            out.append(self.candidates[top if cols is None else cols.gather(1, top)])
        return torch.cat(out) if out else torch.empty(0, k, dtype=torch.long)

    def _exact(self, q: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """fp32 `scores` of each query against its own shortlist `cols` (n, m) of candidate slots."""
        c = self._cand[cols]                                    # (n, m, d)
        if self.distance == COSINE:
            return -torch.einsum("nd,nmd->nm", torch.nn.functional.normalize(q, dim=1), c)
        return self._sq[cols] - 2.0 * torch.einsum("nd,nmd->nm", q, c)


def token_texts(tokenizer: Any, size: int) -> list[str]:
    """The text of each single token id (what a stop-word list or a vocabulary regex is matched against)."""
    return tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)


def special_ids(tokenizer: Any) -> set[int]:
    return {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}


def vocab_size(tokenizer: Any, vectors: torch.Tensor) -> int:
    """Token ids the tokenizer can produce that have an embedding row (padding rows past len(tokenizer) are
    never candidates)."""
    return min(len(tokenizer), int(vectors.shape[0]))


def candidate_ids(tokenizer: Any, vectors: torch.Tensor, vocab_filter: str | None,
                  texts: list[str] | None = None) -> torch.Tensor:
    """Every non-special token id, or with `vocab_filter` those whose text matches it (re.fullmatch)."""
    size = vocab_size(tokenizer, vectors)
    keep = torch.ones(size, dtype=torch.bool)
    special = [i for i in special_ids(tokenizer) if i < size]
    keep[special] = False
    if vocab_filter is not None:
        pattern = re.compile(vocab_filter)
        texts = texts if texts is not None else token_texts(tokenizer, size)
        keep &= torch.tensor([bool(pattern.fullmatch(t)) for t in texts[:size]])
    return torch.nonzero(keep).squeeze(1)


def load_vectors(source: str, model: Any) -> torch.Tensor:
    """`victim`: the model's input embeddings; otherwise a path to a (vocab × d) tensor (.pt) or array (.npy)."""
    if source == "victim":
        return model.get_input_embeddings().weight.detach().float().cpu()
    path = Path(source).expanduser()
    if not path.is_file():
        raise UserError(f"sanitize.embeddings={source} is neither 'victim' nor an existing .pt/.npy file")
    if path.suffix == ".npy":
        import numpy as np

        vectors = torch.from_numpy(np.load(path))
    else:
        vectors = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(vectors, torch.Tensor) or vectors.ndim != 2:
        raise UserError(f"sanitize.embeddings={source} must hold one 2-D table (vocab x d)")
    return vectors.float()


# CusText's output sets over a table: the sanitisers' CusText+ and collab's edge-side CusText both draw from them.
def custext_sets(table: Table, tokens: torch.Tensor, k: int, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For each token: its output set (m, k') of the k' = min(k, |V|) most similar candidates, nearest first
    (the token itself first when it is a candidate), and the exponential mechanism's probabilities (m, k')."""
    k = min(k, int(table.candidates.numel()))
    # Output sets depend on the table and k only: memoised on the table (the Bayes attacker asks for the
    # sets of the same candidates again on the deranged view).
    memo = table.memo.setdefault(("custext_sets", k), {})
    missing = sorted({int(t) for t in tokens.tolist()} - memo.keys())
    if missing:
        new = torch.tensor(missing, dtype=torch.long)
        found = table.nearest(table.vectors[new], k)
        for t, row in zip(missing, found):
            memo[t] = row
    sets = torch.stack([memo[int(t)] for t in tokens.tolist()]) if tokens.numel() else torch.empty(0, k, dtype=torch.long)
    sim = similarity(table, table.vectors[tokens].unsqueeze(1), table.vectors[sets])
    lo, hi = sim.min(1, keepdim=True).values, sim.max(1, keepdim=True).values
    u = torch.where(hi > lo, (sim - lo) / (hi - lo).clamp_min(1e-30), torch.ones_like(sim))
    return sets, torch.softmax(epsilon * u / 2.0, dim=1)


def similarity(table: Table, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """CusText's similarity of embeddings (broadcast over the last axis): cosine, or minus the Euclidean
    distance."""
    if table.distance == COSINE:
        return torch.nn.functional.cosine_similarity(a, b, dim=-1)
    return -(a - b).norm(dim=-1)
