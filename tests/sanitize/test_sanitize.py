"""Token-level sanitisers (paper 001): the mechanisms against independent small computations, the prompt
layout (only text tokens change), the attackers and their controls, bad parameters, and the smoke sweep
through the command line."""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from attacks.sanitize import bayes, neighbours, scoring, window
from harness.errors import UserError
from harness.sanitize import mechanisms as M
from harness.sanitize.mechanisms import Settings
from harness.sanitize.tasks import MINI_SST2, Scored
from harness.token_embeddings import Table

from ..conftest import compose_config, run_cli_in_process


def _table(v=40, d=6, distance="euclidean", seed=0, candidates=None):
    g = torch.Generator().manual_seed(seed)
    vectors = torch.randn(v, d, generator=g)
    return Table(vectors, torch.arange(v) if candidates is None else candidates, distance)


def _brute_nearest(vectors, cands, q, distance, exclude=None):
    """argmin over candidates in numpy, written out (the independent reference)."""
    best, best_d = None, math.inf
    for c in cands:
        if c == exclude:
            continue
        e = vectors[c]
        d = (np.linalg.norm(q - e) if distance == "euclidean"
             else 1 - q @ e / (np.linalg.norm(q) * np.linalg.norm(e)))
        if d < best_d:
            best, best_d = c, d
    return best


# --- mechanisms -----------------------------------------------------------------------------------------

def test_window_weights_gaussian_normalised_and_even_windows_share_the_peak():
    offsets, w = M.window_offsets(5, 1.25)
    assert offsets == [-2, -1, 0, 1, 2]
    assert np.allclose(w, [math.exp(-o * o / (2 * 1.25 ** 2)) for o in offsets])
    offsets, w = M.window_offsets(4, 0.75)
    assert offsets == [-1, 0, 1, 2] and w[1] == pytest.approx(w[2]) and w[1] > w[0] == pytest.approx(w[3])
    f = M.window_matrix(6, 5, 1.25)
    assert torch.allclose(f.sum(1), torch.ones(6))
    # Row 0 is truncated: only offsets 0, 1, 2 exist, renormalised.
    raw = [math.exp(-o * o / (2 * 1.25 ** 2)) for o in (0, 1, 2)]
    assert np.allclose(f[0, :3].numpy(), np.array(raw) / sum(raw), atol=1e-6) and f[0, 3:].abs().sum() == 0


def test_quasi_embeddings_match_a_loop_and_never_cross_sequences():
    t = _table()
    seqs = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]]
    ids = torch.tensor(sum(seqs, []))
    seg = torch.tensor([0] * 7 + [1] * 3)
    got = M.quasi_embeddings(t.vectors, ids, seg, 4, 0.9)
    offsets, w = M.window_offsets(4, 0.9)
    rows = []
    for s in seqs:
        for i in range(len(s)):
            acc, tot = np.zeros(t.dim), 0.0
            for o, wo in zip(offsets, w):
                if 0 <= i + o < len(s):
                    acc += wo * t.vectors[s[i + o]].numpy()
                    tot += wo
            rows.append(acc / tot)
    assert np.allclose(got.numpy(), np.array(rows), atol=1e-5)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_stencil_is_the_nearest_token_other_than_the_original(distance):
    t = _table(distance=distance)
    seq = [3, 17, 5, 5, 22, 9, 31, 0]
    out = M.sanitize([seq], t, Settings("stencil", 3, 1.0), torch.Generator().manual_seed(0))[0]
    q = M.quasi_embeddings(t.vectors, torch.tensor(seq), torch.zeros(len(seq), dtype=torch.long), 3, 1.0).numpy()
    v = t.vectors.numpy()
    assert out == [_brute_nearest(v, range(40), q[i], distance, exclude=seq[i]) for i in range(len(seq))]
    assert all(a != b for a, b in zip(seq, out))


@pytest.mark.parametrize("bf16", [True, False])
def test_nearest_with_a_large_vocabulary_matches_brute_force(monkeypatch, bf16):
    """Above SHORTLIST_MIN_VOCAB the search shortlists in bf16 where the CPU multiplies bf16 natively and
    re-ranks in fp32, or scores in fp32 throughout: the same answers either way."""
    from harness import token_embeddings as embeddings

    monkeypatch.setattr(embeddings, "native_bf16", lambda: bf16)
    g = torch.Generator().manual_seed(1)
    t = Table(torch.randn(6000, 16, generator=g), torch.arange(6000))
    assert (t._cand_bf16 is not None) == bf16
    q = torch.randn(50, 16, generator=g)
    got = t.nearest(q, 3, exclude=torch.arange(50))
    d = torch.cdist(q, t.vectors)
    d[torch.arange(50), torch.arange(50)] = float("inf")
    assert torch.equal(got, d.topk(3, largest=False).indices)


def test_dx_noise_radius_has_mean_d_over_eta_and_uniform_direction():
    d, eta = 8, 2.0
    p = M.dx_noise(40000, d, eta, torch.Generator().manual_seed(0))
    r = p.norm(dim=1)
    # Gamma(d, 1/η): mean d/η = 4, sd √d/η ≈ 1.41, so the mean of 40,000 draws is within ±0.03 (4 SE).
    assert abs(r.mean().item() - d / eta) < 0.03
    assert abs(r.var().item() - d / eta ** 2) < 0.1
    u = p / r.unsqueeze(1)
    assert u.mean(0).abs().max().item() < 0.02          # no preferred direction


