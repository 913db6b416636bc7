"""Issue 31: the calibration machinery (attacks/calibration.py), its intervals and the equivalence helper,
and experiment=calibration_smoke through the command line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy import stats

from attacks import calibration, controls
from attacks.splitee import calibration as splitee_calibration
from attacks.splitft import calibration as splitft_calibration
from harness import calibration_config
from metrics import equivalence
from metrics.equivalence import certifiable_margin, examples_needed
from metrics.intervals import mean_t_ci
from metrics.privacy import pairwise_f1, token_prf
from metrics.proportions import clopper_pearson, newcombe_paired

from .conftest import CONF, _share_tokenizer_cache, compose_config, model_cfg, run_cli_in_process


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
        e = mean_t_ci(rng.normal(0.0, 1.0, n))
        hits += controls.classify(e.lo, e.hi, 0.0, 0.5, positive_passed=True, negative_passed=True) == controls.AT_CHANCE
    assert hits / 400 >= 0.75, hits
    # one example fewer than needed for a smaller spread would not do: monotone in sd
    assert examples_needed(0.5, 0.5) < n


def test_t_interval_sd_recovers_the_spread_a_t_interval_was_built_from():
    values = np.random.default_rng(1).normal(2.0, 7.0, 30)
    e = mean_t_ci(values)
    assert equivalence.t_interval_sd(e.lo, e.hi, 30) == pytest.approx(float(np.std(values, ddof=1)), rel=1e-9)
    assert equivalence.t_interval_sd(0.0, 0.0, 30) == 0.0      # all units agree: no spread
    with pytest.raises(ValueError):
        equivalence.t_interval_sd(1.0, 0.0, 30)


def _toy_entry(null_verdict: str) -> calibration.Entry:
    """A verdict whose statistic is the mean of 20 unit-normal examples plus the dose, read by classify."""
    def read(dose, rng):
        e = mean_t_ci(rng.normal(dose, 1.0, 20))
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
    # a one-trial pilot (calibration.trials=1 calibration.dosed_trials=1 is valid input) measures no spread
    pilot = calibration.calibrate(_toy_entry("read"), 1, seed=2, dosed_trials=1)
    assert pilot["false_leak_rate"]["n"] == 1 and pilot["sizing"]["measured"] is None


def test_every_configured_system_has_a_registry_entry():
    assert set(calibration.entries()) == set(calibration_config.SYSTEMS)


def test_text_entries_null_sits_at_its_reference():
    """The sanitiser and label nulls are rows drawn independently of the truths (from the corpus's token
    frequencies): their statistic is centred on 0, and a dose well past the gate reads leak."""
    rng = np.random.default_rng(0)
    vocab = np.arange(50, 400)
    p = 1.0 / np.arange(1, len(vocab) + 1)
    stream = rng.choice(vocab, 5000, p=p / p.sum()).tolist()
    rows = calibration.unigram_rows(stream, 20, 16, rng)
    entry = splitft_calibration.splitft_entry(rows, stream, 1.0, 5.0, [10.0], 10.0)
    values = [entry.null_trial(np.random.default_rng(s)).statistic for s in range(30)]
    assert abs(np.mean(values)) < 3 * np.std(values) / np.sqrt(len(values)) + 0.2
    assert entry.dosed_trial(50.0, np.random.default_rng(0)).verdict == controls.LEAK


def test_text_dose_raises_token_f1_by_the_dose():
    """`dose_row`: a perfect reader's (multiset) token F1 of the dosed row rises by d pp in expectation."""
    rng = np.random.default_rng(1)
    stream = (rng.zipf(1.5, 4000) % 300).tolist()
    gains = []
    for _ in range(400):
        truth, other = calibration.unigram_rows(stream, 2, 64, rng)
        dosed = calibration.dose_row(truth, other, 5.0, rng)
        gains.append(token_prf(truth, dosed)[2] - token_prf(truth, other)[2])
    assert np.mean(gains) == pytest.approx(5.0, abs=3 * np.std(gains) / 20)
    assert calibration.dose_row([1, 2], [1, 2], 50.0, rng) == [1, 2]     # nothing left to leak


def test_pairwise_f1_is_token_prf_of_every_pair():
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 12, int(rng.integers(0, 9))).tolist() for _ in range(14)] + [[], [3, 3, 3, 3]]
    for mode in ("multiset", "set"):
        f1 = pairwise_f1(rows, rows[::-1], mode)
        assert f1.tolist() == [[token_prf(a, b, mode)[2] for b in rows[::-1]] for a in rows]


