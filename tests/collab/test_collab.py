"""Cloud-edge collaborative decoding (paper 003): the defences against independent computations of the
paper's equations, the engine against plain greedy decoding, DecodeLeak's metrics on a hand-worked
example, the evidence rule, the verdict, bad input through the CLI, and experiment=collab_smoke end to end."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from attacks.collab import decodeleak as leak
from attacks.collab.evidence_recall import Vocabulary, first_rank, recall_curves, tokenise_evidence
from harness import configurations
from harness.collab import benchmarks, engine, prompts
from harness.collab.defences import CoGenesis, CoVeil, Defence, DPFusion, DPLogit, Upload, fuse, renyi_divergence
from metrics.answers import constant_answer_floor, option_correct, stated_option

from ..conftest import CONF, run_cli_in_process


def _dists(seed: int, v: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p_s = torch.softmax(3 * torch.randn(v, generator=g, dtype=torch.float64), 0)
    p_l = torch.softmax(3 * torch.randn(v, generator=g, dtype=torch.float64), 0)
    return p_s, p_l


# --- CoVeil ----------------------------------------------------------------------------------------------


def _objective(m: torch.Tensor, cand: torch.Tensor, p_s, p_l, alpha: float, lam: float) -> torch.Tensor:
    """J_t(m) = −U_t(m) + λ·P_t(m), written from eqs. 13-16 (not from the closed-form gradient, eq. 31)."""
    y_star = int(torch.argmax(alpha * p_l + (1 - alpha) * p_s))
    full_m = torch.zeros_like(p_s).index_put((cand,), m)

    def s(i, mask):
        return alpha * p_l[i] + (1 - alpha) * mask[i] * p_s[i]

    zero = torch.zeros_like(p_s)
    u = sum((s(y_star, full_m) - s(j, full_m)) - (s(y_star, zero) - s(j, zero)) for j in cand.tolist()) / len(cand)
    priv = (m * (p_s[cand] - p_l[cand]).abs()).sum()
    return -u + lam * priv


@pytest.mark.parametrize("seed, lam", [(0, 0.0), (1, 0.5), (2, 0.05), (3, 4.0)])
def test_coveil_cloud_upload_rule_is_the_sign_of_the_autograd_gradient(seed, lam):
    p_s, p_l = _dists(seed)
    alpha, k = 0.3, 10
    cv = CoVeil(alpha, lam, k)
    cand, g = cv.upload_scores(p_s, p_l)
    m = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    _objective(m, cand, p_s, p_l, alpha, lam).backward()
    assert torch.allclose(g, m.grad, atol=1e-12)
    up = cv.upload(p_s, p_l, torch.Generator())
    expected = set(cand[m.grad < 0].tolist())
    assert set(up.ids.tolist()) == expected
    assert torch.equal(up.probs.nonzero().flatten().sort().values, torch.tensor(sorted(expected), dtype=torch.long))
    assert torch.allclose(up.probs[list(expected)], p_s[list(expected)]) if expected else up.probs.sum() == 0


def test_coveil_cloud_at_lambda_zero_uploads_the_fused_top_token_only():
    p_s, p_l = _dists(5)
    y_star = int(torch.argmax(fuse(p_l, p_s, 0.3)))
    up = CoVeil(0.3, 0.0, 50).upload(p_s, p_l, torch.Generator())
    assert up.ids.tolist() == [y_star]


@pytest.mark.parametrize("seed, lam", [(0, 0.0), (1, 1.0), (2, 3.0), (4, 50.0)])
def test_coveil_edge_selects_the_argmin_of_eq_19_by_brute_force(seed, lam):
    p_s, p_l = _dists(seed)
    alpha, k = 0.3, 8
    p_f = alpha * p_l + (1 - alpha) * p_s
    order = sorted(range(len(p_f)), key=lambda i: -float(p_f[i]))[:k]
    y_star = order[0]
    j = {i: -(float(p_f[i]) - float(p_f[y_star])) + lam * (float(p_s[i]) - float(p_l[i])) for i in order}
    best = min(order, key=lambda i: j[i])
    assert CoVeil(alpha, lam, k).select(p_s, p_l, torch.Generator()) == best
    if lam == 0.0:
        assert best == y_star


# --- baselines -------------------------------------------------------------------------------------------


def test_cogenesis_uploads_exactly_the_top_b():
    p_s, p_l = _dists(7)
    up = CoGenesis(0.3, 4).upload(p_s, p_l, torch.Generator())
    top4 = set(torch.argsort(p_s, descending=True)[:4].tolist())
    assert set(up.probs.nonzero().flatten().tolist()) == top4
    assert torch.allclose(up.probs[list(top4)], p_s[list(top4)])


def test_dp_logit_sigma_and_renormalised_upload():
    d = DPLogit(0.3, 2.0, 1e-5)
    assert d.sigma == pytest.approx(math.sqrt(2) * math.sqrt(2 * math.log(1.25e5)) / 2.0)
    p_s, p_l = _dists(8)
    up = d.upload(p_s, p_l, torch.Generator().manual_seed(0))
    assert float(up.probs.min()) >= 0 and float(up.probs.sum()) == pytest.approx(1.0)


def test_renyi_divergence_against_the_closed_form():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    direct = math.log(sum(qi ** 2 / pi for qi, pi in zip(q.tolist(), p.tolist())))
    assert renyi_divergence(q, p, 2.0) == pytest.approx(direct)
    assert renyi_divergence(p, p, 2.0) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("eps", [0.0, 0.05, 0.5])
def test_dp_fusion_mixing_weight_is_the_largest_within_the_bound(eps):
    p_s, p_l = _dists(9)
    d = DPFusion(0.3, eps, 2.0)
    q, w = d.calibrated(p_s, p_l)
    assert renyi_divergence(q, p_l, 2.0) <= eps + 1e-9
    if w < 1.0:
        bigger = (w + 1e-3) * p_s + (1 - w - 1e-3) * p_l
        assert renyi_divergence(bigger, p_l, 2.0) > eps
    if eps == 0.0:
        assert w == 0.0 and torch.allclose(q, p_l)
    big = DPFusion(0.3, 1e6, 2.0).calibrated(p_s, p_l)
    assert big[1] == 1.0 and torch.equal(big[0], p_s)


# --- the edge-side baselines (harness/collab/edge_baselines.py) ------------------------------------------


def _table(vectors: torch.Tensor, candidates: list[int]):
    from harness.token_embeddings import Table

    return Table(vectors, torch.tensor(candidates), "euclidean")


@pytest.mark.parametrize("select_from", ["fused", "private"])
def test_custext_is_the_exponential_mechanism_over_the_k_nearest_by_hand(select_from):
    from harness.collab.edge_baselines import CusText

    g = torch.Generator().manual_seed(3)
    vectors = torch.randn(12, 3, generator=g)
    p_s, p_l = _dists(11, v=12)
    d = CusText(0.3, 2.0, _table(vectors, list(range(11))), k=4, select_from=select_from)   # 11: special
    t = int(torch.argmax(0.3 * p_l + 0.7 * p_s if select_from == "fused" else p_s))
    assert d.chosen(p_s, p_l) == t
    assert t != 11                      # these seeds choose a candidate (the special token: the next test)
    dist = [(math.dist(vectors[t].tolist(), vectors[j].tolist()), j) for j in range(11)]
    near = sorted(dist)[:4]
    sims = [-x for x, _ in near]
    u = [(x - min(sims)) / (max(sims) - min(sims)) for x in sims]
    w = [math.exp(2.0 * ui / 2) for ui in u]
    expected = torch.zeros(12, dtype=torch.float64)
    for (_, j), wi in zip(near, w):
        expected[j] = wi / sum(w)
    got = d.distribution(p_s, p_l, "edge", torch.Generator())
    assert torch.allclose(got, expected, atol=1e-6)
    assert near[0][1] == t and float(got[t]) == pytest.approx(max(w) / sum(w), rel=1e-5)


def test_custext_leaves_a_special_token_alone():
    from harness.collab.edge_baselines import CusText

    p_s = torch.tensor([0.1, 0.1, 0.8], dtype=torch.float64)
    d = CusText(0.3, 1.0, _table(torch.eye(3), [0, 1]), k=2)
    assert d.select(p_s, p_s.clone(), torch.Generator()) == 2


@pytest.mark.parametrize("eps, gamma", [(0.5, 10.0), (2.0, 10.0), (8.0, 3.0), (1.0, 1.0)])
def test_ldp_sampler_is_the_clipped_rescaling_and_epsilon_ldp(eps, gamma):
    from scipy.optimize import brentq

    from harness.collab.edge_baselines import LDPSampler, ldp_clip_bounds, ldp_sample_distribution

    lo_f, hi_f = ldp_clip_bounds(eps, gamma)
    # The local sampler's constants (c1 = 1/γ, c2 = γ) against the closed form (γ+1)/(e^ε+γ).
    assert lo_f == pytest.approx((gamma + 1) / (math.exp(eps) + gamma)) and hi_f == pytest.approx(math.exp(eps) * lo_f)
    p_s, p_l = _dists(12)
    q = ldp_sample_distribution(p_s, p_l, eps, gamma)
    # Independent: solve Σ clip(p/r, lo, hi) = 1 for r with a root finder.
    lo, hi = (lo_f * p_l).numpy(), (hi_f * p_l).numpy()
    ps = p_s.numpy()
    mass = lambda log_r: float(((ps * math.exp(-log_r)).clip(lo, hi)).sum()) - 1.0
    r = brentq(mass, -60, 60, xtol=1e-14)
    assert torch.allclose(q, torch.from_numpy((ps * math.exp(-r)).clip(lo, hi)), atol=1e-9)
    # ε-LDP whatever the private input: any two outputs' ratio is at most e^ε.
    other = ldp_sample_distribution(_dists(13)[0], p_l, eps, gamma)
    assert float((q / other).max()) <= math.exp(eps) * (1 + 1e-9)
    d = LDPSampler(0.3, eps, gamma).distribution(p_s, p_l, "edge", torch.Generator())
    assert torch.allclose(d, 0.3 * p_l + 0.7 * q)
    assert torch.allclose(LDPSampler(0.3, eps, gamma, fuse_public=False).distribution(p_s, p_l, "edge", None), q)


def test_ldp_sampler_returns_the_private_distribution_when_no_bound_binds():
    from harness.collab.edge_baselines import ldp_clip_bounds, ldp_sample_distribution

    lo, hi = ldp_clip_bounds(2000.0, 10.0)                  # no overflow: the cap is γ + 1 as ε → ∞
    assert lo == 0.0 and hi == pytest.approx(11.0)
    zero = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)   # a private distribution with zeros
    q0 = ldp_sample_distribution(zero, torch.full((4,), 0.25, dtype=torch.float64), 1.0, 10.0)
    assert bool(torch.isfinite(q0).all()) and float(q0.sum()) == pytest.approx(1.0) and int(q0.argmax()) == 1

    p_l = torch.full((4,), 0.25, dtype=torch.float64)
    p_s = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)   # ratios 0.4..1.6, inside [c, e^ε c] at ε = 4
    assert torch.allclose(ldp_sample_distribution(p_s, p_l, 4.0, 2.0), p_s, atol=1e-9)


@pytest.mark.parametrize("rho, eps", [(0.01, 0.5), (0.3, 2.0), (2.0, 10.0)])
def test_zcdp_conversion_against_dp_accounting(rho, eps):
    import numpy as np
    from dp_accounting.rdp.rdp_privacy_accountant import compute_delta

    from harness.collab.edge_baselines import zcdp_delta, zcdp_rho

    orders = np.concatenate([np.linspace(1.02, 5, 4000), np.linspace(5, 2000, 20000)])
    ref, _ = compute_delta(orders, rho * orders, eps)            # ρ-zCDP is RDP ε(α) = ρα
    assert zcdp_delta(rho, eps) == pytest.approx(ref, rel=1e-3)
    delta = zcdp_delta(rho, eps)
    assert zcdp_rho(eps, delta) == pytest.approx(rho, rel=1e-6)


def test_invisibleink_dclip_and_topk_plus_by_hand():
    import numpy as np

    from harness.collab.edge_baselines import InvisibleInk, InvisibleInkSettings, invisibleink_clip, zcdp_rho

    c_seq = invisibleink_clip(8.0, accounting="sequence", temperature=1.2, tokens=64, delta=1e-5)
    assert c_seq == pytest.approx(1.2 * math.sqrt(2 * zcdp_rho(8.0, 1e-5) / 64))
    p_s, p_l = _dists(14)
    for top_k in (None, 5):
        d = InvisibleInk(0.3, 3.0, InvisibleInkSettings("token", 1.2, top_k), tokens=64, delta=1e-5)
        assert d.clip == pytest.approx(3.0 * 1.2 / 2)
        ls, ll = np.log(p_s.numpy()), np.log(p_l.numpy())
        z = ll + np.clip(ls - ll, -d.clip, d.clip)
        if top_k:
            z = np.where(ll >= np.sort(ll)[-top_k] - 2 * d.clip, z, -np.inf)
        w = np.exp((z - z.max()) / 1.2)
        got = d.distribution(p_s, p_l, "edge", None)
        assert np.allclose(got.numpy(), w / w.sum())
    # InvisibleInk's neighbour: the reference removed (here: the edge without x_priv, p_S = p_L). Per token the
    # two output distributions differ by at most e^(2C/τ) = e^ε (token accounting); two different private
    # contexts by e^(2ε) (the residual moves across the whole [−C, C]).
    full = InvisibleInk(0.3, 3.0, InvisibleInkSettings("token", 1.2, None), tokens=64, delta=1e-5)
    a, none = full.distribution(p_s, p_l, "edge", None), full.distribution(p_l, p_l, "edge", None)
    assert torch.allclose(none, torch.softmax(p_l.log() / 1.2, 0))
    assert float((a / none).log().abs().max()) <= 3.0 + 1e-9
    b = full.distribution(_dists(15)[0], p_l, "edge", None)
    assert 3.0 < float((a / b).log().abs().max()) <= 6.0 + 1e-9


def test_every_collab_configuration_has_a_defence_a_mode_and_a_report_row():
    from harness import configurations
    from harness.collab.config import MODES_OF
    from harness.collab.defences import make_defence
    from harness.collab.edge_baselines import Options
    from runners.report.collab import ORDER

    names = configurations.names(system=configurations.COLLAB)
    assert sorted(ORDER) == sorted(names) and sorted(MODES_OF) == sorted(names)
    opts = Options(custext_table=_table(torch.eye(3), [0, 1, 2]))
    for name in names:
        d = make_defence(name, None if name == "collab_none" else 2.0, alpha=0.3, candidates=5, dp_delta=1e-5,
                         renyi_order=2.0, baselines=opts)
        assert d.name == name


def test_decoding_distribution_of_each_rule():
    p_s, p_l = _dists(16)
    cg = CoGenesis(0.3, 3)
    up = cg.upload(p_s, p_l, None).probs
    assert torch.allclose(cg.distribution(p_s, p_l, "cloud", None), (0.3 * p_l + 0.7 * up) / (0.3 + 0.7 * up.sum()))
    assert torch.allclose(Defence(0.3).distribution(p_s, p_l, "edge", None), fuse(p_l, p_s, 0.3))
    cv = CoVeil(0.3, 2.0, 10)
    point = cv.distribution(p_s, p_l, "edge", None)
    assert float(point.sum()) == 1.0 and int(point.argmax()) == cv.select(p_s, p_l, None)


class _FixedLM:
    """A stand-in model whose next-token distribution is `probs` at every position."""

    def __init__(self, probs: torch.Tensor):
        self.logits = probs.log().float()

    def __call__(self, input_ids, logits_to_keep=1, **_):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.logits.expand(1, logits_to_keep, -1).clone(), cache=None)


def test_likelihood_option_scoring_by_hand():
    from harness.collab import protocol
    from metrics.answers import best_option, scored_correct

    tok = _WordTokenizer()
    for w in ["yes", "Yes", "no", "No", "not", "Not", " sure"]:
        tok.id(w)
    p_s = torch.tensor([0.4, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], dtype=torch.float64)
    p_l = torch.tensor([0.05, 0.05, 0.3, 0.3, 0.1, 0.1, 0.1], dtype=torch.float64)
    ex = benchmarks.Example("e", "q?", "ctx", ("ctx",), ("yes", "no", "not sure"), "yes")
    pair = protocol.Pair(_FixedLM(p_s), _FixedLM(p_l), tok, 7, None)
    f = 0.3 * p_l + 0.7 * p_s
    for mode in ("cloud", "edge"):
        scores = protocol.option_loglik(pair, [ex], Defence(0.3), mode=mode, seed=0)[0]
        assert scores["yes"] == pytest.approx(math.log(float(f[0] + f[1])), rel=1e-5)
        assert scores["no"] == pytest.approx(math.log(float(f[2] + f[3])), rel=1e-5)
        # A two-token option: P("not" or "Not") · P(" sure" after it), each step's fused distribution.
        assert scores["not sure"] == pytest.approx(math.log(float((f[4] + f[5]) * f[6])), rel=1e-5)
        assert best_option(scores) == "yes" and scored_correct(scores, "yes") == 100.0
    alone = protocol.option_loglik(pair, [ex], None, mode="cloud", seed=0)[0]
    assert best_option(alone) == "no" and alone["no"] == pytest.approx(math.log(0.6), rel=1e-5)
    # CoVeil's deterministic edge-side rule: only the option it selects has a finite score.
    point = protocol.option_loglik(pair, [ex], CoVeil(0.3, 0.0, 7), mode="edge", seed=0)[0]
    assert point["yes"] == pytest.approx(0.0, abs=1e-12) and point["no"] == -math.inf
    assert best_option({"yes": -1.0, "no": -1.0}) is None and best_option({"yes": -math.inf}) is None


# --- the engine on tiny models ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    from harness.models import load_model, model_entry

    edge = load_model(model_entry("tiny-llama"))
    cloud = load_model(model_entry("tiny-llama-tied"))
    return edge, cloud


def _greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         min_new_tokens=n)
    return out[0, len(ids):].tolist()


def test_engine_reduces_to_each_party_alone_at_alpha_0_and_1(pair):
    edge, cloud = pair
    tok = edge.tokenizer
    vocab = engine.shared_vocab(tok, cloud.tokenizer)
    ex = benchmarks.load_benchmark(OmegaConf.create(dict(name="builtin", path=None, hub_id=None, n_examples=2,
                                                         max_context_words=None, answer_critical=False))).examples[0]
    e_ids = prompts.encode(tok, prompts.party_text(ex, private=True))
    c_ids = prompts.encode(tok, prompts.party_text(ex, private=False))
    kw = dict(max_new_tokens=6, vocab=vocab, eos=None, rng=torch.Generator(), example_id=ex.id, view_top=10)
    for mode in ("cloud", "edge"):
        only_edge = engine.collaborate(edge.model, cloud.model, e_ids, c_ids, Defence(0.0), mode=mode, **kw)
        only_cloud = engine.collaborate(edge.model, cloud.model, e_ids, c_ids, Defence(1.0), mode=mode, **kw)
        assert only_edge.output_ids == _greedy(edge.model, e_ids, 6)
        assert only_cloud.output_ids == _greedy(cloud.model, c_ids, 6)
    # The floor's generation is the cloud alone, and its per-step top-K equal the teacher-forced ones.
    ids, sets = engine.cloud_only(cloud.model, c_ids, max_new_tokens=6, vocab=vocab, eos=None, top=5)
    assert ids == _greedy(cloud.model, c_ids, 6)
    assert engine.cloud_topk_along(cloud.model, c_ids, ids, vocab=vocab, top=5) == sets


def test_view_channels_hold_what_the_cloud_receives(pair):
    edge, cloud = pair
    tok = edge.tokenizer
    vocab = len(tok)
    ex = benchmarks.load_benchmark(OmegaConf.create(dict(name="builtin", path=None, hub_id=None, n_examples=2,
                                                         max_context_words=None, answer_critical=False))).examples[1]
    e_ids = prompts.encode(tok, prompts.party_text(ex, private=True))
    c_ids = prompts.encode(tok, prompts.party_text(ex, private=False))
    kw = dict(max_new_tokens=4, vocab=vocab, eos=None, rng=torch.Generator(), example_id=ex.id, view_top=7)
    cloud_side = engine.collaborate(edge.model, cloud.model, e_ids, c_ids, CoGenesis(0.3, 3), mode="cloud", **kw)
    chans = [e.channel for e in cloud_side.exposures]
    assert chans == [engine.PUBLIC_QUERY] + [engine.UPLOADED_PROBS] * 4
    assert cloud_side.exposures[0].tensor.tolist() == c_ids
    assert all(e.tensor.shape == (3, 2) for e in cloud_side.exposures[1:])
    edge_side = engine.collaborate(edge.model, cloud.model, e_ids, c_ids, Defence(0.3), mode="edge", **kw)
    synced = [int(e.tensor[0]) for e in edge_side.exposures if e.channel == engine.SYNCED_TOKENS]
    assert synced == edge_side.output_ids
    # The attack reads the view only: edge-side sets are the cloud's own top-K along the synced prefix.
    from harness.adversary_view import AdversaryView

    sets = leak.exposure_sets(AdversaryView(edge_side.exposures), ex.id, cloud=cloud.model, vocab=vocab, top=5)
    assert sets == engine.cloud_topk_along(cloud.model, c_ids, synced, vocab=vocab, top=5)
    with pytest.raises(ValueError, match="different tokenizers"):
        engine.shared_vocab(tok, _WordTokenizer())


def test_option_prefix_continues_from_the_prompt_cache_as_a_full_forward(pair):
    from harness.collab.protocol import _Prefix

    edge = pair[0]
    vocab = len(edge.tokenizer)
    prompt, toks = list(range(5, 30)), [40, 41]
    pre = _Prefix(edge.model, prompt, vocab)
    with torch.no_grad():
        full = torch.softmax(edge.model(input_ids=torch.tensor([prompt + toks]), logits_to_keep=3).logits[0, :, :vocab]
                             .double(), -1)
    assert torch.allclose(pre.first, full[0], atol=1e-5)
    assert torch.allclose(pre.after(toks), full[1:], atol=1e-5)
    assert torch.allclose(pre.after(toks), full[1:], atol=1e-5)      # the prompt's cache is not consumed


class _ContextSensitiveLM:
    """A stand-in edge model: it answers "yes" when its prompt holds a `Context:` line, else "no"."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.yes, self.no = tokenizer(" yes", add_special_tokens=False)["input_ids"][0], \
            tokenizer(" no", add_special_tokens=False)["input_ids"][0]

    def __call__(self, input_ids, cache=None, use_cache=True, logits_to_keep=1):
        from types import SimpleNamespace

        if cache is None:
            cache = {"context": "Context:" in self.tok.decode(input_ids[0].tolist())}
        logits = torch.zeros(1, 1, len(self.tok))
        logits[0, 0, self.yes if cache["context"] else self.no] = 10.0
        return SimpleNamespace(logits=logits, cache=cache)


