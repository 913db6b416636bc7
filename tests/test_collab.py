"""Cloud-edge collaborative decoding (paper 003): the defences against independent computations of the
paper's equations, the engine against plain greedy decoding, DecodeLeak's metrics on a hand-worked
example, the evidence rule, the verdict, bad input through the CLI, and experiment=collab_smoke end to end."""
from __future__ import annotations

import json
import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from attacks import collab_decodeleak as leak
from harness.collab import benchmarks, engine, prompts
from harness.collab.defences import CoGenesis, CoVeil, Defence, DPFusion, DPLogit, fuse, renyi_divergence
from metrics.answers import option_correct, stated_option
from metrics.evidence_recall import Vocabulary, first_rank, recall_curves, tokenise_evidence

from .conftest import CONF, run_cli


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


# --- the engine on tiny models ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    from harness.models import load_model

    edge = load_model(OmegaConf.load(CONF / "model" / "tiny-llama.yaml"))
    cloud = load_model(OmegaConf.load(CONF / "model" / "tiny-llama-tied.yaml"))
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


def test_stated_option():
    assert stated_option("No. Maybe later, yes.", ("yes", "no", "maybe")) == "no"
    assert stated_option("I cannot tell", ("yes", "no", "maybe")) is None
    assert option_correct("Yes, because", ("yes", "no", "maybe"), "yes") == 100.0


def test_verdict_rule_on_constructed_curves():
    def curves(values):
        return leak.Curves([{"token_er": {10: v}} for v in values])

    floor = curves([10, 20, 30, 40])
    high = curves([40, 52, 58, 75])
    same = curves([10, 20, 30, 40])
    v = leak.verdict(high, floor, None, same, 10, 1.0, 5.0)
    assert v["verdict"] == "leak" and v["positive_control_pass"] and v["negative_control_pass"]
    v = leak.verdict(same, floor, high, same, 10, 1.0, 5.0)
    assert v["verdict"] == "at_chance"
    v = leak.verdict(same, floor, same, same, 10, 1.0, 5.0)      # a positive control that fails
    assert v["verdict"] == "inconclusive" and not v["positive_control_pass"]
    v = leak.verdict(high, floor, None, high, 10, 1.0, 5.0)       # a negative control that leaks
    assert v["verdict"] == "inconclusive" and not v["negative_control_pass"]


# --- the command line ------------------------------------------------------------------------------------

SMOKE = ["experiment=collab_smoke", "hydra.mode=RUN"]


@pytest.mark.parametrize("args, expected", [
    (["collab.alpha=1.5"], "collab.alpha must lie in [0, 1], got 1.5"),
    (["collab.alpha=-0.1"], "collab.alpha must lie in [0, 1], got -0.1"),
    (["collab.metrics.ks=[0,5]"], "collab.metrics.ks must be a non-empty list of K >= 1"),
    (["collab.metrics.report_k=7"], "collab.metrics.report_k must be >= 1 and one of"),
    (["collab.candidates=0"], "collab.candidates must be >= 1, got 0"),
    (["epsilon=-1"], "epsilon must be a finite number > 0, got -1.0"),           # λ < 0
    (["configuration=collab_cogenesis", "collab.fusion=edge"], "defends cloud-side fusion only"),
    (["configuration=collab_cogenesis", "epsilon=2.5"], "a whole number >= 1, got 2.5"),
    (["configuration=collab_dp_logit", "collab.parameter_zero=true"], "has no parameter value 0"),
    (["configuration=ep1"], "belongs to the splitee system, which runner=collab does not run"),
    (["collab.fusion=both"], "collab.fusion='both' is not one of cloud, edge"),
    (["collab.benchmark.name=pubmedqa", "collab.benchmark.path=/nonexistent.json"], "is not a file"),
])
def test_bad_values_are_refused_before_any_model_loads(hydra_conf, args, expected):
    from harness import schema
    from harness.errors import UserError
    from runners.registry import runner_systems

    from .conftest import compose_config

    cfg = compose_config(["experiment=collab_smoke", *args])
    with pytest.raises(UserError) as e:
        schema.validate(cfg, runner_systems())
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_bad_input_through_the_cli_is_one_line_exit_2(tmp_path):
    res = run_cli([*SMOKE, "collab.alpha=1.5"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2, res.stderr
    assert res.stderr_lines == ["splitbench: error: collab.alpha must lie in [0, 1], got 1.5"]


def test_collab_smoke_experiment(tmp_path):
    out = tmp_path / "out"
    res = run_cli(["experiment=collab_smoke"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted(p.parent for p in out.rglob(".done"))
    assert len(runs) == 4
    seen = set()
    for run in runs:
        r = json.loads((run / "results.json").read_text())
        seen.add((r["configuration"], r["fusion"]))
        for key in ("token_er_at_k", "rouge1_er_at_k", "span_er_at_k", "auc_at_k", "floor_token_er_at_k",
                    "floor_rouge1_er_at_k", "floor_span_er_at_k", "floor_auc_at_k", "inversion_rouge1_recall",
                    "floor_inversion_rouge1_recall", "accuracy", "tradeoff", "verdict"):
            assert key in r, key
        assert set(r["token_er_at_k"]) == {"1", "5", "20"}
        assert r["verdict"] in ("leak", "at_chance", "inconclusive") and "smoke" in r["tags"]
        assert r["tradeoff"]["leakage"]["floor"] == r["floor_token_er_at_k"]["20"]
        from harness.adversary_view import AdversaryView

        view = AdversaryView.load(run / "view.pt")
        assert view.meta["system"] == "collab" and view.meta["configuration"] == r["configuration"]
        channel = engine.UPLOADED_PROBS if r["fusion"] == "cloud" else engine.SYNCED_TOKENS
        assert set(view.channels()) == {engine.PUBLIC_QUERY, channel}
    assert seen == {("coveil", "cloud"), ("coveil", "edge"), ("collab_dp_fusion", "cloud"), ("collab_dp_fusion", "edge")}
    # The report section renders both fusion modes with their plots.
    from runners.report.document import build

    build(out, tmp_path / "report", include_tags=("smoke",))
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Cloud-edge collaborative decoding (paper 003)" in text
    assert "cloud-side fusion" in text and "edge-side fusion" in text and "Matched utility" in text
    assert len(list((tmp_path / "report").glob("report_collab_*.png"))) == 4
