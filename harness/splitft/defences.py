"""The client's defences at the first cut (paper 002 §II "Existing defenses", §V PrivPair), one interface:

    embed(e)                   the embedding output before block 1 (embedding dχ-privacy perturbs it)
    send(s_A)                  what crosses to the server at cut k (s_A, or s'_A); its autograd path to s_A
                               is the gradient the client's A receives back
    recover(s'_B, s_A, s'_A)   what C gets from the server's output (PrivPair's W2; the others: s'_B)
    regulariser(e, s_A)        an extra client-side loss (NoPeek's distance correlation), or None
    burst(step, ...)           PrivPair's burst alignment; the others have none

Mechanisms and their knob (the run's `epsilon`, harness/configurations.py):
- none: s_A as it is.
- smashed-data DP, Gaussian (knob ε): every token vector of s_A clipped to ℓ2 norm c, plus N(0, σ²I) with
  σ = Δ₂·√(2 ln(1.25/δ))/ε and Δ₂ = 2c (replacing one token moves its clipped vector by at most 2c): the
  classic Gaussian mechanism (Dwork & Roth 2014, Thm A.1), per token and per exposure, not composed.
- smashed-data DP, Laplace (knob ε): ℓ1 clip to c₁, Laplace noise of scale b = Δ₁/ε, Δ₁ = 2c₁, per coordinate.
  c (c₁) is `splitft.dp.clip_norm`, or with null the mean ℓ2 (ℓ1) token norm of s_A on D_align: public
  data, so the calibration itself costs no privacy.
- embedding dχ-privacy (knob η; Feyisetan et al. 2020, the paper's ref. [24]): each token's embedding
  e + z with density of z ∝ exp(−η‖z‖): z = r·u, u uniform on the sphere, r ~ Gamma(d, 1/η).
- NoPeek (knob α; Vepakomma et al. 2020): loss + α·dCor(e, s_A), the distance correlation between the
  token embeddings and the smashed token vectors, over at most `max_tokens` token rows of the batch.
- PrivPair (knob λ, the coupling weight): harness/splitft/privpair.py.

None of these touches the gradient the client sends up at cut m (∂L/∂s'_B, `grad_up`), from which BiSR(b)
reads the labels (attacks/splitft/bisr_backward.py). `GradientGuard` is the one guard on that channel, and it
goes on top of any defence above (`splitft.grad_up`): every token vector of the gradient clipped to ℓ2 norm
c, plus N(0, (z·c)² I), paper 004's mitigation of its own returned gradient. It carries no DP claim: one
label moves every earlier position's gradient row through C's attention, so the per-row clip bounds no
per-label sensitivity.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from harness.partition import clip_and_noise, clip_rows  # noqa: F401  (also this module's API)


class Defence:
    """No defence: the interface's identity."""

    name = "none"
    obfuscates = False     # whether what crosses differs from s_A (so H_A and the plain s_B are measured)

    def setup(self, part: Any, align: torch.Tensor, generator: torch.Generator) -> None:
        """Calibrate on D_align (public blocks) before training."""

    def embed(self, e: torch.Tensor) -> torch.Tensor:
        return e

    def send(self, s_a: torch.Tensor) -> torch.Tensor:
        return s_a

    def recover(self, s_b_recv: torch.Tensor, s_a: torch.Tensor, s_a_sent: torch.Tensor) -> torch.Tensor:
        return s_b_recv

    def regulariser(self, e: torch.Tensor, s_a: torch.Tensor) -> torch.Tensor | None:
        return None

    def burst(self, step: int, part: Any, align: torch.Tensor, generator: torch.Generator,
              record: Any = None) -> dict[str, float] | None:
        return None

    # adapters the client keeps across rounds (never uploaded)
    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        pass


class GradientGuard:
    """The clip-and-noise guard on `grad_up` (module docstring); `clip` None: the gradient goes up as it is."""

    def __init__(self, clip: float | None, noise_multiplier: float, generator: torch.Generator) -> None:
        self.clip, self.noise_multiplier, self.generator = clip, float(noise_multiplier), generator

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        if self.clip is None:
            return grad
        return clip_and_noise(grad, float(self.clip), self.noise_multiplier, self.generator)


def gaussian_sigma(clip: float, epsilon: float, delta: float) -> float:
    """σ of the Gaussian mechanism for ℓ2 sensitivity 2·clip (replace-one)."""
    return 2.0 * clip * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def laplace_scale(clip: float, epsilon: float) -> float:
    """b of the Laplace mechanism for ℓ1 sensitivity 2·clip."""
    return 2.0 * clip / epsilon


