"""The empirical privacy audit (attacks/splitee/privacy_audit.py, metrics/auditing.py; issue 52): the audit of a
Gaussian mechanism of known μ reads that μ within its interval and never more, the null reads nothing, the
accountant's closed form agrees with dp-accounting's composition and counts exactly the exposures whose means
differ, and experiment=privacy_audit_smoke through the CLI with its bad inputs and its report section."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from attacks.splitee import privacy_audit as pa
from attacks.splitee import sequential as sq
from harness.splitee import accounting
from metrics import auditing

from ..conftest import CONF, builtin_prompt_ids, run_cli_in_process

pytestmark = pytest.mark.usefixtures("one_torch_thread")
OPS = ["qkv", "o", "gate_up"]


@pytest.fixture(scope="module")
def tiny():
    from harness.models import load_model

    return load_model(OmegaConf.load(CONF / "model" / "tiny-llama.yaml"))


def settings(**kw) -> pa.Settings:
    base = dict(pairs=("worst_case",), trials=1200, prompt=0, position=4, suffix=0, candidates=4, null_game=True,
                fpr=auditing.FPR_TARGETS, batch_size=400)
    return pa.Settings(**{**base, **kw})


def gaussian_scores(mu: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The LLR of a Gaussian mechanism of known μ: N(μ²/2, μ²) under A (label 1), N(−μ²/2, μ²) under B."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    return rng.normal(np.where(labels == 1, 0.5, -0.5) * mu * mu, mu), labels


@pytest.mark.parametrize("mu", [0.5, 1.5, 3.0])
def test_audit_of_a_known_gaussian_mechanism_is_a_lower_bound_and_its_fit_covers_mu(mu):
    """4,000 trials of N(±μ²/2, μ²): the bound never exceeds μ and comes within 0.8 of it (the finite-sample
    cap at 4,000 trials is above 3); the Gaussian fit's interval holds μ; every target row's FPR stays near its
    target on the evaluation half (thresholds from the calibration half)."""
    scores, labels = gaussian_scores(mu, 4000, seed=int(10 * mu))
    audit = auditing.audit(scores, labels, seed=0)
    assert mu - 0.8 <= audit.mu_lower <= mu
    d, lo, hi = audit.separation
    assert lo <= mu <= hi and abs(d - mu) < 0.15 * mu + 0.1
    for p in audit.points:
        assert p.fpr_ci[0] <= p.target + 0.01 and p.fpr <= 3 * p.target + 0.005
        assert p.mu_lower is None or p.mu_lower <= mu
    # the headline is the best target's bound at Bonferroni level: at most the best row's own 95% bound
    assert audit.mu_lower <= max(p.mu_lower for p in audit.points if p.mu_lower is not None)


def test_null_scores_certify_nothing():
    """Labels independent of the scores: the bound is 0 (μ ≥ 0 is all it can say) and the fit's interval
    holds 0."""
    rng = np.random.default_rng(3)
    audit = auditing.audit(rng.normal(size=3000), rng.integers(0, 2, 3000), seed=0)
    assert audit.mu_lower == 0.0
    assert audit.separation[1] <= 0.0 <= audit.separation[2]
    assert all(p.mu_lower is None or p.mu_lower <= 0 for p in audit.points)


def test_roc_curve_and_threshold_on_a_hand_example():
    scores = np.array([0.9, 0.8, 0.8, 0.3, 0.1])
    labels = np.array([1, 1, 0, 1, 0])
    fpr, tpr = auditing.roc_curve(scores, labels)
    assert fpr.tolist() == [0.0, 0.0, 0.5, 0.5, 1.0]
    assert tpr.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 1.0])   # the tie at 0.8 moves both at once
    # at most ⌊0.34·3⌋ = 1 of the negatives exceeds the threshold, and no lower threshold keeps that
    assert auditing.threshold_at(np.array([0.2, 0.5, 0.7]), 0.34) == 0.5
    assert auditing.threshold_at(np.array([0.2, 0.5, 0.7]), 0.01) == 0.7
    assert auditing.gdp_mu_lower(0.5, 0.5) == pytest.approx(0.0) and auditing.gdp_mu_lower(0.0, 0.1) is None


def test_closed_form_mu_is_dp_accountings_composition():
    """The accountant's μ = ε√K (Gaussian mechanisms compose to μ-GDP, Dong et al. 2022 Cor. 3.3): its (ε, δ)
    equals dp-accounting's PLD composition of K Gaussian events of noise multiplier 1/ε."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    eps, k, delta = 0.3, 90, 1e-5
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0 / eps), k)
    composed = PLDAccountant().compose(event).get_epsilon(delta)
    assert composed == pytest.approx(accounting.dp_epsilon(accounting.composed_mu([eps] * k), delta), rel=0.01)


