"""BiSR's backward stage on the audited trainer's returned gradient (attacks/grad_audit/bisr_backward.py),
calibrated before it joins a verdict (issue 32): at chance on a null signal (gradients of shuffled labels)
and above the gate on a known leak (the unmitigated gradient), on tiny-llama."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from attacks.grad_audit import bisr_backward as bb
from attacks.labels import constant_guesses
from harness.adversary_view import AdversaryView
from harness.grad_audit.trainer import CLOUD_OUTPUT, RETURNED_GRADIENT, DecoyTrainer, FrameTruth, TopologySettings
from harness.models import load_model

from ..conftest import CONF

MARGIN, POSITIVE_MARGIN = 1.0, 5.0     # the audit's gates.probe_margin_pp and positive_margin_pp
SETTINGS = bb.BisrSettings(frames=4, steps=30, lr=1.0, beta=0.85, temperature=1.2, prior=True)
REAL, DECOYS, T = 20, 8, 7


@pytest.fixture(scope="module")
def tiny():
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "tiny-llama.yaml"))
    cfg.pop("defaults", None)
    return load_model(cfg).model


def _text(n: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of a Zipf-like unigram text over 40 token ids: a constant guess scores ~22 %, two rows agree
    at a position ~8 % of the time."""
    weights = 1.0 / torch.arange(1, 41, dtype=torch.float64)
    return 100 + 7 * torch.multinomial(weights, n * T, replacement=True, generator=gen).view(n, T)


