"""The attack suite on tiny random models: capture alignment, the Bayes attacker (σ = 0, huge σ, k-averaging
against the σ/√k prediction), the learned attacker against the chance floor on T3, the shuffled control,
checkpoint reuse, the verdict logic, the corpus, and experiment=attack_smoke through the CLI.

The learned-attacker tests use `tiny-llama-tied` (tied embeddings, like the real decoders) with the
body/aligned recipe of attack_smoke: about 10 s of training each on one thread.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from attacks import controls
from attacks.corpus import chunk, load_corpus, paragraphs
from attacks.inversion import Example, TrainSettings, shuffle_pairs
from attacks.splitee import bayes
from attacks.splitee.capture import CaptureSpec, capture, features_from_view, truncated
from attacks.splitee.pipeline import Pipeline, Store
from harness.errors import UserError
from metrics.intervals import Estimate
from metrics.privacy import corpus_token_prf

from ..conftest import CONF, builtin_prompt_ids, run_cli, run_cli_in_process

# Tiny models: one thread is faster than two on a shared machine (no oversubscription).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The engine's and attack.capture's values of conf/ (config.yaml, experiment/attack.yaml), which the product
# path always passes to CaptureSpec and Pipeline; layer 0, as experiment=attack's attack.layer.
_ENGINE = OmegaConf.load(CONF / "splitee" / "default.yaml").engine
_CAPTURE = OmegaConf.load(CONF / "experiment" / "attack.yaml").attack.capture
ENGINE = dict(offload=tuple(_ENGINE.offload), sigma_scale=float(_ENGINE.sigma_scale),
              sensitivity_rule=str(_ENGINE.sensitivity_rule), slalom_frac_bits=int(_ENGINE.slalom_frac_bits),
              slalom_scaling=str(_ENGINE.slalom_scaling))


def spec_of(configuration: str, epsilon: float | None, seed: int, component: str, **settings) -> CaptureSpec:
    """A CaptureSpec with the YAML's engine and capture values, `settings` overriding them."""
    return CaptureSpec(configuration, epsilon, seed, component, **{
        "layer": 0, **ENGINE, "max_new_tokens": int(_CAPTURE.max_new_tokens), "batch_size": int(_CAPTURE.batch_size),
        **settings})


def pipeline_of(**fields) -> Pipeline:
    """A Pipeline with the YAML's engine and capture values, no model configs, workload or ε lengths."""
    return Pipeline(**{**ENGINE, "capture_batch_size": int(_CAPTURE.batch_size),
                       "capture_max_new_tokens": int(_CAPTURE.max_new_tokens), "victim_config": None,
                       "decoder_config": None, "workload": None, "eval_epsilon_lengths": None, **fields})


@pytest.fixture(scope="module")
def tied():
    from harness.models import load_model

    return load_model(OmegaConf.load(CONF / "model" / "tiny-llama-tied.yaml"))


@pytest.fixture(scope="module")
def prompts(tied):
    return builtin_prompt_ids(tied.tokenizer, 8, use_chat_template=False)


# max_minutes well above what 150 steps take: the step count, not a busy machine, must end training.
SETTINGS = TrainSettings(mode="body", layout="aligned", window=8, batch_size=16, lr=3e-3, decoder_lr=3e-3,
                         max_steps=150, max_minutes=10, eval_every=50, val_windows=32, max_target_tokens=64,
                         head="lm", evidence_scale=10.0, warmup_steps=20, projection_hidden=None, gen_batch_size=32,
                         seed=0)


@pytest.fixture(scope="module")
def pipe(tied, prompts, tmp_path_factory):
    corpus_cfg = {"source": "builtin", "n_train": 150, "n_val": 16, "min_tokens": 16, "max_tokens": 48}
    corpus = load_corpus(corpus_cfg, tied.tokenizer, seed=0)
    return pipeline_of(victim=tied, decoder=tied, eval_prompts=prompts, corpus=corpus,
                    corpus_record={**corpus_cfg, "provenance": corpus.source},
                    store=Store(tmp_path_factory.mktemp("cache")), seed=0, train_settings=SETTINGS,
                    capture_batch_size=16, code="test", log=lambda m: None)


# ---------------------------------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------------------------------


def test_capture_drops_left_padding(tied, prompts):
    """T3 layer-0 QKV exposures of a left-padded batch of unequal prompts are exactly LN(E[t]) per token."""
    cap = capture(tied.model, prompts[:4], spec_of("t3", None, 0, "qkv", batch_size=4), pad_token_id=2)[0]
    assert len({len(p) for p in prompts[:4]}) > 1
    norm = tied.model.model.layers[0].input_layernorm
    with torch.no_grad():
        for f, p in zip(cap.features, prompts[:4]):
            assert torch.equal(f, norm(tied.model.model.embed_tokens(torch.tensor(p))))


def test_truncated_capture_equals_full_engine(tied, prompts):
    """Capturing on the model cut after layer ℓ gives bit-identical exposures (same masks) to the full engine."""
    from harness.adversary_view import AdversaryView
    from harness.splitee.engine import EngineSettings, SplitEngine

    batch = prompts[:3]
    spec = spec_of("ep1", 3.0, 7, "composite", layer=1, batch_size=3)
    short = capture(tied.model, batch, spec, pad_token_id=2)[0]
    engine = SplitEngine(tied.model, EngineSettings("ep1", epsilon=3.0, seed=7, record_view=True))
    engine.generate(batch, 1, pad_token_id=2)
    full = features_from_view(AdversaryView(engine.view.exposures), ("qkv", "o", "gate_up"), 1, [len(p) for p in batch])
    assert all(torch.equal(a, b) for a, b in zip(short.features, full))
    assert short.dims == {"qkv": 64, "o": 64, "gate_up": 64}
    assert len(truncated(tied.model, 1).model.layers) == 1 and len(tied.model.model.layers) == 2