def _game(tiny, epsilon, s, prompt):
    model = tiny.model
    keys = [(op, layer) for layer in range(len(model.model.layers)) for op in OPS]
    a, i = pa.submission(prompt, 1, s)
    sigmas = sq.op_sigmas(model, "ep1", epsilon, [len(a)], keys, sigma_scale=1.0, sensitivity_rule="paper")[0]
    pair = pa.build_pair("worst_case", model, a, i, keys, sigmas, OPS, "paper", s.candidates)
    return pair, keys, sigmas


def test_one_exposure_game_on_the_tiny_model_reads_its_known_mu(tiny):
    """The layer-0 QKV exposure of the differing token is one Gaussian mechanism of known μ =
    ‖RMSNorm(E[a]) − RMSNorm(E[b])‖/σ (the codebook, computed here apart from the auditor's T3 means), ε set so
    that μ = 2. Through the engine, 1,200 trials: the exposure's audit bound lies in [μ − 1, μ] and its fit's
    interval holds μ; the whole submission's fit holds the pair's μ, and the bound stays below the accountant's."""
    from attacks.splitee.bayes import codebook

    prompt = builtin_prompt_ids(tiny.tokenizer, 1, use_chat_template=False)[0]
    s = settings()
    pair, keys, sigmas = _game(tiny, 1.0, s, prompt)
    book = codebook(tiny.model)
    gap = float((book[pair.a[pair.position]] - book[pair.b[pair.position]]).norm())
    epsilon = 2.0 * sigmas[("qkv", 0)] / gap          # σ ∝ 1/ε: this ε makes the exposure's μ exactly 2
    sigmas = sq.op_sigmas(tiny.model, "ep1", epsilon, [pair.n], keys, sigma_scale=1.0, sensitivity_rule="paper")[0]
    known = gap / sigmas[("qkv", 0)]
    assert known == pytest.approx(2.0, rel=1e-5)
    first = ("qkv", 0)
    assert pa.pair_mu({first: pair.means_a[first][:1]}, {first: pair.means_b[first][:1]}, sigmas) == pytest.approx(
        known, rel=1e-4)
    scores = pa.play(tiny.model, pair, pa.Scorer(pair, sigmas, keys), s, configuration="ep1", epsilon=epsilon,
                     seed=0, offload=OPS, sigma_scale=1.0, sensitivity_rule="paper", epsilon_length=pair.n, keys=keys)
    exposure = auditing.audit(scores["exposure"], scores["labels"], seed=0)
    assert known - 1.0 <= exposure.mu_lower <= known
    assert exposure.separation[1] <= known <= exposure.separation[2]
    whole = auditing.audit(scores["submission"], scores["labels"], seed=0)
    mu = pa.pair_mu(pair.means_a, pair.means_b, sigmas, keys)
    assert whole.separation[1] <= mu <= whole.separation[2] and whole.mu_lower <= mu
    acc = pa.accountant(pair, len(tiny.model.model.layers), OPS, epsilon)
    assert mu < acc["mu"] == pytest.approx(epsilon * math.sqrt(acc["exposures"]))
    # the null game: A's trials against themselves certify nothing
    null = pa.null_game(scores, 0)
    assert auditing.audit(null["submission"], null["labels"], seed=0).mu_lower == 0.0


def test_accountant_counts_exactly_the_exposures_whose_means_differ(tiny):
    """With 3 positions after the differing token, the (op, layer, position) rows whose clean inputs differ
    between A and B are the accountant's K(n, i) of harness/splitee/accounting.py, prefill only."""
    prompt = builtin_prompt_ids(tiny.tokenizer, 1, use_chat_template=False)[0]
    pair, keys, _ = _game(tiny, 1.0, settings(suffix=3), prompt)
    differ = sum(int((pair.means_a[k] != pair.means_b[k]).any(-1).sum()) for k in keys)
    assert differ == pa.accountant(pair, len(tiny.model.model.layers), OPS, 1.0)["exposures"] == 1 + 1 * 4 + 2 * 2 * 4


def test_typical_neighbour_is_the_models_likeliest_other_token(tiny):
    prompt = builtin_prompt_ids(tiny.tokenizer, 1, use_chat_template=False)[0]
    a, i = pa.submission(prompt, 1, settings())
    with torch.no_grad():
        logits = tiny.model(input_ids=torch.tensor([a[:i]])).logits[0, -1]
    ranked = logits.argsort(descending=True).tolist()
    expected = ranked[0] if ranked[0] != a[i] else ranked[1]
    keys = [("qkv", 0)]
    pair = pa.build_pair("typical", tiny.model, a, i, keys, {keys[0]: 1.0}, OPS, "paper", 1)
    assert pair.b == a[:i] + [expected] + a[i + 1:]


