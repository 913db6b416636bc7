"""The exact reference ⟨w, x⟩ the unmasking error is measured against (docs/fp_bound.md §4).

`exact_dot` is as accurate as a dot product computed in twice fp64 and rounded once (error-free products
and an error-free pairwise sum); `reference_dot_grid` uses it for fp64 operands and an fp64 GEMM for
narrower ones, whose products are exact in fp64. `reference_error_bound` says how far either can be from
the exact value, so that a measured error is never blamed on the reference.
"""
from __future__ import annotations

import math

import torch

from harness.splitee.numerics.precisions import U64, gamma

_SPLITTER = 2.0**27 + 1.0


def _two_product(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p + e = a·b exactly (Dekker 1971, without FMA; fp64, no overflow or underflow)."""
    p = a * b
    ca, cb = _SPLITTER * a, _SPLITTER * b
    ah = ca - (ca - a)
    al = a - ah
    bh = cb - (cb - b)
    bl = b - bh
    e = al * bl - (((p - ah * bh) - al * bh) - ah * bl)
    return p, e


def _sum2_pairwise(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, e) with s + e ≈ Σ over the last dimension: an error-free pairwise tree (Knuth's TwoSum at every
    node) whose exact rounding errors are summed apart in fp64 into e (Ogita, Rump & Oishi 2005, Sum2,
    in pairwise order). Each level adds the first half to the second (contiguous blocks: fast)."""
    err = torch.zeros(p.shape[:-1], dtype=torch.float64)
    while p.shape[-1] > 1:
        if p.shape[-1] % 2:
            p = torch.cat([p, torch.zeros(*p.shape[:-1], 1, dtype=p.dtype)], dim=-1)
        half = p.shape[-1] // 2
        a, b = p[..., :half], p[..., half:]
        s = a + b
        z = s - a
        err += ((a - (s - z)) + (b - z)).sum(-1)
        p = s
    return p[..., 0], err


def exact_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """⟨a, b⟩ over the last dimension, "exactly": as if computed in twice fp64 and rounded once (fp64).

    Products of numbers with at most 26 significant bits (fp32, bf16, fp16) are exact in fp64; fp64
    products are split error-free into p + e (`_two_product`). The p go through `_sum2_pairwise`; its
    exact rounding errors and the tiny e (|e| ≤ 2^−53·|p|) are summed in plain fp64 and added to the
    tree's sum in one final rounding. Error ≤ 2^−53·|⟨a,b⟩| + O(d·log d·2^−106)·Σ|aᵢbᵢ|
    (`reference_error_bound`, docs/fp_bound.md §4); tests check it against exact rational arithmetic.
    """
    a64, b64 = torch.broadcast_tensors(a.double(), b.double())
    if a.dtype == torch.float64 or b.dtype == torch.float64:
        p, e = _two_product(a64, b64)
        s, err = _sum2_pairwise(p)
        return s + (err + e.sum(-1))
    s, err = _sum2_pairwise(a64 * b64)
    return s + err


def reference_dot_grid(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The reference ⟨w, x⟩ for a [B, d] × [r, d] grid of working-precision operands, and its method.

    fp64 operands: `exact_dot`. Narrower operands: an fp64 GEMM: every product is exact in fp64, so the
    only error is the fp64 summation's, ≤ γ_d(2^−53)·Σ|wᵢxᵢ| in any order (`reference_error_bound`).
    """
    if x.dtype == torch.float64:
        return exact_dot(x[:, None, :], w[None, :, :]), "sum2"
    return x.double() @ w.double().T, "fp64"


def reference_error_bound(ref: torch.Tensor, s_wx: torch.Tensor, d: int, method: str = "sum2") -> torch.Tensor:
    """How far the reference can be from the exact ⟨w, x⟩ (s_wx = Σ|wᵢxᵢ|, fp64; docs/fp_bound.md §4).

    "sum2" (`exact_dot`): 2^−53·|ref|·(1 + 2^−51) + 4·γ_{2d}·2^−53·(⌈log₂ d⌉ + 2)·Σ|wᵢxᵢ|.
    "fp64" (exact products, fp64 sum in any order): γ_d·Σ|wᵢxᵢ|·(1 + 2^−51).
    """
    if method == "fp64":
        return gamma(d, U64) * s_wx.double() * (1 + 4 * U64)
    levels = math.ceil(math.log2(max(2, d))) + 2
    return U64 * ref.abs() * (1 + 4 * U64) + 4 * gamma(2 * d, U64) * U64 * levels * s_wx.double()
