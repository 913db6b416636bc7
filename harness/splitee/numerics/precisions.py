"""Working precisions of the floating-point study: unit roundoff and Higham's γ_n (docs/fp_bound.md §1-§2)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

U64 = 2.0**-53


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype
    p: int                 # significand bits, the implicit bit included

    @property
    def u(self) -> float:
        """Unit roundoff of round-to-nearest, 2^−p."""
        return 2.0**-self.p


PRECISIONS: dict[str, Precision] = {
    "fp64": Precision("fp64", torch.float64, 53),
    "fp32": Precision("fp32", torch.float32, 24),
    "fp16": Precision("fp16", torch.float16, 11),
    "bf16": Precision("bf16", torch.bfloat16, 8),
}


def precision(name: str | Precision) -> Precision:
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; choose from {', '.join(PRECISIONS)}") from None


def gamma(n: int, u: float) -> float:
    """γ_n = n·u/(1−n·u) (Higham 2002, Lemma 3.1); +inf where n·u ≥ 1 and the lemma says nothing."""
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else math.inf


def to_working(t: torch.Tensor, prec: str | Precision) -> torch.Tensor:
    """Round to the working precision (the operands the TEE holds)."""
    return t.to(precision(prec).dtype)
