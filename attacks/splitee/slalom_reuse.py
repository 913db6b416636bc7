"""Slalom's one-time pad and the case where it fails: a mask reused across two submissions (docs/sequential_attack.md).

With a fresh mask r uniform in Z_q, the device sees e = (x_q + r) mod q, uniform in Z_q whatever x_q is: the
exposure is independent of the input, so no attacker, sequential or other, beats the prior alone from it.
If the same r masks two inputs, (e₁ − e₂) mod q = (x₁,q − x₂,q) mod q, and re-centred into (−q/2, q/2] it is
the exact difference of the quantised inputs whenever that difference lies within ±(q−1)/2 (always for
quantised RMSNorm outputs). At layer 0 the QKV input is a function of the token alone (μ_v = RMSNorm₀(E[v]),
attacks/splitee/bayes.py), so the attacker looks for the token pairs (a, b) with Q(μ_a) − Q(μ_b) equal to that
difference: one pass over the vocabulary with a hash of the quantised codewords (`pairs_from_difference`).
"""
from __future__ import annotations

import numpy as np
import torch

from harness.splitee.mechanisms import SLALOM_MODULUS, centre, quantise


def blind(x_q: torch.Tensor, mask: torch.Tensor, modulus: int = SLALOM_MODULUS) -> torch.Tensor:
    """What the device receives: (x_q + r) mod q (int64)."""
    return torch.remainder(x_q.long() + mask.long(), modulus)


def reused_difference(e1: torch.Tensor, e2: torch.Tensor, modulus: int = SLALOM_MODULUS) -> torch.Tensor:
    """(e₁ − e₂) mod q re-centred into (−q/2, q/2]: x₁,q − x₂,q when both were blinded with the same mask."""
    return centre(torch.remainder(e1.long() - e2.long(), modulus), modulus)


def quantised_codebook(book: torch.Tensor, frac_bits: int) -> np.ndarray:
    """Q(μ_v) for every token (int64 [V, d]): the layer-0 QKV input each token produces, quantised as Slalom does."""
    return quantise(book, frac_bits).to(torch.int64).numpy()


def pairs_from_difference(diff: np.ndarray, book_q: np.ndarray, seed: int = 0) -> list[tuple[int, int]]:
    """Every token pair (a, b) with Q(μ_a) − Q(μ_b) = diff (one position's difference, int64 [d]): for each a,
    Q(μ_b) = Q(μ_a) − diff is looked up among the codewords by a random linear hash, then checked exactly."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 2**31, size=book_q.shape[1], dtype=np.int64)
    keys = book_q @ weights                      # wraps modulo 2^64: a hash, checked exactly below
    target = (book_q - diff[None]) @ weights
    order = np.argsort(keys)
    sorted_keys = keys[order]
    found = np.searchsorted(sorted_keys, target)
    out = []
    for a in np.nonzero((found < len(keys)) & (sorted_keys[np.minimum(found, len(keys) - 1)] == target))[0]:
        i = found[a]
        while i < len(keys) and sorted_keys[i] == target[a]:
            b = int(order[i])
            if np.array_equal(book_q[a] - book_q[b], diff):
                out.append((int(a), b))
            i += 1
    return out