def test_view_round_trips_meta_and_channels(tied, prompts, tmp_path):
    """A saved view.pt keeps its meta and every exposure's channel; attacks read only their own channel, so
    an exposure another system adds changes nothing; a view.pt written before channels existed still loads."""
    from harness.adversary_view import MASKED_INPUT, AdversaryView, Exposure, view_meta
    from harness.provenance import source_digest
    from harness.splitee.engine import EngineSettings, SplitEngine

    batch, lengths = prompts[:2], [len(p) for p in prompts[:2]]
    engine = SplitEngine(tied.model, EngineSettings("ep1", epsilon=3.0, seed=7, record_view=True))
    engine.generate(batch, 2, pad_token_id=2)
    cfg = OmegaConf.create({"configuration": {"name": "ep1"}, "epsilon": 3.0, "seed": 7,
                            "model": {"name": "tiny-llama-tied"}, "workload": {"name": "builtin"}})
    view = engine.view
    view.meta.update(view_meta(cfg, workload="six prompts"))
    assert view.meta == {"system": "splitee", "configuration": "ep1",
                         "privacy_parameter": {"name": "epsilon", "value": 3.0}, "seed": 7, "model": "tiny-llama-tied",
                         "workload": "six prompts", "code_digest": source_digest()}
    assert view_meta(cfg, configuration="epn")["privacy_parameter"] == {"name": None, "value": None}
    features = {ops: features_from_view(view, ops, 0, lengths) for ops in (("qkv", "o"), ("lm_head",))}
    view.exposures.append(Exposure("lm_head", None, 1, (2, 7), torch.rand(2, 7), channel="probabilities"))
    view.save(tmp_path / "view.pt")

    back = AdversaryView.load(tmp_path / "view.pt")
    assert back.meta == view.meta and back.channels() == (MASKED_INPUT, "probabilities")
    assert [(e.op, e.layer, e.step, e.shape, e.channel) for e in back.exposures] == \
        [(e.op, e.layer, e.step, e.shape, e.channel) for e in view.exposures]
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(back.exposures, view.exposures))
    assert len(back.select(op="lm_head")) == 3 and len(back.select(op="lm_head", channel="probabilities")) == 1
    for ops, want in features.items():
        assert all(torch.equal(a, b) for a, b in zip(features_from_view(back, ops, 0, lengths), want))

    old = tmp_path / "old_view.pt"
    torch.save({"meta": {}, "exposures": [{k: v for k, v in e.__dict__.items() if k != "channel"}
                                          for e in view.exposures[:-1]]}, old)
    assert AdversaryView.load(old).channels() == (MASKED_INPUT,)
    # Captures fill their views' meta too (the Pipeline adds the model, the prompts and the code).
    spec = spec_of("epn", None, 3, "qkv")
    cap = capture(tied.model, batch, spec, pad_token_id=2)[0]
    assert cap.meta == spec.meta() and cap.meta["configuration"] == "epn" and cap.meta["seed"] == 3


def test_capture_refuses_what_is_not_exposed(tied, prompts):
    spec = spec_of("ep1", 1.0, 0, "composite", offload=("qkv", "lm_head"))
    with pytest.raises(UserError, match="kept in the TEE"):
        capture(tied.model, prompts[:1], spec, pad_token_id=2)
    # A configuration that offloads nothing exposes nothing to capture.
    with pytest.raises(UserError, match="configurations"):
        capture(tied.model, prompts[:1], spec_of("tdx", None, 0, "qkv"), pad_token_id=2)


# ---------------------------------------------------------------------------------------------------
# Bayes attacker
# ---------------------------------------------------------------------------------------------------


def test_bayes_recovers_every_token_without_noise(tied, prompts):
    cap = capture(tied.model, prompts, spec_of("t3", None, 0, "qkv", batch_size=8), pad_token_id=2)[0]
    book = bayes.codebook(tied.model)
    rec = bayes.attack(cap.features, prompts, book, k=5, vocab_per_chunk=5000, rows_per_chunk=300)
    assert rec.pooled_top1 >= 99.0 and rec.pooled_topk >= rec.pooled_top1
    assert rec.guesses == prompts


def test_bayes_is_at_chance_under_huge_noise(tied, prompts):
    cap = capture(tied.model, prompts, spec_of("ep1", 1e-6, 0, "qkv", batch_size=8), pad_token_id=2)[0]
    book = bayes.codebook(tied.model)
    rec = bayes.attack(cap.features, prompts, book, k=5)
    n = rec.n_positions
    chance = bayes.chance_top1(rec.guesses, prompts)
    # σ ≈ 4.5e7: the guesses carry no information; one hit in ~1,400 positions is already 0.07%.
    assert rec.pooled_top1 <= chance + 3 * 100 * math.sqrt(max(chance, 100 / n) / 100 / n)
    assert rec.pooled_top1 < 0.5
    # And its reconstructions sit far below the chance floor of real prompts.
    assert corpus_token_prf(prompts, rec.guesses).f1.hi < controls.floor(prompts)