def test_answer_critical_filter_keeps_what_only_the_evidence_answers(pair):
    from harness.collab import protocol

    tok = pair[0].tokenizer
    bench = benchmarks.load_benchmark(OmegaConf.create(dict(name="builtin", path=None, hub_id=None, n_examples=None,
                                                            max_context_words=None, answer_critical=True)))
    fake = protocol.Pair(_ContextSensitiveLM(tok), None, tok, len(tok), None)
    kept = protocol.answer_critical(fake, bench.examples, n=None, max_new_tokens=2)
    assert [e.id for e in kept] == [e.id for e in bench.examples if e.answer == "yes"]
    assert len(protocol.answer_critical(fake, bench.examples, n=2, max_new_tokens=2)) == 2


# --- DecodeLeak metrics on a hand-worked example --------------------------------------------------------


class _WordTokenizer:
    """Whole words with their leading space as tokens (" pupils" and "pupils" differ), ids on first use."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def id(self, piece: str) -> int:
        return self.vocab.setdefault(piece, len(self.vocab))

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.id(p) for p in re.findall(r" ?\S+", text)]}

    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        return "".join(inv[i] for i in ids)

    def get_vocab(self):
        return dict(self.vocab)


def test_evidence_recall_metrics_by_hand():
    tok = _WordTokenizer()
    vocab = Vocabulary(tok)
    ev = tokenise_evidence(["pinpoint pupils", "slow breathing"], vocab, leading_space=True)
    i = tok.id
    steps = [[i(" the"), i(" pupils"), i(" x")], [i(" slow"), i("pinpoint"), i(" y")]]
    ranks = first_rank(steps)
    assert ranks[i(" pupils")] == 1 and ranks[i(" slow")] == 0 and ranks[i("pinpoint")] == 1
    c = recall_curves(ranks, ev, vocab, [1, 2, 3])
    assert c["token_er"] == {1: 25.0, 2: 50.0, 3: 50.0}           # " pinpoint" (spaced) is never exposed
    assert c["rouge1_er"] == {1: 25.0, 2: 75.0, 3: 75.0}          # words: the bare "pinpoint" counts here
    assert c["span_er"][2] == 50.0 and c["span_er"][1] == 25.0
    assert c["auc"][3] == pytest.approx((25 + 50 + 50) / 3)
    bare = tokenise_evidence(["pinpoint pupils", "slow breathing"], vocab, leading_space=False)
    # Bare: each span's first word loses its space ("pinpoint", "slow"): "pinpoint" and " pupils" are exposed.
    assert recall_curves(ranks, bare, vocab, [2])["token_er"][2] == 50.0
    assert recall_curves({}, ev, vocab, [3])["token_er"][3] == 0.0


def test_informed_attacker_unites_the_signal_with_its_own_guesses():
    tok = _WordTokenizer()
    vocab = Vocabulary(tok)
    i = tok.id
    ev = [tokenise_evidence(["pinpoint pupils", "slow breathing"], vocab, leading_space=True)]
    signal = [[[i(" pupils")], []]]                      # a sparse upload: one id, then nothing
    prior = [[[i(" the"), i(" slow"), i(" a")], [i(" breathing"), i(" x")]]]
    informed = leak.score_sets(signal, ev, vocab, [1, 2, 3], prior=prior)
    concatenated = leak.score_sets([signal[0] + prior[0]], ev, vocab, [1, 2, 3])
    assert informed.rows == concatenated.rows
    assert informed.rows[0]["token_er"] == {1: 50.0, 2: 75.0, 3: 75.0}   # pupils@0, breathing@0, slow@1
    alone = leak.score_sets(signal, ev, vocab, [1, 2, 3]).rows[0]["token_er"]
    floor = leak.score_sets(prior, ev, vocab, [1, 2, 3]).rows[0]["token_er"]
    assert all(informed.rows[0]["token_er"][k] >= max(alone[k], floor[k]) for k in (1, 2, 3))


def test_evidence_rule_and_agreement():
    spans = benchmarks.evidence_spans("Her pupils were pinpoint and breathing slow; she was drowsy.",
                                      "Pinpoint pupils and slow breathing mean opioid excess.", "Is it an opioid?")
    assert spans == ("pupils", "pinpoint", "breathing slow")
    agree = benchmarks.span_agreement(spans, ["pupils were pinpoint", "breathing slow", "drowsy"])
    assert agree["precision"] == 100.0 and agree["recall"] == pytest.approx(80.0)


def test_judged_agreement_pools_spans_over_examples():
    rows = [(2, 4, 1), (0, 3, 2), (3, 3, 0)]        # (judged evidence, rule spans, missed) per example
    a = benchmarks.judged_agreement(rows, n_boot=200)
    assert a["precision"].mean == pytest.approx(100 * 5 / 10) and a["recall"].mean == pytest.approx(100 * 5 / 8)
    assert a["precision"].lo <= 50.0 <= a["precision"].hi and a["n_missed"] == 3
    one = benchmarks.judged_agreement([(1, 2, 0), (1, 2, 0)], n_boot=50)["precision"]
    assert one.lo == one.hi == 50.0                     # identical examples: no spread to resample


def test_stated_option():
    assert stated_option("No. Maybe later, yes.", ("yes", "no", "maybe")) == "no"
    assert stated_option("I cannot tell", ("yes", "no", "maybe")) is None
    assert option_correct("Yes, because", ("yes", "no", "maybe"), "yes") == 100.0


def test_option_accuracy_at_the_edges_has_a_wilson_interval():
    """Every example right (and the cloud alone every one wrong): accuracy 100 and 0 with Wilson's interval on
    10 examples, never a zero-width one (issue 34, item 3); ROUGE-L's mean interval is widened to what 10
    examples earn (issue 51), never [100, 100]."""
    from types import SimpleNamespace as NS

    from harness.collab.experiment import utility
    from metrics.proportions import wilson

    examples = [NS(options=("yes", "no", "maybe"), answer="yes", reference="a b c") for _ in range(10)]
    runs = NS(signals=NS(texts=["Yes."] * 10), floor=NS(texts=["No."] * 10))
    cfg = NS(collab=NS(option_scoring="stated"))
    use = utility(cfg, NS(pair=None), NS(examples=examples, has_options=True), runs)
    lo, hi = wilson(10, 10)
    assert use.metric == "accuracy" and (use.value.mean, use.value.lo, use.value.hi) == pytest.approx((100, 100 * lo, 100))
    assert use.value.lo < 75 and (use.cloud_only.mean, use.cloud_only.lo) == (0.0, 0.0) and use.cloud_only.hi > 25
    rouge = utility(cfg, NS(pair=None), NS(examples=examples, has_options=False),
                    NS(signals=NS(texts=["a b c"] * 10), floor=NS(texts=["a b c"] * 10)))
    assert rouge.metric == "rouge_l" and (rouge.value.mean, rouge.value.hi) == pytest.approx((100.0, 100.0))
    assert rouge.value.lo < 75.0        # 0 of 10 differing still allows 30.8 % of examples to differ


def test_constant_answer_floor_is_the_most_frequent_gold_answers_share():
    assert constant_answer_floor(["yes", "no", "yes", "maybe"]) == 50.0
    assert constant_answer_floor(["yes", "no", "maybe"]) == pytest.approx(100 / 3)
    assert constant_answer_floor([]) == 0.0


def test_verdict_rule_on_constructed_curves():
    def curves(values):
        return leak.Curves([{"token_er": {10: v}} for v in values])

    null = curves([10, 20, 30, 40])
    high = curves([40, 52, 58, 75])
    same = curves([10, 20, 30, 40])
    v = leak.verdict(high, null, None, (same, null), 10, 1.0, 5.0)
    assert v["verdict"] == "leak" and v["positive_control_pass"] and v["negative_control_pass"]
    # Issue 51 changed this verdict from at_chance: 4 examples that agree exactly have a t interval [0, 0], but
    # 0 differing of 4 bound the mean only by B·CP_U(0, 4) = 60 pp at B = 100 pp.
    v = leak.verdict(same, null, (high, null), (same, null), 10, 1.0, 5.0)
    assert v["verdict"] == "inconclusive" and v["null_excess_token_er_ci"] == [0.0, 0.0] and v["zero_spread"]
    assert v["null_excess_token_er_earned_ci"] == pytest.approx([-60.24, 60.24], abs=0.01)
    # with a per-example bound fixed in advance small enough for 4 examples to earn ±1 pp, it certifies
    v = leak.verdict(same, null, (high, null), (same, null), 10, 1.0, 5.0, per_item_bound_pp=1.6)
    assert v["verdict"] == "at_chance" and v["null_excess_token_er_earned_ci"][1] <= 1.0
    v = leak.verdict(same, null, (same, null), (same, null), 10, 1.0, 5.0)      # a positive control that fails
    assert v["verdict"] == "inconclusive" and not v["positive_control_pass"]
    v = leak.verdict(high, null, None, (high, null), 10, 1.0, 5.0)       # a negative control that leaks
    assert v["verdict"] == "inconclusive" and not v["negative_control_pass"]


# --- issue 31: the verdict's statistic against signals without private information -------------------------


class _RandomIds(Defence):
    """A cloud-side signal that carries no private information: 100 uniformly random token ids a step."""

    name = "random_ids"

    def upload(self, p_S, p_L, rng):
        ids = torch.randperm(p_S.numel(), generator=rng)[:100]
        probs = torch.zeros_like(p_S)
        probs[ids] = torch.linspace(1.0, 0.5, 100, dtype=p_S.dtype)
        return Upload(probs, ids)


@pytest.fixture(scope="module")
def null_runs(pair):
    """The tiny pair on 6 built-in examples, 4 tokens: each test signal (seed 0), its null signal (the same
    mechanism, the edge without x_priv, at the runner's null seed) and a second null (the runner's negative
    control seed); the cloud alone's sets; the evidence."""
    from attacks.collab.evidence_recall import Vocabulary, tokenise_evidence
    from harness.collab import protocol
    from harness.collab.experiment import NEGATIVE_CONTROL_SEED_OFFSET, NULL_SEED_OFFSET

    edge, cloud = pair
    vocab = engine.shared_vocab(edge.tokenizer, cloud.tokenizer)
    examples = benchmarks.load_benchmark(OmegaConf.create(dict(
        name="builtin", path=None, hub_id=None, n_examples=6, max_context_words=None,
        answer_critical=False))).examples
    p = protocol.Pair(edge.model, cloud.model, edge.tokenizer, vocab, None)
    top = 100

    def sets(defence, mode, private, seed=0):
        sig = protocol.collaborate_all(p, examples, defence, mode=mode, seed=seed, private=private,
                                       max_new_tokens=4, view_top=top)
        return [leak.exposure_sets(sig.view, e.id, cloud=cloud.model, vocab=vocab, top=top) for e in examples]

    vi = Vocabulary(edge.tokenizer)
    ev = [tokenise_evidence(e.evidence, vi, True) for e in examples]
    floor = protocol.cloud_alone(p, examples, max_new_tokens=4, top=top).sets
    runs = {name: tuple(sets(make(), mode, private, seed) for private, seed in ((True, 0), (False, NULL_SEED_OFFSET),
                                                                          (False, NEGATIVE_CONTROL_SEED_OFFSET)))
            for name, make, mode in (("random", lambda: _RandomIds(0.3), "cloud"),
                                     ("dp_fusion_0", lambda: DPFusion(0.3, 0.0, 2.0), "edge"))}
    # A known leak: the undefended edge without x_priv, with the private context's content ids uploaded at one
    # more step; its null is that edge without the injection (deterministic: the second null is the same).
    undefended_null = sets(Defence(0.3), "cloud", False)
    ctx = [sorted(vi.content_ids(e.context, True)) for e in examples]
    runs["injected"] = ([[c] + s for c, s in zip(ctx, undefended_null)], undefended_null, undefended_null)
    return runs, floor, ev, vi


