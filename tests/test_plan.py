"""`splitbench --dry-run` / `--plan` (runners/plan.py): a sweep's jobs, which are finished, an estimate of the
rest from the wall time finished runs record, and nothing written."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .conftest import run_cli, run_cli_in_process


def _files(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")} if root.exists() else {}


def test_a_dry_run_lists_the_sweeps_jobs_marks_the_finished_one_and_writes_nothing(tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    done = run_cli_in_process(["experiment=smoke", "epsilon=1"], out, cache)  # one job of the sweep, really run
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "smoke/tiny-llama/ep1/eps=1/default/results.json").read_text())
    assert results["provenance"]["wall_s"] > 0                                 # what the estimate reads
    assert 0 < results["provenance"]["cpu_s"]                                  # what a sweep's CPU cost sums
    before = _files(tmp_path)
    plan = run_cli_in_process(["--dry-run", "-m", "experiment=smoke", "epsilon=1,2"], out, cache)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    assert lines[0].startswith("plan: 2 job(s), 2 run(s): 1 finished, 1 to run")
    assert "  finished  smoke/tiny-llama/ep1/eps=1/default" in lines
    assert "  to run    smoke/tiny-llama/ep1/eps=2/default" in lines
    assert any(line.startswith("estimate: smoke · tiny-llama: 1 run(s) to do × mean") for line in lines)
    assert _files(tmp_path) == before                                          # no run, no multirun.yaml, no lock
    assert not (out / "smoke/tiny-llama/ep1/eps=2").exists()


def test_a_dry_run_with_a_mistake_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for args in (["--plan", "experiment=smoke", "epsilon=1,2"],               # a sweep without -m
                 ["--plan", "-m", "experiment=smoke", "configuration=ep1,nope"],
                 ["--dry-run", "--config-name", "x", "experiment=smoke"]):
        res = run_cli(args, out, tmp_path / "cache")
        assert res.returncode == 2 and len(res.stderr_lines) == 1, (args, res.stderr)
        assert res.stderr_lines[0].startswith("splitbench: error: ")
    assert not out.exists() and os.listdir(tmp_path) in ([], ["cache"])
