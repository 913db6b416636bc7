"""The command line end to end on the tiny random Llama (a few seconds per run).

Covers DESIGN.md's contracts: exit code 2 and one stderr line for user errors found at run time (and no
files left; those refused while the config is composed or validated are the table of test_bad_input.py),
the results.json / samples.jsonl fields, skip-on-rerun, a sweep that is interrupted (a job crashing and
the whole process killed) and rerun does no finished job twice and ends where an uninterrupted sweep
ends, and an ε sweep over a configuration that ignores ε runs once.

The runs call the console script's entry point in the test process (conftest run_cli_in_process: the
same argv, environment and exit status, without paying the Python + torch start-up per run); the
interrupted sweep's first attempt is a real process, since it is killed.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from .conftest import REPO, run_cli, run_cli_in_process

# A tiny fidelity run: 2 prompts, 4 tokens, no semantic model (keeps each job about a second).
TINY = ["experiment=smoke", "workload.n_prompts=2", "generation.max_new_tokens=4", "generation.batch_size=2",
        "semantic_model=null"]


def tiny(*overrides: str) -> list[str]:
    """TINY with `overrides` in place of its values of the same keys: a key given twice is refused (issue 54)."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [a for a in TINY if a.split("=", 1)[0] not in keys] + list(overrides)

CONTRACT = ("experiment", "configuration", "epsilon", "model", "workload", "n_prompts", "status", "metrics",
            "provenance")

# Wraps the fidelity runner to count how often each job really runs, and to interrupt a sweep: the job
# whose name contains $SB_FAIL raises once, the one containing $SB_KILL kills the whole process once.
PROBE = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
import runners.splitee.fidelity as fidelity

_real = fidelity.run

def run(cfg, ctx):
    log = Path(os.environ["SB_COUNTER"])
    with log.open("a") as handle:
        handle.write(ctx.name + "\\n")
    for var, act in (("SB_FAIL", "fail"), ("SB_KILL", "kill")):
        key = os.environ.get(var)
        marker = log.with_name(log.name + "." + act)
        if key and key in ctx.name and not marker.exists():
            marker.write_text("")
            if act == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("simulated crash")
    return _real(cfg, ctx)

fidelity.run = run
from runners.run import main
main()
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(PROBE.format(repo=str(REPO)))
    return path


@pytest.fixture
def count_jobs(monkeypatch):
    """PROBE's counting for in-process runs: every job that really runs appends its name to the file
    `count_jobs(path)` names."""
    import runners.splitee.fidelity as fidelity

    real = fidelity.run

    def start(counter: Path) -> None:
        def run(cfg, ctx):
            with counter.open("a") as handle:
                handle.write(ctx.name + "\n")
            return real(cfg, ctx)

        monkeypatch.setattr(fidelity, "run", run)

    return start


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _runs(root: Path) -> dict[str, Path]:
    """Finished run dirs under root, by their path relative to root."""
    return {str(p.parent.relative_to(root)): p.parent for p in root.rglob(".done")}


def _counts(counter: Path) -> Counter:
    return Counter(counter.read_text().split()) if counter.exists() else Counter()


def _comparable(run_dir: Path) -> dict:
    """What must not depend on how the sweep got there: metrics (minus timings) and generated ids."""
    results = json.loads((run_dir / "results.json").read_text())
    metrics = {k: v for k, v in results["metrics"].items() if "seconds" not in k}
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    ids = [(s["id"], s["baseline_ids"], s["output_ids"]) for s in samples]
    return {"metrics": metrics, "ids": ids, "epsilon": results["epsilon"], "hash": results["config_hash"]}


@pytest.mark.parametrize("override, expected", [
    (["model=nope"], "no config option 'model/nope'"),
    (["model=llama-3.2-3b-instruct"], "meta-llama/Llama-3.2-3B-Instruct"),   # a hub model, offline
    (["configuration=gpu"], "needs CUDA"),
    (["generation.max_new_tokens=5000"], "exceeds the model's context"),
])
def test_user_errors_found_at_run_time_one_line_exit_2_no_files(tmp_path, override, expected):
    import torch

    if override == ["configuration=gpu"] and torch.cuda.is_available():
        pytest.skip("checks the no-CUDA path")
    out = tmp_path / "out"
    res = run_cli_in_process(tiny(*override), out, tmp_path / "cache")
    assert res.returncode == 2, res.stderr
    assert len(res.stderr_lines) == 1, res.stderr
    assert res.stderr_lines[0].startswith("splitbench: error: ") and expected in res.stderr_lines[0], res.stderr
    assert _files(out) == []