def _read(runs, name, floor, ev, vi, k=100, margin=1.0):
    """The verdict as the runner reads it (attacks/collab/suite.audit): each pair over matched steps."""
    run, null, null_again = runs[name]
    inj, inj_null, _ = runs["injected"]

    def pair(a, b):
        return leak.paired_scores(a, b, ev, vi, [k], prior=floor, step_matching="matched")

    return leak.verdict(*pair(run, null), pair(inj, inj_null), pair(null_again, null), k, margin, 5.0)


def test_random_ids_read_at_chance_against_their_null_but_above_the_floor(null_runs):
    runs, floor, ev, vi = null_runs
    v = _read(runs, "random", floor, ev, vi)
    assert v["positive_control_pass"] and v["negative_control_pass"]
    # Issue 51 changed this verdict from at_chance: 6 examples earn at best ±B·CP_U(0, 6) = ±45.9 pp, so they
    # certify nothing at 1 pp; what stays is that random ids never read leak. With a bound of 1.1 pp fixed in
    # advance they would have certified while the null shared the signal's seed (the excess was then exactly 0).
    # The null now draws its own ids, so the excess is a real draw whose interval holds 0.
    assert v["verdict"] == "inconclusive", v
    lo, hi = v["null_excess_token_er_ci"]
    assert lo <= 0.0 <= hi and hi > lo, v
    # The statistic issue 31 replaced: the informed attacker's excess over the floor credits the random ids'
    # extra coverage (no example below 0); at 48 tokens on SmolLM2 it read +4.3 [1.5, 7.0] pp, a leak.
    run = leak.score_sets(runs["random"][0], ev, vi, [100], prior=floor).values("token_er", 100)
    old = [a - b for a, b in zip(run, leak.score_sets(floor, ev, vi, [100]).values("token_er", 100))]
    assert min(old) >= 0.0, old
    # The second null is an independent draw: the negative control's interval holds 0.
    lo, hi = v["negative_control_excess_token_er_ci"]
    assert lo <= 0.0 <= hi