def _run(model, mitigation=None, clip_quantile=None, frames=4, seed=3):
    st = TopologySettings(1, 2, 8, 1.0, 0.35, 1e-3, mitigation, "random", clip_quantile)
    trainer = DecoyTrainer(model, st, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    view, truth = AdversaryView(), FrameTruth()
    for i in range(frames):
        trainer.step(_text(REAL, gen), _text(DECOYS, gen), view, truth, i, i % 2, record_cloud_output=True)
    return SimpleNamespace(view=view, truth=truth, seed=seed), st


def test_the_view_holds_the_cloud_output_only_on_the_frames_asked_for(tiny):
    st = TopologySettings(1, 2, 8, 1.0, 0.35, 1e-3, None, "random", None)
    trainer = DecoyTrainer(tiny, st, seed=0)
    gen = torch.Generator().manual_seed(0)
    view, truth = AdversaryView(), FrameTruth()
    for i in range(3):
        trainer.step(_text(REAL, gen), _text(DECOYS, gen), view, truth, i, i % 2, record_cloud_output=i == 2)
    [out] = view.select(channel=CLOUD_OUTPUT)
    assert out.step == 2 and out.tensor.shape == (REAL + DECOYS, T, 64)


def test_loss_gradient_is_the_gradient_the_local_node_returned(tiny):
    """The controls' gradients are built by the trainer's own loss: on the unmitigated arm it reproduces the
    returned gradient (and its zeros on the decoys)."""
    run, st = _run(tiny, frames=2)
    from harness.partition import Partition

    part = Partition(tiny, st.cut_after, st.resume_at)
    for out, g in zip(run.view.select(channel=CLOUD_OUTPUT), run.view.select(channel=RETURNED_GRADIENT)):
        i = out.step
        got = bb.loss_gradient(part, out.tensor, run.truth.tokens[i], run.truth.is_real[i], REAL)
        torch.testing.assert_close(got, g.tensor, rtol=1e-4, atol=1e-9)
    shuffled = bb.shuffled_tokens(run.truth.tokens[0], run.truth.is_real[0])
    real = run.truth.is_real[0]
    assert torch.equal(shuffled[~real], run.truth.tokens[0][~real])
    assert torch.equal(shuffled[real].sort(0).values, run.truth.tokens[0][real].sort(0).values)
    assert not torch.equal(shuffled[real], run.truth.tokens[0][real])


def test_the_controls_gradients_from_one_pass_equal_two_fresh_ones(tiny):
    """attack_seed takes the positive control's gradient (true labels) and the null's (shuffled) from one
    forward through the tail (loss_gradients): each must equal, bit for bit, the gradient of its own pass."""
    run, st = _run(tiny, mitigation=(None, 1.0), clip_quantile=0.5, frames=2)
    from harness.partition import Partition

    part = Partition(tiny, st.cut_after, st.resume_at)
    for out in run.view.select(channel=CLOUD_OUTPUT):
        tokens, real = run.truth.tokens[out.step], run.truth.is_real[out.step]
        other = bb.shuffled_tokens(tokens, real)
        clean, null = bb.loss_gradients(part, out.tensor, [tokens, other], real, REAL)
        assert torch.equal(clean, bb.loss_gradient(part, out.tensor, tokens, real, REAL))
        assert torch.equal(null, bb.loss_gradient(part, out.tensor, other, real, REAL))
        assert not torch.equal(clean, null)


def test_guard_estimate_from_what_the_cloud_receives():
    gen = torch.Generator().manual_seed(0)
    g = torch.zeros(80, 8, 576)
    g[:32] = torch.nn.functional.normalize(torch.randn(32, 8, 576, generator=gen), dim=-1) * 0.01   # at the clip
    noisy = g + 0.35 * 0.01 * torch.randn(g.shape, generator=gen)
    guard = bb.guard_of(noisy, (None, 0.35))
    assert guard["noise_multiplier"] == 0.35 and guard["clip"] == pytest.approx(0.01, rel=0.02)
    assert bb.guard_of(noisy, (0.02, 0.35)) == {"clip": 0.02, "noise_multiplier": 0.35}   # a published clip
    assert bb.guard_of(g, (None, 0.0))["clip"] == pytest.approx(0.01)
    assert bb.guard_of(g, None) is None


def test_bisr_backward_reads_a_known_leak_and_sits_at_chance_on_a_null(tiny):
    """The calibration the issue asks for before the attacker joins a verdict. Known leak: on the
    unmitigated returned gradient it recovers the labels far above the constant guess (lower bound past
    the gate's margin), verdict leak, its controls passing. Null: the same attacker on the gradient of
    shuffled labels (its negative control) reads no leak against the floor and scores exactly what that
    null permits, the shuffled labels' own agreement with the truth, within ±margin (at_chance)."""
    run, st = _run(tiny)
    seed = bb.attack_seed(run, tiny, st, SETTINGS, REAL)
    assert len(seed.labels) == 4 * REAL and seed.positions_matched == 2 * 4 * REAL * (T - 1)
    m = bb.summarise([seed], MARGIN, POSITIVE_MARGIN)
    assert m["bisr_b_positions"] == 4 * REAL * (T - 1) == 480
    # the floor: the constant guess on the same labels
    floor = constant_guesses(seed.labels)
    assert m["bisr_b_top1_floor"] == pytest.approx(100 * sum(a == b for r, f in zip(seed.labels, floor)
                                                             for a, b in zip(r, f)) / 480)
    # known leak
    assert m["bisr_b_top1"] > 95.0 and m["bisr_b_minus_floor_pp_ci_lo"] > MARGIN
    assert m["bisr_b_verdict"] == "leak" and m["bisr_b_positive_pass"] and m["bisr_b_negative_pass"]
    # this random model's decoding knows nothing: the gradient is what reads the labels
    assert m["bisr_b_decode_top1"] < 5.0 and m["bisr_b_minus_decode_pp_ci_lo"] > 90.0
    # null: below the floor's margin (no leak) ...
    assert m["bisr_b_null_minus_floor_pp_ci_hi"] <= MARGIN
    # ... and at the null's own chance: what the shuffled labels themselves score against the truth
    chance = bb.difference(seed.labels, seed.null, seed.null_labels, "null_minus_chance")
    from attacks import controls

    verdict = controls.classify(chance["null_minus_chance_ci_lo"], chance["null_minus_chance_ci_hi"], 0.0, MARGIN,
                                positive_passed=m["bisr_b_positive_pass"], negative_passed=True)
    assert verdict == "at_chance", chance
    assert bb.top1(seed.labels, seed.null_labels, "c")["c"] < m["bisr_b_top1_floor"]


def test_the_mitigation_is_attacked_with_the_guard_the_cloud_estimates(tiny):
    """Mitigated (the quantile clip binding on half the positions, noise 0.35 × the clip): every row has
    support, the attacker computes only the real rows (rows are independent under the MAP loss), the
    positive control (the undefended gradient) still reads the labels, and the null reads no leak."""
    run, st = _run(tiny, mitigation=(None, 0.35), clip_quantile=0.5, frames=2)
    seed = bb.attack_seed(run, tiny, st, SETTINGS, REAL)
    assert seed.positions_matched == 3 * 2 * REAL * (T - 1)      # attack, positive, null: real rows only
    m = bb.summarise([seed], MARGIN, POSITIVE_MARGIN)
    assert m["bisr_b_positive_top1"] > 95.0 and m["bisr_b_positive_pass"]
    assert m["bisr_b_null_minus_floor_pp_ci_hi"] <= MARGIN and m["bisr_b_negative_pass"]
    assert m["bisr_b_verdict"] in ("leak", "at_chance", "inconclusive")


def test_report_table_shows_the_attack_beside_its_floor_and_the_decoding():
    from pathlib import Path

    from runners.report import grad_audit as section
    from runners.report.runs import Run

    m = {"bisr_b_verdict": "leak", "bisr_b_positions": 448, "bisr_b_top1": 99.5, "bisr_b_top1_ci_lo": 98.4,
         "bisr_b_top1_ci_hi": 99.9, "bisr_b_top1_floor": 6.0, "bisr_b_minus_floor_pp": 93.5,
         "bisr_b_minus_floor_pp_ci_lo": 91.0, "bisr_b_minus_floor_pp_ci_hi": 95.0, "bisr_b_decode_top1": 0.0,
         "bisr_b_negative_pass": True, "bisr_b_positive_pass": True, "bisr_b_seconds": 12.0}
    data = {"experiment": "grad_audit", "experiment_name": "grad_audit", "model": "m", "workload": "w",
            "configuration": "decoy_trainer", "status": "ok", "metrics": m, "seeds": [{}],
            "topology": {"cut_after": 1, "resume_at": 2, "latent_dim": 16, "delegated_layers": 1}}
    [group] = section.groups([Run(Path("."), "decoy_trainer", "ok", data)])
    table = section.bisr_md(group)
    assert "99.50 [98.40, 99.90]" in table and "93.50 [91.00, 95.00]" in table and "**leak**" in table
    data["metrics"] = {k: v for k, v in m.items() if k != "bisr_b_verdict"}
    [group] = section.groups([Run(Path("."), "decoy_trainer", "ok", data)])
    assert section.bisr_md(group) is None