def test_sizing_rule_predicts_the_verdicts_it_sizes():
    """metrics/equivalence: mean_plan's certification probability and power are those of classify on
    simulated per-unit data; paired_plan's those of Newcombe's interval on simulated tables; units_needed is
    the smallest n that meets its target."""
    rng = np.random.default_rng(3)
    n, sd = 200, 5.0
    plan = equivalence.mean_plan(sd, sd, n, 1.0, 2.0)
    cert = power = 0
    for _ in range(400):
        null, dosed = mean_t_ci(rng.normal(0.0, sd, n)), mean_t_ci(rng.normal(2.0, sd, n))
        cert += controls.classify(null.lo, null.hi, 0.0, 1.0, positive_passed=True, negative_passed=True) == \
            controls.AT_CHANCE
        power += controls.classify(dosed.lo, dosed.hi, 0.0, 1.0, positive_passed=True, negative_passed=True) == \
            controls.LEAK
    assert cert / 400 == pytest.approx(plan.certify_probability, abs=0.07)
    assert power / 400 == pytest.approx(plan.power, abs=0.07)
    # Newcombe: the vectorised tables agree with newcombe_paired, the probabilities with a direct simulation
    pp = equivalence.paired_plan(600, 0.3, 0.04, 1.0, 4.0, draws=3000, seed=1)
    hits = leaks = 0
    for _ in range(300):
        t = rng.multinomial(600, [0.28, 0.02, 0.02, 0.68])
        _, lo, hi = newcombe_paired(*t)
        hits += -0.01 <= lo and hi <= 0.01
        t = rng.multinomial(600, [0.28, 0.06, 0.02, 0.64])
        leaks += newcombe_paired(*t)[1] > 0.01
    assert hits / 300 == pytest.approx(pp.certify_probability, abs=0.07)
    assert leaks / 300 == pytest.approx(pp.power, abs=0.08)
    # the smallest n: n − 1 falls short of the target
    rule = lambda k: equivalence.mean_plan(4.7, 5.0, k, 1.0, 2.0, spread_null_pp=2.6, spread_dosed_pp=4.6)
    need = equivalence.units_needed(rule, 0.95)
    assert rule(need).meets(0.95) and not rule(need - 1).meets(0.95)
    # a margin below c·sd/√n is never certified; the spreads of paired and unpaired differences
    assert equivalence.mean_plan(10.0, 10.0, 30, 1.0, 2.0).certify_probability == 0.0
    assert equivalence.paired_sd_pp(0.04) == pytest.approx(20.0)
    assert equivalence.unpaired_sd_pp(0.5, 0.5) == pytest.approx(100 * 0.5 ** 0.5)


def test_calibration_runs_under_its_own_directory(hydra_conf):
    """Not under the SpliTEE configuration and ε the defaults select: calibration reads neither."""
    from hydra.core.hydra_config import HydraConfig

    cfg = compose_config(["paths.output_dir=out", "experiment=calibration_smoke", "epsilon=5", "configuration=epn"],
                         hydra_node=True)
    HydraConfig.instance().set_config(cfg)
    assert str(cfg.hydra.run.dir) == "out/calibration_smoke/tiny-llama/calibration/eps=na/default"


# attack.sequential.map_reference in conf/splitee/default.yaml: the reference the smoke calibrates MAP's verdict against
MAP_REFERENCE = str(OmegaConf.load(CONF / "splitee" / "default.yaml").attack.sequential.map_reference)


