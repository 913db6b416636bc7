"""experiment=restore (runners/splitee/restore.py, paper Table 7) on a hand-made attack run: the restorer's text is
re-tokenised and scored by the attack's metrics, with a paired change and the restored floor."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.results import DONE, RESULTS, SAMPLES
from runners.report.plotting import Figures
from runners.report.runs import scan
from runners.report.splitee import restore as restore_section
from runners.splitee.restore import read_source

from ..conftest import run_cli_in_process

VICTIM = {"name": "tiny-llama-tied", "kind": "random", "revision": None, "architecture": "llama", "seed": 0,
          "hf_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "head_dim": 16, "intermediate_size": 128, "tie_word_embeddings": True}}
PROMPTS = [[1000 + i for i in range(12)], [2000 + i for i in range(12)], [3000 + i for i in range(12)]]


def _source(root: Path, *, experiment: str = "attack", done: bool = True) -> Path:
    run = root / "attack_run"
    run.mkdir(parents=True)
    samples = [{"id": f"p{i}", "prompt": f"prompt {i}", "prompt_ids": p,
                "output_ids": p[:6] + [5] * 6,       # half the prompt recovered, then a repeated token
                "bayes_output_ids": p} for i, p in enumerate(PROMPTS)]   # the Bayes attacker recovered all
    results = {"experiment": experiment, "experiment_name": "attack", "status": "ok", "model": "tiny-llama-tied",
               "workload": "builtin", "configuration": "t3", "epsilon": None, "config_hash": "abc",
               "attack": {"setting": "noise_free", "component": "qkv", "layer": 0},
               "metrics": {"verdict": "leak", "positive_control_pass": True, "negative_control_pass": True,
                           "bayes_positive_control_pass": True},
               "provenance": {"config": {"model": VICTIM, "attack": {"controls": {"gate_margin_pp": 1.0}}},
                              "code": {"commit": "c0ffee"}}}
    (run / RESULTS).write_text(json.dumps(results))
    (run / SAMPLES).write_text("".join(json.dumps(s) + "\n" for s in samples))
    if done:
        (run / DONE).write_text("")
    return run


def test_restore_scores_raw_and_restored_reconstructions(tmp_path):
    source = _source(tmp_path / "src")
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=restore_smoke", f'restore.source="{source}"', "semantic_model=null"], out,
                             tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    (path,) = list(out.rglob(RESULTS))
    r = json.loads(path.read_text())
    assert (r["configuration"], r["model"], r["restoration_model"]) == ("t3", "tiny-llama-tied", "tiny-llama-tied")
    learned, bayes = r["attackers"]["learned"], r["attackers"]["bayes"]
    # Raw scores follow from the hand-made reconstructions: 6 of the 12 guessed tokens are the prompt's.
    assert bayes["raw"]["token_f1"] == pytest.approx(100.0)
    assert learned["raw"]["token_precision"] == pytest.approx(100 * 6 / 12)
    assert learned["raw"]["token_recall"] == pytest.approx(100 * 6 / 12)
    # The change is paired: restored minus raw, per prompt.
    samples = [json.loads(line) for line in (path.parent / SAMPLES).read_text().splitlines()]
    deltas = [s["bayes_restored_token_f1"] - s["bayes_raw_token_f1"] for s in samples]
    assert bayes["delta_token_f1"] == pytest.approx(sum(deltas) / len(deltas))
    assert r["metrics"]["verdict"] == "leak"      # the source's leak stays the run's verdict
    assert r["tradeoff"]["leakage"]["metric"] == "token_f1" and r["tradeoff"]["utility"] is None
    md = "\n".join(restore_section.markdown(restore_section.groups(scan(out)), Figures(tmp_path)))
    assert "| Bayes attacker | token F1 % | 100.00 [100.00, 100.00] |" in md and "**p0**" in md


def test_a_missing_source_is_one_line_and_no_files(tmp_path):
    out = tmp_path / "out"
    missing = tmp_path / "nothing"
    res = run_cli_in_process(["experiment=restore_smoke", f'restore.source="{missing}"'], out, tmp_path / "cache")
    assert res.returncode == 2 and len(res.stderr_lines) == 1 and "no results.json there" in res.stderr, res.stderr
    assert not list(out.rglob(RESULTS))


@pytest.mark.parametrize("kind, message", [
    ("fidelity", "is a 'fidelity' run, not an attack run"),
    ("unfinished", "did not finish"),
])
def test_sources_that_are_not_finished_attack_runs(tmp_path, kind, message):
    source = _source(tmp_path, experiment="fidelity" if kind == "fidelity" else "attack", done=kind != "unfinished")
    with pytest.raises(UserError, match=message):
        read_source(source)