def test_bayes_k_averaging_matches_sigma_over_sqrt_k(pipe):
    """Averaging k exposures of k submissions (fresh masks, through the engine) recovers what one exposure
    at σ/√k recovers (simulated from the public codebook), within sampling error."""
    out = pipe.bayes("ep1", 4.0, [1, 4, 16, 64], top_k=5, prior="uniform", rows_per_chunk=1024, vocab_per_chunk=16384)
    curve = {p["k"]: p for p in out["k_curve"]}
    assert sorted(curve) == [1, 4, 16, 64]
    n = curve[1]["n_positions"]
    for k, p in curve.items():
        got, want = p["top1_pooled"] / 100, p["top1_predicted_pooled"] / 100
        se = math.sqrt(max(got * (1 - got), want * (1 - want), 1.0 / n) * 2 / n)
        assert abs(got - want) <= 4 * se, (k, got, want, se)
    tops = [curve[k]["top1_pooled"] for k in (1, 4, 16, 64)]
    assert tops == sorted(tops) and tops[-1] > 50 > tops[0]      # the repeated-submission attack works


# ---------------------------------------------------------------------------------------------------
# Learned attacker and controls
# ---------------------------------------------------------------------------------------------------


def _f1(pipe, inv, rec, configuration="t3", epsilon=None, component="qkv"):
    cap = pipe.eval_capture(configuration, epsilon, component, 0)
    recon = pipe.reconstruct(inv, rec["key"], cap, component)
    return recon, controls.score(pipe.eval_prompts, recon, None, text_metrics=False).f1


def test_learned_attacker_beats_the_floor_on_t3(pipe):
    floor = controls.floor(pipe.eval_prompts)
    inv, rec = pipe.attacker("t3", None, "qkv", 0)
    recon, f1 = _f1(pipe, inv, rec)
    assert not rec["cache_hit"] and rec["training"]["steps"] == SETTINGS.max_steps
    assert [len(r) for r in recon] == [len(p) for p in pipe.eval_prompts]
    assert f1.lo > floor + 10.0, (f1, floor)
    assert controls.positive_control(f1, floor, 10.0).passed


def test_evidence_head_reads_each_exposure_where_the_frozen_lm_cannot(pipe):
    """A frozen random decoder routes exposures to its output only partly (projection mode, 20 steps); the
    evidence head's cosine path reads layer-0 exposures, which are LN(E[t]), nearly exactly."""
    floor = controls.floor(pipe.eval_prompts)
    quick = replace(SETTINGS, mode="projection", max_steps=20, eval_every=20)
    lm_inv, lm_rec = replace(pipe, train_settings=quick).attacker("t3", None, "qkv", 0)
    ev_pipe = replace(pipe, train_settings=replace(quick, head="evidence"))
    ev_inv, ev_rec = ev_pipe.attacker("t3", None, "qkv", 0)
    assert ev_rec["key"] != lm_rec["key"] and ev_inv.head == "evidence"
    _, lm_f1 = _f1(pipe, lm_inv, lm_rec)
    _, ev_f1 = _f1(ev_pipe, ev_inv, ev_rec)
    assert ev_f1.lo > 95.0 and ev_f1.lo > lm_f1.hi + 20.0, (ev_f1, lm_f1, floor)
    assert ev_pipe.settings_for("lm_head").head == "lm"     # one row per prompt: no position to compare with
    with pytest.raises(ValueError, match="one exposure row per target token"):
        ev_inv.generate([Example(torch.zeros(1, 64), [1, 2, 3])])


def test_slalom_residues_are_attacked_as_numbers_and_read_nothing(pipe):
    """Slalom's blinded residues mod q reach 10^7, past float16: the noise-aware attacker trains on them in
    float32 (finite losses; in float16 they overflowed to NaN) and, the pad being uniform, reads no more
    than the floor."""
    from harness.splitee.mechanisms import SLALOM_MODULUS

    cap = pipe.eval_capture("slalom", None, "qkv", 0)
    values = torch.cat(cap.features)
    assert values.min() >= 0 and values.max() < SLALOM_MODULUS and values.max() > 65_504
    quick = replace(pipe, train_settings=replace(SETTINGS, max_steps=20, eval_every=10))
    inv, rec = quick.attacker("slalom", None, "qkv", 0)
    assert math.isfinite(rec["training"]["best_val_loss"]), rec["training"]
    _, f1 = _f1(quick, inv, rec, configuration="slalom")
    assert f1.lo <= controls.floor(pipe.eval_prompts) + 1.0, f1


@pytest.mark.slow   # the default suite checks the same control: test_attack_smoke_cli's negative_control_pass
def test_shuffled_control_sits_at_the_floor(pipe):
    floor = controls.floor(pipe.eval_prompts)
    inv, rec = pipe.attacker("t3", None, "qkv", 0, shuffled=True)
    _, f1 = _f1(pipe, inv, rec)
    assert f1.hi <= floor + 1.0, (f1, floor)
    assert controls.negative_control(f1, floor, 1.0).passed


def test_checkpoint_is_reused(pipe):
    inv1, rec1 = pipe.attacker("t3", None, "qkv", 0)      # trained by the test above (or now)
    inv2, rec2 = pipe.attacker("t3", None, "qkv", 0)
    assert rec2["cache_hit"] and rec2["key"] == rec1["key"]
    examples = [Example(f, list(p), i, 0) for i, (f, p) in
                enumerate(zip(pipe.eval_capture("t3", None, "qkv", 0).features, pipe.eval_prompts))][:2]
    assert inv1.generate(examples) == inv2.generate(examples)
    # A setting that changes the attacker is not served the cached one.
    short = replace(pipe, train_settings=replace(SETTINGS, max_steps=3))
    inv3, rec3 = short.attacker("t3", None, "qkv", 0)
    assert not rec3["cache_hit"] and rec3["key"] != rec1["key"] and rec3["training"]["steps"] == 3
    assert any(not torch.equal(a, b) for a, b in zip(_tensors(inv1.state()), _tensors(inv3.state())))
    # The training curves (the W&B step history): the training loss beside the validation loss at each
    # validation step, kept out of the results record and read back from the checkpoint on a cache hit.
    curve = short.curves[rec3["key"]]
    assert [s for s, _ in curve["train_history"]] == [s for s, _ in curve["val_history"]] == [3]
    assert curve["val_history"] == [tuple(p) for p in rec3["training"]["val_history"]]
    assert "train_history" not in rec3 and "train_history" not in rec3["training"]
    hit = replace(short, curves={})
    hit.attacker("t3", None, "qkv", 0)
    assert hit.curves[rec3["key"]] == {**curve, "cache_hit": True} and not curve["cache_hit"]


