"""Metric modules against hand-computed values and the libraries' own documented numbers."""

from __future__ import annotations

import inspect
import math
import zipfile

import numpy as np
import pytest
import sacrebleu
from scipy import stats

from metrics import intervals
from metrics.intervals import Estimate, bootstrap_ci, mean_ci, mean_t_ci, paired_difference_ci
from metrics.privacy import chance_floor, corpus_token_prf, token_prf
from metrics.proportions import proportion_ci, wilson
from metrics.semantic import SemanticModelError, assemble_split_zip, load_semantic_model, semantic_similarity
from metrics.text import (
    compare_generations,
    corpus_bleu,
    exact_match,
    first_divergence,
    rouge_l,
    sentence_bleu,
    token_match_rate,
)

# sacrebleu 2.x README ("Using SacreBLEU from Python", also the compatibility-API section), shipped
# in site-packages/sacrebleu-*.dist-info/METADATA:
#   sacrebleu.corpus_bleu(sys, refs) -> BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ...)
README_REFS = [
    ["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
    ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."],
]
README_SYS = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]


@pytest.fixture(scope="module")
def minilm():
    return load_semantic_model("all-MiniLM-L6-v2")


# --- intervals ---------------------------------------------------------------------------------------


def test_mean_t_ci_matches_student_t_by_hand():
    x = [1.0, 2.0, 3.0, 4.0, 10.0]
    # mean 4, s² = (9+4+1+0+36)/4 = 12.5
    half = stats.t.ppf(0.975, df=4) * math.sqrt(12.5) / math.sqrt(5)
    est = mean_t_ci(x)
    assert est.n == 5
    assert est.mean == pytest.approx(4.0, abs=1e-12)
    assert est.lo == pytest.approx(4.0 - half, abs=1e-9)
    assert est.hi == pytest.approx(4.0 + half, abs=1e-9)
    assert est.hi - est.lo == pytest.approx(2 * 2.7764451 * 3.5355339 / 2.2360680, rel=1e-6)


@pytest.mark.parametrize("estimator", [mean_ci, mean_t_ci])
def test_mean_intervals_degenerate_cases_collapse_exactly(estimator):
    assert estimator([42.0]) == Estimate(42.0, 42.0, 42.0, 1)
    # 0.1 three times: a float mean would be 0.10000000000000002 with a nonzero std.
    assert estimator([0.1, 0.1, 0.1]) == Estimate(0.1, 0.1, 0.1, 3)
    with pytest.raises(ValueError):
        estimator([])


def test_mean_t_ci_bounds_clip_a_percentage_interval():
    raw = mean_t_ci([100.0, 100.0, 0.0])
    assert raw.hi > 100.0  # the unclipped t interval leaves the metric's range
    clipped = mean_t_ci([100.0, 100.0, 0.0], bounds=(0.0, 100.0))
    assert (clipped.mean, clipped.lo, clipped.hi) == (raw.mean, 0.0, 100.0)


def test_mean_ci_is_the_seeded_percentile_bootstrap_of_the_mean():
    """mean_ci is bootstrap_ci of np.mean with the same resamples (2000, seed 0), computed without a Python
    loop over resamples, and in blocks of resamples at large n without changing a digit."""
    x = np.random.default_rng(4).lognormal(0.0, 1.0, 50)
    est = mean_ci(x)
    assert est == bootstrap_ci(x, np.mean, n_boot=2000, seed=0) == mean_ci(x)
    assert mean_ci(x, seed=1) != est
    small_blocks = pytest.MonkeyPatch.context()
    with small_blocks as mp:
        mp.setattr(intervals, "_RESAMPLE_CELLS", 7)     # 1 resample per block
        assert mean_ci(x) == est


def test_mean_ci_is_not_the_t_interval_on_a_skewed_sample():
    """A right-skewed sample, as sentence BLEU often is (most prompts near 1, a few high): the bootstrap interval
    reaches further above the mean than below it and stays above the smallest value, where mean ± t·s/√n is
    symmetric and reaches below 0. Fails if mean_ci goes back to the t interval."""
    x = [1.0] * 24 + [3.0, 5.0, 20.0, 60.0, 100.0]
    boot, t = mean_ci(x), mean_t_ci(x)
    assert boot.mean == t.mean
    assert t.hi - t.mean == pytest.approx(t.mean - t.lo) and t.lo < 0.0
    assert boot.hi - boot.mean > 1.2 * (boot.mean - boot.lo)
    assert boot.lo >= 1.0


