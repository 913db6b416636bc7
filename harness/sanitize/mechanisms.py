"""The four token-level sanitisers of paper 001 (and the identity, the attackers' positive control).

Each maps sequences of token ids to sequences of the same lengths, one token for one token, vectorised over
every position of every sequence at once (the sequences are concatenated; a window never crosses from one
into the next):

- stencil (Harel et al.): φ̃_i = Σ_j f_ij E[t_j] over a window of L tokens with Gaussian weights of std σ
  normalised to sum 1; t̃_i = the candidate nearest φ̃_i other than t_i. Deterministic.
- dx_noise (Feyisetan et al. 2020, Qu et al. 2021): E[t_i] + p, p = r·u, r ~ Gamma(d, 1/η) (shape d, scale
  1/η, so E[r] = d/η), u uniform on the unit sphere of R^d; then the nearest candidate.
- dx_stencil (the paper's Algorithm 1): the Stencil quasi-embedding φ̃_i + p; then the nearest candidate,
  the original allowed unless `may_return_original` is false.
- custext_plus (CusText, Chen et al. 2023, with stop words kept): each token's output set is its k most
  similar candidates (itself included); t' is drawn from it by the exponential mechanism,
  P(t'|t) ∝ exp(ε·u(t, t')/2) with u the similarity min-max normalised to [0, 1] over the set (Δu = 1).
  Stop words are returned unchanged.

Tokens outside the candidate vocabulary (special tokens, or those a vocab_filter drops: the paper's
out-of-vocabulary tokens) are returned unchanged by every mechanism.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from harness.token_embeddings import COSINE, Table, custext_sets, similarity  # noqa: F401  (mechanisms' own API)

IDENTITY, STENCIL, DX_NOISE, DX_STENCIL, CUSTEXT_PLUS = "identity", "stencil", "dx_noise", "dx_stencil", "custext_plus"
MECHANISMS = (IDENTITY, STENCIL, DX_NOISE, DX_STENCIL, CUSTEXT_PLUS)
# The mechanisms whose privacy parameter is η of dχ privacy (the rest: ε of CusText+, none for Stencil).
DX = (DX_NOISE, DX_STENCIL)


@dataclass(frozen=True)
class Settings:
    mechanism: str
    window: int = 5                 # L
    sigma: float = 1.25             # σ of the Gaussian weights
    parameter: float | None = None  # η (dx_noise, dx_stencil) or ε (custext_plus)
    may_return_original: bool = True  # dx_stencil only; stencil never returns it, dx_noise always may
    custext_k: int = 20

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown mechanism {self.mechanism!r}")
        if self.window < 1 or not self.sigma > 0 or self.custext_k < 1:
            raise ValueError(f"bad settings {self}")
        if self.mechanism in DX + (CUSTEXT_PLUS,) and not (self.parameter is not None and self.parameter > 0):
            raise ValueError(f"{self.mechanism} needs a privacy parameter > 0, got {self.parameter}")

    @property
    def uses_window(self) -> bool:
        return self.mechanism in (STENCIL, DX_STENCIL)


def window_offsets(window: int, sigma: float) -> tuple[list[int], list[float]]:
    """The offsets j − i of Stencil's window of L tokens and their unnormalised Gaussian weights f'.

    Odd L: offsets −(L−1)/2 … (L−1)/2, centred on the token itself, so its own weight is the largest. Even
    L: offsets −(L/2−1) … L/2, with the Gaussian centred half-way between the token and the next one, so the
    two share the largest weight (the paper's §5: "the highest weights spread across the original token
    and its nearest neighbor"). Both are symmetric about the window's centre and decay away from it."""
    first = -((window - 1) // 2)
    offsets = list(range(first, first + window))
    centre = (first + offsets[-1]) / 2.0
    return offsets, [math.exp(-((o - centre) ** 2) / (2.0 * sigma * sigma)) for o in offsets]


def window_matrix(length: int, window: int, sigma: float) -> torch.Tensor:
    """(n, n) f_ij for one sequence: row i holds the window weights of position i, truncated at the
    sequence's ends and renormalised to sum 1 (what `quasi_embeddings` computes row by row)."""
    offsets, weights = window_offsets(window, sigma)
    f = torch.zeros(length, length, dtype=torch.float64)
    for o, w in zip(offsets, weights):
        for i in range(length):
            if 0 <= i + o < length:
                f[i, i + o] = w
    return (f / f.sum(1, keepdim=True)).float()


def _window_terms(segment: torch.Tensor, window: int, sigma: float):
    """Per window offset: (offset, weight, source index, valid mask), and each position's weight total."""
    n = segment.shape[0]
    pos = torch.arange(n)
    terms, total = [], torch.zeros(n, 1)
    for o, w in zip(*window_offsets(window, sigma)):
        src = (pos + o).clamp(0, max(n - 1, 0))
        ok = (pos + o >= 0) & (pos + o < n) & (segment[src] == segment)
        terms.append((o, w, src, ok))
        total[ok] += w
    return terms, total


def quasi_embeddings(vectors: torch.Tensor, ids: torch.Tensor, segment: torch.Tensor, window: int,
                     sigma: float) -> torch.Tensor:
    """φ̃ (n, d) of flat `ids` whose sequence numbers are `segment`: one shifted sum per window offset, each
    row's weights normalised over the part of its window inside its own sequence."""
    e = vectors[ids]
    out = torch.zeros_like(e)
    terms, total = _window_terms(segment, window, sigma)
    for _, w, src, ok in terms:
        out[ok] += w * e[src[ok]]
    return out / total


def own_weights(segment: torch.Tensor, window: int, sigma: float) -> torch.Tensor:
    """(n,) f_ii: the normalised weight of each position's own token in its quasi-embedding."""
    terms, total = _window_terms(segment, window, sigma)
    w0 = next(w for o, w, _, _ in terms if o == 0)
    return w0 / total.squeeze(1)


def dx_noise(n: int, dim: int, eta: float, generator: torch.Generator) -> torch.Tensor:
    """n draws of p = r·u: r ~ Gamma(shape d, scale 1/η), u uniform on the unit sphere (Fernandes et al.
    2019: the d-dimensional Laplace density ∝ exp(−η‖p‖))."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    r = torch.from_numpy(np.random.default_rng(seed).gamma(dim, 1.0 / eta, size=n)).float()
    u = torch.randn(n, dim, generator=generator)
    u = u / u.norm(dim=1, keepdim=True)
    return r.unsqueeze(1) * u


def sanitize(sequences: Sequence[Sequence[int]], table: Table, settings: Settings, generator: torch.Generator,
             keep: torch.Tensor | None = None, chunk: int = 256) -> list[list[int]]:
    """The sanitised sequences (same lengths). `keep` (V,) bool marks token ids to leave unchanged besides the
    non-candidates (CusText+'s stop words)."""
    lengths = [len(s) for s in sequences]
    if sum(lengths) == 0:
        return [[] for _ in sequences]
    ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long)
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    out = sanitize_flat(ids, segment, table, settings, generator, keep=keep, chunk=chunk)
    return [part.tolist() for part in torch.split(out, lengths)]


def sanitize_flat(ids: torch.Tensor, segment: torch.Tensor, table: Table, settings: Settings,
                  generator: torch.Generator, keep: torch.Tensor | None = None, chunk: int = 256) -> torch.Tensor:
    """`sanitize` on concatenated ids with their sequence numbers."""
    m = settings.mechanism
    fixed = ~table.is_candidate[ids]
    if m == CUSTEXT_PLUS and keep is not None:
        fixed |= keep[ids]
    if m == IDENTITY:
        return ids.clone()
    out = ids.clone()
    if m == CUSTEXT_PLUS:
        todo = torch.nonzero(~fixed).squeeze(1)
        if todo.numel():
            uniq, inverse = torch.unique(ids[todo], return_inverse=True)
            sets, probs = custext_sets(table, uniq, settings.custext_k, float(settings.parameter))
            pick = torch.multinomial(probs[inverse], 1, generator=generator).squeeze(1)
            out[todo] = sets[inverse, pick]
        return out
    if settings.uses_window:
        queries = quasi_embeddings(table.vectors, ids, segment, settings.window, settings.sigma)
    else:
        queries = table.vectors[ids].clone()
    if m in DX:
        queries += dx_noise(queries.shape[0], table.dim, float(settings.parameter), generator)
    exclude = ids if m == STENCIL or (m == DX_STENCIL and not settings.may_return_original) else None
    todo = torch.nonzero(~fixed).squeeze(1)
    if todo.numel():
        nearest = table.nearest(queries[todo], 1, exclude=None if exclude is None else exclude[todo], chunk=chunk)
        out[todo] = nearest[:, 0]
    return out
