"""Issue 31: the calibration machinery (attacks/calibration.py), its intervals and the equivalence helper,
and experiment=calibration_smoke through the command line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from attacks import calibration, controls
from harness import calibration_config
from metrics.equivalence import certifiable_margin, examples_needed
from metrics.intervals import mean_ci
from metrics.proportions import clopper_pearson

from .conftest import run_cli_in_process


@pytest.mark.parametrize("k, n", [(0, 30), (0, 36), (1, 36), (17, 40), (36, 36)])
def test_clopper_pearson_is_scipys_exact_interval(k, n):
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert clopper_pearson(k, n) == pytest.approx((ref.low, ref.high), abs=1e-9)


def test_clopper_pearson_bounds_the_issue_quotes():
    assert clopper_pearson(0, 30)[1] == pytest.approx(0.116, abs=5e-4)
    assert clopper_pearson(0, 36)[1] == pytest.approx(0.097, abs=5e-4)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_equivalence_helper_is_its_own_inverse_and_certifies_as_promised():
    n = examples_needed(6.0, 1.0)
    assert certifiable_margin(6.0, n) <= 1.0 < certifiable_margin(6.0, n - 1)
    assert certifiable_margin(6.0, 4 * n) < certifiable_margin(6.0, n)
    # Simulated nulls at that n: the at_chance call (the whole 95% t interval within ±m) comes at >= 80 %.
    rng = np.random.default_rng(0)
    n = examples_needed(1.0, 0.5)
    hits = 0
    for _ in range(400):
        e = mean_ci(rng.normal(0.0, 1.0, n))
        hits += controls.classify(e.lo, e.hi, 0.0, 0.5, positive_passed=True, negative_passed=True) == controls.AT_CHANCE
    assert hits / 400 >= 0.75, hits
    # one example fewer than needed for a smaller spread would not do: monotone in sd
    assert examples_needed(0.5, 0.5) < n


def _toy_entry(null_verdict: str) -> calibration.Entry:
    """A verdict whose statistic is the mean of 20 unit-normal examples plus the dose, read by classify."""
    def read(dose, rng):
        e = mean_ci(rng.normal(dose, 1.0, 20))
        v = controls.classify(e.lo, e.hi, 0.0, 0.2, positive_passed=True, negative_passed=True)
        return calibration.Trial(v, e.mean)

    return calibration.Entry("toy", "noise", "nothing", "units", lambda rng: read(0.0, rng) if null_verdict == "read"
                             else calibration.Trial(null_verdict, 0.0), read, [0.1, 2.0], 2.0, 0.2, 20)


def test_calibrate_counts_verdicts_with_exact_intervals():
    r = calibration.calibrate(_toy_entry(controls.AT_CHANCE), 36, seed=1, dosed_trials=10)
    assert r["false_leak_rate"] == {"k": 0, "n": 36, "rate": 0.0, "ci": list(clopper_pearson(0, 36))}
    assert r["certify_rate"]["k"] == 36 and r["acceptance"]["certify_rate_ge_80pct"]
    assert r["power"]["2"]["k"] == 10 and r["power_at_gate_dose"] == r["power"]["2"]   # +2 σ/unit: always leak
    assert r["power"]["0.1"]["k"] < 10
    assert all(r["acceptance"].values())
    leaky = calibration.calibrate(_toy_entry(controls.LEAK), 36, seed=1, dosed_trials=10)
    assert leaky["false_leak_rate"]["k"] == 36 and not leaky["acceptance"]["false_leak_upper_le_10pct"]
    # real noise at n = 20 and m = 0.2: 95% t half-width ≈ 0.47 > m, so no null can be certified
    noisy = calibration.calibrate(_toy_entry("read"), 36, seed=2, dosed_trials=10)
    assert noisy["certify_rate"]["k"] == 0 and noisy["false_leak_rate"]["k"] <= 3
    assert noisy["certifiable_margin_pp"] == pytest.approx(certifiable_margin(noisy["null_statistic_sd_pp"] * 20 ** 0.5, 20))


def test_every_configured_system_has_a_registry_entry():
    assert set(calibration.REGISTRY) == set(calibration_config.SYSTEMS)


def test_text_entries_null_sits_at_its_reference():
    """The sanitiser and label nulls are built from text outside the evaluated rows: their statistic is
    centred on 0 (another evaluated row's truth would inflate the exposure-free reference by ~100/(n−1))."""
    rng = np.random.default_rng(0)
    vocab = np.arange(50, 400)
    p = 1.0 / np.arange(1, len(vocab) + 1)
    rows = [rng.choice(vocab, 16, p=p / p.sum()).tolist() for _ in range(40)]
    entry = calibration.splitft_entry(rows[:20], rows[20:], 1.0, 5.0, [10.0], 10.0)
    values = [entry.null_trial(np.random.default_rng(s)).statistic for s in range(30)]
    assert abs(np.mean(values)) < 3 * np.std(values) / np.sqrt(len(values)) + 0.2
    assert entry.dosed_trial(50.0, np.random.default_rng(0)).verdict == controls.LEAK


def test_calibration_smoke_through_the_cli(tmp_path):
    res = run_cli_in_process(["experiment=calibration_smoke"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 0, res.stderr[-3000:]
    [path] = list((tmp_path / "out").rglob("results.json"))
    r = json.loads(path.read_text())
    assert r["experiment"] == "calibration" and "smoke" in r["tags"]
    assert set(r["systems"]) == {"collab", "sanitize", "splitft", "grad_audit"}
    for name, s in r["systems"].items():
        fl = s["false_leak_rate"]
        assert fl["n"] == 36 and fl["ci"] == pytest.approx(list(clopper_pearson(fl["k"], 36)))
        assert set(s["power"]) == {"2", "10"} and all(p["n"] == 20 for p in s["power"].values())
        assert s["power_at_gate_dose"] == s["power"]["2"] and set(s["acceptance"]) == {
            "false_leak_upper_le_10pct", "power_at_gate_dose_ge_80pct", "certify_rate_ge_80pct"}
        assert r["metrics"][f"{name}_false_leak_rate"] == fl["rate"]
        # a leak 5× the gate's dose is called more often than at the gate's dose
        assert s["power"]["10"]["rate"] >= s["power"]["2"]["rate"]
    # the report section: one row per system with its null, counts and acceptance marks
    from runners.report.document import build

    build(tmp_path / "out", tmp_path / "report", include_tags=("smoke",))
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Verdicts calibrated against nulls (issue 31)" in text
    fl = r["systems"]["collab"]["false_leak_rate"]
    assert "| collab | 12 | random ids" in text and f"{fl['k']}/36" in text


def test_bad_calibration_values_are_one_line_errors(tmp_path):
    res = run_cli_in_process(["experiment=calibration_smoke", "calibration.systems=[collab,spliteee]"],
                             tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2 and len(res.stderr_lines) == 1
    assert "calibration.systems must be distinct values from collab, sanitize, splitft, grad_audit" in res.stderr_lines[0]
    res = run_cli_in_process(["experiment=calibration_smoke", "calibration.collab.gate_dose_pp=3"],
                             tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2 and "calibration.collab.gate_dose_pp must be one of its doses_pp" in res.stderr_lines[0]