def test_dp_fusion_at_epsilon_zero_reads_at_chance(null_runs):
    runs, floor, ev, vi = null_runs
    v = _read(runs, "dp_fusion_0", floor, ev, vi)
    # Issue 51 changed this verdict from at_chance: the null shared the signal's seed, so at ε = 0 it reproduced
    # the signal bit for bit and the t interval was [0, 0]; the test could not fail. The null now draws at its
    # own seed, so the mechanism shows its own noise against it; 6 examples certify nothing at 1 pp, and a
    # mechanism that ignores x_priv never reads leak.
    assert v["verdict"] == "inconclusive", v
    assert runs["dp_fusion_0"][0] != runs["dp_fusion_0"][1]    # independent draws, not a copy of the signal
    lo, hi = v["null_excess_token_er_earned_ci"]
    assert lo < 0.0 < hi and hi - lo > 0.0


def test_the_private_context_injected_reads_leak(null_runs):
    runs, floor, ev, vi = null_runs
    v = _read(runs, "injected", floor, ev, vi)
    assert v["verdict"] == "leak" and v["null_excess_token_er_ci"][0] > 5.0, str(v)


# --- issue 51 item 3: a signal with no content and more steps reads at chance ------------------------------


def _step_entry(step_matching, units=600, margin=3.0):
    """The calibration's collab entry on constructed data: 12 examples of 20 evidence ids each in a vocabulary
    of 2000, 4 steps, 100 random ids a step (each step covers 5 % of the vocabulary, so the step count matters
    a lot: 4 steps cover 18.5 % of the evidence, 8 steps 33.7 %)."""
    from attacks.collab import calibration
    from attacks.collab.evidence_recall import Evidence

    rng = np.random.default_rng(7)
    evidence = []
    for _ in range(12):
        ids = frozenset(int(i) for i in rng.choice(2000, 20, replace=False))
        evidence.append(Evidence((ids,), ids, frozenset()))
    data = calibration.CollabData(evidence, [[] for _ in evidence], None, 2000, 4)
    return calibration.collab_entry(data, units=units, ids_per_step=100, k=100, margin_pp=margin,
                                    positive_margin_pp=5.0, doses_pp=[6.0], gate_dose_pp=6.0,
                                    step_matching=step_matching)


