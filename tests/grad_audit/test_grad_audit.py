"""The returned-gradient audit (paper 004): transforms, the trainer's returned gradient, the partition and
probe attacks with their controls, the pooling, the locked protocol and the CLI (smoke, bad input)."""
from __future__ import annotations

import hashlib
import itertools
import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from attacks.grad_audit import partition, probe
from harness import configurations, schema
from harness.adversary_view import AdversaryView
from harness.errors import UserError
from harness.grad_audit.trainer import (
    RETURNED_GRADIENT,
    DecoyTrainer,
    FrameTruth,
    TopologySettings,
    topology_settings,
)
from harness.grad_audit.transforms import (
    assemble_frame,
    carrying_norms,
    clip_positions,
    frame_clip,
    mitigate,
    random_rotation,
)
from harness.models import load_model
from metrics.proportions import wilson
from metrics.random_effects import dersimonian_laird
from runners.registry import runner_systems

from ..conftest import CONF, compose_config, run_cli_in_process

# --- transforms -------------------------------------------------------------------------------------

def test_topology_settings_are_the_yamls(hydra_conf):
    """TopologySettings has no defaults of its own: topology_settings passes every field from the grad_audit
    section (conf/grad_audit/default.yaml, the experiment's overrides), the mitigation for decoy_mitigated only."""
    import dataclasses

    for f in dataclasses.fields(TopologySettings):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
    g = compose_config(["experiment=grad_audit_smoke", "grad_audit.train.init=random"]).grad_audit
    plain = topology_settings(g, "decoy_trainer")
    assert plain == TopologySettings(g.cut_after, g.resume_at, g.latent_dim, g.clip, g.noise_ratio, g.train.lr,
                                     None, "random", None)
    assert topology_settings(compose_config(["experiment=grad_audit_smoke"]).grad_audit, "decoy_trainer").init == \
        OmegaConf.load(CONF / "grad_audit" / "default.yaml").train.init
    mitigated = topology_settings(g, "decoy_mitigated")
    assert mitigated.mitigation == (g.mitigation.grad_clip, g.mitigation.noise_multiplier)
    assert mitigated.clip_quantile == g.mitigation.clip_quantile


def test_clip_positions_caps_every_vector_and_keeps_short_ones():
    x = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0)) * 4
    x[0, 0] = 0.01                                   # already short: unchanged
    y = clip_positions(x, 1.0)
    assert torch.all(torch.linalg.vector_norm(y, dim=-1) <= 1.0 + 1e-6)
    assert torch.equal(y[0, 0], x[0, 0])
    long = torch.linalg.vector_norm(x, dim=-1) > 1.0
    assert torch.allclose(torch.linalg.vector_norm(y, dim=-1)[long], torch.ones(int(long.sum())), atol=1e-6)
    # direction kept
    cos = torch.nn.functional.cosine_similarity(x, y, dim=-1)
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-6)


def test_rotation_is_orthogonal():
    r = random_rotation(12, torch.Generator().manual_seed(3))
    assert torch.allclose(r @ r.T, torch.eye(12), atol=1e-5)


