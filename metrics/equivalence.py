"""Which "at chance" margin a number of examples can certify, and how many examples a margin needs.

The verdict (attacks/controls.classify) says at_chance when the whole 95% Student-t interval of a mean
per-example statistic lies within reference ± m: an equivalence test (TOST at 2.5 % per side). With
per-example standard deviation σ, n examples and the true mean at the reference, the estimate is about
N(ref, σ²/n) and the interval's half-width t·σ/√n (t = t_{0.975, n−1}), so the call is made when
|mean − ref| ≤ m − t·σ/√n. It is made with probability at least `power` when

    m ≥ (σ/√n)·(t_{0.975, n−1} + z_{(1+power)/2}),

which `certifiable_margin` returns, and `examples_needed` inverts (the smallest n that satisfies it). The
normal approximation of the mean is the same one the Student-t interval makes; σ comes from a pilot run
(or a calibration experiment's null trials). A margin below t·σ/√n can never be certified at that n.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats


def certifiable_margin(sd: float, n: int, power: float = 0.8, confidence: float = 0.95,
                       per_item_bound: float | None = None) -> float:
    """The smallest margin m that n examples of per-example spread `sd` certify (at_chance) with probability
    ≥ `power` when the true mean sits at the reference. With `per_item_bound` B the verdict reads the earned
    interval, whose half-width is at least h₀ = B·CP_U(0, n) (`zero_spread_bound`): m = max(t·se, h₀) + z·se."""
    if n < 2:
        raise ValueError(f"need n >= 2 examples, got {n}")
    if sd < 0 or not 0 < power < 1 or not 0 < confidence < 1:
        raise ValueError(f"need sd >= 0 and power, confidence in (0, 1), got {sd}, {power}, {confidence}")
    t = float(stats.t.ppf((1 + confidence) / 2, n - 1))
    z = float(stats.norm.ppf((1 + power) / 2))
    se = sd / math.sqrt(n)
    h0 = 0.0 if per_item_bound is None else zero_spread_bound(n, per_item_bound, confidence)
    return max(t * se, h0) + z * se


def examples_needed(sd: float, margin: float, power: float = 0.8, confidence: float = 0.95,
                    limit: int = 10_000_000, per_item_bound: float | None = None) -> int:
    """The smallest n ≥ 2 whose `certifiable_margin` is at most `margin` (ValueError past `limit`)."""
    if margin <= 0:
        raise ValueError(f"need a margin > 0, got {margin}")

    def cm(k: int) -> float:
        return certifiable_margin(sd, k, power, confidence, per_item_bound)

    if cm(2) <= margin:
        return 2
    lo, hi = 2, 4
    while cm(hi) > margin:
        lo, hi = hi, hi * 2
        if hi > limit:
            raise ValueError(f"more than {limit} examples needed for margin {margin} at sd {sd}")
    while hi - lo > 1:       # the margin falls with n: bisect for the first n that meets it
        mid = (lo + hi) // 2
        if cm(mid) <= margin:
            hi = mid
        else:
            lo = mid
    return hi


def t_interval_sd(lo: float, hi: float, n: int, confidence: float = 0.95) -> float:
    """The per-unit standard deviation s that a Student-t interval mean ± t_{(1+c)/2, n−1}·s/√n of n units
    implies (metrics.intervals.mean_t_ci): the spread to size with when a result kept its interval, not its
    values (a report reading results.json)."""
    if n < 2 or not hi >= lo:
        raise ValueError(f"need n >= 2 and lo <= hi, got n={n}, [{lo}, {hi}]")
    return (hi - lo) / 2.0 / float(stats.t.ppf((1 + confidence) / 2, n - 1)) * math.sqrt(n)


# --- sizing a verdict: the margin n units certify and the n a margin needs, for the null and a dose --------
#
# A verdict reads leak when its interval's lower end exceeds +m, at_chance when the whole interval lies
# within ±m (attacks/controls.classify, controls.sequential_verdict). With the estimate θ̂ ~ N(θ, se²) and
# the interval θ̂ ± c·se (c = t_{0.975, n−1} for a Student-t interval of a mean, z_{0.975} for a Wald one):
#
#   P(at_chance | θ = b) = Φ((m − c·se₀ − b)/se₀) − Φ((−m + c·se₀ − b)/se₀)       (≥ 80 % needs m ≥ (c + z_{0.9})·se₀ at b = 0)
#   P(leak | θ = dose)   = 1 − Φ((m + c·se₁ − dose)/se₁)                           (≥ 80 % at dose 2m needs m ≥ (c + z_{0.8})·se₁)
#
# so certification binds first: with c ≈ 1.96, se₀ ≤ m/3.24, while a gate dose of 2m needs se₁ ≤ m/2.80.
# se = σ/√n for a mean of per-unit values of spread σ; a paired proportion difference of discordance rate δ
# has σ = √(δ − θ²) per unit, two independent proportions p₁, p₂ of n each σ = √(p₁(1−p₁) + p₂(1−p₂)).
# Newcombe's paired interval (metrics/proportions.newcombe_paired) is not Wald's near 0 (its Wilson margins
# keep a width of about z²/n even with no discordant pair), so its probabilities are computed from
# simulated tables instead (`paired_plan`).


@dataclass(frozen=True)
class Plan:
    """What a verdict of n units is predicted to do: certify a null (true difference 0) and call a leak at
    the dose, each with probability; the standard errors (pp) it assumed."""

    n: int
    margin_pp: float
    dose_pp: float
    se_null_pp: float
    se_dosed_pp: float
    certify_probability: float
    power: float

    def meets(self, target: float = 0.8) -> bool:
        return self.certify_probability >= target and self.power >= target


def paired_sd_pp(discordance: float, difference: float = 0.0) -> float:
    """The per-unit spread (pp) of a paired difference of two proportions: √(δ − θ²), δ the share of units
    where the two disagree and θ the difference."""
    if not 0 <= discordance <= 1 or abs(difference) > discordance:
        raise ValueError(f"need 0 <= |difference| <= discordance <= 1, got {difference}, {discordance}")
    return 100.0 * math.sqrt(discordance - difference * difference)


def unpaired_sd_pp(p1: float, p2: float) -> float:
    """The per-unit-pair spread (pp) of the difference of two independent proportions of n units each:
    se = √(p₁(1−p₁) + p₂(1−p₂))/√n."""
    if not (0 <= p1 <= 1 and 0 <= p2 <= 1):
        raise ValueError(f"need proportions in [0, 1], got {p1}, {p2}")
    return 100.0 * math.sqrt(p1 * (1 - p1) + p2 * (1 - p2))


def mean_plan(sd_null_pp: float, sd_dosed_pp: float, n: int, margin_pp: float, dose_pp: float, *,
              interval: str = "t", bias_pp: float = 0.0, shift_pp: float | None = None,
              spread_null_pp: float | None = None, spread_dosed_pp: float | None = None,
              confidence: float = 0.95, per_item_bound_pp: float | None = None) -> Plan:
    """The verdict's predicted certification probability (null at `bias_pp`) and power (true difference
    `shift_pp`, the statistic's shift at the dose: `dose_pp` unless the attacker reads only part of it) for
    n units of per-unit spreads sd_null (the null) and sd_dosed (at the dose), with a Student-t
    (`interval="t"`) or Wald (`"z"`) 95% interval (module comment above). The interval's width is
    c·sd/√n; the estimate itself varies by spread/√n, which is sd unless given: a statistic against a
    reference computed on the same units (the exposure-free F1) varies less than its interval assumes.
    With `per_item_bound_pp` the certification reads the earned interval, never narrower than ±h₀
    (`zero_spread_bound`)."""
    if n < 2 or min(sd_null_pp, sd_dosed_pp) < 0 or margin_pp <= 0:
        raise ValueError(f"need n >= 2, spreads >= 0 and a margin > 0, got {n}, {sd_null_pp}, {sd_dosed_pp}, {margin_pp}")
    if interval not in ("t", "z"):
        raise ValueError(f"interval must be 't' or 'z', got {interval!r}")
    q = (1 + confidence) / 2
    c = float(stats.t.ppf(q, n - 1)) if interval == "t" else float(stats.norm.ppf(q))
    se0, se1 = sd_null_pp / math.sqrt(n), sd_dosed_pp / math.sqrt(n)
    sp0 = se0 if spread_null_pp is None else spread_null_pp / math.sqrt(n)
    sp1 = se1 if spread_dosed_pp is None else spread_dosed_pp / math.sqrt(n)
    h0 = 0.0 if per_item_bound_pp is None else zero_spread_bound(n, per_item_bound_pp, confidence)
    room = margin_pp - max(c * se0, h0)     # |estimate| up to this certifies
    if room <= 0:
        certify = 0.0
    elif sp0 == 0:
        certify = float(abs(bias_pp) <= room)
    else:
        certify = float(stats.norm.cdf((room - bias_pp) / sp0) - stats.norm.cdf((-room - bias_pp) / sp0))
    shift = dose_pp if shift_pp is None else shift_pp
    need = margin_pp + c * se1          # an estimate above this reads leak
    power = float(shift > need) if sp1 == 0 else float(stats.norm.sf((need - shift) / sp1))
    return Plan(n, margin_pp, dose_pp, se0, se1, certify, power)


def _newcombe_vec(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, earned: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """metrics.proportions.newcombe_paired (lo, hi) for arrays of tables, as fractions; with `earned`,
    newcombe_earned's."""
    z = float(stats.norm.ppf(0.975))
    n = a + b + c + d

    def wilson(k):
        p = k / n
        den = 1 + z * z / n
        centre = (p + z * z / (2 * n)) / den
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
        return p, np.where(k == 0, 0.0, np.maximum(0.0, centre - half)), np.where(k == n, 1.0, np.minimum(1.0, centre + half))

    p1, l1, u1 = wilson(a + b)
    p2, l2, u2 = wilson(a + c)
    margins = ((a + b) * (c + d) * (a + c) * (b + d)).astype(float)
    phi = np.where(margins > 0, (a * d - b * c) / np.sqrt(np.where(margins > 0, margins, 1.0)), 0.0)
    theta = (b - c) / n
    lo = theta - np.sqrt(np.maximum(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = theta + np.sqrt(np.maximum(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    # newcombe_paired's floor ±h₀, and newcombe_earned's half-width (module comment, "the bound a sample
    # earned"), vectorised
    h0 = 1.0 - 0.025 ** (1.0 / n)
    half = h0
    if earned:
        k = b + c
        share = np.where(k >= n, 1.0, stats.beta.ppf(0.975, k + 1, np.maximum(n - k, 1)))
        var = np.maximum(0.0, k / n - theta * theta) * n / np.maximum(n - 1, 1)
        var_u = np.maximum(var, share * 1.0 - theta * theta)      # Σd²/k = 1 for d ∈ {−1, 1}
        half = np.where(k == 0, h0, np.maximum(z * np.sqrt(var_u / n), h0))
    return np.maximum(-1.0, np.minimum(lo, theta - half)), np.minimum(1.0, np.maximum(hi, theta + half))


def paired_plan(n: int, base: float, discordance: float, margin_pp: float, dose_pp: float, *,
                draws: int = 4000, seed: int = 0) -> Plan:
    """The predicted certification probability and power of a verdict on Newcombe's paired interval
    (controls.sequential_verdict: leak when lo > m, at_chance when [lo, hi] ⊂ [−m, m]) over n units, from
    `draws` simulated tables. Null: both proportions at `base`, the units split a = base − δ/2, b = c = δ/2;
    dose d: a share d/100 of the units where both were wrong become first-only (b += d, d −= d)."""
    if n < 1 or not 0 <= base <= 1 or not 0 <= discordance <= 2 * min(base, 1 - base) + 1e-12:
        raise ValueError(f"need n >= 1, base in [0, 1] and 0 <= discordance <= 2·min(base, 1 − base), got "
                         f"{n}, {base}, {discordance}")
    m, dose = margin_pp / 100, dose_pp / 100
    null = [base - discordance / 2, discordance / 2, discordance / 2, 1 - base - discordance / 2]
    dosed = [null[0], null[1] + dose, null[2], null[3] - dose]
    if min(dosed) < -1e-12:
        raise ValueError(f"a dose of {dose_pp} pp exceeds the units where both are wrong ({100 * null[3]:.1f} %)")
    rng = np.random.default_rng(seed)
    out = []
    for probs, earned in ((null, True), (dosed, False)):   # at_chance reads the earned interval, leak Newcombe's
        t = rng.multinomial(n, np.clip(probs, 0, None) / sum(np.clip(probs, 0, None)), size=draws)
        out.append(_newcombe_vec(*t.T, earned=earned))
    (lo0, hi0), (lo1, _) = out
    certify = float(np.mean((lo0 >= -m) & (hi0 <= m)))
    power = float(np.mean(lo1 > m))
    se0 = paired_sd_pp(discordance) / math.sqrt(n)
    se1 = 100.0 * math.sqrt(discordance + dose - dose * dose) / math.sqrt(n)
    return Plan(n, margin_pp, dose_pp, se0, se1, certify, power)


# --- the bound a sample earned: no certification from a sample without spread (issue 51) ---------------------
#
# An interval of a mean of per-item differences d_i says nothing about items the sample did not draw. Every d_i
# lies in [−B, B], B the per-item bound fixed before the run (100 pp by default: a rate cannot move an item by
# more; or the positive control's largest per-item effect). Write π for the share of items whose difference is
# not 0 and ν for their mean difference, so the mean is μ = π·ν and |μ| ≤ π·B.
#
# - No spread (all d_i = 0): the only evidence is that 0 of n items differ. With probability ≥ 1 − a,
#   π ≤ π₀ = CP_U(0, n) = 1 − a^(1/n) (Clopper–Pearson, one-sided, a = 2.5 %), so |μ| ≤ h₀ = π₀·B exactly.
#   30 items: h₀ = 11.6 pp at B = 100; 400 items: 0.92 pp. No sample of n items can rule out a share π₀ of
#   items that all differ by B, spread or not: h₀ is a floor on every half-width at n.
# - Some spread (k ≥ 1 items differ): the t interval's half-width c·s/√n rests on the sample's s, which
#   underestimates the spread when the few differing items are large (most items 0): its coverage at n = 400
#   with 2 % of items at 100 pp is 90 %, not 97.5 % a side. The variance is σ² = π·E[d² | d ≠ 0] − μ²; the
#   part that does differ estimates E[d² | d ≠ 0] by r² = Σd_i²/k, and the share by π ≤ CP_U(k, n). So
#   σ_U² = max(s², CP_U(k, n)·r² − μ̂²), and the half-width is max(c·σ_U/√n, h₀). Where many items differ,
#   CP_U(k, n) ≈ k/n and σ_U ≈ s: the rule is the t interval's; where few do, it is the count's.
#
# The earned interval is the data's interval widened to μ̂ ± that half-width (`earned_interval`); a verdict's
# at_chance reads it (attacks/controls.classify, `certify`), its leak the data's own interval (a leak is what
# the data show; a certification must also hold for what they could have missed). Monotone in what the rule
# can promise: (i) no sample of n earns less than ±h₀, so no differing item ever makes the bound tighter than
# the all-zero sample's; (ii) along a sweep of k = 0..n items that differ by the same x (either sign), neither
# the reach max(|lo|, |hi|) nor the end on x's side ever falls (the t interval alone falls at the corner, from
# a positive width at k = 1 to 0 at k = 0, and again at k = n); (iii) Newcombe's paired interval gets the floor
# (metrics.proportions.newcombe_paired) and the whole rule (newcombe_earned) with d_i ∈ {−1, 0, 1} (B = 100 pp,
# which no paired proportion can exceed): their upper ends never fall as b grows, their lower never rise as c
# grows. A general sample can narrow when an added item lands near its mean (s falls): that is the t interval's own
# behaviour, not a corner effect. tests/test_metrics.py sweeps all three.


def zero_spread_bound(n: int, per_item_bound: float, confidence: float = 0.95) -> float:
    """h₀ = CP_U(0, n)·B: the largest mean shift n items that all agree cannot rule out (one-sided
    Clopper–Pearson at (1 + confidence)/2; 0 of 400 gives 0.92 %)."""
    if n < 1 or per_item_bound < 0 or not 0 < confidence < 1:
        raise ValueError(f"need n >= 1, a bound >= 0 and confidence in (0, 1), got {n}, {per_item_bound}, {confidence}")
    return per_item_bound * (1.0 - ((1.0 - confidence) / 2.0) ** (1.0 / n))


def _share_upper(k: int, n: int, a: float) -> float:
    return 1.0 if k >= n else float(stats.beta.ppf(1.0 - a, k + 1, n - k))


def earned_half_width(n: int, k: int, mean: float, sd: float, sum_sq: float, per_item_bound: float, *,
                      critical: float | None = None, confidence: float = 0.95) -> float:
    """The half-width a sample of n differences earned (module comment above): max(c·σ_U/√n, h₀), k the items
    that differ from 0, `sum_sq` Σd², `sd` the sample's (ddof 1), c the interval's critical value (Student t by
    default)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    h0 = zero_spread_bound(n, per_item_bound, confidence)
    if k == 0 or n < 2:
        return h0 if k == 0 else per_item_bound
    a = (1.0 - confidence) / 2.0
    c = float(stats.t.ppf(1.0 - a, n - 1)) if critical is None else critical
    var_u = max(sd * sd, _share_upper(k, n, a) * sum_sq / k - mean * mean)
    return max(c * math.sqrt(var_u) / math.sqrt(n), h0)


def earned_interval(differences, lo: float, hi: float, per_item_bound: float, *,
                    confidence: float = 0.95) -> tuple[float, float]:
    """The interval an at_chance call may read: the data's [lo, hi] (a t interval of the mean of
    `differences`) widened to mean ± `earned_half_width`, inside ±per_item_bound. Zero width is impossible:
    n differences all 0 earn ±h₀."""
    d = np.asarray(differences, dtype=float).ravel()
    if d.size == 0:
        raise ValueError("earned_interval needs at least one difference")
    if per_item_bound <= 0:
        raise ValueError(f"the per-item bound must be > 0, got {per_item_bound}")
    n, m = int(d.size), float(d.mean())
    sd = float(d.std(ddof=1)) if n > 1 else 0.0
    half = earned_half_width(n, int(np.count_nonzero(d)), m, sd, float(np.dot(d, d)), per_item_bound,
                             confidence=confidence)
    return max(-per_item_bound, min(lo, m - half)), min(per_item_bound, max(hi, m + half))


def units_needed(plan: Callable[[int], Plan], target: float = 0.8, start: int = 2, limit: int = 1_000_000) -> int:
    """The smallest n ≥ start whose plan certifies a null and calls the dose a leak, each with probability
    ≥ target (plan(n).meets(target)); both rise with n, so double then bisect. ValueError past `limit`."""
    if plan(start).meets(target):
        return start
    lo, hi = start, 2 * start
    while not plan(hi).meets(target):
        lo, hi = hi, hi * 2
        if hi > limit:
            raise ValueError(f"more than {limit} units needed")
    while hi - lo > 1:       # plan(lo) fails, plan(hi) meets
        mid = (lo + hi) // 2
        if plan(mid).meets(target):
            hi = mid
        else:
            lo = mid
    return hi


def certification_note(n: int, margin_pp: float, certify_probability: float, n_needed: int | None,
                       target: float = 0.8) -> str | None:
    """What a report says where n units cannot certify ±margin (issue 51 item 4): None where the sizing rule
    predicts a certification with probability ≥ `target` at n (`mean_plan`, `paired_plan`); else "n = 30
    certifies nothing; ±1 pp needs n = 447" (probability 0: the interval's floor, c·se or ±h₀, is wider than
    the margin), or how often n does certify, with the n `units_needed` asks for ≥ `target` (None: past its
    limit)."""
    if certify_probability >= target:
        return None
    head = (f"n = {n} certifies nothing" if certify_probability <= 0 else
            f"n = {n} certifies ±{margin_pp:g} pp only {100 * certify_probability:.0f} % of the time")
    need = "more than 1,000,000" if n_needed is None else f"{n_needed}"
    return f"{head}; ±{margin_pp:g} pp needs n = {need}"