def test_random_ids_with_twice_the_steps_read_at_chance_over_matched_steps():
    """Random ids with 2x the steps of their null: over all steps (step_matching=none) the extra coverage reads
    as a leak; over matched steps (the default) they read at_chance, and a real dose still reads leak."""
    entry = _step_entry("matched")
    long_null = entry.extra_nulls["long_random_ids"]
    verdicts = [long_null(np.random.default_rng(s)) for s in range(3)]
    assert [t.verdict for t in verdicts] == ["at_chance"] * 3, verdicts
    assert entry.dosed_trial(6.0, np.random.default_rng(0)).verdict == "leak"
    unmatched = _step_entry("none").extra_nulls["long_random_ids"](np.random.default_rng(0))
    assert unmatched.verdict == "leak" and unmatched.statistic > 10.0, unmatched
    # per_step, the alternative: coverage saturates, so dividing by steps reads the longer signal below its null
    # (expected −1.7 pp: 33.7 / 2 against 18.5)
    per_step = [_step_entry("per_step").extra_nulls["long_random_ids"](np.random.default_rng(s)) for s in range(3)]
    assert all(t.verdict != "leak" for t in per_step) and sum(t.statistic for t in per_step) / 3 < -0.5, per_step


def test_match_steps_cuts_each_example_to_the_shorter():
    a, b = leak.match_steps([[[1], [2], [3]], [[4]]], [[[5]], [[6], [7]]])
    assert a == [[[1]], [[4]]] and b == [[[5]], [[6]]]
    with pytest.raises(ValueError):
        leak.paired_scores([[[1]]], [[[2]]], [], None, [1], prior=None, step_matching="longest")


# --- the command line ------------------------------------------------------------------------------------

SMOKE = ["experiment=collab_smoke", "hydra.mode=RUN"]