def dchi_noise(shape: tuple[int, ...], eta: float, generator: torch.Generator) -> torch.Tensor:
    """Noise with density ∝ exp(−η‖z‖) over the last axis (d): uniform direction, Gamma(d, 1/η) radius."""
    d = shape[-1]
    direction = torch.randn(shape, generator=generator)
    direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    rows = int(math.prod(shape[:-1]))
    # torch's Gamma sampler takes no generator: draw it from a seeded numpy stream instead.
    import numpy as np

    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    radius = torch.as_tensor(np.random.default_rng(seed).gamma(d, 1.0 / eta, size=rows), dtype=direction.dtype)
    return direction * radius.view(*shape[:-1], 1)


def distance_correlation(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sample distance correlation (Székely et al. 2007) of rows of x (n, p) and y (n, q), in [0, 1]:
    double-centred distance matrices A, B; dCor² = ⟨A,B⟩ / √(⟨A,A⟩⟨B,B⟩)."""
    def centred(z: torch.Tensor) -> torch.Tensor:
        d = torch.cdist(z, z) if z.shape[0] > 1 else z.new_zeros(1, 1)
        return d - d.mean(0, keepdim=True) - d.mean(1, keepdim=True) + d.mean()

    a, b = centred(x), centred(y)
    dcov2 = (a * b).mean()
    denom = torch.sqrt((a * a).mean() * (b * b).mean()).clamp_min(1e-12)
    return torch.sqrt(torch.clamp(dcov2 / denom, min=0.0) + 1e-12)


class _Calibrated(Defence):
    """A clip norm from the config, or the mean token norm of s_A on D_align."""

    p = 2

    def __init__(self, epsilon: float, clip: float | None) -> None:
        self.epsilon, self.clip = float(epsilon), clip

    def setup(self, part: Any, align: torch.Tensor, generator: torch.Generator) -> None:
        self.generator = generator
        if self.clip is None:
            with torch.no_grad():
                s_a, _ = part.head(align)
            self.clip = float(s_a.norm(p=self.p, dim=-1).mean())


class SmashedGaussian(_Calibrated):
    name, obfuscates, p = "smashed_dp_gaussian", True, 2

    def __init__(self, epsilon: float, clip: float | None, delta: float) -> None:
        super().__init__(epsilon, clip)
        self.delta = float(delta)

    @property
    def sigma(self) -> float:
        return gaussian_sigma(float(self.clip), self.epsilon, self.delta)

    def send(self, s_a: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(s_a.shape, generator=self.generator, dtype=s_a.dtype) * self.sigma
        return clip_rows(s_a, float(self.clip), 2) + noise


class SmashedLaplace(_Calibrated):
    name, obfuscates, p = "smashed_dp_laplace", True, 1

    @property
    def scale(self) -> float:
        return laplace_scale(float(self.clip), self.epsilon)

    def send(self, s_a: torch.Tensor) -> torch.Tensor:
        u = torch.rand(s_a.shape, generator=self.generator, dtype=s_a.dtype) - 0.5
        noise = -self.scale * torch.sign(u) * torch.log1p(-2.0 * u.abs())   # inverse-CDF Laplace(0, b)
        return clip_rows(s_a, float(self.clip), 1) + noise


class EmbeddingDx(Defence):
    name, obfuscates = "embedding_dx", True

    def __init__(self, eta: float) -> None:
        self.eta = float(eta)

    def setup(self, part: Any, align: torch.Tensor, generator: torch.Generator) -> None:
        self.generator = generator

    def embed(self, e: torch.Tensor) -> torch.Tensor:
        return e + dchi_noise(tuple(e.shape), self.eta, self.generator).to(e.dtype)


class NoPeek(Defence):
    name = "nopeek"

    def __init__(self, alpha: float, max_tokens: int) -> None:
        self.alpha, self.max_tokens = float(alpha), int(max_tokens)

    def setup(self, part: Any, align: torch.Tensor, generator: torch.Generator) -> None:
        self.generator = generator

    def regulariser(self, e: torch.Tensor, s_a: torch.Tensor) -> torch.Tensor:
        x, z = e.detach().reshape(-1, e.shape[-1]), s_a.reshape(-1, s_a.shape[-1])
        if x.shape[0] > self.max_tokens:
            rows = torch.randperm(x.shape[0], generator=self.generator)[:self.max_tokens]
            x, z = x[rows], z[rows]
        return self.alpha * distance_correlation(x, z)
