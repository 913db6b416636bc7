"""Privacy accounting of the Gaussian masks: the nominal per-token ε and the bound composed over every exposure.

The paper (§3.4, §5.4) masks each offloaded input with η ~ N(0, (Δ/ε)² I), Δ the op's global ℓ2
sensitivity, so every single exposure is ε-GDP with respect to its input (Prop. 6), and then quotes ε per
token, setting composition aside. One prompt token, however, reaches the accelerator many times. This
module counts those exposures and composes them (Prop. 7, Dong et al. 2022 Cor. 3.3; adaptive
composition holds): μ = √(Σ_k ε_k²). The (ε, δ)-DP equivalent of μ-GDP is computed with `dp-accounting`
(the exact Gaussian-mechanism conversion of Balle & Wang 2018, since μ-GDP is the Gaussian mechanism with
noise multiplier 1/μ), never by hand.

Which exposures one changed token influences. Prompt of n tokens, the changed token at position i
(0-based), L decoder layers, N new tokens generated greedily (the prefill produces the first one, then
N − 1 decode forward passes), offloaded ops ⊆ {qkv, o, gate_up, lm_head}:

- prefill, QKV of layer 0: its input at position j is LN(E[t_j]), a function of token j alone → 1.
- prefill, QKV of layers 1..L−1, and O and Gate/Up of every layer: the input at position j mixes every
  position ≤ j (causal attention) → the n − i positions i..n−1, in each of those layers:
  (L − 1)(n − i) for QKV, L(n − i) each for O and Gate/Up.
- prefill, LM head: only the last position's logits are computed (and n − 1 ≥ i) → 1.
- every decode step: the token it feeds is the previous argmax, a function of the whole prompt, and every
  layer attends to position i → every exposure of the step: L per layer op offloaded, + 1 for the LM head.

K(n, i) = [qkv]·(1 + (L−1)(n−i)) + ([o] + [gate_up])·L(n−i) + [lm_head] + (N−1)·(L·([qkv]+[o]+[gate_up]) + [lm_head])

The worst case is i = 0. Every one of these exposures is ε-GDP at the configuration's per-exposure ε
(harness/configurations.py `exposure_epsilons`: the configuration's per-row ε divided by
`engine.sigma_scale`, which multiplies every σ), so μ = ε·√K. Prompts submitted more than once compose further (k submissions:
μ·√k); that is a property of the user's behaviour, not of one inference, and is not included.
Configurations without Gaussian masks (t3: none; slalom: computational hiding, not DP; cpu/gpu/tdx) have
no ε: their entries are None.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness import configurations

LAYER_OPS = ("qkv", "o", "gate_up")


@dataclass(frozen=True)
class ExposureCount:
    """Exposures one changed prompt token can influence, by op and phase (see the module docstring)."""

    qkv: int
    o: int
    gate_up: int
    lm_head: int
    prefill: int
    decode: int

    @property
    def total(self) -> int:
        return self.prefill + self.decode


def exposure_count(n: int, i: int, n_layers: int, max_new_tokens: int, offload: Iterable[str]) -> ExposureCount:
    """Count the exposures that token i of an n-token prompt can change (module docstring formula)."""
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"need 0 <= i < n, got n={n}, i={i}")
    if n_layers < 1 or max_new_tokens < 1:
        raise ValueError(f"need n_layers >= 1 and max_new_tokens >= 1, got {n_layers}, {max_new_tokens}")
    ops = set(offload)
    later = n - i                      # positions i..n-1
    steps = max_new_tokens - 1         # decode forward passes
    qkv = (1 + (n_layers - 1) * later + steps * n_layers) if "qkv" in ops else 0
    o = (n_layers * later + steps * n_layers) if "o" in ops else 0
    gate_up = (n_layers * later + steps * n_layers) if "gate_up" in ops else 0
    lm_head = (1 + steps) if "lm_head" in ops else 0
    per_step = n_layers * sum(op in ops for op in LAYER_OPS) + ("lm_head" in ops)
    decode = steps * per_step
    return ExposureCount(qkv, o, gate_up, lm_head, prefill=qkv + o + gate_up + lm_head - decode, decode=decode)


def composed_mu(epsilons: Iterable[float]) -> float:
    """μ of the composition of ε_k-GDP mechanisms: √(Σ ε_k²) (paper Prop. 7)."""
    return math.sqrt(math.fsum(e * e for e in epsilons))


def dp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε such that μ-GDP implies (ε, δ)-DP, via dp_accounting's exact Gaussian conversion.

    μ-GDP is exactly the Gaussian mechanism with sensitivity 1 and noise standard deviation 1/μ (Dong et
    al. 2022, Thm. 2.7), so `dp_accounting.get_epsilon_gaussian(1/μ, δ)` gives the tight ε.
    """
    import dp_accounting

    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if mu < 0 or math.isnan(mu):
        raise ValueError(f"mu must be >= 0, got {mu}")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    # δ(0) = Φ(μ/2) − Φ(−μ/2) = erf(μ/(2√2)): where that is already ≤ δ, ε = 0, the answer dp_accounting reaches
    # too, but through log1p(−1) and a RuntimeWarning for a μ this small (ε = 1e-20 per exposure).
    if math.erf(mu / (2 * math.sqrt(2))) <= delta:
        return 0.0
    return float(dp_accounting.get_epsilon_gaussian(1.0 / mu, delta))