def test_evidence_heads_on_one_decoder_share_one_unit_table(pipe):
    """Every evidence-head inverter built on the decoder reads one unit-normalised copy of its embedding
    table, in any mode; the copy is in no checkpoint, and an inverter loaded from the cache generates what
    the trained one did. A table changed in place is normalised afresh."""
    import torch.nn.functional as F

    from attacks.inversion import build, unit_embeddings

    quick = replace(SETTINGS, mode="projection", head="evidence", max_steps=20, eval_every=20)
    ev_pipe = replace(pipe, train_settings=quick)
    inv1, rec1 = ev_pipe.attacker("t3", None, "qkv", 0)      # trained by the evidence-head test (or now)
    inv2, rec2 = ev_pipe.attacker("t3", None, "qkv", 0)
    body = build(pipe.decoder.model, rec1["d_in"], replace(quick, mode="body"))
    emb = pipe.decoder.model.get_input_embeddings().weight
    assert rec2["cache_hit"] and inv1.unit_embeddings is inv2.unit_embeddings is body.unit_embeddings
    assert body.decoder.get_input_embeddings().weight is not emb       # body mode: a private decoder copy
    assert torch.equal(inv1.unit_embeddings, F.normalize(emb.detach().float(), dim=-1))
    assert not any("unit" in k for k in inv1.state_dict()) and "unit_embeddings" not in inv1.state()
    examples = [Example(f, list(p), i, 0) for i, (f, p) in
                enumerate(zip(pipe.eval_capture("t3", None, "qkv", 0).features, pipe.eval_prompts))][:2]
    assert inv1.generate(examples) == inv2.generate(examples)
    table = torch.randn(5, 3)
    first = unit_embeddings(table)
    assert unit_embeddings(table) is first
    table.add_(1.0)
    assert torch.equal(unit_embeddings(table), F.normalize(table, dim=-1)) and not torch.equal(unit_embeddings(table), first)


def _tensors(state):
    """Every tensor of a nested state dict, in a fixed order."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state) for t in _tensors(state[k])]
    return []


def _changed(value):
    """Another value of the same kind (validity does not matter: only the cache key is computed)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    if value is None:
        return 7
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, tuple):
        return value[:-1]
    if isinstance(value, dict):
        return {**value, "other": 1}
    if isinstance(value, list):
        return [*value, [1]]
    raise AssertionError(f"no changed value for {value!r}")


# Pipeline fields that change no result, and why. Every other field must change the cache keys below.
NOT_IN_KEYS = {
    "store": "where the cache lives", "log": "progress messages", "timings": "measured", "cache_events": "measured",
    "curves": "measured (the attackers' training curves, for the W&B step history)",
    "workload": "the evaluation prompts' name, in the captures' meta only (the prompts' ids are keyed)",
    "corpus": "built from corpus_record (keyed) and the victim's tokenizer (keyed with the victim)",
    "train_settings": "field by field below",
}
INVERTER_ONLY = {"decoder", "decoder_config", "corpus_record"}     # the evaluation capture does not use them
CAPTURE_ONLY = {"eval_prompts", "eval_epsilon_lengths", "mask_seed"}   # the attacker is trained on the corpus
NOT_IN_INVERTER_KEY = {"gen_batch_size": "reconstruction only (keyed there)"}   # TrainSettings


def test_cache_keys_hold_every_field_that_changes_a_result(pipe):
    """Each Pipeline and TrainSettings field changes the key of the inverter and of the evaluation capture
    (or the one of them it feeds), or is listed above with a reason: a field added later that the keys
    ignore fails here instead of serving a stale attacker or capture from the cache."""
    from dataclasses import fields

    def keys(p, *axes, shuffled=False):
        axes = axes or ("ep1", 3.0, "qkv", 0)
        return p.inverter_key(*axes, shuffled=shuffled), p.eval_capture_key(*axes)

    inverter, capture = keys(pipe)
    for f in fields(TrainSettings):
        variant = replace(pipe, train_settings=replace(SETTINGS, **{f.name: _changed(getattr(SETTINGS, f.name))}))
        assert (keys(variant)[0] == inverter) == (f.name in NOT_IN_INVERTER_KEY), f.name
    wrong = []
    for f in fields(Pipeline):
        if f.name in NOT_IN_KEYS:
            continue
        value = getattr(pipe, f.name)
        if f.name in ("victim", "decoder"):
            changed = replace(value, name=value.name + "-other")
        elif f.name == "eval_prompts":
            changed = [p[:-1] for p in value]
        else:
            changed = _changed(value)
        got = keys(replace(pipe, **{f.name: changed}))
        want = (f.name not in CAPTURE_ONLY, f.name not in INVERTER_ONLY)      # (inverter, capture) change
        if (got[0] != inverter, got[1] != capture) != want:
            wrong.append(f.name)
    assert not wrong, f"cache keys ignore (or wrongly hold) {wrong}: key them, or classify them above"
    # The capture's own axes (configuration, ε, component, layer) and the shuffled control.
    variants = [keys(pipe, *axes) for axes in [("epn", None, "qkv", 0), ("ep1", 4.0, "qkv", 0),
                                               ("ep1", 3.0, "composite", 0), ("ep1", 3.0, "qkv", 1)]]
    assert all(v[0] != inverter and v[1] != capture for v in variants) and len(set(variants)) == 4
    assert keys(pipe, shuffled=True) == (keys(pipe, shuffled=True)[0], capture) != (inverter, capture)