def test_dx_stencil_may_return_the_original_and_the_option_forbids_it():
    t = _table()
    seq = list(range(12))
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    # L = 1 and negligible noise: the quasi-embedding is E[t] itself, so the nearest token is the original.
    same = M.sanitize([seq], t, Settings("dx_stencil", 1, 1.0, parameter=1e9), gen())[0]
    assert same == seq
    never = M.sanitize([seq], t, Settings("dx_stencil", 1, 1.0, parameter=1e9, may_return_original=False), gen())[0]
    assert all(a != b for a, b in zip(seq, never))
    # dχ Noise with the same negligible noise is the identity as well.
    assert M.sanitize([seq], t, Settings("dx_noise", parameter=1e9), gen())[0] == seq


def test_custext_plus_probabilities_match_the_exponential_mechanism():
    t = _table(v=30)
    k, eps = 6, 3.0
    sets, probs = M.custext_sets(t, torch.tensor([4]), k, eps)
    v = t.vectors.numpy()
    dist = np.linalg.norm(v - v[4], axis=1)
    top = np.argsort(dist)[:k]
    sim = -dist[top]
    u = (sim - sim.min()) / (sim.max() - sim.min())
    expect = np.exp(eps * u / 2) / np.exp(eps * u / 2).sum()
    assert sets[0].tolist() == top.tolist() and sets[0, 0] == 4
    assert np.allclose(probs[0].numpy(), expect, atol=1e-6)
    # Sampling follows them: 20,000 copies of token 4.
    out = M.sanitize([[4] * 20000], t, Settings("custext_plus", parameter=eps, custext_k=k),
                     torch.Generator().manual_seed(0))[0]
    freq = Counter(out)
    for token, p in zip(top, expect):
        assert abs(freq[int(token)] / 20000 - p) < 0.015


def test_custext_plus_keeps_stop_words_and_nothing_changes_a_non_candidate():
    t = _table(candidates=torch.arange(1, 40))      # token 0 is out of the vocabulary (e.g. special)
    keep = torch.zeros(40, dtype=torch.bool)
    keep[7] = True                                   # a stop word
    seq = [0, 7, 12, 7, 0, 25]
    for s in (Settings("custext_plus", parameter=0.01, custext_k=10), Settings("stencil"),
              Settings("dx_noise", parameter=0.5)):
        out = M.sanitize([seq] * 50, t, s, torch.Generator().manual_seed(0), keep=keep)
        assert all(o[0] == 0 and o[4] == 0 for o in out)
        if s.mechanism == "custext_plus":
            assert all(o[1] == 7 and o[3] == 7 for o in out)
            assert any(o[2] != 12 for o in out)      # ε = 0.01: nearly uniform over the set


def test_an_empty_vocabulary_is_a_user_error():
    with pytest.raises(UserError, match="empty after filtering"):
        Table(torch.zeros(5, 2), torch.tensor([], dtype=torch.long))


def test_a_filter_that_leaves_no_token_is_one_user_error_line(tiny_sanitizer):
    from omegaconf import OmegaConf

    from harness.sanitize import sanitizer

    from ..conftest import CONF

    loaded = tiny_sanitizer[0]
    section = OmegaConf.load(CONF / "sanitize" / "default.yaml")
    section.vocab_filter = "zzqqzzqq"
    with pytest.raises(UserError, match="candidate vocabulary is empty after filtering") as err:
        sanitizer.build(section, "dx_noise", 1.0, loaded.model, loaded.tokenizer)
    assert "\n" not in str(err.value)


def test_only_the_text_tokens_of_a_templated_prompt_change(tiny_sanitizer):
    from harness.sanitize import prompts

    loaded, workload, sanitizer = tiny_sanitizer
    out = prompts.sanitize_prompts(sanitizer, workload.prompts, loaded.tokenizer, seed=0)
    specials = set(loaded.tokenizer.all_special_ids)
    for p, ids, (a, b), orig in zip(workload.prompts, out.input_ids, out.spans, out.original_text_ids):
        assert len(ids) == len(p.input_ids) and b - a == len(orig) and list(p.input_ids[a:b]) == orig
        assert list(ids[:a]) == list(p.input_ids[:a]) and list(ids[b:]) == list(p.input_ids[b:])
        assert any(t in specials for t in p.input_ids[:a])       # the chat template is there, and unchanged
        assert sum(x != y for x, y in zip(ids[a:b], orig)) == len(orig)   # Stencil changes every text token
    view = prompts.adversary_view(out, {"system": "sanitize"})
    assert view.channels() == ("sanitized_tokens",) and prompts.read_view(view) == out.text_ids()


@pytest.fixture(scope="module")
def tiny_sanitizer():
    from omegaconf import OmegaConf

    from harness.models import load_model, model_entry
    from harness.sanitize import sanitizer
    from harness.workloads import load_workload

    from ..conftest import CONF

    loaded = load_model(model_entry("tiny-llama"))
    wl = OmegaConf.load(CONF / "workload" / "builtin.yaml")
    wl.n_prompts = 2
    workload = load_workload(wl, loaded.tokenizer, 0)
    section = OmegaConf.load(CONF / "sanitize" / "default.yaml")
    return loaded, workload, sanitizer.build(section, "stencil", None, loaded.model, loaded.tokenizer)


# --- attacks --------------------------------------------------------------------------------------------