def test_smoke_run_contract_and_skip_on_rerun(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    res = run_cli_in_process(["experiment=smoke"], out, cache)
    assert res.returncode == 0, res.stderr
    run_dir = out / "smoke" / "tiny-llama" / "ep1" / "eps=1" / "default"
    assert sorted(p.name for p in run_dir.iterdir()) == [".done", "results.json", "samples.jsonl", "sensitivity.json"]
    results = json.loads((run_dir / "results.json").read_text())
    for key in CONTRACT:
        assert key in results, key
    assert (results["experiment"], results["configuration"], results["epsilon"], results["status"]) == \
        ("fidelity", "ep1", 1.0, "ok")
    assert results["model"] == "tiny-llama" and results["workload"] == "builtin" and results["n_prompts"] == 3
    assert results["tags"] == ["smoke"] and results["baseline"] in ("cpu", "gpu")
    assert results["privacy_parameter"] == {"name": "epsilon", "value": 1.0, "unit": "ε-GDP per exposure"}
    metrics = results["metrics"]
    for name in ("exact_match", "token_match_rate", "bleu", "rouge_l", "semantic_similarity"):
        assert 0.0 <= metrics[name] <= 100.0 and metrics[f"{name}_ci_lo"] <= metrics[name] <= metrics[f"{name}_ci_hi"]
    assert metrics["bleu_signature"].startswith("nrefs:1")
    prov = results["provenance"]
    assert prov["seed"] == 0 and prov["config"]["configuration"]["name"] == "ep1"
    assert prov["versions"]["torch"] and prov["versions"]["hydra-core"].startswith("1.3")
    import importlib.metadata

    for package in ("lm-eval", "flwr", "peft", "dp-accounting", "datasets"):   # the sibling systems' stack too
        assert prov["versions"][package] == importlib.metadata.version(package), package
    assert "commit" in prov["code"] and prov["tee_kind"] and prov["device"]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3
    for s in samples:
        assert len(s["output_ids"]) == 8 and len(s["baseline_ids"]) == 8  # exactly max_new_tokens
        assert {"id", "prompt", "output_text", "baseline_text", "exact_match", "token_match_rate"} <= set(s)
    # The terminal shows a short table.
    assert "exact_match" in res.stdout and "vs" in res.stdout

    # splitbench-export reads the run into one tidy table that pandas loads: one row per metric.
    import pandas as pd

    from runners.export import main as export_main
    table = tmp_path / "table"
    assert export_main([str(out), "--out", str(table)]) == 0
    df = pd.read_parquet(table.with_suffix(".parquet"))
    assert df.run_dir.unique().tolist() == ["smoke/tiny-llama/ep1/eps=1/default"]
    assert not df.metric.duplicated().any() and {"exact_match", "bleu", "rouge_l"} <= set(df.metric)
    em = df.set_index("metric").loc["exact_match"]
    assert (em.system, em.configuration, em.parameter, em.parameter_value, em.model, em.tags) == \
        ("splitee", "ep1", "epsilon", 1.0, "tiny-llama", "smoke")
    assert (em.value, em.ci_lo, em.ci_hi) == (metrics["exact_match"], metrics["exact_match_ci_lo"],
                                              metrics["exact_match_ci_hi"])

    # A rerun skips the finished run and touches none of its files.
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    again = run_cli_in_process(["experiment=smoke"], out, cache)
    assert again.returncode == 0 and "already complete" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before

    # Another system's parameter is not part of this run's identity: the same directory and config hash (so
    # the finished run is skipped, not refused as stale), and one line on stderr says it was left out.
    other = run_cli_in_process(["experiment=smoke", "collab.alpha=0.5"], out, cache)
    assert other.returncode == 0, other.stderr
    assert "skip smoke/tiny-llama/ep1/eps=1/default: already complete" in other.stdout
    assert other.stderr_lines == ["splitbench: note: runner fidelity does not read collab.alpha=0.5: left out of "
                                  "smoke/tiny-llama/ep1/eps=1/default and its config hash"]
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before
    assert [d.name for d in (out / "smoke" / "tiny-llama" / "ep1" / "eps=1").iterdir()] == ["default"]


def test_sweep_with_a_bad_job_and_a_stale_run(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    base = ["experiment=smoke", "workload.n_prompts=1", "generation.batch_size=1", "semantic_model=null"]
    # One job of the sweep is a user error: the others still run, the sweep ends with exit code 2.
    res = run_cli_in_process(["-m", *base, "generation.max_new_tokens=0,2"], out, cache)
    assert res.returncode == 2
    assert res.stderr_lines[-1].startswith("splitbench: error: the sweep finished with failed jobs, first ")
    assert "generation.max_new_tokens must be >= 1, got 0" in res.stderr_lines[-1]
    (name, run_dir), = _runs(out).items()
    assert "generation.max_new_tokens=2" in name
    assert not any("max_new_tokens=0" in str(p) for p in out.rglob("*"))  # the bad job left nothing

    # A finished run of a *different* config in the same directory is refused, not overwritten...
    single = [*base, "generation.max_new_tokens=2"]
    results = json.loads((run_dir / "results.json").read_text())
    (run_dir / "results.json").write_text(json.dumps({**results, "config_hash": "0" * 64}))
    refused = run_cli_in_process(single, out, cache)
    assert refused.returncode == 2 and len(refused.stderr_lines) == 1, refused.stderr
    assert "holds a finished run of a different config" in refused.stderr_lines[0]
    assert json.loads((run_dir / "results.json").read_text())["config_hash"] == "0" * 64
    # ...unless rerun=true, which recomputes it in place: the same numbers, the baseline from the cache.
    redone = run_cli_in_process([*single, "rerun=true"], out, cache)
    assert redone.returncode == 0, redone.stderr
    again = json.loads((run_dir / "results.json").read_text())
    assert again["config_hash"] == results["config_hash"] and again["metrics"]["exact_match"] == results["metrics"]["exact_match"]
    assert again["provenance"]["baseline_cache"]["hit"] is True


def test_interrupted_sweep_resumes_without_redoing_work(tmp_path, probe, count_jobs):
    sweep = ["-m", *TINY, "configuration=t3,ep1,slalom"]
    out, cache, counter = tmp_path / "out", tmp_path / "cache", tmp_path / "count"
    env = {"SB_COUNTER": str(counter), "SB_FAIL": "/ep1/", "SB_KILL": "/slalom/"}

    first = run_cli(sweep, out, cache, script=probe, env=env)
    assert first.returncode != 0  # killed by SIGKILL in the third job
    done = _runs(out)
    assert list(done) == ["smoke/tiny-llama/t3/eps=na/" + _rest()]
    failed = json.loads((out / "smoke/tiny-llama/ep1/eps=1" / _rest() / "results.json").read_text())
    assert failed["status"] == "failed" and "simulated crash" in failed["error"]
    t3_mtime = (out / next(iter(done)) / "results.json").stat().st_mtime_ns

    count_jobs(counter)   # the crash and the kill are spent: the retry only counts, in this process
    second = run_cli_in_process(sweep, out, cache)
    assert second.returncode == 0, second.stderr
    assert "already complete" in second.stdout
    assert (out / next(iter(done)) / "results.json").stat().st_mtime_ns == t3_mtime
    counts = _counts(counter)
    names = {c: f"smoke/tiny-llama/{c}/{'eps=1' if c == 'ep1' else 'eps=na'}/{_rest()}" for c in ("t3", "ep1", "slalom")}
    # t3 ran once; ep1 and slalom twice (the interrupted attempt and the retry), never a finished job again.
    assert counts == Counter({names["t3"]: 1, names["ep1"]: 2, names["slalom"]: 2})
    assert sorted(_runs(out)) == sorted(names.values())

    # The same sweep uninterrupted, from scratch, ends with the same results.
    clean_out, clean_cache = tmp_path / "clean", tmp_path / "clean-cache"
    clean = run_cli_in_process(sweep, clean_out, clean_cache)
    assert clean.returncode == 0, clean.stderr
    assert sorted(_runs(clean_out)) == sorted(_runs(out))
    for name, run_dir in _runs(out).items():
        assert _comparable(run_dir) == _comparable(clean_out / name), name


def _rest() -> str:
    return "generation.batch_size=2,generation.max_new_tokens=4,semantic_model=null,workload.n_prompts=2"


def test_epsilon_sweep_runs_ignoring_configurations_once(tmp_path, count_jobs):
    out, counter = tmp_path / "out", tmp_path / "count"
    count_jobs(counter)
    res = run_cli_in_process(["-m", *TINY, "configuration=ep1,epn", "epsilon=0.5,5,15"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    runs = _runs(out)
    assert sorted(runs) == sorted([f"smoke/tiny-llama/ep1/eps={e}/{_rest()}" for e in ("0.5", "5", "15")]
                                  + [f"smoke/tiny-llama/epn/eps=na/{_rest()}"])
    assert sum(_counts(counter).values()) == 4  # 6 jobs, 4 distinct runs
    assert res.stdout.count("ignores epsilon") == 2
    epn = json.loads((runs[f"smoke/tiny-llama/epn/eps=na/{_rest()}"] / "results.json").read_text())
    assert epn["epsilon"] is None
    # EPN's own ε, 1/√n per prompt (n: the prompt's text tokens by default), is recorded per prompt and on average.
    samples = [json.loads(line) for line in (runs[f"smoke/tiny-llama/epn/eps=na/{_rest()}"] / "samples.jsonl").read_text().splitlines()]
    assert epn["epsilon_n"] == "text"
    for s in samples:
        assert s["epsilon_n_tokens"] < s["n_prompt_tokens"]
        assert s["epsilon"] == pytest.approx(s["epsilon_n_tokens"] ** -0.5)
    assert epn["metrics"]["epsilon_mean"] == pytest.approx(sum(s["epsilon"] for s in samples) / len(samples))
    eps = {json.loads((d / "results.json").read_text())["epsilon"] for n, d in runs.items() if "/ep1/" in n}
    assert eps == {0.5, 5.0, 15.0}


@pytest.mark.parametrize("mode", ["prefix", "separate"])
def test_timing_run_table(tmp_path, mode, monkeypatch):
    import wandb

    from .test_wandb_mirror_offline import _Run

    mirrored = _Run()
    monkeypatch.setattr(wandb, "init", lambda **kw: mirrored)
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=timing_smoke", "timing.configurations=[cpu,t3,ep1]",
                              "timing.max_new_tokens=[2,3]", "workload.n_prompts=3", "generation.batch_size=2",
                              f"timing.mode={mode}", "logger=wandb"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    (run_dir,) = _runs(out).values()
    assert "/all/eps=1/" in str(run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    for key in CONTRACT:
        assert key in results, key
    rows = results["table"]
    assert [(r["configuration"], r["max_new_tokens"]) for r in rows] == \
        [(c, n) for c in ("cpu", "t3", "ep1") for n in (2, 3)]
    for r in rows:
        assert r["seconds_per_prompt"] > 0 and r["n_prompts"] == 3
        assert {"attention_proj_s", "ffn_proj_s", "lm_head_s", "masking_s", "crossing_s", "other_s"} <= set(r)
        # Batches of 2 and 1 prompts: each batch's seconds per prompt, and they add back up to the total.
        batch = r["batch_seconds_per_prompt"]
        assert len(batch) == 2 and r["seconds_per_prompt"] == pytest.approx((2 * batch[0] + batch[1]) / 3)
    assert rows[0]["masking_s"] == 0.0 and rows[-1]["masking_s"] > 0.0  # cpu masks nothing, ep1 does
    assert results["mode"] == mode
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * len(rows) and all(len(s["output_ids"]) == s["max_new_tokens"] for s in samples)
    # The 2-token outputs begin the 3-token ones, and t3 generates what cpu does, batch by batch.
    ids = {(s["configuration"], s["max_new_tokens"], s["id"]): s["output_ids"] for s in samples}
    assert all(ids[(c, 3, i)][:2] == ids[(c, 2, i)] for c, _, i in ids)
    assert all(ids[("t3", n, i)] == ids[("cpu", n, i)] for _, n, i in ids)
    if not results["cuda"]:
        assert "device side ran on the CPU" in " ".join(results["notes"]) and "device side ran on the CPU" in res.stdout
    # The W&B step history: each batch's tokens per second for every configuration and limit, one step per batch.
    history = [(step, data) for step, data in mirrored.logged if step is not None]
    assert [step for step, _ in history] == [0, 1]
    for step, data in history:
        assert set(data) == {f"batch_tokens_per_second/{r['configuration']}_{r['max_new_tokens']}" for r in rows}
        assert all(v > 0 for v in data.values())
    for r in rows:   # the batches' rates average back to the row's, weighted by their time
        rates = [d[f"batch_tokens_per_second/{r['configuration']}_{r['max_new_tokens']}"] for _, d in history]
        seconds = [2 * r["batch_seconds_per_prompt"][0], r["batch_seconds_per_prompt"][1]]
        assert sum(x * t for x, t in zip(rates, seconds)) / sum(seconds) == pytest.approx(r["tokens_per_second"])


# ---------------------------------------------------------------------------------------------------
# W&B mirror (in-process, with a fake wandb.init: nothing leaves the machine)
# ---------------------------------------------------------------------------------------------------


class _FakeRun:
    def __init__(self, fail_on_log: bool = False) -> None:
        self.summary: dict = {}
        self.logged: list = []
        self.finished = 0
        self.fail_on_log = fail_on_log

    def log(self, data):
        if self.fail_on_log:
            raise ConnectionError("upload refused\nwith detail")
        self.logged.append(data)

    def finish(self):
        self.finished += 1


def _logger_cfg(name: str = "wandb"):
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "logger": {"name": name, "project": "splitbench", "entity": None, "mode": "offline", "group": None},
        "experiment_name": "fidelity", "runner": "fidelity", "tags": ["smoke"], "seed": 0,
    })


def test_wandb_mirror_init_arguments_and_finish(tmp_path, monkeypatch):
    import wandb

    from harness.wandb_mirror import mirror

    calls, run = [], _FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kw: calls.append(kw) or run)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    results = {"metrics": {"bleu": 12.5, "bleu_signature": "nrefs:1"}, "status": "ok", "epsilon": 1.0}
    assert mirror(_logger_cfg(), tmp_path, results, [{"id": "a", "output_ids": [1, 2]}], name="m/ep1/eps=1/default")
    (kw,) = calls
    assert kw["group"] == "fidelity" and kw["job_type"] == "fidelity" and kw["mode"] == "disabled"  # env wins
    assert kw["config"]["seed"] == 0 and kw["dir"] == str(tmp_path) and kw["reinit"] == "finish_previous"
    assert run.summary["bleu"] == 12.5 and "bleu_signature" not in run.summary and run.summary["status"] == "ok"
    assert isinstance(run.logged[0]["samples"], wandb.Table)
    assert run.finished == 1
    assert mirror(_logger_cfg("none"), tmp_path, results, [], name="x") is False and len(calls) == 1  # logger=none: no W&B


def test_wandb_failure_is_one_warning_and_still_finishes(tmp_path, monkeypatch, capsys):
    import wandb

    from harness.wandb_mirror import mirror

    run = _FakeRun(fail_on_log=True)
    monkeypatch.setattr(wandb, "init", lambda **kw: run)
    assert mirror(_logger_cfg(), tmp_path, {"metrics": {}}, [{"id": "a"}], name="x") is False
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["splitbench: warning: W&B mirror failed, local results are kept: ConnectionError: upload refused"]
    assert run.finished == 1

    def refuse(**kw):
        raise RuntimeError("wandb.init timed out")

    monkeypatch.setattr(wandb, "init", refuse)
    assert mirror(_logger_cfg(), tmp_path, {"metrics": {}}, [], name="x") is False
    assert "RuntimeError: wandb.init timed out" in capsys.readouterr().err


def test_fidelity_run_mirrors_tokens_per_second_per_batch(tmp_path, monkeypatch):
    """A fidelity run's W&B step history: the tested configuration's tokens per second, one step per batch,
    and the baseline's where it was generated (here: a fresh cache); results.json holds the aggregate only."""
    import wandb

    from .test_wandb_mirror_offline import _Run

    mirrored = _Run()
    monkeypatch.setattr(wandb, "init", lambda **kw: mirrored)
    done = run_cli_in_process(tiny("workload.n_prompts=3", "logger=wandb"), tmp_path / "out", tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    (results,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("results.json")]
    history = [(step, data) for step, data in mirrored.logged if step is not None]
    assert [step for step, _ in history] == [0, 1]      # 3 prompts in batches of 2
    assert all(set(d) == {"batch_tokens_per_second", "baseline/batch_tokens_per_second"} for _, d in history)
    tokens = [2 * 4, 1 * 4]                             # max_new_tokens=4, no early stop
    seconds = [n / d["batch_tokens_per_second"] for n, (_, d) in zip(tokens, history)]
    assert sum(tokens) / sum(seconds) == pytest.approx(results["tokens_per_second"])
    assert mirrored.summary["tokens_per_second"] == results["tokens_per_second"]
    assert "batch_tokens_per_second" not in json.dumps(results)


def test_speed_history_names_each_mask_seed_and_the_baseline():
    from runners.splitee.fidelity import speed_history

    assert speed_history([0, 1], [[10.0, 12.0], [9.0, None]], [20.0, 21.0]) == [
        {"step": 0, "batch_tokens_per_second": 10.0, "batch_tokens_per_second/mask_seed1": 9.0,
         "baseline/batch_tokens_per_second": 20.0},
        {"step": 1, "batch_tokens_per_second": 12.0, "baseline/batch_tokens_per_second": 21.0}]
    assert speed_history([0], [[10.0]], None) == [{"step": 0, "batch_tokens_per_second": 10.0}]


def test_source_digest_follows_computing_code_not_reports(tmp_path):
    """Caches (baselines, trained attackers) are keyed on this digest: an edit to computing code must change
    it, an edit to the report (runners/report/, which only reads finished results) must not."""
    from harness.provenance import SOURCE_DIRS
    from harness.provenance import source_digest as cached

    source_digest = cached.__wrapped__     # the process-wide memo would hide the edits below
    for name in SOURCE_DIRS:
        (tmp_path / name).mkdir()
    (tmp_path / "runners" / "report").mkdir(parents=True)
    (tmp_path / "harness" / "engine.py").write_text("x = 1\n")
    (tmp_path / "runners" / "report" / "fidelity.py").write_text("y = 1\n")
    before = source_digest(tmp_path, SOURCE_DIRS)
    (tmp_path / "runners" / "report" / "fidelity.py").write_text("y = 2\n")
    assert source_digest(tmp_path, SOURCE_DIRS) == before
    (tmp_path / "harness" / "engine.py").write_text("x = 2\n")
    assert source_digest(tmp_path, SOURCE_DIRS) != before


def test_saved_view_says_what_produced_it(tmp_path):
    """engine.record_view=true saves view.pt beside the results, its meta naming the run that made it."""
    from harness.adversary_view import MASKED_INPUT, AdversaryView

    done = run_cli_in_process([*TINY, "engine.record_view=true", "epsilon=2"], tmp_path / "out", tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    (path,) = (tmp_path / "out").rglob("view.pt")
    view = AdversaryView.load(path)
    assert view.channels() == (MASKED_INPUT,) and view.exposures
    meta = {k: v for k, v in view.meta.items() if k != "code_digest"}
    assert meta == {"system": "splitee", "configuration": "ep1", "privacy_parameter": {"name": "epsilon", "value": 2.0},
                    "seed": 0, "model": "tiny-llama", "workload": "builtin"}
    assert len(view.meta["code_digest"]) == 64


def test_a_failure_record_has_every_runners_header(tmp_path, hydra_conf):
    """runners/run.py `_record_failure`: the header runners.common.results_header writes for every run (of the
    model and workload the config names, nothing scored), then status failed, the error and its trace."""
    from harness.results import RunDir
    from runners.common import results_header
    from runners.run import _record_failure

    from .conftest import compose_config

    cfg = compose_config(["experiment=smoke", "configuration=slalom"])
    try:
        raise RuntimeError("bank exhausted\nsecond line")
    except RuntimeError as exc:
        _record_failure(RunDir(tmp_path / "run"), cfg, "smoke/tiny-llama/slalom/eps=na/default", "0" * 64, exc)
    failed = json.loads((tmp_path / "run" / "results.json").read_text())
    assert not (tmp_path / "run" / ".done").exists()
    header = results_header(cfg, "fidelity", generation=False, model="tiny-llama", workload=cfg.workload.name)
    assert list(failed)[:len(header)] == list(header)
    assert failed.pop("traceback")[-1].startswith("RuntimeError: bank exhausted")
    assert failed == {**header, "status": "failed", "configuration": "slalom", "epsilon": None,
                      "error": "RuntimeError: bank exhausted", "metrics": {}, "tags": ["smoke"],
                      "config_hash": "0" * 64, "run_dir": "smoke/tiny-llama/slalom/eps=na/default"}
    assert (failed["experiment"], failed["experiment_name"], failed["model"], failed["n_prompts"]) == (
        "fidelity", "smoke", "tiny-llama", None)
