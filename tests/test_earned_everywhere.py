"""Issue 51 item 1, in every system: each at_chance call reads the interval the data earned (metrics/equivalence.py),
at a per-item bound B stated in the system's config, and the rule is monotone wherever it is used."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attacks import controls
from metrics.equivalence import earned_interval, zero_spread_bound
from metrics.intervals import mean_t_ci

ROOT = Path(__file__).resolve().parents[1]
H30, H400 = zero_spread_bound(30, 100.0), zero_spread_bound(400, 100.0)     # 11.57 and 0.92 pp

# function name -> the keyword that carries the interval its at_chance reads
VERDICT_CALLS = {"classify": "certify", "sequential_verdict": "certify", "verdict": "certify"}


def _verdict_calls():
    """(file, line, function name, keywords) of every call of controls' verdict functions outside the tests."""
    out = []
    for base in ("attacks", "runners"):
        for path in sorted((ROOT / base).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) and getattr(f.value, "id", None) == "controls" else \
                    f.id if isinstance(f, ast.Name) and path.name == "controls.py" else None
                if name in VERDICT_CALLS:
                    out.append((path.relative_to(ROOT).as_posix(), node.lineno, name, {k.arg for k in node.keywords}))
    return out


def test_every_verdict_call_reads_an_earned_interval():
    """Every call of classify / sequential_verdict / verdict in the runners, attacks and calibration passes the
    interval the data earned. The one exception is controls.recompute, which re-derives verdicts of results
    written before the three-way rule from the intervals they stored (no per-item values to earn from)."""
    calls = _verdict_calls()
    assert len(calls) >= 14, calls     # the sites of issue 51's list: a vanished call would pass vacuously
    missing = [(f, line, name) for f, line, name, kw in calls if VERDICT_CALLS[name] not in kw]
    assert missing == [("attacks/controls.py", _recompute_line(), "classify")], missing


def _recompute_line() -> int:
    tree = ast.parse((ROOT / "attacks/controls.py").read_text(encoding="utf-8"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "recompute")
    return next(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "classify")


@pytest.mark.parametrize("section, key", [("sanitize.attack", "per_item_bound_pp"),
                                          ("splitft.attack", "per_item_bound_pp"),
                                          ("attack.controls", "per_item_bound_pp"),
                                          ("grad_audit.gates", "per_item_bound_pp"),
                                          ("collab.controls", "per_item_bound_pp")])
def test_each_system_states_its_per_item_bound_in_its_config(section, key, hydra_conf):
    """B is fixed in advance in each system's config (100 pp everywhere: see each config's comment), and a bound
    outside (0, 100] pp is one user error line."""
    from omegaconf import OmegaConf

    from harness import schema
    from harness.errors import UserError
    from runners.registry import runner_systems
    from tests.conftest import compose_config

    cfg = compose_config([])
    assert OmegaConf.select(cfg, f"{section}.{key}") == 100.0
    if section == "collab.controls":
        return      # collab's own check (tests/collab) words it for Token-ER
    experiment = {"sanitize.attack": "sanitize_smoke", "splitft.attack": "splitft_smoke",
                  "attack.controls": "attack_smoke", "grad_audit.gates": "grad_audit_smoke"}[section]
    bad = compose_config([f"experiment={experiment}", f"{section}.{key}=0"])
    with pytest.raises(UserError, match=rf"{section}\.{key}=0\.0: a per-item bound of the earned interval lies in "
                                        r"\(0, 100\] pp") as err:
        schema.validate(bad, runner_systems())
    assert "\n" not in str(err.value)


# --- zero spread: 30 items at the reference certify nothing, 400 certify ±1 pp, in each system's verdict ---------


def _same(n: int) -> tuple[list[list[int]], list[list[int]]]:
    """n truths that share two tokens and differ in two, and n identical guesses of the shared two and two others:
    every item's F1 is 50 and so is the exposure-free reference (a guess scores the same against any truth), so
    every difference is exactly 0; the truths read as their own guesses score 100 against a reference of 50."""
    return [[1, 2, 100 + i, 10_000 + i] for i in range(n)], [[1, 2, 5, 6]] * n


@pytest.mark.parametrize("n, expected", [(30, "inconclusive"), (400, "at_chance")])
def test_sanitiser_verdict_earns_its_bound(n, expected):
    import torch

    from attacks.sanitize import scoring

    truths, observed = _same(n)
    s, _ = scoring.score_attacker("identity", lambda obs: [torch.tensor(o).view(-1, 1) for o in obs], truths,
                                  observed, 1, 1.0, True, per_item_bound_pp=100.0)
    assert (s.f1.lo, s.f1.hi, s.reference) == (50.0, 50.0, 50.0)
    h = H30 if n == 30 else H400
    assert s.earned == pytest.approx((50.0 - h, 50.0 + h)) and s.verdict == expected
    flat = s.flat(1)
    assert flat["identity_token_f1_earned_ci_hi"] == pytest.approx(50.0 + h)
    assert flat["identity_token_f1_per_item_bound_pp"] == 100.0


@pytest.mark.parametrize("n, expected", [(30, "inconclusive"), (400, "at_chance")])
def test_split_ft_label_verdict_earns_its_bound(n, expected):
    from attacks.splitft.cell import assess

    truths, guesses = _same(n)
    plain = [[i, i + 1000, i + 2000] for i in range(n)]     # distinct rows: the positive control reads them
    m = assess("label", truths, guesses, plain, plain, 1.0, 5.0, per_item_bound_pp=100.0)
    h = H30 if n == 30 else H400
    assert (m["label_token_f1_ci_lo"], m["label_token_f1_ci_hi"]) == (50.0, 50.0)
    assert (m["label_token_f1_earned_ci_lo"], m["label_token_f1_earned_ci_hi"]) == pytest.approx((50 - h, 50 + h))
    assert m["label_token_f1_per_item_bound_pp"] == 100.0 and m["label_verdict"] == expected


@pytest.mark.parametrize("n, expected", [(30, "inconclusive"), (400, "at_chance")])
def test_splitee_bayes_verdict_earns_its_bound(n, expected):
    from attacks.splitee.suite import _bayes_metrics

    truths, guesses = _same(n)
    out = {"top1": [0.0] * n, "topk": [0.0] * n, "top_k": 5, "guesses": guesses, "chance_top1": 0.0,
           "sigma_mean": 1.0, "k_curve": []}
    clean = {**out, "guesses": truths}
    m = _bayes_metrics(out, clean, truths, 1.0, 10.0, 100.0)
    h = H30 if n == 30 else H400
    assert (m["bayes_token_f1_earned_ci_lo"], m["bayes_token_f1_earned_ci_hi"]) == pytest.approx((50 - h, 50 + h))
    assert m["bayes_verdict"] == expected


def test_gradient_audit_partition_verdict_reads_its_earned_interval():
    """The norm-rank agreement's Wilson interval is never zero-width; the verdict still reads the earned one, which
    holds it and never falls below ±B·CP_U(0, n) around the rate."""
    import torch

    from attacks.grad_audit.partition import partition_attack

    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(8, 2, 3, generator=g) for _ in range(4)]
    real = [torch.zeros(8, dtype=torch.bool).index_fill_(0, torch.randperm(8, generator=g)[:4], True) for _ in grads]
    part = partition_attack(grads, real, 4, margin_pp=5.0, positive_margin_pp=5.0, seed=0, per_item_bound_pp=100.0)
    (lo, hi), (e_lo, e_hi) = part["norm_rank_ci_pct"], part["norm_rank_earned_ci_pct"]
    rate = 100 * part["norm_rank"].rate
    assert e_lo <= lo < hi <= e_hi and e_hi - rate >= zero_spread_bound(32, 100.0) - 1e-9
    assert part["verdict"] == "inconclusive"     # 32 rows earn ±10.9 pp at least: past the ±5 pp margin


