"""The lm-eval task splitbench ships (harness/lm_eval_tasks): `splitbench-lm-eval ... --tasks splitbench_mc` runs
offline with no --include_path, as the usage guide's example (docs/usage.md) writes it."""
from __future__ import annotations

import json
import tomllib
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

import pytest

from harness.lm_eval_tasks import TASKS_DIR, load, with_shipped_tasks

from .conftest import REPO

pytest.importorskip("lm_eval")


def test_the_shipped_folder_is_added_only_where_tasks_are_named_and_no_include_path_is():
    run = ["splitbench-lm-eval", "run", "--model", "splitbench", "--tasks", "splitbench_mc"]
    assert with_shipped_tasks(run) == [*run, "--include_path", str(TASKS_DIR)]
    assert with_shipped_tasks(["splitbench-lm-eval", "ls", "tasks"])[-2:] == ["--include_path", str(TASKS_DIR)]
    own = [*run, "--include_path", "/my/tasks"]
    assert with_shipped_tasks(own) == own                          # lm-eval takes one path: the user's wins
    assert with_shipped_tasks(["splitbench-lm-eval", "--help"]) == ["splitbench-lm-eval", "--help"]


def test_the_task_data_is_packaged_and_its_chance_floor_is_a_quarter():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data["harness"]
    for name in ("splitbench_mc.yaml", "splitbench_mc.jsonl"):
        assert (TASKS_DIR / name).is_file() and any(fnmatch(f"data/lm_eval_tasks/{name}", p) for p in patterns), name
    docs = load()["test"]
    assert len(docs) == 20 and all(len(d["choices"]) == 4 for d in docs)
    assert Counter(d["answer"] for d in docs) == {0: 5, 1: 5, 2: 5, 3: 5}   # one fixed position scores 25 %


def test_the_readme_example_runs_offline_without_an_include_path(tmp_path: Path, splitbench_lm_eval):
    readme = (REPO / "docs" / "usage.md").read_text()      # the example's home since the README was cut short
    assert "--tasks splitbench_mc" in readme and "model=tiny-llama,configuration=cpu" in readme
    proc = splitbench_lm_eval(["splitbench-lm-eval", "run", "--model", "splitbench", "--model_args",
                               "model=tiny-llama,configuration=cpu", "--tasks", "splitbench_mc", "--output_path",
                               str(tmp_path)], env={"HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = tmp_path.rglob("results_*.json")
    result = json.loads(path.read_text())
    assert result["n-samples"]["splitbench_mc"]["effective"] == 20
    assert 0.0 <= result["results"]["splitbench_mc"]["acc,none"] <= 1.0
