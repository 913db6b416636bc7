"""The proven bound on the floating-point error of unmasking (paper §5.5; docs/fp_bound.md §3-§4).

The TEE recovers one output element ⟨w, x⟩ as fl(⟨w, fl(x+η)⟩) − fl(⟨w, η⟩): the device's answer minus
the correction, both in a working precision with unit roundoff u = 2^−p. docs/fp_bound.md derives, step
by step, the bound implemented here (`forward_error_bound`, `bound_from_sums`):

    |fl(fl(⟨w, fl(x+η)⟩) − fl(⟨w, η⟩)) − ⟨w, x⟩|
        ≤ (1+u)·(c₁·Σ|wᵢ||xᵢ+ηᵢ| + c₂·Σ|wᵢ||ηᵢ|) + u·|⟨w, x⟩|,
    c₁ = (1+u)(1+γ_d(u_acc))(1+ρ) − 1,   c₂ = (1+γ_d(u_acc))(1+ρ) − 1,   γ_n(v) = n·v/(1−n·v)  (Higham §3.1)

where u_acc is the precision the dot products accumulate in and ρ = u when that accumulator is wider
than the working precision (its result is rounded once more when stored), else 0. With u_acc = u this is
at most (1+u)(γ_{d+1}·Σ|w||x+η| + γ_d·Σ|w||η|) + u|⟨w,x⟩|. The bound is infinite when d·u_acc ≥ 1 (bf16
with d ≥ 256, fp16 with d ≥ 2048): Higham's γ_d does not exist there.

Operands. w, x and η are the working-precision numbers the TEE holds (x and w rounded from the fp32 model
once, η drawn and rounded); the reference ⟨w, x⟩ is the exact dot product of those operands
(harness/splitee/numerics/reference.py), so the error measured is the unmasking's alone, not the cost of storing
the model in that precision.
"""
from __future__ import annotations

import math

import torch

from harness.splitee.numerics.precisions import U64, Precision, gamma, precision, to_working
from harness.splitee.numerics.reference import exact_dot


def bound_coefficients(d: int, prec: str | Precision, accumulate: str | Precision | None = None) -> tuple[float, float]:
    """(c₁, c₂) of the bound for dot products of length d (docs/fp_bound.md, Theorem 1 and Corollary 2).

    `accumulate` is the precision the dot product sums in (None: the working precision itself). When it
    is wider, the accumulated value is rounded once more to the working precision (ρ = u).
    """
    prec = precision(prec)
    acc = prec if accumulate is None else precision(accumulate)
    if acc.u > prec.u:
        raise ValueError(f"accumulating {prec.name} in the narrower {acc.name} is outside the bound's model")
    u, g = prec.u, gamma(d, acc.u)
    rho = u if acc.u < u else 0.0
    if math.isinf(g):
        return math.inf, math.inf
    # (1+u)(1+g)(1+ρ) − 1 and (1+g)(1+ρ) − 1 expanded into sums of non-negative terms: evaluating them as
    # written would itself cancel catastrophically in fp64 when g ≈ 10⁻¹⁴ (the fp64 case).
    c2 = g + rho + g * rho
    c1 = u + c2 + u * c2
    return c1, c2


def evaluation_factor(d: int) -> float:
    """Covers the bound's own evaluation in fp64 (sums of d non-negative terms, a few more operations):
    the fp64 result times this factor is ≥ the exact value of the bound (docs/fp_bound.md §4)."""
    return 1.0 + 4.0 * gamma(d + 8, U64)


def bound_from_sums(s_xeta: torch.Tensor, s_eta: torch.Tensor, abs_wx: torch.Tensor, d: int,
                    prec: str | Precision, accumulate: str | Precision | None = None) -> torch.Tensor:
    """The bound from its three ingredients (fp64 tensors of one shape): Σ|wᵢ||xᵢ+ηᵢ|, Σ|wᵢ||ηᵢ|, |⟨w,x⟩|."""
    prec = precision(prec)
    c1, c2 = bound_coefficients(d, prec, accumulate)
    if math.isinf(c1):
        return torch.full_like(s_xeta, math.inf, dtype=torch.float64)
    u = prec.u
    b = (1 + u) * (c1 * s_xeta.double() + c2 * s_eta.double()) + u * abs_wx.double()
    return b * evaluation_factor(d)


def first_order_bound(s_xeta: torch.Tensor, s_eta: torch.Tensor, d: int, prec: str | Precision) -> torch.Tensor:
    """γ_d·(Σ|w||x+η| + Σ|w||η|): the two dot products' error terms only, in the working precision,
    without the rounding of x+η and of the final subtraction (docs/fp_bound.md §5). Reported beside the
    full bound because this is the form a reader most likely meets; it is not a proven bound."""
    g = gamma(d, precision(prec).u)
    if math.isinf(g):
        return torch.full_like(s_xeta, math.inf, dtype=torch.float64)
    return g * (s_xeta.double() + s_eta.double())


def forward_error_bound(w: torch.Tensor, x: torch.Tensor, eta: torch.Tensor, prec: str | Precision,
                        accumulate: str | Precision | None = None) -> torch.Tensor:
    """Bound on |fl(fl(⟨w, fl(x+η)⟩) − fl(⟨w, η⟩)) − ⟨w, x⟩| per dot product, fp64.

    w, x, η broadcast against each other over leading dimensions; the last is the dot-product dimension
    d. They are first rounded to the working precision (a no-op for operands already in it); the bound is
    for those operands.
    """
    prec = precision(prec)
    w, x, eta = (to_working(t, prec).double() for t in torch.broadcast_tensors(w, x, eta))
    d = w.shape[-1]
    s_xeta = (w.abs() * (x + eta).abs()).sum(-1)
    s_eta = (w.abs() * eta.abs()).sum(-1)
    return bound_from_sums(s_xeta, s_eta, exact_dot(w, x).abs(), d, prec, accumulate)