def test_custext_bayes_posterior_is_the_exact_likelihood_ranking():
    t = _table(v=30)
    s = Settings("custext_plus", parameter=2.0, custext_k=5)
    observed = [[4, 9, 13]]
    guesses = bayes.rank(observed, t, s, 5, bayes.BayesSettings(candidates=30, samples=64, local_vocab=256), seed=0)[0]
    sets, probs = M.custext_sets(t, torch.arange(30), 5, 2.0)
    for pos, tp in enumerate(observed[0]):
        lik = torch.tensor([float(probs[c][sets[c] == tp].sum()) for c in range(30)])
        best = lik.max()
        assert lik[guesses[pos, 0]] == pytest.approx(float(best))
        assert lik[guesses[pos]].tolist() == sorted(lik[guesses[pos]].tolist(), reverse=True)


def test_bayes_attacker_beats_neighbours_on_stencil_and_inverts_it_when_noise_free():
    """Stencil never returns the original, so the neighbour attacker's first guess (t' itself) is always
    wrong; the mechanism-aware attacker, simulating the mechanism, puts the truth first far more often."""
    t = _table(v=60, d=4, seed=3)
    g = torch.Generator().manual_seed(5)
    originals = [torch.randint(0, 60, (20,), generator=g).tolist() for _ in range(6)]
    s = Settings("stencil", 1, 1.0)      # L = 1: t' is the nearest other token to E[t]
    observed = M.sanitize(originals, t, s, torch.Generator().manual_seed(0))
    nb = neighbours.rank(observed, t, 5)
    by = bayes.rank(observed, t, s, 5, bayes.BayesSettings(candidates=60, local_vocab=60, samples=64), seed=0)
    wi = window.rank(observed, t, s, 5)
    top1 = lambda guesses: np.mean(scoring.hit_rates(originals, guesses, 5)[0])  # noqa: E731
    assert top1(nb) == 0.0
    assert top1(by) > 40.0 and top1(wi) > 10.0


def _exact_planar_likelihood(vectors, mean, observed, eta, n_theta=20000):
    """P(mean + p ∈ Vor(observed)) in d = 2 by quadrature over the direction of p: along each ray mean + r·u
    the cell is an interval of r (a convex cell), whose probability is a difference of the radius's
    Gamma(2, 1/η) CDF (mechanisms.dx_noise). The independent reference of the sampled likelihoods."""
    from scipy import stats

    v, e, mu = vectors.double().numpy(), vectors[observed].double().numpy(), np.asarray(mean, dtype=float)
    theta = (np.arange(n_theta) + 0.5) * 2 * math.pi / n_theta
    u = np.stack([np.cos(theta), np.sin(theta)], 1)
    lo, hi = np.zeros(n_theta), np.full(n_theta, np.inf)
    for j in range(len(v)):
        if j == observed:
            continue
        # ‖q − e‖² ≤ ‖q − v_j‖² with q = mu + r·u is a + r·b ≤ 0
        a, b = 2 * mu @ (v[j] - e) - (v[j] @ v[j] - e @ e), 2 * u @ (v[j] - e)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = -a / b
        hi, lo = np.where(b > 0, np.minimum(hi, r), hi), np.where(b < 0, np.maximum(lo, r), lo)
    cdf = stats.gamma(2, scale=1 / eta).cdf
    return float(np.where(hi > lo, cdf(hi) - cdf(lo), 0.0).mean())


def test_dx_likelihoods_match_the_exact_voronoi_probability():
    """The sampled P(t' | c) of dχ Noise, down to likelihoods of a few 1e-3, agree with the exact
    probability that E[c] + p falls in t''s Voronoi cell over the whole vocabulary (12 tokens in the plane;
    a 4-token prefilter, so most cells are decided by the full search): within 5 of the estimator's own
    standard errors, which are themselves at most √(P/M) (the MIS bound)."""
    vectors = torch.randn(12, 2, generator=torch.Generator().manual_seed(0))
    t, eta, samples = Table(vectors, torch.arange(12)), 2.0, 2000
    post = bayes.posterior([[3, 7]], t, Settings("dx_noise", parameter=eta), 12,
                           bayes.BayesSettings(candidates=12, samples=samples, local_vocab=4), seed=0)
    for i, tp in enumerate((3, 7)):
        for j in range(12):
            c = int(post.candidates[i, j])
            exact = _exact_planar_likelihood(vectors, vectors[c].numpy(), tp, eta)
            est, se = float(post.likelihood[i, j]), float(post.std_error[i, j])
            assert se <= math.sqrt(exact / samples) * 1.2 + 1e-4
            assert abs(est - exact) <= 5 * se + 1e-4, (tp, c, est, exact, se)
    assert float(post.likelihood.min()) < 0.01    # small likelihoods were in the test
    # The prefilter only saves work: the whole vocabulary as the local set gives the same estimates.
    full = bayes.posterior([[3, 7]], t, Settings("dx_noise", parameter=eta), 12,
                           bayes.BayesSettings(candidates=12, samples=samples, local_vocab=12), seed=0)
    assert torch.equal(full.likelihood, post.likelihood)


def test_excluding_dx_stencil_likelihood_matches_plain_simulation():
    """With the original excluded (dχ-Stencil, `may_return_original` false) the output depends on the
    candidate: the pooled estimate agrees with plain draws of each candidate through the mechanism itself
    (L = 1, so the quasi-embedding is E[c])."""
    vectors = torch.randn(10, 2, generator=torch.Generator().manual_seed(2))
    t = Table(vectors, torch.arange(10))
    s = Settings("dx_stencil", window=1, parameter=2.0, may_return_original=False)
    post = bayes.posterior([[4]], t, s, 10, bayes.BayesSettings(candidates=10, samples=1000, local_vocab=3), seed=1)
    n = 20000
    for j in range(10):
        c = int(post.candidates[0, j])
        out = M.sanitize([[c] * n], t, s, torch.Generator().manual_seed(100 + j))[0]
        p = sum(o == 4 for o in out) / n
        se = math.hypot(float(post.std_error[0, j]), math.sqrt(p * (1 - p) / n))
        assert abs(float(post.likelihood[0, j]) - p) <= 5 * se + 1e-4, (c, float(post.likelihood[0, j]), p)
    assert float(post.likelihood[0, 0]) == 0.0     # t' cannot come from itself