def privacy_summary(configuration: str, epsilon: float | None, prompt_lengths: Sequence[int], n_layers: int,
                    max_new_tokens: int, offload: Iterable[str], sigma_scale: float, delta: float,
                    epsilon_lengths: Sequence[int] | None = None) -> dict:
    """Flat results.json metrics for one run: the worst case over the run's prompts and token positions.

    Keys (None for configurations without Gaussian masks):
      epsilon_nominal        per-exposure ε the masks give (EP1: ε/sigma_scale; EPN: the largest 1/√n over
                             the prompts, i.e. the shortest prompt's) — what the paper quotes
      gdp_exposures_composed K at i = 0 for the longest prompt: exposures one token can influence
      gdp_mu_composed        μ of the composed mechanism, max over prompts: ε·√K(n)
      dp_epsilon_composed    the ε of (ε, dp_delta)-DP implied by gdp_mu_composed (dp-accounting)
      dp_delta               δ used for the conversion (the config's dp_delta)
    """
    offload = tuple(offload)
    lengths = [int(n) for n in prompt_lengths]
    if not lengths:
        raise ValueError("privacy_summary needs at least one prompt length")
    # ε per prompt from its n (EPN's 1/√n counts `epsilon_lengths`, default every token); the exposure count
    # K(n) always counts the positions the model really runs.
    eps_n = lengths if epsilon_lengths is None else [int(n) for n in epsilon_lengths]
    if len(eps_n) != len(lengths):
        raise ValueError("epsilon_lengths must give one n per prompt")
    eps = configurations.exposure_epsilons(configuration, epsilon, eps_n, sigma_scale)
    out: dict = {"epsilon_nominal": None, "gdp_exposures_composed": None, "gdp_mu_composed": None,
                 "dp_epsilon_composed": None, "dp_delta": delta}
    counts = [exposure_count(n, 0, n_layers, max_new_tokens, offload).total for n in lengths]
    out["gdp_exposures_composed"] = max(counts)
    if eps[0] is None:
        return out
    mus = [e * math.sqrt(k) for e, k in zip(eps, counts)]
    out["epsilon_nominal"] = max(eps)
    out["gdp_mu_composed"] = max(mus)
    out["dp_epsilon_composed"] = dp_epsilon(out["gdp_mu_composed"], delta)
    return out


METRIC_DEFINITIONS = {
    "epsilon_nominal": "per-exposure epsilon of the Gaussian masks (ep1: epsilon/sigma_scale; epn: largest 1/sqrt(n)); "
                       "the paper's per-token figure, composition ignored",
    "gdp_exposures_composed": "exposures one prompt token can influence (position 0 of the longest prompt: every "
                              "layer, later position and decode step; harness/splitee/accounting.py)",
    "gdp_mu_composed": "mu-GDP of their composition, sqrt(sum eps_k^2), worst prompt",
    "dp_epsilon_composed": "(epsilon, dp_delta)-DP equivalent of gdp_mu_composed (dp-accounting, exact Gaussian)",
    "dp_delta": "delta of that conversion",
}