def test_privacy_audit_smoke_through_the_cli_and_its_report(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    res = run_cli_in_process(["experiment=privacy_audit_smoke"], out, cache)
    assert res.returncode == 0, res.stderr
    run = out / "privacy_audit_smoke" / "tiny-llama" / "ep1" / "eps=1" / "default"
    data = json.loads((run / "results.json").read_text())
    m = data["metrics"]
    assert data["experiment"] == "privacy_audit" and data["tags"] == ["smoke"]
    assert set(m["tpr_at_fpr"]) == {"0.1", "1", "10"} and all(0 <= v <= 100 for v in m["tpr_at_fpr"].values())
    assert 0 <= m["empirical_mu_lower"] <= m["pair_mu"] <= m["accountant_mu"]
    assert m["accountant_mu"] == pytest.approx(math.sqrt(6))          # ε = 1, 3 exposures a layer, 2 layers
    assert m["worst_case_exposure_accountant_mu"] == 1.0 and m["null_submission_pair_mu"] == 0.0
    assert set(data["roc"]) == {"worst_case", "typical", "null"}
    curve = data["roc"]["worst_case"]["submission"]
    assert curve["fpr_pct"][0] == 0 and curve["fpr_pct"][-1] == 100 and curve["tpr_pct"][-1] == 100
    # the shared ROC record (metrics/roc.py, issue 52 item 4): AUC with its interval, TPR read off the curve, and
    # at 0.1 % FPR not measurable with ~100 negatives rather than a number
    assert curve["auc_ci"][0] <= curve["auc"] <= curve["auc_ci"][1] and curve["auc"] == m["auc"]
    assert curve["positives"] + curve["negatives"] == 200 and len(curve["fpr_pct"]) <= 200
    low = {p["fpr_target_pct"]: p for p in curve["tpr_at_fpr"]}
    assert low[0.1]["tpr_pct"] is None and "negatives resolve FPR" in low[0.1]["reason"]
    assert low[10.0]["tpr_ci_pct"][0] <= low[10.0]["tpr_pct"] <= low[10.0]["tpr_ci_pct"][1]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["game"] for s in samples] == ["worst_case", "typical", "null"]
    assert len(samples[0]["labels"]) == len(samples[0]["submission_llr"]) == 200
    # the export: TPR at each target FPR a row with its Clopper–Pearson interval, the bounds beside them
    from runners.export import table

    rows = {r["metric"]: r for r in table(out)[0]}
    assert rows["tpr_at_fpr[10]"]["value"] == m["tpr_at_fpr"]["10"]
    assert [rows["tpr_at_fpr[10]"]["ci_lo"], rows["tpr_at_fpr[10]"]["ci_hi"]] == m["tpr_at_fpr_ci"]["10"]
    assert rows["empirical_mu_lower"]["value"] == m["empirical_mu_lower"] and "typical_exposure_accountant_mu" in rows
    assert [rows["auc"]["value"], rows["auc"]["ci_lo"], rows["auc"]["ci_hi"]] == [m["auc"], m["auc_ci_lo"], m["auc_ci_hi"]]
    from runners.report.cli import main as report_main

    assert report_main([str(out), "--include-tagged", "smoke"]) == 0
    report = (out / "report.md").read_text()
    assert "## Empirical privacy audit" in report and "worst_case" in report
    assert "| ε=1 | worst_case · submission | " in report and "AUC [95% CI]" in report
    assert any(p.name.startswith("report_privacy_audit") for p in out.glob("*.png"))


@pytest.mark.parametrize("override,expected", [
    ("privacy_audit.position=100000", "privacy_audit: the prompt has"),
    ("configuration=t3", "the privacy audit measures SpliTEE's Gaussian masks"),
    ("privacy_audit.pairs=[worst,typical]", "privacy_audit.pairs must be distinct values"),
    ("privacy_audit.trials=8", "privacy_audit.trials must be >= 16"),
    ("privacy_audit.fpr=[0.5,1.5]", "privacy_audit.fpr must be distinct false-positive rates"),
])
def test_bad_inputs_one_line_exit_2_no_files(tmp_path, override, expected):
    from harness.splitee import config

    assert config.AUDIT_PAIRS == pa.PAIRS      # the torch-free schema's copy of the pairs the game knows
    out, cache = tmp_path / "out", tmp_path / "cache"
    res = run_cli_in_process(["experiment=privacy_audit_smoke", override], out, cache)
    assert res.returncode == 2
    assert len(res.stderr_lines) == 1 and expected in res.stderr_lines[0], res.stderr
    assert not list(out.rglob("results.json"))
