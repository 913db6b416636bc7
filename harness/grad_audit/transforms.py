"""The local node's forward transforms and the mitigation of the returned gradient (paper 004).

Forward, per row (one block of text) and per position vector of it:

    z = clip_C(R · W_down · s_A) + N(0, (noise_ratio·C)² I)

W_down (d → D) is the trainable bottleneck, R a secret random rotation of the latent (D × D orthogonal, one
per seed), clip_C scales every position vector to norm at most C. Decoy rows go through the same transforms,
and a fresh secret permutation of the rows mixes them into the frame (`assemble_frame`): the permutation
must come after the decoys join, or it would hide nothing.

The mitigation (paper: "per-row clipping of the returned gradient at C = 0.01 plus proportional Gaussian
noise") is the same clip-and-noise on what the local node returns, applied to every row, decoys included:

    g' = clip_c(g) + N(0, (noise_multiplier·c)² I).

The paper's c = 0.01 never binds: real rows' per-position gradient norms are at most 7.8·10⁻⁴ (issue 31), so
it is noise at about 200× the signal. `frame_clip` sets c per frame at a quantile of the real rows'
per-position norms the local node is about to return (adaptive clipping in the manner of Andrew et al. 2021,
here read off each frame rather than learnt privately: the audit is empirical, not a DP guarantee), so a
share 1 − q of them is clipped and the noise scales with the clipped norm. The quantile is over the positions
that carry a gradient: a row's last one never does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from harness.partition import clip_and_noise, clip_rows


def clip_positions(x: torch.Tensor, c: float) -> torch.Tensor:
    """Every vector along the last axis scaled to norm at most c (unchanged where it is already shorter)."""
    return clip_rows(x, c, 2)


def random_rotation(dim: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-random orthogonal matrix (QR of a Gaussian matrix, signs fixed by R's diagonal)."""
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


class LocalObfuscation(nn.Module):
    """The local node's bottleneck, rotation, clip and noise on s_A (module docstring)."""

    def __init__(self, hidden: int, latent: int, clip: float, noise_ratio: float, generator: torch.Generator):
        super().__init__()
        self.down = nn.Linear(hidden, latent, bias=False)
        with torch.no_grad():
            self.down.weight.copy_(torch.randn(latent, hidden, generator=generator) / math.sqrt(hidden))
        self.register_buffer("rotation", random_rotation(latent, generator))
        # a fixed scale of s_A before the bottleneck (1 unless DecoyTrainer.warm_start sets it), so that the
        # bottleneck's weights stay of order one and Adam's steps of lr move them by the same relative amount
        self.register_buffer("input_scale", torch.ones(()))
        self.clip, self.sigma = float(clip), float(noise_ratio) * float(clip)

    def forward(self, s_a: torch.Tensor, noise: torch.Generator) -> torch.Tensor:
        z = clip_positions(self.down(s_a * self.input_scale) @ self.rotation.T, self.clip)
        if self.sigma > 0:
            z = z + self.sigma * torch.randn(z.shape, generator=noise)
        return z


@dataclass
class Frame:
    """One frame in the cloud's row order: payload[i] is row perm[i] of cat(real, decoys)."""

    payload: torch.Tensor      # (rows, T, D)
    perm: torch.Tensor         # (rows,) cloud row i = local row perm[i]
    n_real: int

    @property
    def is_real(self) -> torch.Tensor:
        return self.perm < self.n_real

    @property
    def real_index(self) -> torch.Tensor:
        """The cloud row of each real row, in the local node's order."""
        return torch.argsort(self.perm)[:self.n_real]


def assemble_frame(real: torch.Tensor, decoys: torch.Tensor, generator: torch.Generator) -> Frame:
    """Real and decoy rows, mixed by a fresh secret permutation."""
    rows = torch.cat([real, decoys])
    perm = torch.randperm(rows.shape[0], generator=generator)
    return Frame(rows[perm], perm, real.shape[0])


def mitigate(grad: torch.Tensor, clip: float, noise_multiplier: float, generator: torch.Generator) -> torch.Tensor:
    """The returned gradient clipped per position vector to `clip` plus N(0, (noise_multiplier·clip)²) on
    every entry, decoy rows included (module docstring): split fine-tuning's guard on `grad_up`."""
    return clip_and_noise(grad, clip, noise_multiplier, generator)


def carrying_norms(real_grad: torch.Tensor) -> torch.Tensor:
    """The per-position ℓ2 norms of the real rows' returned gradient (rows, T, d), flattened, over the
    positions that carry one. A row's last position never does (nothing after it is predicted from it), so
    with 8-token rows 12.5 % of all norms are exactly 0: a quantile over all of them would put the clip at 0
    for q < 0.125 and return nothing but zeros."""
    norms = real_grad.norm(dim=-1).flatten()
    return norms[norms > 0]


def frame_clip(norms: torch.Tensor, fixed: float | None, quantile: float | None) -> float:
    """The mitigation's clip for one frame: `fixed`, or the `quantile` of `norms`, the real rows' carrying
    norms (`carrying_norms`), so a share 1 − q of those is clipped."""
    if quantile is None:
        return float(fixed)
    if norms.numel() == 0:
        raise ValueError("the mitigation's quantile clip: no real position carries a returned gradient")
    return float(torch.quantile(norms.double(), float(quantile)))