def test_prefix_layout_and_lm_head_run(tied, prompts, tmp_path):
    """The GEIA prefix layout and the LM-head component (one exposed row per prompt) train and decode."""
    corpus = load_corpus({"source": "builtin", "n_train": 20, "n_val": 4, "min_tokens": 16, "max_tokens": 24},
                         tied.tokenizer, seed=0)
    pipe = pipeline_of(victim=tied, decoder=tied, eval_prompts=prompts[:3], corpus=corpus, corpus_record={"t": 1},
                    store=Store(tmp_path), seed=0, train_settings=replace(SETTINGS, layout="prefix", max_steps=5),
                    code="test", log=lambda m: None)
    for component in ("qkv", "lm_head"):
        inv, rec = pipe.attacker("t3", None, component, 0)
        assert inv.layout == "prefix"
        cap = pipe.eval_capture("t3", None, component, 0)
        recon = pipe.reconstruct(inv, rec["key"], cap, component)
        want = [len(p) if component == "qkv" else min(len(p), SETTINGS.max_target_tokens) for p in prompts[:3]]
        assert [len(r) for r in recon] == want
        if component == "lm_head":
            assert [tuple(f.shape) for f in cap.features] == [(1, 64)] * 3


def test_verdicts():
    """The three-way rule of attacks/controls.py at floor 20, margin 1: each branch, and its edges."""
    floor = 20.0
    est = lambda m, lo, hi: Estimate(m, lo, hi, 10)  # noqa: E731
    good_pos = controls.positive_control(est(80, 75, 85), floor, 10.0)
    good_neg = controls.negative_control(est(19, 17, 20.5), floor, 1.0)
    bad_pos = controls.positive_control(est(35, 29, 41), floor, 10.0)      # lower bound 29 < 30
    bad_neg = controls.negative_control(est(24, 22, 26), floor, 1.0)       # upper bound 26 > 21
    assert good_pos.passed and good_neg.passed and not bad_pos.passed and not bad_neg.passed

    def v(lo, hi, pos=good_pos, neg=good_neg):
        out = controls.verdict(est((lo + hi) / 2, lo, hi), floor, 1.0, pos, neg)
        assert out["attack_gate"] == (out["attack_verdict"] == "at_chance")
        return out["attack_verdict"]

    assert v(19.2, 20.8) == v(19.0, 21.0) == "at_chance"          # within floor ± margin, edges included
    assert v(21.01, 30) == v(40, 60) == "leak"                     # lower bound above floor + margin
    assert v(0.09, 0.47) == v(12.2, 16.3) == "inconclusive"        # far below the floor: the attacker failed
    assert v(18.9, 20.5) == "inconclusive"                         # reaches below floor - margin
    assert v(19.5, 21.5) == v(20.5, 23) == "inconclusive"          # reaches past floor + margin, not above it
    # A failed control: never at chance; a leak stays a leak unless the pipeline leaks without exposures.
    assert v(19.5, 20.5, pos=bad_pos) == v(19.5, 20.5, neg=bad_neg) == v(19.5, 20.5, None, None) == "inconclusive"
    assert v(40, 60, pos=bad_pos) == "leak" and v(40, 60, neg=bad_neg) == v(40, 60, None, None) == "inconclusive"
    out = controls.verdict(est(20, 19.5, 20.5), floor, 1.0, bad_pos, good_neg)
    assert (out["attack_valid"], out["attack_at_floor"], out["attack_gate"]) == (False, True, False)
    # The worst over attackers: leak > inconclusive > at_chance.
    assert controls.worst(["at_chance", "inconclusive", "at_chance"]) == "inconclusive"
    assert controls.worst(["inconclusive", "leak", None]) == "leak" and controls.worst([None]) is None
    with pytest.raises(ValueError):
        controls.worst(["pass"])


def test_old_verdicts_are_rederived():
    """A results.json from the two-way gate: its below-floor "pass" reads inconclusive, from the stored
    interval; without the interval pass | fail | invalid map to at_chance | leak | inconclusive."""
    old = {"attack_verdict": "pass", "token_f1_ci_lo": 12.15, "token_f1_ci_hi": 16.29, "chance_floor_token_f1": 23.84,
           "gate_margin_pp": 1.0, "positive_control_pass": True, "negative_control_pass": True,
           "bayes_top1_ci_lo": 100.0, "bayes_top1_chance": 0.01}
    assert controls.recompute(old) == "inconclusive" and controls.recompute_bayes(old) == "leak"
    assert controls.recompute({**old, "token_f1_ci_lo": 23.0, "token_f1_ci_hi": 24.5}) == "at_chance"
    assert [controls.recompute({"attack_verdict": x}) for x in ("pass", "fail", "invalid")] == \
        ["at_chance", "leak", "inconclusive"]
    assert controls.recompute_bayes({"attack_verdict": "pass"}) is None and controls.recompute({}) is None
    assert controls.recompute_bayes({**old, "bayes_top1_ci_lo": 0.5}) == "inconclusive"    # no Bayes control then
    assert controls.recompute({**old, "attack_verdict": "leak"}) == "leak"                 # new results: as stored


