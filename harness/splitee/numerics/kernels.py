"""The working-precision kernels the floating-point study evaluates (docs/fp_bound.md §5).

- "library": torch's F.linear in the working dtype, what the engine calls. On CPU torch accumulates bf16
  and fp16 GEMMs in fp32 and rounds the result once (`probe_accumulation` measures this; the bound then
  uses u_acc = 2^−24 for it, `library_accumulation`). fp32/fp64 GEMMs sum in blocks in the working
  precision: any summation tree obeys γ_d, so the bound's model still holds.
- "sequential": recursive summation in the working precision, every product and every addition rounded
  to it (the bound's model exactly, by construction; `sequential_dot`).
A kernel outside the model shows up as a non-zero `violations` count in the study: it is reported, never
filtered.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.splitee.numerics.bound import evaluation_factor
from harness.splitee.numerics.precisions import PRECISIONS, Precision, gamma, precision
from harness.splitee.numerics.reference import reference_dot_grid

KERNELS = ("library", "sequential")


def recursive_sum(p: torch.Tensor) -> torch.Tensor:
    """p[0] + p[1] + … over the FIRST dimension, left to right, each addition rounded to p's dtype.

    torch computes an elementwise bf16/fp16 operation in fp32 and rounds the result; rounding twice
    (to fp32, then to p bits) equals rounding once for + and × when 24 ≥ 2p + 2 (Figueroa 1995), true
    for bf16 (p = 8) and fp16 (p = 11), so every step is correctly rounded (tests compare with scalar
    loops). torch.cumsum and .sum() accumulate bf16/fp16 in fp32 and are therefore not used.
    """
    acc = p[0].clone()
    for i in range(1, p.shape[0]):
        acc.add_(p[i])
    return acc


def sequential_dot(a: torch.Tensor, b: torch.Tensor, prec: str | Precision) -> torch.Tensor:
    """⟨a, b⟩ over the last dimension by recursive summation in the working precision (Higham §3.1's
    model: products rounded, then s ← fl(s + pᵢ) in order). Returns the working dtype."""
    dt = precision(prec).dtype
    products = torch.mul(*torch.broadcast_tensors(a.to(dt), b.to(dt)))
    return recursive_sum(products.movedim(-1, 0).contiguous())


def sequential_grid(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[B, d] × [r, d] → [B, r] of sequential dot products in x's dtype (x and w already in it)."""
    products = x[:, None, :] * w[None, :, :]
    return recursive_sum(products.movedim(-1, 0).contiguous())


def library_grid(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[B, d] × [r, d] → [B, r] with torch's F.linear in x's dtype: the engine's own call."""
    return F.linear(x, w)


def grid(kernel: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[B, d] × [r, d] → [B, r] with the named kernel (one of KERNELS)."""
    if kernel == "library":
        return library_grid(x, w)
    if kernel == "sequential":
        return sequential_grid(x, w)
    raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def probe_accumulation(prec: str | Precision, d: int = 1024, n: int = 64, seed: int = 0) -> dict:
    """What torch's F.linear does in this precision here: n single dot products of length d and one
    [n, d] × [d, n] GEMM, compared with the exactly rounded results and with recursive summation.

    kind:
    - "wide-accumulator": every result lies within the bound of an fp32 accumulation rounded once to
      the working precision, and at least 90% equal the exactly rounded value (a result one ulp off
      the exact rounding is expected where fp32's own error straddles a rounding boundary);
    - "sequential": every result equals recursive summation in the working precision;
    - "other": neither (e.g. blocked or vectorised summation in the working precision).
    """
    prec = precision(prec)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64).to(prec.dtype)
    w = torch.randn(n, d, generator=g, dtype=torch.float64).to(prec.dtype)
    # Both shapes the harness uses: one dot product per call, and an [n, d] × [d, n] GEMM.
    single = torch.stack([F.linear(x[i:i + 1], w[i:i + 1])[0, 0] for i in range(n)]).double()
    gemm = F.linear(x, w).double()

    def both(values: torch.Tensor) -> torch.Tensor:
        return torch.cat([values.diagonal(), values.flatten()])

    lib = torch.cat([single, gemm.flatten()])
    exact = both(reference_dot_grid(x, w)[0])
    once = exact.to(prec.dtype).double()
    seq = both(sequential_grid(x, w).double())
    s_abs = both(x.double().abs() @ w.double().abs().T)
    g32 = gamma(d, PRECISIONS["fp32"].u)
    wide_bound = (1 + prec.u) * g32 * s_abs + prec.u * exact.abs()
    f_once = (lib == once).double().mean().item()
    f_seq = (lib == seq).double().mean().item()
    f_wide = ((lib - exact).abs() <= wide_bound * evaluation_factor(d)).double().mean().item()
    if prec.name in ("bf16", "fp16") and f_wide == 1.0 and f_once >= 0.9:
        kind = "wide-accumulator"
    elif f_seq == 1.0:
        kind = "sequential"
    else:
        kind = "other"
    return {"precision": prec.name, "kind": kind, "frac_rounded_once": f_once, "frac_sequential": f_seq,
            "frac_within_fp32_accumulation_bound": f_wide, "d": d, "n_results": int(lib.numel()),
            "torch": torch.__version__}


def library_accumulation(prec: str | Precision, probe: dict | None) -> str:
    """The accumulation precision the bound assumes for the library kernel: fp32 for bf16/fp16 when the
    probe found a wide accumulator rounded once; otherwise the working precision (valid for any
    summation order within it)."""
    prec = precision(prec)
    if prec.name in ("bf16", "fp16") and probe is not None and probe.get("kind") == "wide-accumulator":
        return "fp32"
    return prec.name