def test_mean_ci_stays_below_100_without_clipping():
    """18 prompts at 100 and two lower ones: mean 95.5, whose t interval reaches 102.4; every resample's mean
    is at most 100, so the bootstrap's upper end is 100 with no bounds argument to clip it (there is none)."""
    x = [100.0] * 18 + [40.0, 70.0]
    t = mean_t_ci(x)
    assert t.hi == pytest.approx(102.4, abs=0.05)
    boot = mean_ci(x)
    assert boot.mean == 95.5 and boot.lo < 95.5 and boot.hi == 100.0
    assert "bounds" not in inspect.signature(mean_ci).parameters


def test_paired_difference_cancels_the_spread_between_units():
    a, b = [5.0, 3.0, 7.0, 4.0], [4.9, 2.9, 6.9, 3.9]
    paired = paired_difference_ci(a, b)
    assert paired.mean == pytest.approx(0.1) and paired.hi - paired.lo < 1e-9   # a constant difference
    assert mean_ci(a).lo < mean_ci(b).hi                                         # unpaired: overlapping
    with pytest.raises(ValueError, match="same units"):
        paired_difference_ci(a, b[:3])


def test_bootstrap_ci_is_seeded_and_close_to_t_for_a_mean():
    rng = np.random.default_rng(1)
    x = rng.normal(50.0, 10.0, size=400)
    a = bootstrap_ci(x, np.mean, n_boot=2000, seed=3)
    b = bootstrap_ci(x, np.mean, n_boot=2000, seed=3)
    t = mean_t_ci(x)
    assert a == b
    assert a.mean == pytest.approx(float(np.mean(x)), abs=1e-12)
    # For a mean of 400 normal values the percentile bootstrap and the t interval agree closely.
    assert a.lo == pytest.approx(t.lo, abs=0.25)
    assert a.hi == pytest.approx(t.hi, abs=0.25)
    assert bootstrap_ci([7.0], np.mean) == Estimate(7.0, 7.0, 7.0, 1)


# --- token level -------------------------------------------------------------------------------------


def test_token_match_rate_with_unequal_lengths():
    assert token_match_rate([1, 2, 3, 4], [1, 2, 9]) == 50.0  # positions 0,1 match; L = 4
    assert token_match_rate([1, 2], [1, 2, 3, 4]) == 50.0  # a strict prefix pays for the missing tail
    assert token_match_rate([5, 1, 2], [1, 2]) == 0.0  # no alignment: shifted sequences mismatch
    assert token_match_rate([], [3]) == 0.0
    assert token_match_rate([], []) == 100.0


def test_first_divergence_and_exact_match():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [7]) == 0
    assert exact_match([1, 2, 3], [1, 2, 3]) == 100.0
    assert exact_match([1, 2, 3], [1, 2]) == 0.0


# --- text level --------------------------------------------------------------------------------------


def test_sacrebleu_readme_value_and_our_corpus_bleu_equals_sacrebleu():
    assert sacrebleu.corpus_bleu(README_SYS, README_REFS).score == pytest.approx(48.53, abs=0.005)
    # Ours is single-reference: it must equal sacrebleu.corpus_bleu on the same data, and its bootstrap
    # (which recomputes BLEU from summed per-prompt statistics) must reproduce that value at full sample.
    ours = corpus_bleu(README_REFS[0], README_SYS)
    expected = sacrebleu.corpus_bleu(README_SYS, [README_REFS[0]]).score
    assert ours.estimate.mean == pytest.approx(expected, abs=1e-9)
    assert ours.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert ours.estimate.lo <= ours.estimate.mean <= ours.estimate.hi
    assert ours.estimate.lo < ours.estimate.hi