def test_calibration_smoke_meets_the_issues_acceptance(tmp_path):
    """Issue 31's acceptance, read from experiment=calibration_smoke's results.json: per system (collab,
    sanitize, splitft, grad_audit, splitee with MAP against its configured reference) the false-leak rate's
    Clopper–Pearson upper bound ≤ 10 %, power at the gate's dose ≥ 80 %, nulls certified at_chance ≥ 80 %, and
    the sizing that chose each n recorded beside them."""
    res = run_cli_in_process(["experiment=calibration_smoke"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 0, res.stderr[-3000:]
    [path] = list((tmp_path / "out").rglob("results.json"))
    assert path.parent.relative_to(tmp_path / "out").as_posix() == "calibration_smoke/tiny-llama/calibration/eps=na/default"
    r = json.loads(path.read_text())
    assert r["experiment"] == "calibration" and "smoke" in r["tags"]
    assert set(r["systems"]) == {"collab", "sanitize", "splitft", "grad_audit", "splitee"}
    for name, s in r["systems"].items():
        fl, cert, gate = s["false_leak_rate"], s["certify_rate"], s["power_at_gate_dose"]
        # issue 51: no at_chance from a zero-width interval, in any system
        assert s["zero_spread_certifications"] == 0 == r["metrics"][f"{name}_zero_spread_certifications"]
        assert fl["n"] == 36 and fl["ci"] == pytest.approx(list(clopper_pearson(fl["k"], 36)))
        assert fl["ci"][1] <= 0.10, (name, fl)
        assert gate == s["power"]["2"] and gate["n"] == 20 and gate["rate"] >= 0.80, (name, gate)
        assert cert["rate"] >= 0.80, (name, cert)
        assert all(s["acceptance"].values()), (name, s["acceptance"])
        assert r["metrics"][f"{name}_false_leak_rate"] == fl["rate"]
        # the sizing: n, margin and the predicted probabilities at the planning values n was chosen with
        z = s["sizing"]
        assert z["n"] == s["n_examples"] and z["margin_pp"] == s["margin_pp"] == 1.0 and z["gate_dose_pp"] == 2.0
        assert z["planned"]["n_needed"] <= z["n"] and z["planned"]["predicted_certify_probability"] >= z["target"]
        assert z["measured"]["predicted_certify_probability"] is not None
        if "10" in s["power"]:     # a leak 5× the gate's dose is called at least as often
            assert s["power"]["10"]["rate"] >= gate["rate"]
    # SpliTEE: MAP's own false-leak rate against its configured reference, beside the entry's (worst of MAP,
    # likelihood), and MAP against the other reference on the same nulls, reported beside them
    sp = r["systems"]["splitee"]
    other = {"prior": "null_view", "null_view": "prior"}[MAP_REFERENCE]
    assert set(sp["by_attacker"]) == {"map", "likelihood", f"map_against_{other}"}
    assert sp["references"]["map"] == {"prior": "the prior alone", "null_view": "MAP on a null view"}[MAP_REFERENCE]
    for part in sp["by_attacker"].values():
        assert part["false_leak_rate"]["ci"][1] <= 0.10 and part["certify_rate"]["rate"] >= 0.80
    assert r["metrics"]["splitee_map_false_leak_rate"] == sp["by_attacker"]["map"]["false_leak_rate"]["rate"]
    assert r["metrics"]["splitee_false_leak_rate"] >= r["metrics"]["splitee_map_false_leak_rate"]
    # issue 51 item 3: random ids with 2x the null's steps, read over matched steps, never read leak
    long = r["systems"]["collab"]["extra_nulls"]["long_random_ids"]
    assert long["false_leak_rate"]["n"] == 36 and long["false_leak_rate"]["ci"][1] <= 0.10, long
    assert r["metrics"]["collab_long_random_ids_false_leak_rate"] == long["false_leak_rate"]["rate"]
    # issue 51 items 2 and 4: collab's two nulls built through the engine at its published n (the smoke: 6
    # examples, 4 tokens, 12 trials each), each with its counts and no certification from a zero-width interval
    co = r["systems"]["collab"]
    assert set(co["engine_nulls"]) == {"random_ids_along_undefended_steps", "dp_fusion_eps0_edge"}
    for null, x in co["engine_nulls"].items():
        fl = x["false_leak_rate"]
        assert x["trials"] == fl["n"] == x["certify_rate"]["n"] == 12, (null, x)
        assert fl["ci"] == pytest.approx(list(clopper_pearson(fl["k"], 12)))
        assert x["zero_spread_certifications"] == 0 == r["metrics"][f"collab_{null}_zero_spread_certifications"]
        assert r["metrics"][f"collab_{null}_false_leak_rate"] == fl["rate"]
    # the DP-Fusion null decodes at its own seed: not every trial reproduces its signal bit for bit
    assert co["engine_nulls"]["dp_fusion_eps0_edge"]["zero_width_intervals"] < 12
    pub = co["published"]
    assert pub["n"] == 6 and pub["false_leak_rate"]["n"] == 24 and pub["power_at_gate_dose"]["n"] == 12
    assert pub["zero_spread_certifications"] == 0
    # 6 examples earn at best ±B·CP_U(0, 6) = ±45.9 pp: they certify nothing at 1 pp, and the report says so
    assert pub["note"] == f"n = 6 certifies nothing; ±1 pp needs n = {pub['n_needed_80pct']}" and pub["n_needed_80pct"] > 300
    assert r["metrics"]["collab_published_n"] == 6
    # the other systems' published n, where the config states one, from their sizing at the planning values
    assert r["systems"]["sanitize"]["published"]["n"] == 8 and r["systems"]["splitee"]["published"]["n"] == 320
    assert r["systems"]["sanitize"]["published"]["note"].startswith("n = 8 certifies nothing; ±1 pp needs n = ")
    assert "published" not in r["systems"]["splitft"] and "published" not in r["systems"]["grad_audit"]
    # the report section: one row per system with its null, counts and acceptance marks
    from runners.report.document import build

    build(tmp_path / "out", tmp_path / "report", include_tags=("smoke",))
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Verdicts calibrated against nulls (issue 31)" in text
    fl = r["systems"]["collab"]["false_leak_rate"]
    assert "| collab | 450 | planned 447 (at n: certify" in text and "random ids" in text and f"{fl['k']}/36" in text
    assert "; measured " in text   # the n the rule asks at the run's own measured rates, beside the planned n
    assert "*At the published n*" in text and pub["note"] in text and "random_ids_along_undefended_steps" in text


def test_certification_note_says_what_a_published_n_cannot_certify():
    """metrics/equivalence.certification_note, on the sizing rule's predictions: 30 examples at B = 100 pp earn
    at best ±11.6 pp, so they certify nothing at 1 pp whatever their spread, and the note gives the n the rule
    asks; at that n there is no note."""
    def rule(k):
        return equivalence.mean_plan(2.0, 5.0, k, 1.0, 2.0, per_item_bound_pp=100.0)

    need = equivalence.units_needed(rule, 0.8)
    assert rule(30).certify_probability == 0.0 and need >= 368       # h₀ ≤ 1 pp needs n ≥ 368
    assert equivalence.certification_note(30, 1.0, rule(30).certify_probability, need) == \
        f"n = 30 certifies nothing; ±1 pp needs n = {need}"
    assert equivalence.certification_note(need, 1.0, rule(need).certify_probability, need) is None
    assert equivalence.certification_note(400, 1.0, 0.43, 500) == \
        "n = 400 certifies ±1 pp only 43 % of the time; ±1 pp needs n = 500"


def test_bad_calibration_values_are_one_line_errors(tmp_path):
    res = run_cli_in_process(["experiment=calibration_smoke", "calibration.systems=[collab,spliteee]"],
                             tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2 and len(res.stderr_lines) == 1
    assert "calibration.systems must be distinct values from splitee, sanitize, splitft, collab, grad_audit" in res.stderr_lines[0]
    res = run_cli_in_process(["experiment=calibration_smoke", "calibration.collab.gate_dose_pp=3"],
                             tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2 and "calibration.collab.gate_dose_pp must be one of its doses_pp" in res.stderr_lines[0]
    res = run_cli_in_process(["experiment=calibration_smoke", "calibration.collab.engine.n_examples=1"],
                             tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2 and len(res.stderr_lines) == 1
    assert "calibration.collab.engine.n_examples must be" in res.stderr_lines[0], res.stderr_lines
    res = run_cli_in_process(["experiment=calibration_smoke", f"calibration.splitee.pool_path={tmp_path / 'none.txt'}"],
                             tmp_path / "pool_out", tmp_path / "cache")
    assert res.returncode == 2 and len(res.stderr_lines) == 1
    assert "calibration.splitee.pool_path=" in res.stderr_lines[0] and "does not exist" in res.stderr_lines[0]
    assert not [p for p in (tmp_path / "pool_out").rglob("*") if p.is_file()]   # nothing written


def test_splitee_pool_is_cut_in_order_from_a_text_file(tmp_path):
    """calibration.splitee.pool_path: the pool's rows are the file's paragraphs tokenised in order (WikiText
    headings dropped, as the built-in corpus's paragraphs), and a file too short for the pool is one line."""
    from harness.errors import UserError
    from harness.models import load_model

    _share_tokenizer_cache(tmp_path)     # the tokenizer parsed once per machine, not once per run of this test
    tok = load_model(model_cfg("tiny-llama"), cache_dir=tmp_path).tokenizer
    path = tmp_path / "pool.txt"
    path.write_text(" = A heading = \nThe cat sat on the mat.\n\nA second paragraph, longer than the first one is.\n")
    stream = tok("The cat sat on the mat.")["input_ids"] + tok("A second paragraph, longer than the first one is.")["input_ids"]
    source = f"calibration.splitee.pool_path={path}"
    rows = calibration.text_rows(tok, 2, 4, path.read_text(), source=source)
    assert rows == [stream[:4], stream[4:8]]
    assert calibration.text_rows(tok, 2, 4) != rows          # the default is the built-in corpus
    with pytest.raises(UserError, match=r"pool_path=.* has \d+ tokens, fewer than 100 rows of 4"):
        calibration.text_rows(tok, 100, 4, path.read_text(), source=source)


def _splitee_data(vocab=60, dim=16, prompts=8, length=9, prior_hits=0.0, seed=0):
    """A synthetic pool: random unit-scale codebook, prompts of random tokens, a prior whose argmax is the
    true token at a share `prior_hits` of the positions (and a random token elsewhere)."""
    import torch

    rng = np.random.default_rng(seed)
    book = torch.as_tensor(rng.standard_normal((vocab, dim)), dtype=torch.float32)
    tokens = [rng.integers(vocab, size=length).tolist() for _ in range(prompts)]
    where = [(r, p) for r in range(prompts) for p in range(1, length)]
    log_prior = torch.as_tensor(rng.standard_normal((len(where), vocab)), dtype=torch.float32)
    for i, (r, p) in enumerate(where):
        if rng.random() < prior_hits:
            log_prior[i, tokens[r][p]] = 10.0
    guess = log_prior.argmax(-1).tolist()
    return splitee_calibration.SpliteeData(tokens, where, torch.log_softmax(log_prior, -1), guess, book,
                                   (book * book).sum(-1), 50.0, 1e-3)


def test_splitee_null_reads_another_prompt_and_doses_read_their_own():
    """The SpliTEE entry: on a null (another prompt's view at σ = 50, far above the codebook's spread) MAP
    equals the prior at almost every position, so it never reads leak; every position dosed (its own
    exposure at σ = 10⁻³) is recovered, MAP − prior = 100 − prior's hits, and both attackers read leak."""
    data = _splitee_data(prior_hits=0.3)
    entry = splitee_calibration.splitee_entry(data, positions=40, margin_pp=1.0, min_recall=0.99, doses_pp=[100.0],
                                      gate_dose_pp=100.0, map_reference="prior")
    nulls = [entry.null_trial(np.random.default_rng(s)) for s in range(10)]
    assert all(t.verdict != controls.LEAK for t in nulls)
    assert all(abs(t.statistic) <= 5.0 for t in nulls)
    dosed = entry.dosed_trial(100.0, np.random.default_rng(0))
    assert dosed.verdict == controls.LEAK and dosed.parts == {"map": controls.LEAK, "likelihood": controls.LEAK,
                                                              "map_against_null_view": controls.LEAK}
    assert 50.0 <= dosed.statistic <= 90.0       # 100 % recovered minus the prior's ~30 %
    r = calibration.calibrate(entry, 10, seed=0, dosed_trials=5)
    assert r["by_attacker"]["map"]["false_leak_rate"]["k"] == 0 and r["power"]["100"]["k"] == 5
    # the certifiable margin is the reach of the null trials' own Newcombe intervals, not a t-based guess:
    # 40 positions cannot certify ±1 pp (even with no discordant pair Newcombe's interval reaches ±3 pp here)
    assert r["certifiable_margin_pp"] > 1.0 and r["certify_rate"]["k"] == 0
    assert r["certifiable_margin_method"].startswith("80th percentile")


def test_splitee_map_against_a_null_view_is_unbiased_where_against_the_prior_it_reads_below():
    """A null view informative about *another* prompt's token (σ = 1.6 against a unit-normal codebook of 16
    dimensions, a prior that names the token at 30 % of positions with a lead the likelihood can overturn)
    pulls MAP off the prior's right answers: MAP − prior sits about 6 pp below 0 on every null, inconclusive,
    never at chance, whatever n. MAP against MAP on a second null view is centred at 0 (|mean| < 1 pp over 6
    nulls of 1500 positions), and a 20 pp dose reads leak against either reference; at σ = 1 the pull is strong
    enough that against the prior the same dose does not read leak (the bias costs power as well)."""
    data = _splitee_data(vocab=60, dim=16, prompts=40, length=51, prior_hits=0.3, seed=1)
    data.sigma = 1.6
    by = {ref: splitee_calibration.splitee_entry(data, positions=1500, margin_pp=1.0, min_recall=0.99, doses_pp=[20.0],
                                         gate_dose_pp=20.0, map_reference=ref) for ref in ("prior", "null_view")}
    nulls = {ref: [e.null_trial(np.random.default_rng(s)) for s in range(6)] for ref, e in by.items()}
    assert max(t.statistic for t in nulls["prior"]) < -3.0
    assert all(t.parts["map"] == controls.INCONCLUSIVE for t in nulls["prior"])
    assert abs(np.mean([t.statistic for t in nulls["null_view"]])) < 1.0
    assert all(t.parts["map"] != controls.LEAK for t in nulls["null_view"])
    # the same trial (same generator) reads both references: each entry reports the other's as a part
    for a, b in zip(nulls["prior"], nulls["null_view"]):
        assert a.part_statistics["map_against_null_view"] == b.statistic
        assert b.part_statistics["map_against_prior"] == a.statistic
    for entry in by.values():
        dosed = entry.dosed_trial(20.0, np.random.default_rng(0))
        assert dosed.parts["map"] == controls.LEAK and 12.0 <= dosed.statistic <= 28.0
    # a stronger pull (σ = 1: MAP − prior about −22 pp on a null) swallows a 20 pp dose against the prior
    data.sigma = 1.0
    strong = splitee_calibration.splitee_entry(data, positions=1500, margin_pp=1.0, min_recall=0.99, doses_pp=[20.0],
                                       gate_dose_pp=20.0, map_reference="null_view")
    strong = strong.dosed_trial(20.0, np.random.default_rng(0))
    assert strong.parts["map"] == controls.LEAK and strong.parts["map_against_prior"] != controls.LEAK
    data.sigma = 1.6
    r = calibration.calibrate(by["null_view"], 4, seed=0, dosed_trials=1)
    assert r["references"]["map"] == "MAP on a null view"
    assert set(r["by_attacker"]) == {"map", "likelihood", "map_against_prior"}
    assert r["by_attacker"]["map_against_prior"]["null_statistic_mean_pp"] < -3.0
    assert abs(r["by_attacker"]["map"]["null_statistic_mean_pp"]) < 1.5


def test_splitee_scores_are_the_sequential_attackers():
    """The entry's score of a view is attacks/sequential.gaussian_scores on the codebook (its layer-0 QKV
    stage): the same argmax for the same exposure."""
    import torch

    from attacks.splitee import sequential as sq

    data = _splitee_data()
    y = data.book[3] + 0.1 * torch.ones(data.book.shape[1])
    theirs = sq.gaussian_scores(data.book, y, 0.5, data.book_sq)
    ours = (2.0 * (y[None] @ data.book.T) - data.book_sq) / (2.0 * 0.5 * 0.5)
    assert torch.allclose(ours[0].double(), theirs, rtol=1e-5, atol=1e-4) and int(theirs.argmax()) == 3


def test_splitee_guesses_in_tiles_are_the_full_matrix_argmax():
    """The SpliTEE entry scores a tile of positions × tokens at a time: its argmaxes are the full score
    matrix's, ties included (the first maximal token, also where the tie spans two tiles)."""
    import torch

    data = _splitee_data(vocab=70, dim=16, prompts=8, length=9)
    book_t, half_sq = data.book.T.contiguous(), -0.5 * data.book_sq
    rng = np.random.default_rng(0)
    idx = rng.choice(len(data.where), 50, replace=False)
    y = torch.as_tensor(rng.standard_normal((50, 16)), dtype=torch.float32)
    sigma = rng.uniform(0.5, 2.0, 50)
    full = (torch.addmm(half_sq, y, book_t) * torch.as_tensor(1 / sigma ** 2, dtype=torch.float32)[:, None])
    want = full.argmax(-1).numpy(), (full + data.log_prior[torch.as_tensor(idx)]).argmax(-1).numpy()
    for chunk, block in ((7, 16), (50, 70), (128, 4096), (1, 1)):
        got = splitee_calibration.splitee_guesses(data, book_t, half_sq, y, sigma, idx, chunk, block)
        assert all((g == w).all() for g, w in zip(got, want)), (chunk, block)
    # ties: equal maxima in two tiles (columns 3 and 9, 5 and 6 in one tile) keep the first
    best = splitee_calibration.RunningArgmax(2)
    m = np.zeros((2, 12), np.float32)
    m[0, [3, 9]], m[1, [5, 6]] = 1.0, 2.0
    for c in range(0, 12, 4):
        best.update(m[:, c:c + 4], 0, c)
    assert best.index.tolist() == m.argmax(-1).tolist() == [3, 5]
