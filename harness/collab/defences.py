"""What the edge sends at each decoding step, undefended and under each defence (paper 003 §2.2, §4, A.1.4).

Every defence runs on the edge with the edge's p_S and the cloud-provided p_L (paper §4: in both modes the
cloud sends p_L), both float64 probability vectors over the shared vocabulary.

- Cloud-side fusion: `upload(p_S, p_L, rng)` returns what the edge uploads: a vector over the vocabulary
  that is zero where nothing is uploaded (`Upload`). The cloud then fuses α·p_L + (1−α)·upload and
  decodes greedily.
- Edge-side fusion: `select(p_S, p_L, rng)` returns the token the edge synchronises to the cloud.

Parameters (the run's `epsilon` knob, harness/configurations.py): CoVeil's λ, CoGenesis's B, the ε of
DP-Logit and DP-Fusion, and of the edge-side baselines CusText, LDP-Sampler and InvisibleInk
(harness/collab/edge_baselines.py). The interface and the fusion rule they share are harness/collab/fusion.py.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from harness.collab.fusion import Defence, Upload, fuse


class CoVeil(Defence):
    """CoVeil (paper §4.2-4.3, Algorithms 1-2)."""

    name = "coveil"

    def __init__(self, alpha: float, lam: float, candidates: int):
        super().__init__(alpha)
        self.lam, self.candidates = float(lam), int(candidates)

    def upload_scores(self, p_S: torch.Tensor, p_L: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidate pool C_t = TopK(p_S) and the Taylor coefficients g_t(i) of eq. 31:
        g(i) = −(1−α)·p_S(i)·(1[i = y*] − 1/|C|) + λ·|p_S(i) − p_L(i)|, y* = argmax p_fuse (eq. 25)."""
        k = min(self.candidates, p_S.numel())
        cand = torch.topk(p_S, k).indices
        y_star = int(torch.argmax(fuse(p_L, p_S, self.alpha)))
        ps, pl = p_S[cand], p_L[cand]
        is_star = (cand == y_star).to(p_S.dtype)
        g = -(1.0 - self.alpha) * ps * (is_star - 1.0 / k) + self.lam * (ps - pl).abs()
        return cand, g

    def upload(self, p_S, p_L, rng):
        cand, g = self.upload_scores(p_S, p_L)
        chosen = cand[g < 0]                          # eq. 18: S_t = {i ∈ C_t : g_t(i) < 0}
        out = torch.zeros_like(p_S)
        out[chosen] = p_S[chosen]
        return Upload(out, chosen)

    def select_scores(self, p_S: torch.Tensor, p_L: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """C_t = TopK(p_fuse) in descending order and J_t(i) = −U_t(i) + λ·P_t(i) (eqs. 19-21)."""
        p_f = fuse(p_L, p_S, self.alpha)
        k = min(self.candidates, p_f.numel())
        top = torch.topk(p_f, k)
        cand = top.indices
        utility = top.values - top.values[0]          # eq. 20: p_fuse(i) − p_fuse(y*)
        privacy = p_S[cand] - p_L[cand]               # eq. 21 (signed)
        return cand, -utility + self.lam * privacy

    def select(self, p_S, p_L, rng):
        cand, j = self.select_scores(p_S, p_L)
        return int(cand[int(torch.argmin(j))])        # eq. 22; ties go to the higher-ranked candidate


class CoGenesis(Defence):
    """CoGenesis (Zhang et al. 2024b): upload only the top-B SLM probabilities (cloud-side)."""

    name = "collab_cogenesis"

    def __init__(self, alpha: float, b: float):
        super().__init__(alpha)
        self.b = int(b)

    def upload(self, p_S, p_L, rng):
        ids = torch.topk(p_S, min(self.b, p_S.numel())).indices
        out = torch.zeros_like(p_S)
        out[ids] = p_S[ids]
        return Upload(out, ids)


class DPLogit(Defence):
    """DP-Logit (Ji and Li 2024): the Gaussian mechanism on the uploaded SLM probability vector (cloud-side).

    σ = Δ₂·√(2 ln(1.25/δ))/ε with Δ₂ = √2, the largest ℓ2 distance of two probability vectors; the noisy
    vector is clipped at 0 and renormalised (post-processing) before upload."""

    name = "collab_dp_logit"
    random_modes = ("cloud",)

    def __init__(self, alpha: float, epsilon: float, delta: float):
        super().__init__(alpha)
        self.sigma = math.sqrt(2.0) * math.sqrt(2.0 * math.log(1.25 / delta)) / float(epsilon)

    def upload(self, p_S, p_L, rng):
        noisy = p_S + self.sigma * torch.randn(p_S.shape, generator=rng, dtype=p_S.dtype)
        noisy = noisy.clamp_min(0.0)
        total = float(noisy.sum())
        return Upload(noisy / total if total > 0 else noisy, None)


def renyi_divergence(q: torch.Tensor, p: torch.Tensor, order: float) -> float:
    """D_a(q ‖ p) = log(Σ q^a p^(1−a)) / (a − 1), over the support of q (p floored at 1e-300)."""
    mask = q > 0
    qs, ps = q[mask], p[mask].clamp_min(1e-300)
    log_terms = order * torch.log(qs) + (1.0 - order) * torch.log(ps)
    return float(torch.logsumexp(log_terms, 0)) / (order - 1.0)


class DPFusion(Defence):
    """DP-Fusion (Thareja et al. 2026): mix the private SLM distribution toward the public one,
    q_w = w·p_S + (1−w)·p_L, with the largest w ∈ [0, 1] such that D_a(q_w ‖ p_L) ≤ ε (bisection; the
    divergence grows with w). The public baseline is the cloud's p_L (on the edge in both modes).
    Cloud-side: q_w is uploaded. Edge-side: the synced token is sampled from α·p_L + (1−α)·q_w."""

    name = "collab_dp_fusion"
    random_modes = ("edge",)        # cloud-side it uploads q_w, a function of p_S and p_L

    def __init__(self, alpha: float, epsilon: float, order: float, iterations: int = 30):
        super().__init__(alpha)
        self.epsilon, self.order, self.iterations = float(epsilon), float(order), iterations

    def calibrated(self, p_S: torch.Tensor, p_L: torch.Tensor) -> tuple[torch.Tensor, float]:
        if renyi_divergence(p_S, p_L, self.order) <= self.epsilon:
            return p_S, 1.0
        lo, hi = 0.0, 1.0
        for _ in range(self.iterations):
            mid = (lo + hi) / 2
            if renyi_divergence(mid * p_S + (1 - mid) * p_L, p_L, self.order) <= self.epsilon:
                lo = mid
            else:
                hi = mid
        return lo * p_S + (1 - lo) * p_L, lo

    def upload(self, p_S, p_L, rng):
        return Upload(self.calibrated(p_S, p_L)[0], None)

    def select(self, p_S, p_L, rng):
        return int(torch.multinomial(self.distribution(p_S, p_L, "edge", rng).float(), 1, generator=rng))

    def distribution(self, p_S, p_L, mode, rng):
        if mode == "cloud":
            return super().distribution(p_S, p_L, mode, rng)
        return fuse(p_L, self.calibrated(p_S, p_L)[0], self.alpha)


def make_defence(configuration: str, parameter: float | None, *, alpha: float, candidates: int, dp_delta: float,
                 renyi_order: float, baselines: Any = None) -> Defence:
    """The defence of a collab configuration at its parameter value (None for collab_none); `baselines`
    (edge_baselines.Options) holds what the edge-side baselines need beyond their ε."""
    if configuration in ("collab_custext", "collab_ldp_sampler", "collab_invisibleink"):
        from harness.collab import edge_baselines

        assert parameter is not None and baselines is not None, configuration
        return edge_baselines.make(configuration, parameter, alpha=alpha, delta=dp_delta, options=baselines)
    if configuration == "collab_none":
        return Defence(alpha)
    assert parameter is not None, configuration
    if configuration == "coveil":
        return CoVeil(alpha, parameter, candidates)
    if configuration == "collab_cogenesis":
        return CoGenesis(alpha, parameter)
    if configuration == "collab_dp_logit":
        return DPLogit(alpha, parameter, dp_delta)
    if configuration == "collab_dp_fusion":
        return DPFusion(alpha, parameter, renyi_order)
    raise AssertionError(f"no defence for configuration {configuration!r}")