def test_repeat_leak_k():
    """The first k of the curve whose top-1 lower bound clears truth-independent guessing + the margin."""
    m = {"bayes_top1_chance": 0.5, "gate_margin_pp": 1.0, "bayes_top1_k2_ci_lo": 1.4, "bayes_top1_k16_ci_lo": 30.0,
         "bayes_top1_k4_ci_lo": 1.6, "bayes_top1_k4": 3.0, "bayes_top1_k4_predicted": 3.1}
    assert controls.repeat_leak_k(m) == 4
    assert controls.repeat_leak_k({**m, "bayes_top1_k4_ci_lo": 1.5}) == 16      # 1.5 is not above 0.5 + 1
    assert controls.repeat_leak_k({**m, "bayes_top1_k16_ci_lo": 1.0, "bayes_top1_k4_ci_lo": 1.0}) is None
    assert controls.repeat_leak_k({"bayes_top1_k4_ci_lo": 50.0}) is None          # no Bayes chance: no claim


def test_exposure_free_reference():
    """The Bayes attacker's reference: its guesses scored against the other prompts. For guesses equal to
    the prompts it is the chance floor; for guesses sharing no token with any prompt it is 0."""
    prompts = [[1, 2, 3, 4], [1, 5, 6, 7], [2, 5, 8, 9]]          # every pair shares one token of four: F1 25
    assert controls.exposure_free_f1(prompts, prompts) == pytest.approx(25.0) == pytest.approx(controls.floor(prompts))
    assert controls.exposure_free_f1(prompts, [[99] * 4] * 3) == 0.0
    # Every guess is prompt 0: against prompt 0 (two pairs) F1 100, against prompts 1 and 2 (two each) 25.
    assert controls.exposure_free_f1(prompts, [[1, 2, 3, 4]] * 3) == pytest.approx(50.0)
    # Not symmetric in the pairing: the right guess for prompt 0 does not count for prompt 0.
    assert controls.exposure_free_f1(prompts, [[1, 2, 3, 4], [99] * 4, [99] * 4]) == pytest.approx((25 + 25) / 6)


# ---------------------------------------------------------------------------------------------------
# Corpus and training data
# ---------------------------------------------------------------------------------------------------


def test_corpus_text_file_with_crlf_and_headings(tied, tmp_path):
    path = tmp_path / "wiki.raw"
    body = " = Title = \r\n \r\n First paragraph about rivers .\r\n = = Section = = \r\n Second paragraph about bread .\r\n"
    path.write_bytes(body.encode())
    assert paragraphs(path.read_text()) == ["First paragraph about rivers .", "Second paragraph about bread ."]
    c = load_corpus({"source": "text", "path": str(path), "n_train": 2, "n_val": 1, "min_tokens": 2, "max_tokens": 4},
                    tied.tokenizer, seed=0)
    assert len(c.train) == 2 and len(c.val) == 1 and all(2 <= len(p) <= 4 for p in c.train + c.val)
    assert "\r" not in tied.tokenizer.decode([t for p in c.train for t in p])
    with pytest.raises(UserError, match="gives only"):
        load_corpus({"source": "text", "path": str(path), "n_train": 50, "n_val": 1, "min_tokens": 2,
                     "max_tokens": 4}, tied.tokenizer, seed=0)
    with pytest.raises(UserError, match="does not exist"):
        load_corpus({"source": "text", "path": str(tmp_path / "nope")}, tied.tokenizer, seed=0)
    pieces = chunk(list(range(100)), 5, 9, seed=3)
    assert all(5 <= len(p) <= 9 for p in pieces) and [t for p in pieces for t in p] == list(range(sum(map(len, pieces))))


def test_builtin_and_random_corpora(tied):
    c = load_corpus({"source": "builtin", "n_train": 150, "n_val": 16, "min_tokens": 16, "max_tokens": 48},
                    tied.tokenizer, seed=0)
    assert c.n_stream_tokens > 6000
    assert not {tuple(p) for p in c.train} & {tuple(p) for p in c.val}
    r = load_corpus({"source": "random", "n_train": 5, "n_val": 2, "min_tokens": 3, "max_tokens": 5},
                    tied.tokenizer, seed=0)
    special = set(tied.tokenizer.all_special_ids)
    assert len(r.train) == 5 and not special & {t for p in r.train + r.val for t in p}


def test_shuffled_pairs_are_a_derangement():
    examples = [Example(torch.full((3, 2), float(i)), [i, i, i], i, 0) for i in range(6)] + \
               [Example(torch.zeros(1, 2), [99], 6, 0)]
    shuffled = shuffle_pairs(examples, seed=1)
    for before, after in zip(examples[:6], shuffled[:6]):
        assert torch.equal(before.features, after.features) and after.target != before.target
    assert sorted(tuple(e.target) for e in shuffled[:6]) == sorted(tuple(e.target) for e in examples[:6])
    assert shuffled[6].target == [99]      # alone in its length group: nothing to swap with


# ---------------------------------------------------------------------------------------------------
# The CLI
# ---------------------------------------------------------------------------------------------------

KEYS = ("chance_floor_token_f1", "attack_gate", "attack_verdict", "bayes_verdict", "bayes_gate", "verdict",
        "bayes_token_f1_chance", "bayes_positive_control_token_f1", "bayes_positive_control_pass", "bayes_leak_k",
        "token_precision", "token_recall", "token_f1",
        "token_f1_ci_lo", "token_f1_ci_hi", "exact_match", "bleu", "rouge_l", "semantic_similarity",
        "positive_control_token_f1", "negative_control_token_f1", "bayes_top1", "bayes_top5", "bayes_top1_k16",
        "bayes_top1_k16_predicted", "epsilon_nominal", "gdp_mu_composed", "dp_epsilon_composed", "dp_delta")