def test_corpus_bleu_from_statistics_equals_sacrebleu_on_mixed_corpus():
    from metrics.text import _bleu_from_stats, _sentence_bleu_metric

    refs = ["the quick brown fox jumps over the lazy dog", "a b c d e f", "hello there", "x"]
    hyps = ["the quick brown fox jumped over a lazy dog", "a b c d e f", "general kenobi", "x y"]
    rows = []
    for r, h in zip(refs, hyps):
        s = _sentence_bleu_metric().sentence_score(h, [r])
        rows.append([s.sys_len, s.ref_len, *s.counts, *s.totals])
    assert _bleu_from_stats(np.asarray(rows)) == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9
    )


def test_rouge_l_uses_the_stemmer():
    # Stemmed tokens: ref [the, cat, is, run], hyp [the, cat, run] -> LCS 3, P = 1, R = 3/4, F = 6/7.
    assert rouge_l("the cat is running", "the cats run") == pytest.approx(100 * 6 / 7, abs=1e-9)


def test_identical_texts_score_100_everywhere(minilm):
    texts = ["The cat sat on the mat.", "Paris is the capital of France.", "ok", ""]
    ids = [[5, 6, 7, 8], [9, 10, 11], [12], []]
    s = compare_generations(texts, list(texts), ids, [list(i) for i in ids], semantic_model=minilm).summary()
    for key in ("exact_match", "token_match_rate", "bleu_sentence_mean", "rouge_l"):
        assert s[key] == s[f"{key}_ci_hi"] == 100.0, key
    # The rates get Wilson's interval on 4 of 4 prompts, not a zero-width one; BLEU, ROUGE-L and the similarity
    # the interval 4 prompts earned (issue 51): 0 of 4 differing allows CP_U(0, 4) = 60.2 % to differ, each by up to
    # the metric's range, so 39.8 (0–100) and −20.5 (the similarity's −100–100), never [100, 100].
    for key in ("exact_match", "token_match_rate"):
        assert s[f"{key}_ci_lo"] == pytest.approx(100 * wilson(4, 4)[0]) and 40 < s[f"{key}_ci_lo"] < 60, key
    share = 1 - 0.025 ** (1 / 4)
    assert s["rouge_l_ci_lo"] == s["bleu_sentence_mean_ci_lo"] == pytest.approx(100 * (1 - share))
    assert s["semantic_similarity_ci_lo"] == pytest.approx(s["semantic_similarity"] - share * (s["semantic_similarity"] + 100))
    assert s["bleu"] == pytest.approx(100.0, abs=1e-9)
    assert s["semantic_similarity"] >= 99.9
    assert s["mean_first_divergence"] is None and s["n_diverging"] == 0
    assert s["n_prompts"] == 4
    assert s["bleu_signature"].startswith("nrefs:1|")
    p, r, f = token_prf(["The", "cat", "cat"], ["The", "cat", "cat"])
    assert (p, r, f) == (100.0, 100.0, 100.0)


def test_disjoint_texts_score_0():
    refs = ["alpha beta gamma delta", "one two three four five"]
    hyps = ["zeta eta theta iota", "six seven eight nine ten"]
    s = compare_generations(refs, hyps, [[1, 2, 3], [4, 5]], [[6, 7, 8], [9, 10, 11]]).summary()
    assert s["exact_match"] == s["exact_match_ci_lo"] == 0.0 and s["exact_match_ci_hi"] > 0
    assert s["token_match_rate"] == 0.0
    assert s["bleu"] == 0.0
    assert s["bleu_sentence_mean"] == 0.0
    assert s["rouge_l"] == 0.0
    assert s["semantic_similarity"] is None and s["semantic_similarity_ci_lo"] is None
    assert s["mean_first_divergence"] == 0.0 and s["n_diverging"] == 2
    assert token_prf(refs[0].split(), hyps[0].split()) == (0.0, 0.0, 0.0)
    assert sentence_bleu(refs[1], hyps[1]) == 0.0