def test_mitigation_clips_then_adds_proportional_noise_everywhere():
    g = torch.zeros(80, 4, 64)
    g[:32] = torch.randn(32, 4, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(mitigate(g, 0.01, 0.0, torch.Generator()), clip_positions(g, 0.01))
    out = mitigate(g, 0.01, 0.35, torch.Generator().manual_seed(2))
    assert not (out == 0).flatten(1).all(dim=1).any()        # no row is zero any more
    noise = out[32:]                                          # the decoys: pure noise
    assert abs(float(noise.std()) - 0.35 * 0.01) < 0.05 * 0.35 * 0.01


def test_frame_permutation_hides_and_restores_the_real_rows():
    real, decoys = torch.arange(3.0).view(3, 1, 1), 10 + torch.arange(5.0).view(5, 1, 1)
    frame = assemble_frame(real, decoys, torch.Generator().manual_seed(0))
    assert int(frame.is_real.sum()) == 3
    assert torch.equal(frame.payload[frame.real_index], real)
    assert torch.equal(frame.payload[frame.is_real].sort(0).values, real)


# --- proportions and the random-effects pool ----------------------------------------------------------

def test_wilson_against_the_textbook_value_and_bonferroni():
    lo, hi = wilson(81, 263)                 # Wilson 95% interval for 81/263 (Newcombe 1998, Table I)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    assert wilson(81, 263, 0.05, 5) == wilson(81, 263, 0.01)
    lo0, hi0 = wilson(0, 10)
    assert lo0 == 0.0 and round(hi0, 4) == 0.2775


def test_dersimonian_laird():
    homo = dersimonian_laird([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])     # Q = 2 = k - 1: no heterogeneity
    assert homo.tau2 == 0.0 and homo.mean == pytest.approx(2.0) and homo.se == pytest.approx(1 / math.sqrt(3))
    y, v = np.array([0.0, 4.0, 1.0, 6.0]), np.array([0.5, 1.0, 0.25, 2.0])
    w = 1 / v
    fixed = (w * y).sum() / w.sum()
    q = (w * (y - fixed) ** 2).sum()
    tau2 = (q - 3) / (w.sum() - (w ** 2).sum() / w.sum())
    ws = 1 / (v + tau2)
    got = dersimonian_laird(list(y), list(v))
    assert got.tau2 == pytest.approx(tau2) and got.mean == pytest.approx((ws * y).sum() / ws.sum())
    assert got.hi - got.lo == pytest.approx(2 * 1.959964 / math.sqrt(ws.sum()), rel=1e-5)


# --- the partition attack ------------------------------------------------------------------------------

def test_chance_agreement_is_the_mean_over_every_guess():
    n, r = 6, 2
    truth = [1, 1, 0, 0, 0, 0]
    guesses = [set(c) for c in itertools.combinations(range(n), r)]
    mean = np.mean([sum((i in g) == bool(t) for i, t in enumerate(truth)) / n for g in guesses])
    assert partition.chance_agreement(r, n) == pytest.approx(mean)


def test_other_frames_counts_every_ordered_pair():
    gen = torch.Generator().manual_seed(0)
    pred = [torch.rand(10, generator=gen) < 0.4 for _ in range(4)]
    real = [torch.rand(10, generator=gen) < 0.4 for _ in range(4)]
    got = partition.other_frames(pred, real)
    naive = sum(int((pred[i] == real[j]).sum()) for i in range(4) for j in range(4) if i != j)
    assert (got.rows_agree, got.rows, got.frames) == (naive, 12 * 10, 12)


# --- the trainer, on tiny-qwen3 --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "tiny-qwen3.yaml"))
    cfg.pop("defaults", None)
    return load_model(cfg).model


def _frames(model, mitigation, n=4, noise_ratio=0.35, clip_quantile=None, trainer_out=None):
    st = TopologySettings(1, 2, 8, 1.0, noise_ratio, 1e-3, mitigation, "random", clip_quantile)
    trainer = DecoyTrainer(model, st, seed=5)
    gen = torch.Generator().manual_seed(0)
    view, truth = AdversaryView(), FrameTruth()
    for i in range(n):
        trainer.step(torch.randint(0, 500, (4, 6), generator=gen), torch.randint(0, 500, (6, 6), generator=gen),
                     view, truth, i, i % 2)
    if trainer_out is not None:
        trainer_out.append(trainer)
    return view, truth


def test_quantile_clip_binds_on_the_measured_norms_and_scales_the_noise(tiny):
    """Issue 31: the clip at the q-quantile of each frame's real per-position norms shortens a share 1 - q of
    them, and the decoys' noise is noise_multiplier × that clip (the fixed C = 0.01 never bound)."""
    out = []
    view, truth = _frames(tiny, (None, 0.35), n=3, clip_quantile=0.25, trainer_out=out)
    record = out[0].clip_record
    assert len(record) == 3
    for (clip, clipped, total), e, real in zip(record, view.select(channel=RETURNED_GRADIENT), truth.is_real):
        # 4 real rows of 6 tokens; the last position of each carries no gradient and is not counted
        assert total == 4 * 5 and clipped == pytest.approx(0.75 * total, abs=1)
        decoy_noise = e.tensor[~real]
        assert float(decoy_noise.std()) == pytest.approx(0.35 * clip, rel=0.1)
        assert torch.all(torch.linalg.vector_norm(e.tensor[real], dim=-1) <= clip + 0.35 * clip * 30)
    fixed = []
    _frames(tiny, (0.01, 0.35), n=1, trainer_out=fixed)
    assert fixed[0].clip_record[0][0] == 0.01


def test_a_quantile_below_the_share_of_empty_positions_still_clips_above_zero(tiny):
    """q = 0.1 with 6-token rows: 1/6 of the real positions (each row's last) carry no gradient. A quantile
    over all norms put the clip at 0, every returned entry at 0, and BiSR on zero rows crashed."""
    out = []
    view, truth = _frames(tiny, (None, 0.35), n=2, clip_quantile=0.1, trainer_out=out)
    for (clip, clipped, total), e, real in zip(out[0].clip_record, view.select(channel=RETURNED_GRADIENT),
                                               truth.is_real):
        assert clip > 0 and total == 4 * 5 and clipped == pytest.approx(0.9 * total, abs=1)
        assert torch.all((e.tensor[real] != 0).flatten(1).any(dim=1))
    with pytest.raises(ValueError, match="no real position carries"):
        frame_clip(carrying_norms(torch.zeros(2, 3, 4)), None, 0.5)


def test_returned_gradient_is_exactly_zero_on_the_decoys_and_nowhere_else(tiny):
    view, truth = _frames(tiny, None)
    grads = partition.returned_gradients(view)
    assert len(grads) == 4 and view.channels() == ("forward_payload", RETURNED_GRADIENT)
    for g, real in zip(grads, truth.is_real):
        assert g.shape == (10, 6, 64) and int(real.sum()) == 4
        assert torch.all(g[~real] == 0)                               # the audited bug
        assert torch.all((g[real] != 0).flatten(1).any(dim=1))        # every real row has support
    got = partition.agreement(partition.zero_support(grads), truth.is_real)
    assert got.rate == 1.0 and got.frames_identified == 4
    assert not all(torch.equal(truth.is_real[0], r) for r in truth.is_real[1:])   # fresh permutation per frame


def test_forward_payload_is_clipped_per_position(tiny):
    view, _ = _frames(tiny, None, n=2, noise_ratio=0.0)
    for e in view.select(channel="forward_payload"):
        assert e.tensor.shape == (10, 6, 8)
        assert torch.all(torch.linalg.vector_norm(e.tensor, dim=-1) <= 1.0 + 1e-5)


def test_resume_past_the_models_layers_is_a_user_error(tiny):
    with pytest.raises(UserError, match="cut points must satisfy 0 < k < m <= 2"):
        DecoyTrainer(tiny, TopologySettings(1, 5, 8, 1.0, 0.35, 1e-3, None, "random", None), seed=0)


def _reconstruction_error(model, init, ids):
    trainer = DecoyTrainer(model, TopologySettings(1, 2, 8, 1.0, 0.0, 1e-3, None, init, None), seed=5)
    if init == "least_squares":
        trainer.warm_start(ids)
    with torch.no_grad():
        s_a = trainer.part.head(ids)[0]
        rebuilt = trainer.up(trainer.local(s_a, trainer.gen))
    return float(((rebuilt - s_a).norm(dim=-1) / s_a.norm(dim=-1)).mean()), trainer


def test_least_squares_start_decodes_s_a_where_random_maps_do_not(tiny):
    ids = torch.randint(0, 500, (64, 6), generator=torch.Generator().manual_seed(1))
    random_error, _ = _reconstruction_error(tiny, "random", ids)
    fitted_error, trainer = _reconstruction_error(tiny, "least_squares", ids)
    assert random_error > 0.9 and fitted_error < 0.75 * random_error, (random_error, fitted_error)
    # the bottleneck keeps unit-norm rows (Adam's lr then means the same thing), the scale sits in a buffer
    norms = trainer.local.down.weight.norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-4) and float(trainer.local.input_scale) != 1.0