def test_attack_smoke_cli(tmp_path, monkeypatch):
    import wandb

    from ..test_wandb_mirror_offline import _Run

    out, cache = tmp_path / "out", tmp_path / "cache"
    # In this process (conftest run_cli_in_process: the console script's entry point, without the start-up
    # of a new interpreter); conftest's one_torch_thread stands for OMP_NUM_THREADS=1.
    res = run_cli_in_process(["experiment=attack_smoke"], out, cache)
    assert res.returncode == 0, res.stderr[-3000:]
    run = out / "attack_smoke" / "tiny-llama-tied" / "ep1" / "eps=5" / "default"
    results = json.loads((run / "results.json").read_text())
    for key in ("experiment", "configuration", "epsilon", "model", "workload", "n_prompts", "status", "metrics",
                "provenance"):
        assert key in results
    m = results["metrics"]
    assert set(KEYS) <= set(m), set(KEYS) - set(m)
    assert isinstance(m["attack_gate"], bool) and results["tags"] == ["smoke"]
    assert m["positive_control_pass"] and m["negative_control_pass"]       # the smoke attack is valid
    assert {m["attack_verdict"], m["bayes_verdict"], m["verdict"]} <= set(controls.VERDICTS)
    assert m["verdict"] == controls.worst([m["attack_verdict"], m["bayes_verdict"]])
    assert m["attack_gate"] == (m["attack_verdict"] == "at_chance") and m["bayes_positive_control_pass"]
    assert m["bayes_leak_k"] == controls.repeat_leak_k(m)
    assert {"attack_verdict", "bayes_verdict", "verdict", "bayes_token_f1_chance"} <= set(results["metric_definitions"])
    assert m["token_f1_ci_lo"] <= m["token_f1"] <= m["token_f1_ci_hi"]
    # issue 52 item 4: both attackers' per-prompt F1 as tests, own prompt against the next one; 6 prompts resolve
    # FPR >= 16.7 % only, so no TPR at 10 % and below is reported
    assert set(results["roc"]) == {"learned", "bayes"}
    for name, prefix in (("learned", ""), ("bayes", "bayes_")):
        test = results["roc"][name]
        assert test["positives"] == test["negatives"] == 6 and m[f"{prefix}auc"] == test["auc"]
        assert m[f"{prefix}auc_ci_lo"] <= test["auc"] <= m[f"{prefix}auc_ci_hi"]
        assert m[f"{prefix}tpr_at_fpr"] == {"0.1": None, "1": None, "10": None}
    from runners.export import table

    rows = {r["metric"]: r for r in table(out)[0]}
    assert rows["auc"]["value"] == m["auc"] and rows["bayes_auc"]["ci_hi"] == m["bayes_auc_ci_hi"]
    assert "tpr_at_fpr[10]" not in rows       # not measurable: no number, and no error line (runs.data_problems)
    from runners.report.runs import scan
    from runners.report.splitee import attack as section

    text = "\n".join(section.markdown(section.groups(scan(out)), lambda *a, **k: []))    # the section, no figures
    assert "| ep1 ε=5 · noise_aware · qkv | learned |" in text
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == results["n_prompts"] == 6
    assert all(len(s["output_ids"]) == s["n_prompt_tokens"] for s in samples)
    # A rerun skips the finished run; a second setting reuses every cached attacker it shares.
    again = run_cli_in_process(["experiment=attack_smoke"], out, cache)
    assert again.returncode == 0 and "already complete" in again.stdout
    # It also runs a Bayes curve without k = 1: the single-exposure result is the same first submission.
    # Mirrored to a fake W&B: every attacker is a cache hit, so its step history is the cached training curves.
    mirrored = _Run()
    monkeypatch.setattr(wandb, "init", lambda **kw: mirrored)
    oblivious = run_cli_in_process(["experiment=attack_smoke", "attack.setting=noise_oblivious",
                                    "attack.bayes.k=[4,16]", "logger=wandb"], out, cache)
    assert oblivious.returncode == 0, oblivious.stderr[-3000:]
    [run2] = [p for p in run.parent.iterdir() if "noise_oblivious" in p.name]
    results2 = json.loads((run2 / "results.json").read_text())
    assert all(e["hit"] for e in results2["cache"] if "attacker" in e["what"]), results2["cache"]
    history = [(step, data) for step, data in mirrored.logged if step is not None]
    # noise_oblivious: the noise-free attacker is also the positive control, so it is logged once
    assert set().union(*(data for _, data in history)) == {
        f"{role}/{loss}" for role in ("attacker", "negative_control") for loss in ("train_loss", "val_loss")}
    val = results2["training"]["attacker"]["training"]["val_history"]
    assert [(s, d["attacker/val_loss"]) for s, d in history if "attacker/val_loss" in d] == [tuple(p) for p in val]
    assert [s for s, _ in history] == sorted({s for s, _ in history})
    m2 = results2["metrics"]
    assert "bayes_top1_k1" not in m2 and m2["bayes_top1_k16"] == m["bayes_top1_k16"]
    assert (m2["bayes_top1"], m2["bayes_token_f1"], m2["bayes_verdict"]) == \
        (m["bayes_top1"], m["bayes_token_f1"], m["bayes_verdict"])


