"""The attack suite on tiny random models: capture alignment, the Bayes attacker (σ = 0, huge σ, k-averaging
against the σ/√k prediction), the learned attacker against the chance floor on T3, the shuffled control,
checkpoint reuse, the verdict logic, the corpus, and experiment=attack_smoke through the CLI.

The learned-attacker tests use `tiny-llama-tied` (tied embeddings, like the real decoders) with the
body/aligned recipe of attack_smoke: about 10 s of training each on one thread.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from attacks import bayes, controls
from attacks.capture import CaptureSpec, capture, features_from_view, truncated
from attacks.corpus import chunk, load_corpus, paragraphs
from attacks.inversion import Example, TrainSettings, shuffle_pairs
from attacks.pipeline import Pipeline, Store
from harness.errors import UserError
from metrics.intervals import Estimate
from metrics.privacy import corpus_token_prf

from .conftest import CONF, run_cli


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny models: one thread is faster than two on a shared machine (no oversubscription).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tied():
    from harness.models import load_model

    return load_model(OmegaConf.load(CONF / "model" / "tiny-llama-tied.yaml"))


@pytest.fixture(scope="module")
def prompts(tied):
    from harness.workloads import load_workload

    wl = load_workload({"name": "builtin", "source": "builtin", "n_prompts": 8, "use_chat_template": False},
                       tied.tokenizer, seed=0)
    return [list(p.input_ids) for p in wl.prompts]


SETTINGS = TrainSettings(mode="body", layout="aligned", window=8, batch_size=16, lr=3e-3, decoder_lr=3e-3,
                         max_steps=150, max_minutes=2, eval_every=50, val_windows=32, max_target_tokens=64)


@pytest.fixture(scope="module")
def pipe(tied, prompts, tmp_path_factory):
    corpus_cfg = {"source": "builtin", "n_train": 150, "n_val": 16, "min_tokens": 16, "max_tokens": 48}
    corpus = load_corpus(corpus_cfg, tied.tokenizer, seed=0)
    return Pipeline(victim=tied, decoder=tied, eval_prompts=prompts, corpus=corpus,
                    corpus_record={**corpus_cfg, "provenance": corpus.source},
                    store=Store(tmp_path_factory.mktemp("cache")), seed=0, train_settings=SETTINGS,
                    capture_batch_size=16, code="test", log=lambda m: None)


# ---------------------------------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------------------------------


def test_capture_drops_left_padding(tied, prompts):
    """T3 layer-0 QKV exposures of a left-padded batch of unequal prompts are exactly LN(E[t]) per token."""
    cap = capture(tied.model, prompts[:4], CaptureSpec("t3", None, 0, "qkv", batch_size=4), pad_token_id=2)[0]
    assert len({len(p) for p in prompts[:4]}) > 1
    norm = tied.model.model.layers[0].input_layernorm
    with torch.no_grad():
        for f, p in zip(cap.features, prompts[:4]):
            assert torch.equal(f, norm(tied.model.model.embed_tokens(torch.tensor(p))))


def test_truncated_capture_equals_full_engine(tied, prompts):
    """Capturing on the model cut after layer ℓ gives bit-identical exposures (same masks) to the full engine."""
    from harness.adversary_view import AdversaryView
    from harness.split.engine import EngineSettings, SplitEngine

    batch = prompts[:3]
    spec = CaptureSpec("ep1", 3.0, 7, "composite", layer=1, batch_size=3)
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
    from harness.split.engine import EngineSettings, SplitEngine

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
    spec = CaptureSpec("epn", None, 3, "qkv")
    cap = capture(tied.model, batch, spec, pad_token_id=2)[0]
    assert cap.meta == spec.meta() and cap.meta["configuration"] == "epn" and cap.meta["seed"] == 3


def test_capture_refuses_what_is_not_exposed(tied, prompts):
    spec = CaptureSpec("ep1", 1.0, 0, "composite", offload=("qkv", "lm_head"))
    with pytest.raises(UserError, match="kept in the TEE"):
        capture(tied.model, prompts[:1], spec, pad_token_id=2)
    with pytest.raises(UserError, match="configurations"):
        capture(tied.model, prompts[:1], CaptureSpec("slalom", None, 0, "qkv"), pad_token_id=2)


# ---------------------------------------------------------------------------------------------------
# Bayes attacker
# ---------------------------------------------------------------------------------------------------


def test_bayes_recovers_every_token_without_noise(tied, prompts):
    cap = capture(tied.model, prompts, CaptureSpec("t3", None, 0, "qkv", batch_size=8), pad_token_id=2)[0]
    book = bayes.codebook(tied.model)
    rec = bayes.attack(cap.features, prompts, book, k=5, vocab_per_chunk=5000, rows_per_chunk=300)
    assert rec.pooled_top1 >= 99.0 and rec.pooled_topk >= rec.pooled_top1
    assert rec.guesses == prompts


def test_bayes_is_at_chance_under_huge_noise(tied, prompts):
    cap = capture(tied.model, prompts, CaptureSpec("ep1", 1e-6, 0, "qkv", batch_size=8), pad_token_id=2)[0]
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
    # A different training configuration is a different attacker.
    assert pipe._key("inverter", x=1) != pipe._key("inverter", x=2)


def test_prefix_layout_and_lm_head_run(tied, prompts, tmp_path):
    """The GEIA prefix layout and the LM-head component (one exposed row per prompt) train and decode."""
    from dataclasses import replace

    corpus = load_corpus({"source": "builtin", "n_train": 20, "n_val": 4, "min_tokens": 16, "max_tokens": 24},
                         tied.tokenizer, seed=0)
    pipe = Pipeline(victim=tied, decoder=tied, eval_prompts=prompts[:3], corpus=corpus, corpus_record={"t": 1},
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
    floor = 20.0
    est = lambda m, lo, hi: Estimate(m, lo, hi, 10)  # noqa: E731
    good_pos = controls.positive_control(est(80, 75, 85), floor, 10.0)
    good_neg = controls.negative_control(est(19, 17, 20.5), floor, 1.0)
    assert good_pos.passed and good_neg.passed
    assert controls.verdict(est(20, 18, 21.0), floor, 1.0, good_pos, good_neg)["attack_verdict"] == "pass"
    v = controls.verdict(est(25, 21.5, 28), floor, 1.0, good_pos, good_neg)
    assert (v["attack_verdict"], v["attack_gate"]) == ("fail", False)
    bad_pos = controls.positive_control(est(35, 29, 41), floor, 10.0)      # lower bound 29 < 30
    v = controls.verdict(est(20, 18, 21.0), floor, 1.0, bad_pos, good_neg)
    assert (v["attack_verdict"], v["attack_gate"], v["attack_valid"]) == ("invalid", False, False)
    bad_neg = controls.negative_control(est(24, 22, 26), floor, 1.0)
    assert controls.verdict(est(20, 18, 21.0), floor, 1.0, good_pos, bad_neg)["attack_verdict"] == "invalid"
    assert controls.verdict(est(20, 18, 21.0), floor, 1.0, None, None)["attack_verdict"] == "invalid"


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

KEYS = ("chance_floor_token_f1", "attack_gate", "attack_verdict", "token_precision", "token_recall", "token_f1",
        "token_f1_ci_lo", "token_f1_ci_hi", "exact_match", "bleu", "rouge_l", "semantic_similarity",
        "positive_control_token_f1", "negative_control_token_f1", "bayes_top1", "bayes_top5", "bayes_top1_k16",
        "bayes_top1_k16_predicted", "epsilon_nominal", "gdp_mu_composed", "dp_epsilon_composed", "dp_delta")


def test_attack_smoke_cli(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    res = run_cli(["experiment=attack_smoke"], out, cache, env={"OMP_NUM_THREADS": "1"})
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
    assert m["token_f1_ci_lo"] <= m["token_f1"] <= m["token_f1_ci_hi"]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == results["n_prompts"] == 6
    assert all(len(s["output_ids"]) == s["n_prompt_tokens"] for s in samples)
    # A rerun skips the finished run; a second setting reuses every cached attacker it shares.
    again = run_cli(["experiment=attack_smoke"], out, cache, env={"OMP_NUM_THREADS": "1"})
    assert again.returncode == 0 and "already complete" in again.stdout
    oblivious = run_cli(["experiment=attack_smoke", "attack.setting=noise_oblivious"], out, cache,
                        env={"OMP_NUM_THREADS": "1"})
    assert oblivious.returncode == 0, oblivious.stderr[-3000:]
    run2 = out / "attack_smoke" / "tiny-llama-tied" / "ep1" / "eps=5" / "attack.setting=noise_oblivious"
    cache_events = json.loads((run2 / "results.json").read_text())["cache"]
    assert all(e["hit"] for e in cache_events if "attacker" in e["what"]), cache_events


@pytest.mark.parametrize("override, expected", [
    (["configuration=t3"], "noise_free"),
    (["attack.setting=noise_free"], "configuration=t3"),
    (["attack.train.mode=lora"], "attack.train.mode"),
    (["configuration=slalom"], "t3, ep1 and epn"),
])
def test_attack_user_errors(tmp_path, override, expected):
    res = run_cli(["experiment=attack_smoke", *override], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(res.stderr_lines) == 1 and expected in res.stderr_lines[0], res.stderr
