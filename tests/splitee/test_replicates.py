"""Mask replicates (mask_seeds) and EPN's n (epn_n): issue 15 items 3 and 4."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from metrics.replicates import pool

from ..conftest import run_cli_in_process

TINY = ["experiment=smoke", "workload.n_prompts=2", "generation.max_new_tokens=6", "generation.batch_size=2",
        "semantic_model=null"]


def test_pool_means_and_spread():
    seeds = [{"exact_match": 50.0, "bleu": 10.0, "flag": True, "sig": "a", "maybe": None},
             {"exact_match": 100.0, "bleu": 30.0, "flag": True, "sig": "b", "maybe": 1.0}]
    out = pool(seeds, spread=("exact_match",))
    assert out["exact_match"] == 75.0 and out["bleu"] == 20.0
    assert out["flag"] is True and out["sig"] is None and out["maybe"] is None
    assert out["exact_match_seed_sd"] == pytest.approx(statistics.stdev([50.0, 100.0]))
    assert (out["exact_match_seed_min"], out["exact_match_seed_max"]) == (50.0, 100.0)
    assert "bleu_seed_sd" not in out
    assert pool(seeds[:1], spread=("exact_match",)) == seeds[0]  # one seed: that seed's metrics, nothing added
    with pytest.raises(ValueError):
        pool([], spread=())


def _results(out):
    (path,) = out.rglob("results.json")
    samples = [json.loads(line) for line in path.with_name("samples.jsonl").read_text().splitlines()]
    return json.loads(path.read_text()), samples


def test_mask_seeds_replicate_the_masks_not_the_prompts(tmp_path):
    """Heavy noise (ε = 1e-5: the masks cancel up to floating-point error, which grows with σ) so that
    different mask seeds change the generations: each seed is its own
    realisation, the metrics are their mean, and the spread is reported."""
    done = run_cli_in_process([*TINY, "configuration=ep1", "epsilon=1e-5", "mask_seeds=[3,4,5]"], tmp_path / "out",
                              tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    results, samples = _results(tmp_path / "out")
    assert results["mask_seeds"] == [3, 4, 5]
    per_seed = [entry["metrics"] for entry in results["per_mask_seed"]]
    assert [entry["mask_seed"] for entry in results["per_mask_seed"]] == [3, 4, 5]
    for key in ("token_match_rate", "bleu", "rouge_l"):
        assert results["metrics"][key] == pytest.approx(statistics.fmean(m[key] for m in per_seed))
        assert results["metrics"][f"{key}_seed_sd"] == pytest.approx(statistics.stdev(m[key] for m in per_seed))
    by_seed = [s["output_ids_by_mask_seed"] for s in samples]
    assert all(s["output_ids"] == s["output_ids_by_mask_seed"]["3"] for s in samples)
    # Different seeds are different mask realisations: some generated ids differ between them.
    assert any(len({tuple(ids) for ids in row.values()}) > 1 for row in by_seed)


def test_epn_counts_the_prompts_text_tokens_by_default(tmp_path):
    runs = {}
    for reading in ("text", "input_ids"):
        out = tmp_path / reading
        done = run_cli_in_process([*TINY, "configuration=epn", f"epn_n={reading}"], out, tmp_path / "cache")
        assert done.returncode == 0, done.stderr
        runs[reading] = _results(out)
    text, template = runs["text"], runs["input_ids"]
    assert text[0]["epsilon_n"] == "text" and template[0]["epsilon_n"] == "input_ids"
    for results, samples in (text, template):
        expected = [1 / math.sqrt(s["epsilon_n_tokens"]) for s in samples]
        assert [s["epsilon"] for s in samples] == pytest.approx(expected)
        assert results["metrics"]["epsilon_mean"] == pytest.approx(statistics.fmean(expected))
        assert results["metrics"]["epsilon_nominal"] == pytest.approx(max(expected))
    # The chat template adds tokens: counting them lowers ε (the paper's figure counts the text alone).
    assert all(t["epsilon_n_tokens"] < i["epsilon_n_tokens"] == i["n_prompt_tokens"]
               for t, i in zip(text[1], template[1]))