def test_bayes_top5_is_not_below_pr_at_5_under_a_uniform_prior():
    """Originals drawn uniformly from the candidates: the posterior with a uniform prior is then the
    Bayes rule for top-5, so its top-5 may not fall below Pr@5's beyond sampling error (paired over the same
    positions: mean difference ≥ −2 standard errors), at η where dχ Noise keeps from ~20% to ~65% of tokens.
    The attacker's draws are its own: a different run seed gives the same guesses up to sampling error."""
    g = torch.Generator().manual_seed(1)
    v = 300
    t = Table(torch.randn(v, 16, generator=g), torch.arange(v))
    for eta in (2.0, 4.0):
        s = Settings("dx_noise", parameter=eta)
        originals = [torch.randint(0, v, (100,), generator=g).tolist() for _ in range(4)]
        observed = M.sanitize(originals, t, s, torch.Generator().manual_seed(7))
        by = torch.cat(bayes.rank(observed, t, s, 5, bayes.BayesSettings(candidates=16, samples=64, local_vocab=4),
                                  seed=7))
        nb = torch.cat(neighbours.rank(observed, t, 5))
        truth = torch.tensor([x for p in originals for x in p]).unsqueeze(1)
        diff = (by == truth).any(1).float() - (nb == truth).any(1).float()
        assert float(diff.mean()) >= -2 * float(diff.std()) / math.sqrt(diff.numel()), (eta, float(diff.mean()))


def test_the_attacker_draws_from_its_own_stream():
    a = torch.rand(4, generator=bayes.attacker_generator(0))
    assert not torch.equal(a, torch.rand(4, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(a, torch.rand(4, generator=bayes.attacker_generator(0)))


def test_contextual_beam_search_finds_the_exact_map_sequence(tiny_sanitizer):
    """With a beam as wide as every path, (MAP) is found exactly: the best beam is the brute-force argmax of
    Σ log P_LM(t_i | prefix, t_<i) + log P(t'_i | t_i) over all C^n sequences, each scored by one full forward
    pass; a beam of 1 is the greedy path."""
    import itertools

    from attacks.sanitize import contextual

    model = tiny_sanitizer[0].model
    g = torch.Generator().manual_seed(3)
    n, c, prefix = 4, 3, [1, 17, 250]
    cands = torch.randint(5, 2000, (n, c), generator=g)
    loglik = torch.log(torch.rand(n, c, generator=g, dtype=torch.float64))

    def total(seq):
        ids = torch.tensor([prefix + list(seq)])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        lm = sum(float(logp[len(prefix) + i - 1, t]) for i, t in enumerate(seq))
        return lm + sum(float(loglik[i, (cands[i] == t).nonzero()[0, 0]]) for i, t in enumerate(seq))

    paths = [[int(cands[i, j]) for i, j in enumerate(js)] for js in itertools.product(range(c), repeat=n)]
    scored = sorted(paths, key=total, reverse=True)
    beams, scores = contextual.beam_search(model, prefix, cands, loglik, beam=c ** n)
    assert beams[0].tolist() == scored[0]
    assert float(scores[0]) == pytest.approx(total(scored[0]), abs=1e-4)
    seq: list[int] = []
    for i in range(n):
        seq.append(max((int(t) for t in cands[i]), key=lambda t: total(seq + [t])))
    beams1, _ = contextual.beam_search(model, prefix, cands, loglik, beam=1)
    assert beams1[0].tolist() == seq


def test_prior_gain_is_paired_and_its_verdict_needs_the_gain_to_clear_the_margin():
    from attacks.sanitize import contextual

    gain, verdict = contextual.prior_gain([50.0, 61.0, 71.0], [40.0, 50.0, 62.0], 1.0, positive_passed=True,
                                          negative_passed=True)
    d = np.array([10.0, 11.0, 9.0])
    half = 4.302652729911275 * d.std(ddof=1) / math.sqrt(3)     # t(0.975, 2)
    assert gain.mean == pytest.approx(d.mean()) and gain.lo == pytest.approx(d.mean() - half)
    assert verdict == "leak"
    # Unpaired, the two sets of rates overlap (40–62 against 50–71): the pairing is what resolves the gain.
    # The same rates as the prior alone, to within the margin: 3 prompts earn no more than ±B·CP_U(0, 3) = ±70.8 pp
    # (issue 51), so inconclusive; 400 such prompts earn ±0.92 pp and read at chance; a failed negative control
    # never does.
    _, few = contextual.prior_gain([40.0, 40.5, 45.0], [40.0, 40.0, 45.0], 1.0, positive_passed=True,
                                   negative_passed=True)
    assert few == "inconclusive"
    attacker, prior = [40.0, 40.5, 45.0, 44.5] * 100, [40.0, 40.0, 45.0, 45.0] * 100
    _, same = contextual.prior_gain(attacker, prior, 1.0, positive_passed=True, negative_passed=True)
    assert same == "at_chance"
    assert contextual.gain_earned(attacker, prior, contextual.paired_difference_t_ci(attacker, prior), 100.0) == \
        pytest.approx((-0.9179, 0.9179), abs=1e-4)
    _, failed = contextual.prior_gain(attacker, prior, 1.0, positive_passed=True, negative_passed=False)
    assert failed == "inconclusive"


def test_contextual_rates_at_the_edges_have_wilson_intervals(monkeypatch):
    """The contextual attacker's top-1/top-k and the prior's top-1 are rates over positions like the other
    attackers': every prompt at 100 % (or 0 %) reads Wilson's interval on the prompts, not a zero-width one."""
    from attacks.sanitize import contextual
    from metrics.proportions import wilson

    originals = [[5, 6, 7], [8, 9], [10, 11, 12], [13]]
    monkeypatch.setattr(contextual, "prior_hits", lambda model, prefix, originals: [[False] * len(o) for o in originals])

    def attacker(observed):   # always right, in its first guess
        return [torch.tensor([[t, 0, 1] for t in o]) for o in observed]

    score, _, extra = contextual.score(attacker, None, [], originals, originals, 2, 1.0, True)
    lo, _ = wilson(4, 4)
    assert (score.top1.mean, score.top1.lo, score.top1.hi) == pytest.approx((100.0, 100 * lo, 100.0))
    assert score.topk.lo == pytest.approx(100 * lo) and score.top1.lo < 60
    _, hi = wilson(0, 4)
    assert (extra["contextual_prior_top1"], extra["contextual_prior_top1_ci_lo"]) == (0.0, 0.0)
    assert extra["contextual_prior_top1_ci_hi"] == pytest.approx(100 * hi)


def test_contextual_likelihood_floor_and_public_prefix():
    from attacks.sanitize import contextual

    post = bayes.Posterior(torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[0.2, 0.0, 0.05], [0.0, 0.0, 0.0]]),
                           torch.zeros(2, 3))
    ll = contextual.log_likelihoods(post, "dx_noise")
    assert ll[0].tolist() == pytest.approx([math.log(0.2), math.log(0.025), math.log(0.05)])
    assert ll[1].tolist() == [0.0, 0.0, 0.0]
    assert contextual.log_likelihoods(post, "custext_plus")[0, 1] == -math.inf
    assert contextual.public_prefix([[1, 2, 3, 9], [1, 2, 4], [1, 2, 3]]) == [1, 2]