def test_compare_generations_rows_and_summary_by_hand():
    refs = ["a b c d", "same text here", "x y z"]
    hyps = ["a b c e", "same text here", "x y"]
    ref_ids = [[1, 2, 3, 4], [7, 8], [9, 10, 11]]
    hyp_ids = [[1, 2, 3, 5], [7, 8], [9, 10]]
    fs = compare_generations(refs, hyps, ref_ids, hyp_ids)
    assert [r["first_divergence"] for r in fs.rows] == [3, None, 2]
    assert [r["token_match_rate"] for r in fs.rows] == pytest.approx([75.0, 100.0, 200 / 3])
    s = fs.summary()
    assert s["exact_match"] == pytest.approx(100 / 3)
    assert (s["exact_match_ci_lo"], s["exact_match_ci_hi"]) == pytest.approx(tuple(100 * x for x in wilson(1, 3)))
    assert s["token_match_rate"] == pytest.approx((75.0 + 100.0 + 200 / 3) / 3)
    assert s["mean_first_divergence"] == 2.5  # over the two diverging prompts only
    assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    with pytest.raises(ValueError, match="aligned"):
        compare_generations(refs, hyps[:2], ref_ids, hyp_ids)


# --- privacy -----------------------------------------------------------------------------------------


def test_token_prf_multiset_vs_set_by_hand():
    ref, hyp = list("aabc"), list("aaad")
    # multiset: overlap min(2,3) = 2 of 4 hyp and 4 ref tokens
    assert token_prf(ref, hyp, "multiset") == pytest.approx((50.0, 50.0, 50.0))
    # set: {a,b,c} vs {a,d}: overlap 1, P = 1/2, R = 1/3, F1 = 2/5
    assert token_prf(ref, hyp, "set") == pytest.approx((50.0, 100 / 3, 40.0))


def test_token_prf_empty_conventions():
    assert token_prf([], []) == (100.0, 100.0, 100.0)
    assert token_prf([], [1]) == (0.0, 0.0, 0.0)
    assert token_prf([1], [], "set") == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        token_prf([1], [1], "bag")


def test_micro_and_macro_differ_by_hand():
    refs = [["a"], ["b", "c", "d"]]
    hyps = [["a"], ["b", "x"]]
    # prompt 1: P = R = F1 = 100; prompt 2: overlap 1, P = 1/2, R = 1/3, F1 = 2/5
    macro = corpus_token_prf(refs, hyps, "multiset", "macro")
    assert (macro.precision.mean, macro.recall.mean, macro.f1.mean) == pytest.approx((75.0, 200 / 3, 70.0))
    # micro: overlap 2, hyp tokens 3, ref tokens 4 -> P = 2/3, R = 1/2, F1 = 4/7
    micro = corpus_token_prf(refs, hyps, "multiset", "micro")
    assert (micro.precision.mean, micro.recall.mean, micro.f1.mean) == pytest.approx(
        (200 / 3, 50.0, 400 / 7)
    )
    s = micro.summary()
    assert s["token_f1"] == pytest.approx(400 / 7) and s["token_prf_average"] == "micro"
    assert s["token_f1_ci_lo"] <= s["token_f1"] <= s["token_f1_ci_hi"]


def test_chance_floor_by_hand():
    prompts = [["a", "b"], ["b", "c"], ["d"]]
    # F1: (ab, bc) = 50, (ab, d) = 0, (bc, d) = 0, same for the reversed pairs -> mean 50/3
    assert chance_floor(prompts) == pytest.approx(50 / 3)
    assert chance_floor([["a", "a", "b"], ["a", "c"]], "set") == pytest.approx(50.0)
    with pytest.raises(ValueError):
        chance_floor([["a"]])


# --- semantic ----------------------------------------------------------------------------------------


def test_semantic_similarity_minilm(minilm):
    refs = ["The cat sat on the mat.", "The cat sat on the mat.", "The cat sat on the mat."]
    hyps = ["The cat sat on the mat.", "A cat is sitting on the mat.", "Quarterly tax filings are due in April."]
    same, paraphrase, unrelated = semantic_similarity(minilm, refs, hyps)
    assert same >= 99.9
    assert unrelated < 40.0
    assert paraphrase > unrelated + 30.0
    assert load_semantic_model("sentence-transformers/all-MiniLM-L6-v2") is minilm  # cached, not reloaded


