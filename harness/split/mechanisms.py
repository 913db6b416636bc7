"""How the TEE hides the input of one offloaded linear op and recovers W·x from the device's answer.

- Plain (T3): the input crosses in the clear.
- Gaussian (EP1, EPN): x + σ·η with η from the bank, σ = Δ_op·(per-row factor); the TEE subtracts σ·(W·η)
  (paper §4.3, §5.4). The factor comes from the configuration (harness/configurations.py noise_factors).
- Slalom (Tramèr & Boneh 2019, paper §7.2): fixed-point quantisation with `frac_bits` fractional bits of
  inputs and weights, a uniform mask in Z_q, the device computes W_q·(x_q + r) mod q, the TEE subtracts the
  precomputed W_q·r mod q, re-centres into (−q/2, q/2] and de-quantises. Products are carried exactly in a
  float64 GEMM split over the input dimension so that every partial sum stays below 2^53.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SLALOM_MODULUS = 2**23 + 2**21 + 7  # 10,485,767, Slalom's prime
FLOAT64_EXACT = 2**53


def exact_chunk(max_abs_weight: float, modulus: int) -> int:
    """Largest input-dimension chunk whose float64 dot products of values in [0, q) stay exact."""
    return max(1, int((FLOAT64_EXACT - 1) // ((modulus - 1) * max(1.0, max_abs_weight))))


def exact_matmul_mod(x: torch.Tensor, w: torch.Tensor, modulus: int, chunk: int | None = None) -> torch.Tensor:
    """(x @ wᵀ) mod q for float64 tensors holding integers, x in [0, q): exact, never rounded."""
    d = x.shape[-1]
    if chunk is None:
        chunk = exact_chunk(w.abs().max().item(), modulus)
    out = None
    for start in range(0, d, chunk):
        part = torch.remainder(x[..., start:start + chunk] @ w[:, start:start + chunk].T, modulus)
        out = part if out is None else torch.remainder(out + part, modulus)
    return out


def quantise(t: torch.Tensor, frac_bits: int) -> torch.Tensor:
    """Fixed point: round(t·2^f), returned as float64 integers."""
    return torch.round(t.double() * float(2**frac_bits))


def centre(z: torch.Tensor, modulus: int) -> torch.Tensor:
    """Map residues in [0, q) to the signed representatives in (−q/2, q/2]."""
    return torch.where(z > modulus // 2, z - modulus, z)


class Plain:
    name = "plain"

    def needs_bank(self) -> bool:
        return False

    def run(self, op, x: torch.Tensor) -> list[torch.Tensor]:
        ctx = op.ctx
        sent = ctx.boundary.send(op.name, op.layer, x)
        with ctx.clock.time(op.category):
            ys = [F.linear(sent, w, b) for w, b in op.device_params]
        return ctx.boundary.receive(ys)


class Gaussian:
    name = "gaussian"

    def needs_bank(self) -> bool:
        return True

    def chunk_maker(self, op):
        from harness.split.noise_bank import gaussian_chunk_maker

        return gaussian_chunk_maker(op.tee_weights)

    def run(self, op, x: torch.Tensor) -> list[torch.Tensor]:
        ctx = op.ctx
        rows = x.shape[:-1]
        n = math.prod(rows)
        masks, corrections = op.take(n)
        with ctx.clock.time("masking"):
            # σ per batch row: the engine sets Δ-free factors (1/ε or √n_prompt) for the current batch.
            sigma = (op.delta * ctx.sigma_factor).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
            exposed = torch.addcmul(x, sigma, masks.view(*rows, -1))
        sent = ctx.boundary.send(op.name, op.layer, exposed)
        with ctx.clock.time(op.category):
            ys = [F.linear(sent, w, b) for w, b in op.device_params]
        ys = ctx.boundary.receive(ys)
        with ctx.clock.time("masking"):
            # The answers are fresh tensors owned by the TEE now: unmask in place, fused.
            return [y.addcmul_(sigma, c.view(*rows, -1), value=-1.0) for y, c in zip(ys, corrections)]


class Slalom:
    name = "slalom"

    def __init__(self, frac_bits: int = 8, modulus: int = SLALOM_MODULUS) -> None:
        self.frac_bits = frac_bits
        self.modulus = modulus

    def needs_bank(self) -> bool:
        return True

    def quantised_weights(self, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        return [quantise(w, self.frac_bits) for w in weights]

    def chunk_maker(self, op):
        from harness.split.noise_bank import slalom_chunk_maker

        return slalom_chunk_maker(
            op.tee_quantised, self.modulus, lambda x, w: exact_matmul_mod(x, w, self.modulus, op.device_chunk)
        )

    def run(self, op, x: torch.Tensor) -> list[torch.Tensor]:
        ctx, q = op.ctx, self.modulus
        rows = x.shape[:-1]
        masks, corrections = op.take(math.prod(rows))
        with ctx.clock.time("masking"):
            # x·2^f and its rounding are exact in float32 while |x_q| < 2^24; residues < q < 2^24 fit int32.
            x_q = torch.round(x * float(2**self.frac_bits)).to(torch.int32)
            exposed = torch.remainder(x_q + masks.view(*rows, -1), q)
        sent = ctx.boundary.send(op.name, op.layer, exposed)
        with ctx.clock.time(op.category):
            flat = sent.reshape(-1, sent.shape[-1]).double()
            ys = [exact_matmul_mod(flat, w, q, op.device_chunk).to(torch.int32) for w in op.device_quantised]
        ys = ctx.boundary.receive(ys)
        with ctx.clock.time("masking"):
            # |z| < q/2 < 2^23 is exact in float32, and so is scaling by a power of two.
            scale = 2.0 ** (-2 * self.frac_bits)
            outs = []
            for y, c, (_, b) in zip(ys, corrections, op.tee_params):
                z = centre(torch.remainder(y - c, q), q).to(x.dtype).mul_(scale).view(*rows, -1)
                outs.append(z.add_(b) if b is not None else z)
            return outs


def make_mechanism(name: str, slalom_frac_bits: int = 8):
    """The mechanism a split configuration names (harness/configurations.py `mechanism`)."""
    if name == Plain.name:
        return Plain()
    if name == Gaussian.name:
        return Gaussian()
    if name == Slalom.name:
        return Slalom(slalom_frac_bits)
    raise ValueError(f"{name!r} is not a masking mechanism")