def test_curves_are_compared_at_the_pr_at_5_every_series_reaches():
    """Figs. 3 and 4 at matched privacy: accuracy read off each series' piecewise-linear η curve at the Pr@5
    multiples of 10 inside the common range (its midpoint when none is), nothing outside a curve."""
    from runners.report.sanitize import interpolate, matched_levels

    a, b = [(12.0, 60.0), (48.0, 70.0), (30.0, 66.0)], [(5.0, 50.0), (35.0, 65.0)]
    assert matched_levels([a, b]) == [20.0, 30.0]
    assert interpolate(a, 20.0) == pytest.approx(60.0 + 6.0 * 8 / 18) and interpolate(b, 20.0) == pytest.approx(57.5)
    assert interpolate(b, 40.0) is None and interpolate(a, 11.0) is None
    assert interpolate([(10.0, 50.0), (30.0, 60.0), (30.0, 62.0)], 20.0) == pytest.approx(55.5)   # same x averaged
    assert matched_levels([[(5.0, 1.0), (9.0, 2.0)], [(6.0, 1.0), (8.0, 3.0)]]) == [7.0]
    assert matched_levels([[(5.0, 1.0), (8.0, 2.0)], [(12.0, 1.0), (48.0, 3.0)]]) == []     # ranges apart
    assert matched_levels([a, [(20.0, 1.0)]]) == []                                        # one point: no curve


def test_learned_inverter_learns_the_identity(tiny_sanitizer):
    """Trained on text the identity mechanism left as it is, the ridge map is the centre embedding itself:
    every token of unseen prompts comes back first (a shifted window would not)."""
    from attacks.sanitize.learned import LearnedInverter
    from harness.sanitize import prompts

    loaded, workload, stencil = tiny_sanitizer
    identity = stencil.with_mechanism("identity")
    texts = prompts.sanitize_prompts(identity, workload.prompts, loaded.tokenizer, 0).original_text_ids
    guesses = LearnedInverter(identity, loaded.tokenizer, 1500, seed=0).rank(texts, 5)
    assert np.mean(scoring.hit_rates(texts, guesses, 5)[0]) > 95.0