@pytest.fixture(scope="module")
def smoke_cfg():
    """experiment=collab_smoke composed once for the module (each case edits a copy: composing is the cost)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..conftest import compose_config

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose_config(["experiment=collab_smoke"])
    GlobalHydra.instance().clear()
    return cfg


@pytest.mark.parametrize("updates, expected", [
    ({"collab.alpha": 1.5}, "collab.alpha must lie in [0, 1], got 1.5"),
    ({"collab.alpha": -0.1}, "collab.alpha must lie in [0, 1], got -0.1"),
    ({"collab.metrics.ks": [0, 5]}, "collab.metrics.ks must be a non-empty list of K >= 1"),
    ({"collab.metrics.report_k": 7}, "collab.metrics.report_k must be >= 1 and one of"),
    ({"collab.candidates": 0}, "collab.candidates must be >= 1, got 0"),
    ({"epsilon": -1.0}, "epsilon must be a finite number > 0, got -1.0"),           # λ < 0
    ({"configuration.name": "collab_cogenesis", "collab.fusion": "edge"}, "defends cloud-side fusion only"),
    ({"configuration.name": "collab_cogenesis", "epsilon": 2.5}, "a whole number >= 1, got 2.5"),
    ({"configuration.name": "collab_dp_logit", "collab.parameter_zero": True}, "has no parameter value 0"),
    ({"configuration.name": "ep1"}, "belongs to the splitee system, which runner=collab does not run"),
    ({"collab.fusion": "both"}, "collab.fusion='both' is not one of cloud, edge"),
    ({"collab.benchmark.name": "pubmedqa", "collab.benchmark.path": "/nonexistent.json"}, "is not a file"),
    ({"configuration.name": "collab_custext", "collab.fusion": "cloud"}, "defends edge-side fusion only"),
    ({"configuration.name": "collab_invisibleink", "collab.fusion": "cloud"}, "defends edge-side fusion only"),
    ({"configuration.name": "collab_ldp_sampler", "collab.fusion": "edge", "collab.parameter_zero": True},
     "has no parameter value 0"),
    ({"collab.custext.k": 0}, "collab.custext.k must be >= 1, got 0"),
    ({"collab.custext.distance": "manhattan"}, "collab.custext.distance='manhattan' is not one of"),
    ({"collab.custext.embeddings": "/nonexistent.pt"}, "neither 'victim' nor an existing .pt/.npy file"),
    ({"collab.custext.select_from": "cloud"}, "collab.custext.select_from='cloud' is not one of fused, private"),
    ({"collab.ldp_sampler.gamma": 0.5}, "collab.ldp_sampler.gamma must be a finite number >= 1, got 0.5"),
    ({"collab.invisibleink.accounting": "total"}, "collab.invisibleink.accounting='total' is not one of"),
    ({"collab.invisibleink.temperature": 0.0}, "collab.invisibleink.temperature must be a finite number > 0, got 0.0"),
    ({"collab.invisibleink.top_k": 0}, "collab.invisibleink.top_k must be >= 1 or null, got 0"),
    ({"collab.controls.gate_margin_pp": float("nan")}, "collab.controls.gate_margin_pp must be a finite number >= 0, got nan"),
    ({"collab.option_scoring": "vote"}, "collab.option_scoring='vote' is not one of stated, likelihood"),
    ({"collab.option_scoring": "likelihood", "collab.benchmark.name": "dolly"}, "needs an option benchmark"),
    ({"collab.batch_size": 0}, "collab.batch_size must be >= 1 or null, got 0"),
    ({"collab.rng": "global"}, "collab.rng='global' is not one of per_example, shared"),
])
def test_bad_values_are_refused_before_any_model_loads(smoke_cfg, updates, expected):
    from harness import schema
    from harness.errors import UserError
    from runners.registry import runner_systems

    cfg = smoke_cfg.copy()
    for key, value in updates.items():
        OmegaConf.update(cfg, key, value)
    with pytest.raises(UserError) as e:
        schema.validate(cfg, runner_systems())
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_bad_input_through_the_cli_is_one_line_exit_2(tmp_path):
    res = run_cli_in_process([*SMOKE, "collab.alpha=1.5"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2, res.stderr
    assert res.stderr_lines == ["splitbench: error: collab.alpha must lie in [0, 1], got 1.5"]


def test_collab_smoke_experiment(tmp_path, monkeypatch):
    import wandb

    from ..test_wandb_mirror_offline import _Run

    mirrored: dict = {}     # a fake W&B run per job, by its name (the run directory under the sweep)
    monkeypatch.setattr(wandb, "init", lambda **kw: mirrored.setdefault(kw["name"], _Run()))
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=collab_smoke", "logger=wandb"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted(p.parent for p in out.rglob(".done"))
    assert len(runs) == 4 and len(mirrored) == 4
    seen = set()
    for run in runs:
        r = json.loads((run / "results.json").read_text())
        # The W&B step history: one step per example, its Token-ER@20, floor, inversion recall, utility and speed.
        rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        history = [(step, data) for step, data in mirrored[r["run_dir"]].logged if step is not None]
        assert [step for step, _ in history] == list(range(len(rows)))
        for row, (_, data) in zip(rows, history):
            assert data == {"example/token_er_at_20": row["token_er_at_20"],
                            "example/floor_token_er_at_20": row["floor_token_er_at_20"],
                            "example/inversion_rouge1_recall": row["inversion_rouge1_recall"],
                            "example/accuracy": row["utility"], "example/tokens_per_second": data["example/tokens_per_second"]}
            assert data["example/tokens_per_second"] > 0
        seen.add((r["configuration"], r["fusion"]))
        for key in ("token_er_at_k", "rouge1_er_at_k", "span_er_at_k", "auc_at_k", "floor_token_er_at_k",
                    "floor_rouge1_er_at_k", "floor_span_er_at_k", "floor_auc_at_k", "inversion_rouge1_recall",
                    "floor_inversion_rouge1_recall", "accuracy", "tradeoff", "verdict"):
            assert key in r, key
        assert set(r["token_er_at_k"]) == {"1", "5", "20"}
        assert r["verdict"] in ("leak", "at_chance", "inconclusive") and "smoke" in r["tags"]
        assert r["tradeoff"]["leakage"]["floor"] == r["floor_token_er_at_k"]["20"]
        assert r["tradeoff"]["leakage"]["value"] == r["token_er_at_k"]["20"]          # the paper's metric
        # one benchmark and fusion mode per cross-system point (issue 34)
        cloud = "" if r["cloud_model"] == r["model"] else f" · cloud {r['cloud_model']}"
        assert r["tradeoff"]["setting"] == f"builtin · {r['fusion']}-side · α={r['alpha']:g}{cloud}"
        c = r["controls"]            # issue 31: the verdict reads the excess over the null signal
        assert c["verdict_statistic"] == "null_excess_token_er" and len(c["null_excess_token_er_ci"]) == 2
        assert r["metrics"]["null_excess_token_er_at_20"] == c["null_excess_token_er"]
        # issue 52 item 4: the verdict's per-example scores as a test, signal against null
        test = r["roc"]["informed_token_er"]
        assert test["positives"] == test["negatives"] == r["n_prompts"]
        assert test["auc_ci"][0] <= test["auc"] <= test["auc_ci"][1] and r["metrics"]["auc"] == test["auc"]
        assert [p["fpr_target_pct"] for p in test["tpr_at_fpr"]] == [0.1, 1.0, 10.0]
        assert all(p["tpr_pct"] is None and p["reason"] for p in test["tpr_at_fpr"][:2])   # < 100 null examples
        assert set(r["metrics"]["tpr_at_fpr"]) == {"0.1", "1", "10"}
        assert set(r["roc"]) == {"informed_token_er", "inversion"}       # the smoke runs the inversion
        assert r["metrics"]["inversion_auc"] == r["roc"]["inversion"]["auc"]
        gold = [json.loads(line)["gold"] for line in (run / "samples.jsonl").read_text().splitlines()]
        assert r["utility"]["constant_answer_floor"] == r["metrics"]["accuracy_floor"] == constant_answer_floor(gold)
        from harness.adversary_view import AdversaryView

        view = AdversaryView.load(run / "view.pt")
        assert view.meta["system"] == "collab" and view.meta["configuration"] == r["configuration"]
        channel = engine.UPLOADED_PROBS if r["fusion"] == "cloud" else engine.SYNCED_TOKENS
        assert set(view.channels()) == {engine.PUBLIC_QUERY, channel}
        # Issue 50's de-duplication: a deterministic defence's second null is its null; two models, no shared forward.
        d = r["decodes"]
        assert set(d) == {"cloud_alone", "undefended", "signals", "no_context", "null", "null_again"}
        randomised = (r["configuration"], r["fusion"]) == ("collab_dp_fusion", "edge")
        assert d["null_again"]["reused"] == (None if randomised else "null")
        assert d["null_again"]["computed"] == randomised and d["signals"]["computed"]
        assert not any(v["shared_forward"] for v in d.values())
    assert seen == {("coveil", "cloud"), ("coveil", "edge"), ("collab_dp_fusion", "cloud"), ("collab_dp_fusion", "edge")}
    # The report section renders both fusion modes with their plots.
    from runners.report.document import build

    build(out, tmp_path / "report", include_tags=("smoke",))
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Cloud-edge collaborative decoding (paper 003)" in text
    assert "cloud-side fusion" in text and "edge-side fusion" in text and "Matched utility" in text
    assert "constant-answer floor" in text
    assert "AUC [95% CI]" in text and "| informed_token_er |" in text
    from runners.export import table

    rows = [row for row in table(out)[0] if row["metric"] == "auc"]
    assert len(rows) == 4 and all(row["ci_lo"] <= row["value"] <= row["ci_hi"] for row in rows)
    assert len(list((tmp_path / "report").glob("report_collab_*.png"))) == 6    # Figure 3, 4 and 5 per mode


@pytest.mark.slow
def test_edge_side_baselines_and_likelihood_scoring_end_to_end(tmp_path):
    """The three edge-side baselines through the CLI on the smoke pair, utility by likelihood option scoring."""
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=collab_smoke", "collab.fusion=edge", "collab.option_scoring=likelihood",
                              "epsilon=4", "configuration=collab_custext,collab_ldp_sampler,collab_invisibleink"],
                             out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted(p.parent for p in out.rglob(".done"))
    seen = set()
    for run in runs:
        r = json.loads((run / "results.json").read_text())
        seen.add(r["configuration"])
        assert r["option_scoring"] == "likelihood" and r["epsilon"] == 4.0
        assert r["privacy_parameter"] == {"name": "epsilon", "value": 4.0,
                                          "unit": configurations.get(r["configuration"]).parameter_unit}
        rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        assert all(set(row["option_loglik"]) == {"yes", "no", "maybe"} for row in rows)
    assert seen == {"collab_custext", "collab_ldp_sampler", "collab_invisibleink"}


def test_decode_rates_split_the_step_times_by_example():
    from harness.collab.experiment import decode_rates, example_history

    assert decode_rates([[5, 6], [7], []], [0.5, 0.5, 0.25]) == [2.0, 4.0, None]
    rows = [{"token_er_at_5": 40.0, "floor_token_er_at_5": 10.0, "utility": 100.0},
            {"token_er_at_5": 0.0, "floor_token_er_at_5": 0.0, "utility": 0.0}]
    assert example_history(rows, 5, "accuracy", [2.0, None]) == [
        {"step": 0, "example/token_er_at_5": 40.0, "example/floor_token_er_at_5": 10.0, "example/accuracy": 100.0,
         "example/tokens_per_second": 2.0},
        {"step": 1, "example/token_er_at_5": 0.0, "example/floor_token_er_at_5": 0.0, "example/accuracy": 0.0}]


def test_report_keeps_ablations_out_of_the_curves_and_labels_them():
    from runners.report import collab as report
    from runners.report.runs import Run

    def run(name, eps, **extra):
        return Run(Path("."), name, "ok", {"configuration": name, "epsilon": eps, "alpha": 0.3, **extra})

    paper, edge_alone, small_pool = run("coveil", 1.0, candidates=100), run("collab_none", None, alpha=0.0), \
        run("coveil", 1.0, candidates=10)
    other = run("coveil", 4.0, candidates=100)
    group = report.CollabGroup(("m", "m", "b", 3, "cloud", ()), [paper, edge_alone, small_pool, other])
    setting = group.setting
    assert setting == {"alpha": 0.3, "candidates": 100}          # the most common values
    assert group.points == [paper, other]
    assert report._label(edge_alone, setting) == "collab_none α=0"
    assert report._label(small_pool, setting).endswith("|C|=10")
    assert report._label(paper, setting) == "coveil λ=1"           # no suffix in the main setting
    # A run from before results recorded the pool size: read from the resolved config in its provenance.
    older = Run(Path("."), "o", "ok", {"configuration": "coveil", "epsilon": 1.0, "alpha": 0.3,
                                       "provenance": {"config": {"collab": {"candidates": 1000}}}})
    assert report._label(older, setting).endswith("|C|=1000")
    assert report._knob(run("collab_none", None, candidates=10), "candidates") is None   # CoVeil's knob only


# --- batching (issue 50): every example's numbers the same at any batch size ----------------------------

_PARAMETERS = {"collab_none": None, "coveil": 1.0, "collab_cogenesis": 3.0, "collab_dp_logit": 1.0,
               "collab_dp_fusion": 0.5, "collab_custext": 4.0, "collab_ldp_sampler": 2.0, "collab_invisibleink": 64.0}


@pytest.fixture(scope="module")
def batching_setup(pair):
    """The smoke's pair (tiny-llama edge, tiny-llama-tied cloud) on 6 built-in examples, 6 tokens, EOS a token
    that the LDP sampler draws for one example at its third step: its rows stop at different steps (the tiny
    models' greedy answer is one token repeated, so greedy rows never meet it and run to the end)."""
    from harness.collab import protocol
    from harness.collab.edge_baselines import LDPSampler, Options, custext_table

    edge, cloud = pair
    vocab = engine.shared_vocab(edge.tokenizer, cloud.tokenizer)
    examples = benchmarks.load_benchmark(OmegaConf.create(dict(
        name="builtin", path=None, hub_id=None, n_examples=6, max_context_words=None,
        answer_critical=False))).examples
    probe = protocol.collaborate_all(protocol.Pair(edge.model, cloud.model, edge.tokenizer, vocab, None, batch_size=1),
                                     examples, LDPSampler(0.3, _PARAMETERS["collab_ldp_sampler"], 10.0), mode="edge",
                                     max_new_tokens=6, seed=3, view_top=20)
    eos = probe.output_ids[1][2]
    opts = Options(custext_table=custext_table(edge.model, edge.tokenizer, "victim", "euclidean"), max_new_tokens=6)
    return edge, cloud, vocab, examples, eos, opts


def _decode_at(setup, name, mode, batch_size, rng="per_example", private=True, same_model=False):
    from harness.collab import protocol
    from harness.collab.defences import make_defence

    edge, cloud, vocab, examples, eos, opts = setup
    model = cloud.model if same_model else edge.model
    p = protocol.Pair(model, cloud.model, edge.tokenizer, vocab, eos, batch_size=batch_size, rng=rng)
    d = make_defence(name, _PARAMETERS[name], alpha=0.3, candidates=20, dp_delta=1e-5, renyi_order=2.0,
                     baselines=opts)
    return protocol.collaborate_all(p, examples, d, mode=mode, max_new_tokens=6, seed=3, view_top=20, private=private)


def _exposures(sig):
    return [(e.op, e.step, e.channel, e.tensor) for e in sig.view.exposures]


def _runs():
    from harness.collab.config import MODES_OF

    return [(name, mode) for name in _PARAMETERS for mode in MODES_OF[name]]


@pytest.mark.parametrize("name, mode", _runs())
def test_every_defence_decodes_the_same_at_batch_1_and_4(batching_setup, name, mode):
    """Token for token, and every exposure to the last bit: the run, and its null (one shared forward)."""
    for private, same_model in ((True, False), (False, True)):
        one = _decode_at(batching_setup, name, mode, 1, private=private, same_model=same_model)
        four = _decode_at(batching_setup, name, mode, 4, private=private, same_model=same_model)
        assert one.output_ids == four.output_ids
        assert one.shared_forward == four.shared_forward == same_model
        a, b = _exposures(one), _exposures(four)
        assert [x[:3] for x in a] == [x[:3] for x in b]
        assert all(torch.equal(x[3], y[3]) for x, y in zip(a, b))
        if (name, private) == ("collab_ldp_sampler", True):
            lengths = [len(ids) for ids in one.output_ids]
            assert min(lengths) < 6 == max(lengths)         # a row stopped at EOS, others ran on


@pytest.mark.parametrize("name, mode", [r for r in _runs() if r[0] in ("collab_none", "coveil", "collab_cogenesis")
                                        or r == ("collab_dp_fusion", "cloud")])
def test_a_deterministic_defence_decodes_as_before_batching(batching_setup, name, mode):
    """rng=shared is the engine before batching (one example, one row a forward); a deterministic defence's
    batched tokens and exposed ids are its, the probabilities within float rounding (MKL's kernel for one row
    is not the one for four)."""
    old = _decode_at(batching_setup, name, mode, 1, rng="shared")
    new = _decode_at(batching_setup, name, mode, 4)
    assert old.output_ids == new.output_ids
    for (op, step, channel, x), (*_, y) in zip(_exposures(old), _exposures(new), strict=True):
        if channel == engine.UPLOADED_PROBS:
            assert torch.equal(x[:, 0], y[:, 0]) and torch.allclose(x[:, 1], y[:, 1], rtol=1e-6, atol=1e-12)
        else:
            assert torch.equal(x, y)


def test_each_example_draws_from_its_own_generator(batching_setup):
    """rng=per_example: an example's stream does not depend on the others (a subset decodes it the same)."""
    from harness.collab import protocol

    full = _decode_at(batching_setup, "collab_ldp_sampler", "edge", 4)
    edge, cloud, vocab, examples, eos, opts = batching_setup
    sub = _decode_at((edge, cloud, vocab, examples[3:], eos, opts), "collab_ldp_sampler", "edge", 4)
    assert sub.output_ids == full.output_ids[3:]
    g1, g2 = protocol.example_generator(3, "a"), protocol.example_generator(3, "a")
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
    assert not torch.equal(torch.rand(4, generator=protocol.example_generator(3, "a")),
                           torch.rand(4, generator=protocol.example_generator(4, "a")))


def test_floor_and_inversion_are_the_same_at_batch_1_and_4_and_as_generate(batching_setup):
    from harness.collab import protocol

    edge, cloud, vocab, examples, eos, _ = batching_setup
    floors = [protocol.cloud_alone(protocol.Pair(edge.model, cloud.model, edge.tokenizer, vocab, eos, batch_size=b),
                                   examples, max_new_tokens=6, top=5) for b in (1, 4)]
    assert floors[0].output_ids == floors[1].output_ids and floors[0].sets == floors[1].sets
    prompts_ = [prompts.encode(cloud.tokenizer, prompts.party_text(e, private=False)) for e in examples]
    texts = [leak.invert_all(cloud.model, cloud.tokenizer, prompts_, 5, batch_size=b, min_rows=4) for b in (1, 4)]
    assert texts[0] == texts[1]
    # The one-row path is transformers' generate at batch 1 (what the inversion was before batching).
    gen = [cloud.tokenizer.decode(_greedy_until_eos(cloud.model, ids, 5), skip_special_tokens=True) for ids in prompts_]
    assert leak.invert_all(cloud.model, cloud.tokenizer, prompts_, 5, batch_size=1, min_rows=1) == gen


def _greedy_until_eos(model, ids, n):
    x = torch.tensor([ids])
    return model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)[0, len(ids):]


