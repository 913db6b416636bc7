"""DP accounting across rounds for the perturbation baselines (paper 002 §II): what one client's example
is guaranteed over the whole run, not per exposure.

What is composed, and why so:
- The unit is one training example (a block of T tokens) of one client. It can only enter its own
  client's local steps; each time it is drawn into a batch, its s_A goes up with fresh noise: one use of
  the per-step mechanism. Every local step draws its batch with replacement (harness/splitft/client.py),
  so an example may go up 0, 1 or several times in one step; the client counts every send of every one
  of its examples across rounds, and the run composes K = the largest count of any example of any client
  (the least protected example). The draws are indices from a seeded generator that never reads the
  data, so conditioning on them is legitimate; no amplification by subsampling is claimed, because
  fixed-size sampling with replacement is not the Poisson sampling the accountants' amplification
  theorems model (neither dp_accounting's RDP nor its PLD accountant supports `SampledWithReplacementDpEvent`).
- Per token row (what the per-step ε of the configuration is calibrated for): one row of s_A, clipped to
  c, replaced by another: ℓ2 (ℓ1) sensitivity 2c. Per example: all T rows of the block may change, so the
  (T, d) matrix has ℓ2 sensitivity 2c·√T (Gaussian) and ℓ1 sensitivity 2c₁·T (Laplace). Both are
  reported; only the example-level one is a statement about a unit of the client's data (with k ≥ 1 a
  changed input token moves every later row of s_A through attention, so a row is not a token).
- Gaussian: `GaussianDpEvent(σ/Δ₂)` self-composed K times in dp_accounting's RDP accountant, converted to
  ε(δ) at the configuration's δ. Laplace: `LaplaceDpEvent(b/Δ₁)` likewise (its exact RDP, Mironov 2017
  Prop. 6), reported as the smaller of that and the pure basic-composition bound K·Δ₁/b.
- Embedding dχ: per token, η·d(w, w')-privacy (a metric, pure guarantee) of the noisy embedding; A is
  post-processing. K sends of one token compose to K·η per unit of embedding distance; for the worst
  pair of vocabulary tokens d ≤ 2·max‖E_v‖ (triangle inequality), and a whole block of T tokens adds T
  such terms: pure ε, δ = 0, basic composition (exact for pure guarantees).
- Only the `smashed_up` channel (and `smashed_down`, the server's post-processing of it) is covered.
  The server also receives ∂L/∂s'_B, which depends on the labels, and θ_A, θ_C after every step, none of
  them noised: the view as a whole has no DP guarantee (ε = ∞) whatever these numbers say.
"""
from __future__ import annotations

import math
from typing import Any

from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from harness.splitft.defences import gaussian_sigma, laplace_scale

ACCOUNTED = ("smashed_dp_gaussian", "smashed_dp_laplace", "embedding_dx")
COVERED_CHANNELS = ("smashed_up", "smashed_down")


def _rdp_epsilon(event: dp_event.DpEvent, delta: float) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def gaussian_epsilon(noise_multiplier: float, sends: int, delta: float) -> float:
    """ε(δ) of `sends` Gaussian mechanisms of noise multiplier σ/Δ₂, composed (RDP)."""
    if sends == 0:
        return 0.0
    return _rdp_epsilon(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(noise_multiplier), sends), delta)


def laplace_epsilon(noise_multiplier: float, sends: int, delta: float) -> float:
    """ε(δ) of `sends` Laplace mechanisms of noise multiplier b/Δ₁: the smaller of the RDP conversion and
    pure basic composition (sends/noise_multiplier, valid at any δ)."""
    if sends == 0:
        return 0.0
    event = dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(noise_multiplier), sends)
    return min(_rdp_epsilon(event, delta), sends / noise_multiplier)


def account(configuration: str, epsilon: float, *, sends: int, sends_bound: int, seq_len: int, delta: float,
            vocab_norm_max: float | None = None) -> dict[str, Any] | None:
    """The run's accounting record (results.json `privacy_accounting`) for a configuration with a DP
    guarantee, None for the others. `sends`: the largest number of times any one example went up;
    `sends_bound`: the a-priori worst case (every draw of every step the same example). The noise
    multipliers do not depend on the clip c (σ and b scale with it), so neither does the accounting."""
    if configuration not in ACCOUNTED:
        return None
    base = {"mechanism": configuration, "delta": float(delta), "max_sends": int(sends),
            "sends_bound": int(sends_bound), "seq_len": int(seq_len), "covered_channels": list(COVERED_CHANNELS),
            "composition": "per example of one client, over every send of it in every local step of every "
                           "round (largest count over examples); no subsampling amplification"}
    if configuration == "smashed_dp_gaussian":
        row = gaussian_sigma(1.0, epsilon, delta) / 2.0           # σ/Δ₂ with Δ₂ = 2c
        example = row / math.sqrt(seq_len)
        return {**base, "accountant": "dp_accounting RDP", "epsilon_step": float(epsilon),
                "epsilon_step_rdp": gaussian_epsilon(row, 1, delta),
                "noise_multiplier_row": row, "noise_multiplier_example": example,
                "epsilon_row": gaussian_epsilon(row, sends, delta),
                "epsilon_example": gaussian_epsilon(example, sends, delta)}
    if configuration == "smashed_dp_laplace":
        row = laplace_scale(1.0, epsilon) / 2.0                   # b/Δ₁ with Δ₁ = 2c₁
        example = row / seq_len
        return {**base, "accountant": "dp_accounting RDP (min with pure basic composition)",
                "epsilon_step": float(epsilon), "epsilon_step_rdp": laplace_epsilon(row, 1, delta),
                "noise_multiplier_row": row, "noise_multiplier_example": example,
                "epsilon_row": laplace_epsilon(row, sends, delta),
                "epsilon_example": laplace_epsilon(example, sends, delta)}
    diameter = 2.0 * float(vocab_norm_max) if vocab_norm_max is not None else math.nan
    per_distance = sends * float(epsilon)
    return {**base, "accountant": "pure metric DP, basic composition", "delta": 0.0,
            "eta": float(epsilon), "epsilon_step": float(epsilon) * diameter,   # one send, the worst token pair
            "eta_composed": per_distance, "vocab_diameter_bound": diameter,
            "epsilon_row": per_distance * diameter, "epsilon_example": per_distance * diameter * seq_len}