def test_learned_decoder_reads_a_sanitiser_that_keeps_tokens_and_not_shuffled_pairs(tiny_sanitizer):
    """dχ Noise at η = 10⁶ on the 64-dim table moves an embedding by d/η ≈ 6·10⁻⁵: every token stays. The
    learned decoder (the frozen tiny model, a trained projection, the evidence head), trained on the
    corpus sanitised so, names nearly every original first, far above its exposure-free reference, and its
    deranged-view control stays at that reference; the same decoder trained on shuffled (features,
    tokens) pairs learns no reading and recovers little (what it gets is frequent tokens' share)."""
    from omegaconf import OmegaConf

    from attacks.sanitize.decoder import DecoderInverter, DecoderSettings
    from harness.sanitize import prompts
    from harness.sanitize.sanitizer import Sanitizer
    from harness.workloads import load_workload

    from ..conftest import CONF

    loaded, _, stencil = tiny_sanitizer
    keeper = Sanitizer(stencil.table, Settings("dx_noise", parameter=1e6), None, stencil.chunk)
    wl = OmegaConf.load(CONF / "workload" / "builtin.yaml")
    wl.n_prompts = 6
    workload = load_workload(wl, loaded.tokenizer, 0)
    out = prompts.sanitize_prompts(keeper, workload.prompts, loaded.tokenizer, 0)
    originals, observed = out.original_text_ids, out.text_ids()
    assert observed == originals
    # A wall-clock budget far above what 40 steps take, so the step cap ends training on a loaded machine too.
    settings = DecoderSettings(steps=40, minutes=60.0, corpus_tokens=1500, window=16, evidence_scale=30.0)
    results = {}
    for shuffled in (False, True):
        dec = DecoderInverter(keeper, loaded.model, loaded.tokenizer, settings, seed=0, shuffled=shuffled)
        assert dec.log.steps == 40 and dec.record()["head"] == "evidence"
        results[shuffled], guesses = scoring.score_attacker("decoder", lambda obs, d=dec: d.rank(obs, 5), originals,
                                                            observed, 5, 1.0, positive_passed=True)
        assert [g.shape for g in guesses] == [(len(o), 5) for o in originals]
    real, control = results[False], results[True]
    assert real.top1.mean > 90.0 and real.f1.lo > real.reference + 30.0 and real.verdict == "leak", real
    assert real.negative_passed
    assert control.top1.mean < 25.0 and control.top1.mean < real.top1.mean - 60.0, control
    assert control.verdict != "leak", control


def test_controls_flag_an_attacker_that_reads_the_truth():
    t = _table(v=50)
    g = torch.Generator().manual_seed(2)
    originals = [torch.randint(0, 50, (30,), generator=g).tolist() for _ in range(5)]
    observed = M.sanitize(originals, t, Settings("dx_noise", parameter=1e-3), torch.Generator().manual_seed(0))
    honest = lambda obs: neighbours.rank(obs, t, 5)  # noqa: E731
    score, _ = scoring.score_attacker("neighbours", honest, originals, observed, 5, 1.0, positive_passed=True)
    assert score.negative_passed and score.verdict != "leak"       # pure noise: nothing recovered
    # A broken attacker that ignores the view and returns the prompts: the deranged control catches it.
    cheat = lambda obs: [torch.tensor(o).unsqueeze(1).repeat(1, 5) for o in originals]  # noqa: E731
    bad, _ = scoring.score_attacker("cheat", cheat, originals, observed, 5, 1.0, positive_passed=True)
    assert not bad.negative_passed and bad.verdict == "inconclusive"
    # as a test (issue 52 item 4) the cheat scores the same on its own view and on the deranged one: AUC ½
    assert bad.roc["auc"] == 0.5 and bad.roc["positives"] == bad.roc["negatives"] == 5


# --- the command line -----------------------------------------------------------------------------------

BAD = {
    "eta": (["epsilon=-1"], "epsilon must be a finite number > 0"),
    "window": (["sanitize.window=0"], "sanitize.window (Stencil's L) must be >= 1"),
    "k": (["sanitize.custext_k=0"], "sanitize.custext_k must be >= 1"),
    "sigma": (["sanitize.sigma=0"], "sanitize.sigma must be a finite number > 0"),
    "decoder": (["sanitize.attack.decoder_steps=-1"], "sanitize.attack.decoder_steps must be >= 0"),
    "decoder_minutes": (["sanitize.attack.decoder_minutes=0"], "sanitize.attack.decoder_minutes must be a finite number > 0"),
    "corpus": (["sanitize.attack.corpus_path=/nonexistent/corpus.txt"],
               "sanitize.attack.corpus_path=/nonexistent/corpus.txt: no such file"),
}


def test_trained_attackers_read_their_public_text_from_corpus_path(tmp_path):
    """corpus_path replaces the built-in corpus: the pieces are that file's tokens, headings left out, in order."""
    from attacks.sanitize.learned import corpus_sequences

    class Tokens:   # one token per character: the pieces can be read back
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

    path = tmp_path / "public.txt"
    path.write_text(" = Heading = \nabcdef\n\nghij\n", encoding="utf-8")
    pieces = corpus_sequences(Tokens(), 8, length=3, path=str(path))
    assert ["".join(map(chr, p)) for p in pieces] == ["abc", "def", "gh"]
    assert corpus_sequences(Tokens(), 8, length=3) != pieces     # without it: the built-in corpus


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_parameters_are_one_user_error_line(name, hydra_conf):
    from harness import schema
    from runners.registry import runner_systems

    overrides, expected = BAD[name]
    cfg = compose_config(["experiment=sanitize_smoke", *overrides])
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")) as err:
        schema.validate(cfg, runner_systems())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args, expected", [
    (["sanitize.sigma=-0.5"], "sanitize.sigma must be a finite number > 0"),
    (["runner=attack"], "configuration=dx_stencil belongs to the sanitize system"),
])
def test_bad_input_through_the_cli_exits_2_with_one_line(tmp_path, args, expected):
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=sanitize_smoke", "hydra.mode=RUN", *args], out, tmp_path / "cache")
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr_lines if line.startswith("splitbench:")]
    assert len(lines) == 1 and expected in lines[0], res.stderr
    assert not any(p.is_file() for p in out.rglob("*"))


def test_constant_floor_is_the_most_frequent_gold_answers_share():
    assert Scored([100.0, 0.0, 0.0, 100.0], ["1", "0", "1", "1"], []).constant_floor == 75.0
    assert Scored([0.0] * 4, ["A", "B", "C", "D"], []).constant_floor == 25.0
    assert Scored([], [], []).constant_floor == 0.0