def test_unknown_semantic_model_is_a_one_line_user_error():
    # metrics' own error (metrics/ imports nothing from harness/); runners/common.load_semantic raises it as a
    # UserError (tests/test_bad_input.py "semantic model dir empty")
    with pytest.raises(SemanticModelError) as exc:
        load_semantic_model("no-such-model-xyz")
    msg = str(exc.value)
    assert "\n" not in msg and "pip install" in msg and "all-mpnet-base-v2" in msg


def test_assemble_split_zip_concatenates_parts_atomically(tmp_path):
    src = tmp_path / "model.zip"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("tiny-model/modules.json", "[]")
        zf.writestr("tiny-model/1_Pooling/config.json", '{"x": 1}')
    blob = src.read_bytes()
    cuts = [0, len(blob) // 3, 2 * len(blob) // 3, len(blob)]
    parts = []
    for k in range(3):
        part = tmp_path / f"model.zip.{k + 1:03d}"
        part.write_bytes(blob[cuts[k] : cuts[k + 1]])
        parts.append(part)
    cache = tmp_path / "cache"
    target = assemble_split_zip(parts, cache / "tiny-model-0.1")
    assert (target / "modules.json").read_text() == "[]"
    assert (target / "1_Pooling" / "config.json").read_text() == '{"x": 1}'
    assert [p.name for p in cache.iterdir()] == ["tiny-model-0.1"]  # no temp dir left behind
    # Second call: the finished directory is reused and the parts are not read again.
    assert assemble_split_zip([tmp_path / "gone.001"], target) == target
    # Parts in the wrong order do not form a zip: one-line user error, nothing half-written.
    with pytest.raises(SemanticModelError):
        assemble_split_zip(parts[::-1], cache / "broken")
    assert [p.name for p in cache.iterdir()] == ["tiny-model-0.1"]


def test_proportion_ci_wilson_at_the_edges():
    # 15 of 15 prompts: Wilson's lower bound z²/(n+z²) ≈ 79.6 %, not the t interval's zero width.
    est = proportion_ci([100.0] * 15)
    assert est.mean == est.hi == 100.0 and est.n == 15
    z2 = 1.959963984540054 ** 2
    assert est.lo == pytest.approx(100 * 15 / (15 + z2)) and est.lo == pytest.approx(79.6, abs=0.05)
    none = proportion_ci([0.0] * 15)
    assert none.mean == none.lo == 0.0 and none.hi == pytest.approx(100 - est.lo)
    # 0/1 outcomes on another scale, and a mix of 0 and 100: Wilson on k of n.
    assert proportion_ci([1, 0, 1, 1], scale=1.0) == Estimate(0.75, *wilson(3, 4), 4)
    # Rates between the edges: mean_ci's bootstrap.
    assert proportion_ci([100.0, 50.0, 75.0]) == mean_ci([100.0, 50.0, 75.0])
    with pytest.raises(ValueError, match="rates in"):
        proportion_ci([101.0])
    with pytest.raises(ValueError, match="at least one"):
        proportion_ci([])


# --- issue 51: the bound a sample earned (metrics/equivalence.py) ------------------------------------------


def _certify(diffs, margin, bound=100.0):
    """controls.classify's verdict on paired differences with passing controls, as a verdict reads them."""
    from attacks import controls
    from metrics.equivalence import earned_interval
    from metrics.intervals import paired_difference_t_ci

    e = paired_difference_t_ci(list(diffs), [0.0] * len(diffs))
    earned = earned_interval(diffs, e.lo, e.hi, bound)
    return controls.classify(e.lo, e.hi, 0.0, margin, positive_passed=True, negative_passed=True,
                             certify=earned), e, earned


def test_thirty_zero_differences_certify_nothing_at_one_point():
    """30 examples that agree exactly: the t interval is [0, 0], but 0 differing of 30 allows 11.6 % of
    examples to differ (Clopper–Pearson, one-sided 97.5 %): at B = 100 pp the mean could be 11.6 pp."""
    verdict, e, (lo, hi) = _certify([0.0] * 30, 1.0)
    assert (e.lo, e.hi) == (0.0, 0.0) and verdict == "inconclusive"
    assert hi == pytest.approx(100 * (1 - 0.025 ** (1 / 30))) == pytest.approx(11.57, abs=0.01) and lo == -hi
    # the zero-width interval alone never certifies either, whoever forgets the earned one
    from attacks import controls

    assert controls.classify(0.0, 0.0, 0.0, 1.0, positive_passed=True, negative_passed=True) == "inconclusive"


def test_four_hundred_zero_differences_certify_one_point():
    """0 of 400: the one-sided 97.5 % Clopper–Pearson bound is 0.92 %, times B = 100 pp: 0.92 pp ≤ 1 pp."""
    from metrics.proportions import clopper_pearson

    verdict, _, (lo, hi) = _certify([0.0] * 400, 1.0)
    assert hi == pytest.approx(100 * clopper_pearson(0, 400)[1]) == pytest.approx(0.918, abs=1e-3)
    assert verdict == "at_chance" and lo == -hi
    # a smaller per-item bound fixed in advance (the positive control's largest effect) earns less width
    assert _certify([0.0] * 30, 1.0, bound=5.0)[0] == "at_chance"


@pytest.mark.parametrize("n", [10, 30, 400])
@pytest.mark.parametrize("x", [0.5, 1.0, 5.0, 60.0, 100.0, -1.0, -60.0])
def test_earned_bound_never_tightens_as_more_items_differ(n, x):
    """k = 0..n items that differ by x: the reach max(|lo|, |hi|) and the end on x's side never fall (the t
    interval alone goes from a positive width at k = 1 to [0, 0] at k = 0, and falls again at k = n)."""
    from metrics.equivalence import earned_interval, zero_spread_bound

    prev = None
    for k in range(n + 1):
        d = [x] * k + [0.0] * (n - k)
        e = mean_t_ci(d)
        lo, hi = earned_interval(d, e.lo, e.hi, 100.0)
        assert hi - lo >= 2 * zero_spread_bound(n, 100.0) - 1e-9 or max(-lo, hi) == 100.0
        now = (max(-lo, hi), hi if x > 0 else -lo)
        if prev is not None:
            assert now[0] >= prev[0] - 1e-9 and now[1] >= prev[1] - 1e-9, (k, prev, now)
        prev = now


@pytest.mark.parametrize("which", ["newcombe_paired", "newcombe_earned"])
def test_newcombe_paired_is_never_zero_width_and_is_monotone(which):
    """(a, 0, 0, a) gave [0, 0] (φ = 1 cancels the Wilson margins) and one discordant pair against the direction
    raised the upper end (0 → 2.79 % at (14, 0, 1, 15)); now the corner reaches ±CP_U(0, n), and the upper end
    never falls as b grows (the lower never rises as c grows), nor the reach as either does: Newcombe's interval
    (the floor) and the earned one alike."""
    from metrics.equivalence import _newcombe_vec
    from metrics.proportions import newcombe_earned, newcombe_paired

    def interval(a, b, c, d):
        return newcombe_paired(a, b, c, d)[1:] if which == "newcombe_paired" else newcombe_earned(a, b, c, d)

    lo, hi = interval(15, 0, 0, 15)
    assert hi == pytest.approx(1 - 0.025 ** (1 / 30)) and lo == -hi
    assert interval(200, 0, 0, 200)[1] == pytest.approx(0.00918, abs=1e-5)
    for a, d in ((15, 15), (20, 10), (200, 200), (300, 100), (29, 1), (0, 60)):
        ups = [interval(a, b, 0, d - b)[1] for b in range(min(d, 12) + 1)]
        assert all(v >= u - 1e-12 for u, v in zip(ups, ups[1:])), (a, d, ups)
        lows = [interval(a - c, 0, c, d)[0] for c in range(min(a, 12) + 1)]
        assert all(v <= u + 1e-12 for u, v in zip(lows, lows[1:])), (a, d, lows)
        reach = [max(-lo, hi) for lo, hi in (interval(a, b, 0, d - b) for b in range(min(d, 12) + 1))]
        assert all(v >= u - 1e-12 for u, v in zip(reach, reach[1:])), (a, d, reach)
    # the vectorised form the sizing rule simulates with is the same interval
    t = np.array([[15, 0, 0, 15], [200, 3, 1, 196], [10, 5, 0, 85], [200, 1, 0, 199]])
    lo, hi = _newcombe_vec(*t.T, earned=which == "newcombe_earned")
    assert np.allclose(np.c_[lo, hi], [interval(*r) for r in t.tolist()])


def test_newcombe_earned_reaches_the_exact_bound_with_one_discordant_pair():
    """(200, 1, 0, 199): Newcombe's upper end (with its floor) is 1.17 %; the exact bound on θ ≤ p_b is
    CP_U(1, 400) = 1.39 %, and the earned interval reaches 1.40 %. Far from the corner the earned interval
    contains Newcombe's and costs about a tenth of its width (20 % discordance of 400: the share's upper bound,
    24 %, sets the variance)."""
    from metrics.proportions import clopper_pearson, newcombe_earned, newcombe_paired

    assert newcombe_paired(200, 1, 0, 199)[2] < 0.012 < clopper_pearson(1, 400)[1] <= newcombe_earned(200, 1, 0, 199)[1]
    (e_lo, e_hi), (_, lo, hi) = newcombe_earned(60, 60, 20, 260), newcombe_paired(60, 60, 20, 260)
    assert e_lo <= lo and hi <= e_hi and (e_hi - e_lo) <= 1.15 * (hi - lo)


def test_earned_bound_covers_few_large_differences_where_t_does_not():
    """Valid beyond the corner: 400 items of which 2 % differ by 100 pp (mean 2 pp). The t interval's upper
    end misses the mean in about 10 % of samples (few, large differences: s runs low); the earned one in at
    most its nominal 2.5 % (2000 samples: ≤ 3.5 %)."""
    from metrics.equivalence import earned_interval

    rng = np.random.default_rng(0)
    t_miss = miss = 0
    for _ in range(2000):
        d = 100.0 * (rng.random(400) < 0.02)
        e = mean_t_ci(d)
        t_miss += e.hi < 2.0
        miss += earned_interval(d, e.lo, e.hi, 100.0)[1] < 2.0
    assert t_miss / 2000 > 0.06 and miss / 2000 <= 0.035, (t_miss, miss)


@pytest.mark.parametrize("x", [0.01, 1.0, 30.0, 100.0])
def test_a_bounded_metric_at_its_bound_earns_its_interval(x):
    """Table 2's BLEU / ROUGE-L / similarity read 100.0 [100.0, 100.0] over 30 prompts (issue 51). With the metric's
    range, mean_ci's interval (metric_range) is never zero-width: 30 prompts at 100 earn [88.4, 100] on a 0–100 metric, 200 earn
    [98.2, 100]; and k = 0..n prompts moving x below the bound never raise the lower end (each fixed resample's mean
    only falls, and so does the earned floor), nor does any lower end exceed the all-at-the-bound one."""
    from metrics.intervals import earned_range

    assert mean_ci([100.0] * 30, metric_range=(0, 100)).lo == pytest.approx(100 * 0.025 ** (1 / 30)) == \
        pytest.approx(88.43, abs=0.01)
    assert mean_ci([100.0] * 200, metric_range=(0, 100)).lo == pytest.approx(98.17, abs=0.01)
    assert mean_ci([100.0] * 30).lo == 100.0          # without bounds: the bootstrap as it was
    assert earned_range(0.0, 0.0, 0.0, 30, (0.0, 100.0)) == pytest.approx((0.0, 11.57), abs=0.01)
    n, prev = 30, None
    for k in range(n + 1):
        e = mean_ci([100.0 - x] * k + [100.0] * (n - k), metric_range=(0, 100))
        assert e.hi - e.lo > 0 and e.lo <= e.mean <= e.hi
        if prev is not None:
            assert e.lo <= prev + 1e-9, (k, prev, e)
        prev = e.lo
    # corpus BLEU's bootstrap of 30 identical texts: [100, 100] before; the same earned lower end now
    texts = [f"sentence number {i} says the same thing every time" for i in range(30)]
    b = corpus_bleu(texts, list(texts))
    assert b.estimate.hi == pytest.approx(100.0) and b.estimate.lo == pytest.approx(88.43, abs=0.01)