def test_mitigation_removes_the_zero_support(tiny):
    view, truth = _frames(tiny, (0.01, 0.35))
    grads = partition.returned_gradients(view)
    got = partition.agreement(partition.zero_support(grads), truth.is_real)
    assert got.frames_identified == 0 and got.rate == pytest.approx(4 / 10)   # every row looks real


# --- the probe ---------------------------------------------------------------------------------------------

def _synthetic(n, signal, seed):
    gen = torch.Generator().manual_seed(seed)
    y = torch.multinomial(torch.tensor([0.3, 0.2, 0.2, 0.15, 0.15]), n, replacement=True, generator=gen) + 100
    codes = torch.randn(5, 8, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    x = torch.randn(n, 8, generator=gen, dtype=torch.float64) + signal * codes[y - 100]
    return x, y


def test_probe_reads_a_linear_code_and_nothing_from_noise():
    kw = dict(top_k=5, l2=1e-3, max_iter=30, max_rows=10_000, seed=0)
    strong = probe.run_probe(_synthetic(1500, 3.0, 1), _synthetic(1500, 3.0, 2), **kw)
    assert strong.effect_pp > 50 and strong.ci_pp[0] > 50
    none = probe.run_probe(_synthetic(1500, 0.0, 1), _synthetic(1500, 0.0, 2), **kw)
    assert abs(none.effect_pp) < 3
    shuffled = probe.run_probe(_synthetic(1500, 3.0, 1), _synthetic(1500, 3.0, 2), shuffle_labels=True, **kw)
    assert shuffled.ci_pp[1] < 3
    cell, expected = probe.positive_control(_synthetic(1500, 0.0, 1), _synthetic(1500, 0.0, 2), dose=0.5, **kw)
    # a perfect reader of the code gains dose × (share of top-k rows − share of the top-1 token) ≈ 0.5 × 0.7
    assert expected == pytest.approx(35, abs=4) and cell.effect_pp > 0.6 * expected


def test_probe_as_a_test_separates_a_code_and_not_noise():
    """Issue 52 item 4: the probe's log-probability of a row's own token from its own features against from
    another row's: a linear code separates them; without one the AUC's interval holds ½."""
    from metrics import roc

    kw = dict(top_k=5, l2=1e-3, max_iter=30, max_rows=10_000, seed=0)
    strong = probe.fit_probe(_synthetic(1500, 3.0, 1), **kw)
    # a permuted row carries the same token with probability Σp² = 0.215 and then cannot be told apart: a perfect
    # reader reaches AUC ≈ 1 − 0.215/2 ≈ 0.89
    assert roc.roc(*probe.row_scores(strong, _synthetic(1500, 3.0, 2), seed=5))["auc_ci"][0] > 0.8
    none = probe.fit_probe(_synthetic(1500, 0.0, 1), **kw)
    lo, hi = roc.roc(*probe.row_scores(none, _synthetic(1500, 0.0, 2), seed=5))["auc_ci"]
    assert lo <= 0.5 <= hi


def test_dosed_control_on_an_arm_at_the_floor_gives_its_dose():
    """Issue 31: the positive control starts from an arm at the floor (features permuted against labels, the
    probe reads about 0 there) and injects a code worth the dose to a perfect reader; a large dose is read."""
    kw = dict(top_k=5, l2=1e-3, max_iter=30, max_rows=10_000, seed=0)
    live = (_synthetic(1500, 3.0, 1), _synthetic(1500, 3.0, 2))
    floor = probe.run_probe(probe.floor_arm(live[0], 3), probe.floor_arm(live[1], 4), **kw)
    assert abs(floor.effect_pp) < 3                       # the live code is gone
    for dose in (1.0, 2.0):
        _, expected = probe.dosed_control(*live, dose_pp=dose, **kw)
        assert expected == pytest.approx(dose, rel=1e-6)
    big, expected = probe.dosed_control(*live, dose_pp=30.0, **kw)
    assert expected == pytest.approx(30.0) and big.ci_pp[0] > 10


def test_bonferroni_wilson_statistic():
    cell = probe.score(torch.tensor([True] * 30 + [False] * 70), torch.tensor([True] * 20 + [False] * 80))
    assert cell.effect_pp == pytest.approx(10.0)
    assert cell.upper_bound_pp(0.05, 3) == pytest.approx(100 * (wilson(30, 100, 0.05 / 3)[1] - 0.2))


def test_a_probe_at_the_constant_guess_everywhere_earns_its_bound_from_the_row_count():
    """Issue 51: the probe right exactly where the constant guess is: ci_pp [0, 0], but n rows bound the effect
    by ±100·CP_U(0, n) only: 30 rows certify nothing at 1 pp, 6000 rows (0.061 pp) do."""
    from attacks import controls

    for n, certified in ((30, False), (6000, True)):
        right = torch.tensor([True, False] * (n // 2))
        cell = probe.score(right, right)
        assert cell.ci_pp == (0.0, 0.0) and cell.discordant == 0
        lo, hi = cell.earned_ci_pp
        assert hi == pytest.approx(100 * (1 - 0.025 ** (1 / n))) and lo == -hi
        v = controls.classify(*cell.ci_pp, 0.0, 1.0, positive_passed=True, negative_passed=True,
                              certify=cell.earned_ci_pp)
        assert (v == "at_chance") == certified, (n, v)
    # one discordant row of 6000: the count, not the sample's s, sets the width (CP_U(1, 6000) ≈ 0.093 %)
    d = probe.score(torch.tensor([True] + [False] * 5999), torch.tensor([False] * 6000))
    assert d.discordant == 1 and d.earned_ci_pp[1] > d.ci_pp[1] and d.earned_ci_pp[1] <= 0.15


# --- configurations, validation, the CLI ---------------------------------------------------------------------

def test_configurations_belong_to_the_audit():
    names = configurations.names(system=configurations.GRAD_AUDIT)
    assert names == ("decoy_trainer", "decoy_mitigated")
    assert not any(configurations.get(n).uses_epsilon for n in names)
    assert runner_systems()["grad_audit"] == (configurations.GRAD_AUDIT,)


BAD = {
    "a >= b": (["grad_audit.cut_after=2", "grad_audit.resume_at=2"], "grad_audit needs 0 < cut_after < resume_at"),
    "D < 1": (["grad_audit.latent_dim=0"], "grad_audit.latent_dim (D) must be >= 1, got 0"),
    "C <= 0": (["grad_audit.clip=0"], "grad_audit.clip (C) must be a finite number > 0, got 0.0"),
    "gradient clip <= 0": (["grad_audit.mitigation.grad_clip=-1"], "grad_audit.mitigation.grad_clip must be a finite number > 0"),
    "decoys < 0": (["grad_audit.decoy_rows=-1"], "grad_audit.decoy_rows must be >= 0, got -1"),
    "another system's configuration": (["configuration=ep1"], "configuration=ep1 belongs to the splitee system"),
    "text corpus without a path": (["grad_audit.corpus.source=text"], "grad_audit.corpus.source=text needs"),
    "seeds shared between phases": (["grad_audit.seeds.test=[42]"], "grad_audit.seeds must be distinct"),
    "BiSR steps < 1": (["grad_audit.bisr_backward.steps=0"], "grad_audit.bisr_backward.steps must be >= 1, got 0"),
    "BiSR frames past training": (["grad_audit.bisr_backward.frames=13"],
                                  "grad_audit.bisr_backward.frames must be <= grad_audit.train.frames (12), got 13"),
    "BiSR beta outside [0, 1]": (["grad_audit.bisr_backward.beta=2"], "grad_audit.bisr_backward.beta must lie in [0, 1]"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_one_line(hydra_conf, name):
    overrides, message = BAD[name]
    cfg = compose_config(["experiment=grad_audit_smoke", *overrides])
    with pytest.raises(UserError, match=None) as err:
        schema.validate(cfg, runner_systems())
    assert message in str(err.value) and "\n" not in str(err.value)


def test_attack_runner_refuses_the_audit_configuration(hydra_conf):
    cfg = compose_config(["experiment=attack_smoke", "configuration=decoy_trainer"])
    with pytest.raises(UserError, match="belongs to the grad_audit system"):
        schema.validate(cfg, runner_systems())


def test_cli_bad_input_exits_2(tmp_path):
    res = run_cli_in_process(["experiment=grad_audit_smoke", "grad_audit.cut_after=3", "grad_audit.resume_at=2"],
                             tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2 and len(res.stderr_lines) == 1
    assert res.stderr_lines[0].startswith("splitbench: error: grad_audit needs 0 < cut_after < resume_at")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))


def test_smoke_experiment_through_the_cli(tmp_path):
    res = run_cli_in_process(["experiment=grad_audit_smoke"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    [path] = list((tmp_path / "out").rglob("results.json"))
    r = json.loads(path.read_text())
    for key in ("zero_support_agreement", "probe_effect_pp", "probe_upper_bound_pp", "gate", "heldout_ce_increase",
                "verdict", "tradeoff"):
        assert key in r and (key == "tradeoff" or key in r["metrics"] or key == "verdict")
    m = r["metrics"]
    assert r["system"] == "grad_audit" and r["configuration"] == "decoy_trainer" and r["epsilon"] is None
    assert r["tradeoff"]["setting"] == r["workload"]     # one text per cross-system point (issue 34)
    assert r["privacy_parameter"] == {"name": None, "value": None, "unit": None}   # the trainer has no knob
    assert m["zero_support_agreement"] == 1.0 and m["zero_support_frames_identified"] == m["frames_scored"] == 24
    assert m["partition_verdict"] == "leak" and m["verdict"] == "leak"
    assert m["gate"] in ("pass", "fail") and m["utility_gate"] in ("pass", "fail", "unknown")
    # issue 31: the clipped fraction (nothing clipped without mitigation), the CE curve and its convergence,
    # the gate moved by the shuffled probe's bias, the positive control at +1 and +2 pp
    assert r["clipped_fraction"] == m["clipped_fraction"] == 0.0 and m["grad_clip_median"] is None
    assert all(len(s["ce_curve"]) == 4 and s["ce_curve"][-1][0] == 12 for s in r["seeds"])
    assert m["utility_gate"] == ("unknown" if not m["converged"] else m["utility_gate"])
    assert m["probe_gate_offset_pp"] <= 0.0
    assert m["positive_control_doses_pp"] == [0.0, 1.0, 2.0]
    # issue 52 item 4: the per-row scores as tests; the trainer's decoys get a gradient of exactly 0, so the norm
    # separates every real row from every decoy, and the interval is the exact bound of that many pairs, not a point
    part = r["roc"]["partition_norm"]
    assert part["auc"] == m["auc"] == 1.0 and part["auc_ci"][1] == 1.0
    assert part["auc_ci"][0] == pytest.approx(0.025 ** (1 / min(part["positives"], part["negatives"])))
    assert {p["fpr_target_pct"]: p["tpr_pct"] for p in part["tpr_at_fpr"]}[10.0] == 100.0
    assert set(r["roc"]) == {"partition_norm", *(f"probe_{arm}" for arm in r["protocol_l2"])}
    probe = r["roc"][f"probe_{m['probe_arm']}"]
    assert probe["auc"] == m["probe_auc"] and probe["positives"] == probe["negatives"] == m["probe_rows_scored"]
    assert isinstance(m["positive_control_1pp_gate_fires"], bool) and "positive_control_2pp_effect_pp" in m
    # the protocol was locked in the run dir, its hash recorded, before the results were written
    proto = path.parent / "protocol.json"
    assert hashlib.sha256(proto.read_bytes()).hexdigest() == r["protocol_sha256"]
    assert proto.stat().st_mtime <= path.stat().st_mtime
    assert json.loads(proto.read_text())["thresholds"]["bonferroni_m"] == 2 * 3
    probe_excess, bisr_excess = m["probe_effect_pp"], m["bisr_b_top1"] - m["bisr_b_top1_floor"]
    leak = r["tradeoff"]["leakage"]
    assert leak["value"] - leak["floor"] == pytest.approx(max(probe_excess, bisr_excess))
    # issue 32: BiSR's backward stage on the last frame of each scored seed (32 real rows × 7 label positions)
    assert r["bisr_backward"]["frames"] == 1 and m["bisr_b_positions"] == 2 * 32 * 7
    for key in ("bisr_b_top1", "bisr_b_top1_floor", "bisr_b_minus_floor_pp", "bisr_b_minus_floor_pp_ci_lo",
                "bisr_b_minus_floor_pp_ci_hi", "bisr_b_seconds", "bisr_b_positions_matched"):
        assert isinstance(m[key], (int, float)), key
    assert m["bisr_b_verdict"] == "leak" and m["bisr_b_minus_floor_pp_ci_lo"] > m["gate_margin_pp"]


@pytest.mark.slow
def test_mitigated_smoke_through_the_cli(tmp_path):
    res = run_cli_in_process(["experiment=grad_audit_smoke", "configuration=decoy_mitigated"], tmp_path / "out",
                             tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    [path] = list((tmp_path / "out").rglob("results.json"))
    r = json.loads(path.read_text())
    m = r["metrics"]
    assert m["zero_support_frames_identified"] == 0 and m["zero_support_agreement"] == pytest.approx(0.4)
    assert (r["privacy_parameter"]["name"], r["privacy_parameter"]["value"]) == \
        ("sigma", r["mitigation"]["noise_multiplier"])
    assert m["clipped_fraction"] == pytest.approx(0.5, abs=0.02)      # the median clip binds on half


# --- the report section ---------------------------------------------------------------------------------------

def _run(configuration, ce_split, frames_identified, effect):
    from pathlib import Path

    from runners.report.runs import Run

    metrics = {"zero_support_agreement": 1.0 if frames_identified else 0.4,
               "zero_support_frames_identified": frames_identified, "frames_scored": 10,
               "norm_rank_agreement_pct": 90.0, "partition_chance_agreement_pct": 52.0,
               "probe_effect_pp": effect, "probe_effect_pp_ci_lo": effect - 1, "probe_effect_pp_ci_hi": effect + 1,
               "probe_arm": "joint", "probe_upper_bound_pp": effect + 2, "gate": "fail", "heldout_ce_split": ce_split,
               "heldout_ce_increase": ce_split - 3.0, "utility_gate": "pass", "verdict": "leak"}
    data = {"experiment": "grad_audit", "experiment_name": "grad_audit", "model": "m", "workload": "w",
            "configuration": configuration, "status": "ok", "metrics": metrics, "seeds": [{}, {}],
            "topology": {"cut_after": 15, "resume_at": 27, "latent_dim": 64, "delegated_layers": 12},
            "mitigation": {"grad_clip": 0.01, "clip_quantile": None, "noise_multiplier": 0.35}
            if configuration == "decoy_mitigated" else None}
    return Run(Path("."), configuration, "ok", data)


def test_report_section_shows_the_mitigation_cost():
    from runners.report import grad_audit as section
    from runners.report.sections import SECTIONS

    assert section in SECTIONS
    runs = [_run("decoy_mitigated", 3.25, 0, 0.1), _run("decoy_trainer", 3.20, 10, 2.5)]
    [group] = section.groups(runs)
    assert [r.data["configuration"] for r in group.runs] == ["decoy_trainer", "decoy_mitigated"]
    md = "\n".join(section.markdown([group], figure=None))
    assert "10/10 → 0/10" in md and "+0.050 (each run's own seeds)" in md   # the cost: 3.25 − 3.20 nats
    # with per-seed records, the cost is paired over the seeds both ran (52 and 53 here), not the means
    runs[0].data["seeds"] = [{"seed": 51, "ce_split": 9.0}, {"seed": 52, "ce_split": 3.5}, {"seed": 53, "ce_split": 3.7}]
    runs[1].data["seeds"] = [{"seed": 52, "ce_split": 3.2}, {"seed": 53, "ce_split": 3.3}, {"seed": 54, "ce_split": 0.1}]
    md = "\n".join(section.markdown(section.groups(runs), figure=None))
    assert "+0.350 (seeds 52, 53)" in md
    assert "1.000 (10/10)" in md and "+2.50 → +0.10" in md
    assert len(section.summary([group])) == 3


def test_a_clip_sweep_is_one_mitigation_row_per_clip():
    """grad_audit.mitigation.clip_quantile=0.1,0.5,0.9 at one topology: each mitigated run against the same
    trainer, in quantile order, with its clipped fraction (none is dropped)."""
    from runners.report import grad_audit as section

    runs = [_run("decoy_trainer", 3.20, 10, 2.5)]
    for q, ce, effect in ((0.9, 3.30, 1.5), (0.1, 3.60, 0.2), (0.5, 3.40, 0.8)):
        run = _run("decoy_mitigated", ce, 0, effect)
        run.data["mitigation"] = {"grad_clip": None, "clip_quantile": q, "noise_multiplier": 0.35}
        run.metrics["clipped_fraction"] = 1 - q
        runs.append(run)
    md = section.mitigation_md(section.groups(runs)[0])
    rows = [line for line in md.splitlines() if "q=" in line]
    assert [r.split("q=")[1].split(" ")[0] for r in rows] == ["0.1", "0.5", "0.9"]
    assert "90 % clipped" in rows[0] and "10 % clipped" in rows[2]
    assert "+2.50 → +0.20" in rows[0] and "+0.400 (each run's own seeds)" in rows[0]


def test_the_audit_table_names_each_runs_clip_and_counts_the_seeds_a_dose_fired_on():
    """A clip sweep's mitigated rows share a topology: the configuration cell carries the clip. The positive
    control passes only if no seed fires at dose 0, so 'fires at +0: no' (not on every seed) hid the one
    seed that did; the cell counts seeds."""
    from runners.report import grad_audit as section

    trainer, mitigated = _run("decoy_trainer", 3.20, 10, 2.5), _run("decoy_mitigated", 3.3, 0, 0.5)
    mitigated.data["mitigation"] = {"grad_clip": None, "clip_quantile": 0.1, "noise_multiplier": 0.35}
    trainer.metrics.update({"positive_control_doses_pp": [0.0, 1.0], "positive_control_pass": False,
                            "negative_control_pass": True,
                            "positive_control_0pp_gate_fires": False, "positive_control_0pp_gate_fires_seeds": 1,
                            "positive_control_1pp_gate_fires": True, "positive_control_1pp_gate_fires_seeds": 2})
    md = section.audit_md(section.groups([trainer, mitigated])[0])
    assert "| decoy_mitigated (clip q=0.1) |" in md
    assert "✓ / ✗ (fires at +0: 1/2, +1: 2/2 seeds)" in md
    del trainer.metrics["positive_control_0pp_gate_fires_seeds"], trainer.metrics["positive_control_1pp_gate_fires_seeds"]
    assert "(fires at +0: no, +1: yes pp)" in section.audit_md(section.groups([trainer])[0])


def test_the_chart_point_offers_the_attacker_with_the_larger_excess_over_its_own_floor():
    """The trainer's point read the probe's +13 pp while BiSR(b) read +94 pp over its floor: the point takes
    the stronger; under a mitigation where BiSR(b) reads less than the probe, the probe; without BiSR(b), the
    probe."""
    from runners.grad_audit import _tradeoff

    m = {"constant_guess_accuracy_pct": 4.9, "probe_effect_pp": 13.4, "probe_effect_pp_ci_lo": 12.0,
         "probe_effect_pp_ci_hi": 14.9, "probe_arm": "joint", "heldout_ce_increase": 1.0,
         "heldout_ce_increase_ci_lo": 0.8, "heldout_ce_increase_ci_hi": 1.2,
         "bisr_b_top1": 98.9, "bisr_b_top1_ci_lo": 97.4, "bisr_b_top1_ci_hi": 99.5, "bisr_b_top1_floor": 4.9}
    leak = _tradeoff(m, "w")["leakage"]
    assert (leak["metric"], leak["value"], leak["floor"]) == ("bisr_b_top1", 98.9, 4.9)
    assert leak["ci"] == [97.4, 99.5] and leak["attacker"].startswith("BiSR")
    m.update(bisr_b_top1=7.0)                             # +2.1 over its floor: the probe's +13.4 wins
    assert _tradeoff(m, "w")["leakage"]["metric"] == "probe_accuracy_pct"
    del m["bisr_b_top1"]
    leak = _tradeoff(m, "w")["leakage"]
    assert leak["metric"] == "probe_accuracy_pct" and leak["value"] == pytest.approx(4.9 + 13.4)
