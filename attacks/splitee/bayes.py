"""The Bayes-optimal token attacker on the layer-0 QKV exposure (no training; not in the paper).

At layer 0 the QKV input at a position is a function of that position's token alone: LN(E[t]), with E
the embedding table and LN the layer-0 input RMSNorm, both public. Under EP1/EPN the device sees
y = LN(E[t]) + N(0, σ²I) with σ = Δ·sigma_scale/ε, also public. With a uniform prior over the vocabulary
the maximum-likelihood (and Bayes-optimal for 0-1 loss) guess is the nearest codeword,

    t̂ = argmin_t ‖y − LN(E[t])‖² = argmax_t (2·yᵀμ_t − ‖μ_t‖²),   μ_t = LN(E[t]),

which does not depend on σ. With a token prior p(t) (`log_prior`) the MAP guess adds 2σ²·log p(t).
Top-k lists are the k best scores. The vocabulary × positions distance matrix never exists in full: rows
and vocabulary are processed in chunks with a running top-k merge.

Repeated submission: the same prompt sent k times is masked with k fresh draws (the noise bank serves an
entry once), so the mean of the k exposures is LN(E[t]) + N(0, σ²/k·I): recovery at k equals the
single-exposure recovery at σ/√k, which `simulate_exposures` predicts from the codebook alone.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from harness.architectures import architecture_of, decoder_layers
from metrics.intervals import Estimate
from metrics.proportions import proportion_ci


@torch.no_grad()
def codebook(model: nn.Module, chunk: int = 8192) -> torch.Tensor:
    """μ_t = LN(E[t]) for every token t: the layer-0 QKV input each token produces, [V, d] float32."""
    embed = model.get_input_embeddings()
    norm = getattr(decoder_layers(model)[0], architecture_of(model).qkv_norm)
    vocab = embed.weight.shape[0]
    rows = [norm(embed(torch.arange(s, min(s + chunk, vocab)))).float() for s in range(0, vocab, chunk)]
    return torch.cat(rows)


@torch.no_grad()
def ml_topk(y: torch.Tensor, book: torch.Tensor, k: int = 5, *, log_prior: torch.Tensor | None = None,
            sigma: torch.Tensor | float | None = None, rows_per_chunk: int = 1024,
            vocab_per_chunk: int = 16384) -> torch.Tensor:
    """[N, k] token ids, best first, of the nearest codewords of each row of y [N, d] (MAP with a prior).

    `sigma` (a scalar or one value per row) is only used with `log_prior`.
    """
    if y.dim() != 2 or y.shape[1] != book.shape[1]:
        raise ValueError(f"y must be [N, {book.shape[1]}], got {tuple(y.shape)}")
    y = y.float()
    sq = (book * book).sum(-1)                       # ‖μ_t‖²
    if log_prior is not None:
        if sigma is None:
            raise ValueError("a prior needs sigma")
        sig = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1, 1).expand(y.shape[0], 1)
    out = torch.empty(y.shape[0], k, dtype=torch.long)
    for r0 in range(0, y.shape[0], rows_per_chunk):
        rows = y[r0:r0 + rows_per_chunk]
        best_s = torch.full((rows.shape[0], k), -torch.inf)
        best_i = torch.zeros((rows.shape[0], k), dtype=torch.long)
        for v0 in range(0, book.shape[0], vocab_per_chunk):
            part = book[v0:v0 + vocab_per_chunk]
            scores = 2.0 * rows @ part.T - sq[v0:v0 + vocab_per_chunk]
            if log_prior is not None:
                scores = scores + 2.0 * sig[r0:r0 + rows_per_chunk] ** 2 * log_prior[v0:v0 + vocab_per_chunk]
            kk = min(k, part.shape[0])
            s, i = scores.topk(kk, dim=1)
            merged_s = torch.cat([best_s, s], dim=1)
            merged_i = torch.cat([best_i, i + v0], dim=1)
            best_s, pos = merged_s.topk(k, dim=1)
            best_i = merged_i.gather(1, pos)
        out[r0:r0 + rows.shape[0]] = best_i
    return out


def unigram_log_prior(token_lists: Sequence[Sequence[int]], vocab: int) -> torch.Tensor:
    """log p(t) of add-one-smoothed unigram counts (the attacker's prior from its own corpus)."""
    counts = torch.ones(vocab, dtype=torch.float64)
    for ids in token_lists:
        counts += torch.bincount(torch.as_tensor(list(ids), dtype=torch.long), minlength=vocab).double()[:vocab]
    return (counts / counts.sum()).log().float()


@dataclass
class Recovery:
    """Per-prompt top-1 / top-k recovery (% of the prompt's positions whose true token is the best guess /
    among the k best), the top-1 guesses, and the same rates pooled over all positions (micro)."""

    top1: list[float]
    topk: list[float]
    guesses: list[list[int]]
    k: int
    pooled_top1: float
    pooled_topk: float
    n_positions: int

    def estimates(self) -> tuple[Estimate, Estimate]:
        """Macro averages over prompts with 95% intervals that respect 0 and 100 % (metrics/proportions.py)."""
        return proportion_ci(self.top1), proportion_ci(self.topk)


def attack(features: Sequence[torch.Tensor], tokens: Sequence[Sequence[int]], book: torch.Tensor, k: int = 5,
           **kw) -> Recovery:
    """Run the ML attacker on every prompt's exposure rows and score it against the true tokens."""
    lengths = [len(t) for t in tokens]
    if [f.shape[0] for f in features] != lengths:
        raise ValueError("features and tokens must be aligned per prompt and per position")
    y = torch.cat([f.float() for f in features])
    truth = torch.as_tensor([t for ids in tokens for t in ids], dtype=torch.long)
    preds = ml_topk(y, book, k, **kw)
    hit1 = (preds[:, 0] == truth).double()
    hitk = (preds == truth[:, None]).any(1).double()
    top1, topk, guesses = [], [], []
    pos = 0
    for n in lengths:
        top1.append(100.0 * float(hit1[pos:pos + n].mean()))
        topk.append(100.0 * float(hitk[pos:pos + n].mean()))
        guesses.append(preds[pos:pos + n, 0].tolist())
        pos += n
    return Recovery(top1, topk, guesses, k, 100.0 * float(hit1.mean()), 100.0 * float(hitk.mean()), len(truth))


def simulate_exposures(tokens: Sequence[Sequence[int]], book: torch.Tensor, sigmas: Sequence[float],
                       seed: int) -> list[torch.Tensor]:
    """LN(E[t]) + N(0, σ_r²I) for every prompt r: what the mechanism would expose, drawn afresh."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for ids, sigma in zip(tokens, sigmas):
        mu = book[torch.as_tensor(list(ids), dtype=torch.long)]
        out.append(mu + float(sigma) * torch.randn(mu.shape, generator=gen))
    return out


def chance_top1(guesses: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]) -> float:
    """Top-1 (%) a guess independent of the truth would score on these prompts: Σ_t q(t)·p(t), with q the
    guesses' and p the true tokens' empirical distributions (what a shuffled pairing scores on average)."""
    g = np.bincount(np.concatenate([np.asarray(x, dtype=np.int64) for x in guesses]))
    t = np.bincount(np.concatenate([np.asarray(x, dtype=np.int64) for x in tokens]))
    n = max(len(g), len(t))
    g = np.pad(g, (0, n - len(g))) / g.sum()
    t = np.pad(t, (0, n - len(t))) / t.sum()
    return 100.0 * float((g * t).sum())
