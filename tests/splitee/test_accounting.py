"""Privacy accounting (harness/splitee/accounting.py): the exposure count, the GDP composition, the (ε, δ) conversion.

The count is checked twice: against a hand count on a tiny case, and against the engine itself, by
recording the adversary view of two prompts that differ in one token and counting the exposure rows that
change.
"""
from __future__ import annotations

import math

import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from harness.splitee import accounting
from harness.splitee.accounting import composed_mu, dp_epsilon, exposure_count, privacy_summary

EVERY_OP = ("qkv", "o", "gate_up", "lm_head")   # every op offloaded: the hand computations below
DELTA = 1e-5


def test_exposure_count_hand_computed():
    # n = 3 tokens, L = 2 layers, N = 2 new tokens (one decode step), every op offloaded.
    # Token 0: prefill QKV L0 1 + QKV L1 3 + O 2x3 + Gate/Up 2x3 + LM head 1 = 17; the decode step: 2x3 + 1 = 7.
    c = exposure_count(3, 0, 2, 2, EVERY_OP)
    assert (c.qkv, c.o, c.gate_up, c.lm_head, c.prefill, c.decode, c.total) == (6, 8, 8, 2, 17, 7, 24)
    # Token 2 (the last): QKV L0 1 + QKV L1 1 + O 2 + Gate/Up 2 + LM head 1 = 7, decode 7.
    c = exposure_count(3, 2, 2, 2, EVERY_OP)
    assert (c.prefill, c.decode, c.total) == (7, 7, 14)
    # Only QKV and the LM head offloaded: 1 + 3 + 1 = 5 in the prefill, 2 + 1 = 3 per decode step.
    c = exposure_count(3, 0, 2, 2, ("qkv", "lm_head"))
    assert (c.prefill, c.decode, c.o, c.gate_up) == (5, 3, 0, 0)
    # One new token: no decode pass at all.
    assert exposure_count(3, 0, 2, 1, EVERY_OP).decode == 0
    with pytest.raises(ValueError):
        exposure_count(3, 3, 2, 2, EVERY_OP)


def _rows_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Positions whose exposed vectors differ between batch row 0 and row 1 of [2, T, d] exposures."""
    return int(((a - b).abs().amax(-1) > 1e-5 * (1 + a.abs().amax())).sum())


@pytest.mark.parametrize("position", [0, 3, 6])
def test_exposure_count_matches_the_engine(position):
    """Change token `position` of a 7-token prompt; every exposure row that changes must be counted, and in
    the prefill the count is exact. Decode steps: the count is an upper bound (the layer-0 QKV row of a
    step changes only if the generated token does), every other decode row changes."""
    from harness.models import load_model, model_entry
    from harness.splitee.engine import EngineSettings, SplitEngine

    loaded = load_model(model_entry("tiny-llama"))
    a = [1500, 2301, 887, 4096, 77, 905, 3120]
    b = list(a)
    b[position] = 12345
    n, n_layers, new = len(a), 2, 3
    engine = SplitEngine(loaded.model, EngineSettings("t3", record_view=True))
    engine.generate([a, b], new, pad_token_id=0)
    prefill = decode = decode_l0_qkv = 0
    for e in engine.view.exposures:
        changed = _rows_differ(e.tensor[0:1], e.tensor[1:2])
        if e.step == 0:
            prefill += changed
        else:
            decode += changed
            decode_l0_qkv += changed if (e.op, e.layer) == ("qkv", 0) else 0
    count = exposure_count(n, position, n_layers, new, EVERY_OP)
    assert prefill == count.prefill
    steps = new - 1
    assert decode - decode_l0_qkv == count.decode - steps   # everything but layer-0 QKV changes
    assert decode <= count.decode


def test_composition_and_summary():
    assert composed_mu([3.0, 4.0]) == pytest.approx(5.0)
    k = exposure_count(3, 0, 2, 2, EVERY_OP).total                   # 24
    s = privacy_summary("ep1", 0.5, [3, 2], 2, 2, EVERY_OP, 1.0, DELTA)
    assert s["gdp_exposures_composed"] == k and s["epsilon_nominal"] == 0.5
    assert s["gdp_mu_composed"] == pytest.approx(0.5 * math.sqrt(k))
    assert s["dp_epsilon_composed"] == pytest.approx(_analytic_gaussian_epsilon(0.5 * math.sqrt(k), 1e-5), rel=1e-7)
    # The run's δ reaches the conversion.
    s = privacy_summary("ep1", 0.5, [3, 2], 2, 2, EVERY_OP, 1.0, 1e-3)
    assert s["dp_delta"] == 1e-3
    assert s["dp_epsilon_composed"] == pytest.approx(_analytic_gaussian_epsilon(0.5 * math.sqrt(k), 1e-3), rel=1e-7)
    # EPN: ε = 1/√n per prompt, so μ = √(K(n)/n); the worst prompt is reported.
    s = privacy_summary("epn", None, [3, 2], 2, 2, EVERY_OP, 1.0, DELTA)
    worst = max(math.sqrt(exposure_count(n, 0, 2, 2, EVERY_OP).total / n) for n in (3, 2))
    assert s["gdp_mu_composed"] == pytest.approx(worst)
    assert s["epsilon_nominal"] == pytest.approx(1 / math.sqrt(2))
    # sigma_scale multiplies σ, so it divides ε.
    assert privacy_summary("ep1", 1.0, [3], 2, 2, EVERY_OP, 2.0, DELTA)["epsilon_nominal"] == 0.5
    for conf in ("t3", "slalom", "cpu"):
        s = privacy_summary(conf, None, [3], 2, 2, EVERY_OP, 1.0, DELTA)
        assert s["epsilon_nominal"] is None and s["gdp_mu_composed"] is None and s["dp_epsilon_composed"] is None
    assert set(privacy_summary("ep1", 1.0, [3], 2, 2, EVERY_OP, 1.0, DELTA)) == set(accounting.METRIC_DEFINITIONS)


def _gdp_delta(eps: float, mu: float) -> float:
    """δ(ε) of μ-GDP (Dong, Roth & Su 2022, Corollary 2.13), which is the analytic δ(ε) of the Gaussian
    mechanism with sensitivity/σ = μ (Balle & Wang 2018, Theorem 8): Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2).
    The second term in log space, so that e^ε cannot overflow for large μ."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2))