def test_smoke_sweep_runs_every_mechanism(tmp_path, monkeypatch):
    import wandb

    from ..test_wandb_mirror_offline import _Run

    mirrored: dict = {}     # a fake W&B run per job, by its name (the run directory under the sweep)
    monkeypatch.setattr(wandb, "init", lambda **kw: mirrored.setdefault(kw["name"], _Run()))
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=sanitize_smoke", "logger=wandb"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    # lm-eval's chatter (its seeds, the contexts it builds, its templates' defaults) stays off stdout (issue 54)
    assert not [line for line in res.stdout.splitlines() if "Setting random seed" in line or "[Task: " in line
                or "Building contexts" in line], res.stdout
    runs = {p.parent.parent.parent.name: p.parent for p in out.rglob("results.json")}
    assert sorted(runs) == ["custext_plus", "dx_noise", "dx_stencil", "stencil"]
    labels = Counter(json.loads(line)["label"] for line in MINI_SST2.read_text().splitlines() if line.strip())
    mini_floor = 100.0 * max(labels.values()) / sum(labels.values())
    for name, run in runs.items():
        r = json.loads((run / "results.json").read_text())
        m = r["metrics"]
        assert r["status"] == "ok" and r["system"] == "sanitize" and r["tags"] == ["smoke"]
        parameter = r["privacy_parameter"]   # Stencil has none; the others name theirs (eta, epsilon) and its unit
        assert (parameter["name"], parameter["value"]) == ((None, None) if name == "stencil" else
                                                           ({"custext_plus": "epsilon"}.get(name, "eta"), r["epsilon"]))
        assert (parameter["unit"] is None) == (name == "stencil")
        for key in ("accuracy", "pr_at_5", "bayes_top1", "verdict", "contextual_top1", "contextual_top5",
                    "contextual_prior_top1", "contextual_prior_gain_ci_lo", "contextual_verdict"):
            assert key in m, key
        assert m["contextual_prior_gain"] == pytest.approx(m["contextual_top1"] - m["contextual_prior_top1"])
        # Cost as data (issue 32 item 5): every attacker's wall time, per position, and its candidate count.
        attackers = [key[:-len("_verdict")] for key in m if key.endswith("_verdict") and key != "verdict"]
        assert {"neighbours", "bayes", "contextual", "decoder"} <= set(attackers)
        for a in attackers:
            assert m[f"{a}_seconds"] > 0 and m[f"{a}_seconds_per_position"] > 0, a
        assert m["neighbours_candidates_per_position"] == r["sanitize"]["candidate_vocabulary"]
        assert m["contextual_candidates_per_position"] == 2 * m["bayes_candidates_per_position"] == 2 * 16   # beam 2
        assert m["decoder_candidates_per_position"] is None
        # issue 52 item 4: each attacker's per-prompt F1 as a test, own view against the deranged one
        assert set(r["roc"]) == set(attackers)
        for a in attackers:
            test = r["roc"][a]
            assert test["positives"] == test["negatives"] == 3 and m[f"{a}_auc"] == test["auc"]
            assert test["auc_ci"][0] <= test["auc"] <= test["auc_ci"][1]
            assert m[f"{a}_tpr_at_fpr"] == {"0.1": None, "1": None, "10": None}   # 3 prompts resolve FPR >= 33 %
        from attacks.controls import strength
        strongest = max(attackers, key=lambda a: strength(m[f"{a}_token_f1"], m[f"{a}_token_f1_chance"]))
        assert m["auc"] == m[f"{strongest}_auc"]
        from attacks import controls
        assert m["verdict"] == controls.worst([v for key, v in m.items() if key.endswith("_verdict")])
        assert m["verdict"] in ("leak", "at_chance", "inconclusive") and 0 <= m["accuracy"] <= 100
        assert r["tradeoff"]["utility"]["metric"] == "accuracy" and r["tradeoff"]["leakage"]["metric"] == "token_f1"
        assert r["tradeoff"]["setting"] == "tasks sst2"      # one task set per cross-system point (issue 34)
        # The constant-answer floor is the majority label's share of the shipped SST-2 file; a random model has
        # no skill above it, and the chart's utility then says so.
        assert m["accuracy_floor_sst2"] == pytest.approx(mini_floor)
        assert m["accuracy_skill_sst2"] == (m["accuracy_unsanitized_sst2_ci_lo"] > mini_floor)
        skilled = m["accuracy_skill_sst2"]
        assert ("accuracy_skilled" in m) == skilled
        assert ("tasks above their constant-answer floor: sst2" if skilled else "no task above") \
            in r["tradeoff"]["utility"]["reference"]
        if skilled:
            assert r["tradeoff"]["utility"]["value"] == m["accuracy_skilled"] == m["accuracy_sst2"]
        assert (name == "stencil") == (r["epsilon"] is None)
        assert ("window_top1" in m) == (name in ("stencil", "dx_stencil"))
        assert "decoder_top1" in m and r["attack_training"]["decoder"]["steps"] == 10
        # The W&B step history: the decoder's training and validation loss at each of its validation steps.
        history = [(step, data) for step, data in mirrored[r["run_dir"]].logged if step is not None]
        val = r["attack_training"]["decoder"]["val_history"]
        assert [step for step, _ in history] == [step for step, _ in val] and len(val) >= 1
        assert [data["decoder/val_loss"] for _, data in history] == [loss for _, loss in val]
        assert all(set(data) == {"decoder/train_loss", "decoder/val_loss"} for _, data in history)
        assert "train_history" not in r["attack_training"]["decoder"]
        samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == 3 and all(len(s["output_ids"]) > len(s["original_text_ids"]) for s in samples)
        # lm-eval's own records of the accuracy beside them, one per example, agreeing with the metric.
        lm_samples = json.loads((run / "lm_eval_samples.json").read_text())["sst2"]
        assert [s["doc_id"] for s in lm_samples] == list(range(len(lm_samples)))
        assert 100.0 * sum(s["acc"] for s in lm_samples) / len(lm_samples) == pytest.approx(m["accuracy_sst2"])
        assert all(s["arguments"] and s["resps"] for s in lm_samples)
        view = torch.load(run / "view.pt", weights_only=False)
        assert view["meta"]["system"] == "sanitize" and {e["channel"] for e in view["exposures"]} == {"sanitized_tokens"}
        if name == "stencil":
            assert m["unchanged_rate"] == 0.0 and m["neighbours_top1"] == 0.0
            # Stencil never returns the original: the decoder's first guess is never the token it read.
            for s in samples:
                a, b = s["text_span"]
                assert all(g != t for g, t in zip(s["decoder_guess_ids"], s["output_ids"][a:b], strict=True))
    # The report section: one table row per run and the accuracy-vs-Pr@5 plot.
    from runners.report.cli import main as report

    assert report([str(out), "--include-tagged", "smoke", "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Token sanitisers (paper 001, Figs. 2–4)")[1].split("\n## ")[0]
    assert sum(line.startswith(f"| {n} |") for line in section.splitlines() for n in runs) == 4
    assert "contextual − prior (pp)" in section and f"({m['contextual_verdict']})" in section
    assert f"floor {mini_floor:.1f}" in section
    assert ("*no skill*" in section) == (not m["accuracy_skill_sst2"])
    assert "AUC [95% CI]" in section and "| bayes |" in section
    assert list((tmp_path / "report").glob("report_sanitize_*.png"))


def test_fidelity_runs_a_sanitiser_on_the_plain_engine(tmp_path):
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=smoke", "configuration=stencil", "workload.n_prompts=2",
                              "generation.max_new_tokens=2", "generation.batch_size=2", "semantic_model=null"], out,
                             tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    (path,) = out.rglob("results.json")
    r = json.loads(path.read_text())
    assert r["configuration"] == "stencil" and r["epsilon"] is None and r["status"] == "ok"
    assert r["provenance"]["engines"]["test"]["configuration"] == r["baseline"]   # the plain engine