# --- monotone: one more differing item never makes the bound tighter, as the systems call the rule ---------------


@pytest.mark.parametrize("reference", [0.0, 21.5, 50.0])
@pytest.mark.parametrize("n", [2, 5, 12, 30])
def test_the_rule_as_systems_call_it_never_tightens_as_items_differ(reference, n):
    """controls.earned (what sanitisers, split FT, SpliTEE's learned/Bayes/restored and the partition attacker
    call) on n per-item values of which k differ from the reference by x: its reach from the reference never
    falls as k grows, and never drops below ±h₀. The same for the contextual attacker's paired gain."""
    from attacks.sanitize.contextual import gain_earned
    from metrics.intervals import paired_difference_t_ci

    h0 = zero_spread_bound(n, 100.0)
    for x in (0.3, 1.0, 7.0, 50.0, -0.3, -20.0):
        if not 0 <= reference + x <= 100:
            continue
        prev = None
        for k in range(n + 1):
            values = [reference + x] * k + [reference] * (n - k)
            e = mean_t_ci(values)
            lo, hi = controls.earned(values, reference, e.lo, e.hi, 100.0)
            reach = max(reference - lo, hi - reference)
            assert reach >= h0 - 1e-9, (x, k, lo, hi)
            if prev is not None:
                assert reach >= prev - 1e-9, (x, k, prev, reach)
            prev = reach
        prev = None
        for k in range(n + 1):
            attacker, prior = [reference + x] * k + [reference] * (n - k), [reference] * n
            lo, hi = gain_earned(attacker, prior, paired_difference_t_ci(attacker, prior), 100.0)
            reach = max(-lo, hi)
            assert reach >= h0 - 1e-9 and (prev is None or reach >= prev - 1e-9), (x, k, prev, reach)
            prev = reach


@pytest.mark.parametrize("n", [5, 30, 400])
def test_the_probe_rule_never_tightens_as_rows_differ(n):
    """The gradient audit's earned_pp (per-row differences ±100 pp, Wald): its reach never falls as one more row
    differs in the same direction, from the ±h₀ of n agreeing rows on."""
    from attacks.grad_audit.probe import earned_pp

    prev = None
    for k in range(min(n, 40) + 1):
        effect = 100.0 * k / n
        var = max(0.0, (1e4 * k - n * effect ** 2) / max(1, n - 1)) / n
        lo, hi = earned_pp(n, k, effect, var, effect, effect, 100.0)
        reach = max(-lo, hi)
        assert reach >= zero_spread_bound(n, 100.0) - 1e-9 and (prev is None or reach >= prev - 1e-9), (k, prev, reach)
        prev = reach


def test_controls_earned_is_earned_interval_shifted_by_the_reference():
    """The adapter adds no rule of its own: it is metrics.equivalence.earned_interval of values − reference."""
    values = [20.0, 25.0, 18.0, 40.0, 21.0]
    e = mean_t_ci(values)
    d = [v - 21.5 for v in values]
    lo, hi = earned_interval(d, e.lo - 21.5, e.hi - 21.5, 100.0)
    assert controls.earned(values, 21.5, e.lo, e.hi, 100.0) == pytest.approx((lo + 21.5, hi + 21.5))