def _analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ delta, solved here with scipy (δ(ε) decreases in ε): an independent
    computation of what dp_epsilon returns."""
    if _gdp_delta(0.0, mu) <= delta:
        return 0.0
    high = 1.0
    while _gdp_delta(high, mu) > delta:
        high *= 2
    return brentq(lambda e: _gdp_delta(e, mu) - delta, 0.0, high, xtol=1e-14, rtol=1e-14)


# dp_accounting warns of a log(0) inside its search at μ = 1e-6, δ = 1e-8 (harmless: its ε still agrees).
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log1p:RuntimeWarning")
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
@pytest.mark.parametrize("mu", [1e-6, 0.1, 0.5, 1.0, 3.0, 10.0, 20.0])
def test_dp_epsilon_matches_the_analytic_gaussian_mechanism(mu, delta):
    want = _analytic_gaussian_epsilon(mu, delta)
    assert dp_epsilon(mu, delta) == pytest.approx(want, rel=1e-7, abs=1e-12), (mu, delta)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("mu", [1e-20, 1e-9, 1e-6, 5e-6, 1e-4])
def test_dp_epsilon_of_a_tiny_mu_needs_no_search_and_warns_nothing(mu):
    """Issue 54: at ε = 1e-20 per exposure dp_accounting's search warned (log1p of -1). Where δ(0) = erf(μ/(2√2))
    is already ≤ δ, ε is 0 without it; just past that point the search runs as before."""
    want = _analytic_gaussian_epsilon(mu, 1e-5)
    assert dp_epsilon(mu, 1e-5) == pytest.approx(want, rel=1e-7, abs=1e-12)
    assert (want == 0.0) == (mu < 1e-4)


def test_analytic_gaussian_epsilon_reproduces_published_values():
    """The independent solver itself, against numbers it did not produce: μ = 1e-6 is (0, 1e-5)-DP (δ(0) =
    2Φ(μ/2) − 1 ≈ 4·10⁻⁷), and 1-GDP at δ = 1e-5 is ε = 4.3772 (Balle & Wang 2018's calibration)."""
    assert _analytic_gaussian_epsilon(1e-6, 1e-5) == 0.0
    assert _analytic_gaussian_epsilon(1.0, 1e-5) == pytest.approx(4.3772, abs=1e-3)
    assert _gdp_delta(_analytic_gaussian_epsilon(3.0, 1e-8), 3.0) == pytest.approx(1e-8, rel=1e-6)


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0])
def test_dp_conversion_is_tight(mu):
    eps = dp_epsilon(mu, 1e-5)
    # The returned ε is exactly where μ-GDP's privacy profile crosses δ = 1e-5 ...
    assert _gdp_delta(eps, mu) == pytest.approx(1e-5, rel=1e-6)
    # ... and an independent accountant (privacy loss distributions) agrees to within its discretisation.
    import dp_accounting

    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / mu))
    assert pld.get_epsilon(1e-5) == pytest.approx(eps, rel=2e-2)


def test_dp_conversion_known_value_and_edges():
    # 1-GDP (the Gaussian mechanism with σ = sensitivity) at δ = 1e-5: ε = 4.3772 (Balle & Wang 2018's
    # analytic calibration; the same number as dp_accounting's get_epsilon_gaussian(1, 1e-5)).
    assert dp_epsilon(1.0, 1e-5) == pytest.approx(4.3772, abs=1e-3)
    assert dp_epsilon(0.0, DELTA) == 0.0
    assert dp_epsilon(math.inf, DELTA) == math.inf
    assert dp_epsilon(2.0, DELTA) > dp_epsilon(1.0, DELTA) > dp_epsilon(0.5, DELTA)
    with pytest.raises(ValueError):
        dp_epsilon(1.0, 0.0)