def test_one_forward_for_a_null_decode_and_reuse_of_the_same_computation(tmp_path, batching_setup):
    """With one model in both roles, the null decodes' two parties are one forward (p_S = p_L), the same
    numbers as two copies of the model computing it twice; the undefended point's signals, null and second
    null are then decodes done once (results.json `decodes`)."""
    import copy

    edge, cloud, vocab, examples, eos, opts = batching_setup
    ids = [prompts.encode(cloud.tokenizer, prompts.party_text(e, private=False)) for e in examples]
    kw = dict(mode="cloud", max_new_tokens=6, vocab=vocab, eos=eos, example_ids=[e.id for e in examples], view_top=20)
    twin = copy.deepcopy(cloud.model)
    for d in (Defence(0.3), DPLogit(0.3, 1.0, 1e-5)):
        one = engine.collaborate_batch(cloud.model, cloud.model, ids, ids, d,
                                       rngs=[torch.Generator().manual_seed(i) for i in range(6)], **kw)
        two = engine.collaborate_batch(twin, cloud.model, ids, ids, d,
                                       rngs=[torch.Generator().manual_seed(i) for i in range(6)], **kw)
        assert [x.output_ids for x in one] == [x.output_ids for x in two]
        assert all(torch.equal(a.tensor, b.tensor) for x, y in zip(one, two) for a, b in zip(x.exposures, y.exposures))
    out = tmp_path / "out"
    res = run_cli_in_process(SMOKE + ["configuration=collab_none", "collab.cloud=null"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(next(out.rglob("results.json")).read_text())
    d = r["decodes"]
    assert d["signals"]["reused"] == "undefended" and d["null"]["reused"] == d["null_again"]["reused"] == "no_context"
    assert d["no_context"]["shared_forward"] and not d["undefended"]["shared_forward"]
    assert [k for k, v in d.items() if v["computed"]] == ["cloud_alone", "undefended", "no_context"]
    # Each party's prompt forwarded once: x_pub (the cloud alone's) then serves the undefended run's cloud and
    # the null's one forward; x_priv the undefended edge.
    assert r["prompt_forwards"] == {"computed": 6, "reused": 6}


def test_a_prompt_forward_served_from_the_prompt_cache_decodes_the_same(batching_setup):
    from harness.collab import protocol
    from harness.collab.batching import PromptCache

    edge, cloud, vocab, examples, eos, _ = batching_setup
    cache = PromptCache()
    runs = [protocol.collaborate_all(protocol.Pair(edge.model, cloud.model, edge.tokenizer, vocab, eos,
                                                   batch_size=b, rng=rng, prompt_cache=pc), examples, DPLogit(0.3, 1.0, 1e-5),
                                     mode="cloud", max_new_tokens=6, seed=3, view_top=20)
            for b, rng, pc in ((4, "per_example", None), (4, "per_example", cache), (4, "per_example", cache),
                               (1, "shared", None), (1, "shared", cache))]
    assert cache.computed == 12 and cache.reused == 24      # 6 examples × 2 prompts, then served
    for a, b in ((runs[0], runs[1]), (runs[0], runs[2]), (runs[3], runs[4])):
        assert a.output_ids == b.output_ids
        assert all(torch.equal(x[3], y[3]) for x, y in zip(_exposures(a), _exposures(b), strict=True))


def test_a_run_reads_the_same_at_batch_size_1_and_the_default(tmp_path):
    """End to end (a randomised edge-side defence, whose exposures are recomputed by the attacker): samples.jsonl
    and every metric but the timings are the same at collab.batch_size=1 and at the default."""
    results = {}
    for b in ("1", "null"):
        out = tmp_path / f"out{b}"
        res = run_cli_in_process(SMOKE + ["configuration=collab_dp_fusion", "collab.fusion=edge", f"collab.batch_size={b}"],
                                 out, tmp_path / f"cache{b}")
        assert res.returncode == 0, res.stderr[-3000:]
        run = next(out.rglob("results.json")).parent
        r = json.loads((run / "results.json").read_text())
        results[b] = ({k: v for k, v in r["metrics"].items() if "seconds" not in k}, r["batch_size"],
                      (run / "samples.jsonl").read_text())
    assert results["1"][0] == results["null"][0] and results["1"][2] == results["null"][2]
    assert (results["1"][1], results["null"][1]) == (1, 16)


def test_edge_side_exposure_sets_are_one_forward_per_synced_sequence(pair):
    """The audit's memo: the same query and synced tokens read from a second view cost no forward."""
    from harness.adversary_view import AdversaryView

    edge, cloud = pair
    vocab = len(edge.tokenizer)
    ex = benchmarks.load_benchmark(OmegaConf.create(dict(name="builtin", path=None, hub_id=None, n_examples=2,
                                                         max_context_words=None, answer_critical=False))).examples[0]
    c_ids = prompts.encode(edge.tokenizer, prompts.party_text(ex, private=False))
    kw = dict(max_new_tokens=4, vocab=vocab, eos=None, rng=torch.Generator(), example_id=ex.id, view_top=5)
    d = engine.collaborate(edge.model, cloud.model, c_ids, c_ids, Defence(0.3), mode="edge", **kw)
    memo: dict = {}
    first = leak.exposure_sets(AdversaryView(d.exposures), ex.id, cloud=cloud.model, vocab=vocab, top=5, memo=memo)
    assert first == leak.exposure_sets(AdversaryView(d.exposures), ex.id, cloud=cloud.model, vocab=vocab, top=5)

    def no_forward(*args, **kwargs):
        raise AssertionError("the memo should have served these sets")

    again = AdversaryView(list(d.exposures))
    assert leak.exposure_sets(again, ex.id, cloud=no_forward, vocab=vocab, top=5, memo=memo) == first


def test_report_rereads_stored_at_chance_under_the_earned_bound():
    """Results from before issue 51 (no earned interval): the n30 report's at_chance on [0.0, 0.0] reads
    inconclusive (30 agreeing examples bound the mean by ±11.6 pp); at 400 examples with a tight interval the
    floor (0.92 pp) fits within ±1 pp and at_chance stands; a leak is never touched."""
    from runners.report.collab import reread

    old = {"gate_margin_pp": 1.0, "null_excess_token_er": 0.0, "null_excess_token_er_ci": [0.0, 0.0]}
    assert reread(old, "at_chance", 30) == "inconclusive" and reread(old, "leak", 30) == "leak"
    tight = {**old, "null_excess_token_er_ci": [-0.05, 0.05]}
    assert reread(tight, "at_chance", 400) == "at_chance" and reread(tight, "at_chance", 300) == "inconclusive"
    assert reread({**old, "null_excess_token_er_earned_ci": [-0.9, 0.9]}, "at_chance", 30) == "at_chance"


def test_report_shows_the_earned_interval_and_the_margin_its_n_certifies(tmp_path):
    """A point whose 30 examples all agree with their null (t interval [0, 0]) through the verdict's own code, as
    results.json: its row shows inconclusive beside the interval it earned (±B·CP_U(0, 30) = ±11.6 pp, never zero
    width) and says, from its spread (here the negative control's ±3 pp), what n = 30 certifies and what ±1 pp
    needs."""
    from metrics.equivalence import certifiable_margin, examples_needed, zero_spread_bound
    from runners.report import collab as report
    from runners.report.runs import scan

    k, n = 100, 30
    rng = np.random.default_rng(0)

    def curves(values):
        return leak.Curves([{"token_er": {k: float(v)}} for v in values])

    null = rng.uniform(20, 60, n)
    noise = np.resize([3.0, -3.0], n)     # a second null ±3 pp from the null: the mechanism's own noise
    v = leak.verdict(curves(null), curves(null), (curves(null + rng.uniform(10, 30, n)), curves(null)),
                     (curves(null + noise), curves(null)), k, 1.0, 5.0)
    assert v["null_excess_token_er_ci"] == [0.0, 0.0] and v["verdict"] == "inconclusive"
    at_k = {str(k): 40.0}
    data = {"experiment": "collab", "status": "ok", "configuration": "collab_dp_logit", "epsilon": 4.0, "alpha": 0.3,
            "model": "m", "cloud_model": "m", "benchmark": {"name": "pubmedqa"}, "n_prompts": n, "fusion": "cloud",
            "verdict": v["verdict"], "controls": v,
            "utility": {"metric": "accuracy", "value": 50.0, "ci": [30.0, 70.0], "cloud_only": 50.0},
            **{f"{p}{m}_at_k": at_k for m in leak.METRICS for p in ("", "floor_", "excess_")}}
    run = tmp_path / "collab" / "dp_logit"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(data))
    (run / ".done").write_text("")
    [group] = report.groups(scan(tmp_path))
    row = next(line for line in report.table_md(group)[0].splitlines() if line.startswith("| collab_dp_logit"))
    *_, excess, earned, verdict, margin = [c.strip() for c in row.strip().strip("|").split("|")]
    h0 = zero_spread_bound(n, 100.0)
    assert excess == "0.0 [0.0, 0.0]" and earned == f"[{-h0:.1f}, {h0:.1f}]" == "[-11.6, 11.6]"
    assert verdict == "inconclusive"
    sd = 3.0 * math.sqrt(n / (n - 1))     # the ±3 pp differences' sample standard deviation
    reach, need = certifiable_margin(sd, n, per_item_bound=100.0), examples_needed(sd, 1.0, per_item_bound=100.0)
    assert reach > h0 and need > examples_needed(0.0, 1.0, per_item_bound=100.0) == 368   # the spread adds to the floor
    assert margin == f"n = 30 certifies ±{reach:.1f} pp, not ±1 pp; ±1 pp needs n = {need:,}"