def test_task_examples_record_where_they_came_from(tmp_path, monkeypatch):
    """harness/sanitize/tasks.py load_docs_with_source (results.json tasks.<name>.source): the bundled mini SST-2
    and a local file by sha256, a local MMLU folder by the digest of its files, a hub dataset by the commit its
    load was pinned to (harness.text_corpus.load_hub)."""
    import hashlib
    import sys
    import types

    from harness.sanitize.tasks import load_docs_with_source

    docs, source = load_docs_with_source("sst2", None, None, 0)
    assert docs and source == f"builtin:harness/data/sst2_mini.jsonl sha256={hashlib.sha256(MINI_SST2.read_bytes()).hexdigest()}"
    local = tmp_path / "qnli.jsonl"
    local.write_text('{"question": "q?", "sentence": "s.", "label": 0}\n', encoding="utf-8")
    docs, source = load_docs_with_source("qnli", str(local), None, 0)
    assert len(docs) == 1 and source == f"file:{local.resolve()} sha256={hashlib.sha256(local.read_bytes()).hexdigest()}"
    folder = tmp_path / "mmlu"
    folder.mkdir()
    (folder / "a_test.csv").write_text("question,choice0,choice1,choice2,choice3,answer\nq,w,x,y,z,B\n", encoding="utf-8")
    _, first = load_docs_with_source("mmlu", str(folder), None, 0)
    (folder / "a_test.csv").write_text("question,choice0,choice1,choice2,choice3,answer\nq,w,x,y,z,C\n", encoding="utf-8")
    _, second = load_docs_with_source("mmlu", str(folder), None, 0)
    assert first.startswith(f"file:{folder.resolve()} sha256=") and first != second   # the content, not the name

    commit = "c" * 40
    calls = []

    def load_dataset(hub_id, config, split, revision=None):
        calls.append(revision)
        return [{"question": "q?", "sentence": "s.", "label": 1}]

    errors = types.SimpleNamespace(DatasetsError=type("DatasetsError", (Exception,), {}))
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(
        load_dataset=load_dataset, load_dataset_builder=lambda *a: types.SimpleNamespace(hash=commit), exceptions=errors))
    docs, source = load_docs_with_source("qnli", None, None, 0)
    assert calls == [commit] and source == f"hub:nyu-mll/glue/qnli/validation@{commit}"


def test_the_suites_strongest_attacker_is_the_largest_excess_over_its_own_reference():
    """The run's chart point takes the attacker furthest above its own exposure-free reference, not the
    highest F1: a prior-driven guesser at 40 over a reference of 39 loses to one at 30 over 6."""
    from attacks.sanitize import suite
    from metrics.intervals import Estimate

    def score(name: str, f1: float, reference: float) -> scoring.AttackScore:
        e = Estimate(f1, f1 - 1, f1 + 1, 8)
        return scoring.AttackScore(name, e, e, e, reference, e, True, "leak", [])

    result = suite.SuiteResult(metrics={}, scores=[score("prior_driven", 40.0, 39.0), score("bayes", 30.0, 6.0)])
    assert result.strongest.name == "bayes"
    result = suite.SuiteResult(metrics={}, scores=[score("prior_driven", 40.0, 10.0), score("bayes", 30.0, 6.0)])
    assert result.strongest.name == "prior_driven"