@pytest.mark.slow
def test_attack_mask_replicates_cli(tmp_path):
    """mask_seeds for an attack run: the prompts masked afresh per seed, the attackers trained once (cache
    hits after the plain run); seed 0 is the plain run; the verdict is the worst over seeds."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    plain = run_cli(["experiment=attack_smoke"], out, cache, env={"OMP_NUM_THREADS": "1"})
    assert plain.returncode == 0, plain.stderr[-3000:]
    run = out / "attack_smoke" / "tiny-llama-tied" / "ep1" / "eps=5" / "default"
    results = json.loads((run / "results.json").read_text())
    m = results["metrics"]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    reps = run_cli(["experiment=attack_smoke", "mask_seeds=[0,1]"], out, cache, env={"OMP_NUM_THREADS": "1"})
    assert reps.returncode == 0, reps.stderr[-3000:]
    [run3] = [p for p in run.parent.iterdir() if "mask_seeds" in p.name]
    results3 = json.loads((run3 / "results.json").read_text())
    assert all(e["hit"] for e in results3["cache"] if "attacker" in e["what"]), results3["cache"]
    assert results3["mask_seeds"] == [0, 1] and results["mask_seeds"] == [0] and results["per_mask_seed"] is None
    first, second = (r["metrics"] for r in results3["per_mask_seed"])
    assert first["token_f1"] == m["token_f1"] and first["bayes_token_f1"] == m["bayes_token_f1"]
    assert second["bayes_token_f1"] != first["bayes_token_f1"]      # other masks, other guesses
    m3 = results3["metrics"]
    assert m3["token_f1"] == pytest.approx((first["token_f1"] + second["token_f1"]) / 2)
    assert m3["token_f1_seed_min"] == min(first["token_f1"], second["token_f1"])
    assert m3["verdict"] == controls.worst([first["verdict"], second["verdict"]])
    rows = [json.loads(line) for line in (run3 / "samples.jsonl").read_text().splitlines()]
    assert [r["output_ids_by_mask_seed"]["0"] for r in rows] == [s["output_ids"] for s in samples]


class _Swapped:
    """A tokenizer with the first two ids of its vocabulary swapped, otherwise the one it wraps."""

    def __init__(self, tok):
        self._tok = tok

    def __len__(self):
        return len(self._tok)

    def get_vocab(self):
        vocab = dict(self._tok.get_vocab())
        a, b = sorted(vocab)[:2]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        return vocab

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.mark.parametrize("vocab, expected", [("extra", "tokens against"), ("swap", "for the victim and")])
def test_decoder_with_another_tokenizer_is_refused(tmp_path, monkeypatch, vocab, expected):
    """Before any capture or training: one line, exit 2, no files. The real models load, but the decoder
    `tiny-llama` gets another vocabulary than the victim's (the same SmolLM2 tokenizer otherwise): one
    token more (extra), or two ids swapped (swap)."""
    import harness.models as models

    real = models.load_model

    def load_model(cfg, **kw):
        loaded = real(cfg, **kw)
        if loaded.name == "tiny-llama":
            if vocab == "extra":
                loaded.tokenizer.add_tokens(["<another-vocabulary>"])   # a private copy (harness.models)
            else:
                loaded.tokenizer = _Swapped(loaded.tokenizer)
        return loaded

    monkeypatch.setattr(models, "load_model", load_model)
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=attack_smoke", "+model@attack.decoder=tiny-llama"], out, tmp_path / "cache")
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(res.stderr_lines) == 1, res.stderr
    line = res.stderr_lines[0]
    assert line.startswith("splitbench: error: attack.decoder tiny-llama does not share the tokenizer of the victim "
                           "tiny-llama-tied") and expected in line, line
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]
    assert not (tmp_path / "cache" / "attacks").exists()       # nothing captured or trained


def test_check_decoder_compares_the_whole_vocabulary():
    """Same size, one mapping differs → refused; same map → accepted; the victim itself → accepted."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from attacks.splitee.suite import check_decoder

    def loaded(name, vocab):
        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")))
        model = SimpleNamespace(get_input_embeddings=lambda: SimpleNamespace(weight=torch.zeros(len(vocab), 2)))
        return SimpleNamespace(name=name, tokenizer=tok, model=model)

    base = {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    victim = loaded("victim", base)
    check_decoder(victim, victim)
    check_decoder(victim, loaded("same", dict(base)))
    with pytest.raises(UserError, match="token 'b' is id 2 for the victim and 3 for the decoder"):
        check_decoder(victim, loaded("swapped", {**base, "b": 3, "c": 2}))
    with pytest.raises(UserError, match="5 tokens against 4"):
        check_decoder(victim, loaded("bigger", {**base, "d": 4}))


@pytest.mark.parametrize("override, expected", [
    (["configuration=t3"], "noise_free"),
    (["attack.setting=noise_free"], "configuration=t3"),
    (["attack.train.mode=lora"], "attack.train.mode"),
    (["configuration=cpu"], "t3, ep1, epn and slalom"),
])
def test_attack_user_errors(tmp_path, override, expected):
    res = run_cli_in_process(["experiment=attack_smoke", *override], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(res.stderr_lines) == 1 and expected in res.stderr_lines[0], res.stderr


def test_mask_replicates_pool_means_and_keep_the_worst_verdict():
    from attacks.splitee.replicates import pool_mask_seeds

    a = {"token_f1": 10.0, "token_f1_ci_lo": 8.0, "token_f1_ci_hi": 12.0, "bayes_token_f1": 1.0,
         "attack_verdict": "at_chance", "bayes_verdict": "at_chance", "verdict": "at_chance", "attack_gate": True}
    b = {**a, "token_f1": 30.0, "token_f1_ci_lo": 26.0, "token_f1_ci_hi": 34.0, "attack_verdict": "leak",
         "verdict": "leak", "attack_gate": False}
    m = pool_mask_seeds([a, b])
    assert m["token_f1"] == 20.0 and (m["token_f1_ci_lo"], m["token_f1_ci_hi"]) == (17.0, 23.0)
    assert (m["token_f1_seed_min"], m["token_f1_seed_max"]) == (10.0, 30.0)
    assert (m["attack_verdict"], m["verdict"], m["bayes_verdict"]) == ("leak", "leak", "at_chance")
    assert m["attack_gate"] is False and m["bayes_gate"] is True
    assert pool_mask_seeds([a]) == a
