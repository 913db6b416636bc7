"""lm-eval tasks shipped with splitbench, so that `splitbench-lm-eval` runs one with no download and no task file
of the user's: `splitbench_mc`, 20 four-way general-knowledge questions written for this repository
(data/lm_eval_tasks/splitbench_mc.jsonl; each answer position 0–3 five times, so always picking one position scores 25 %, the
chance floor). The wrapper (runners/lm_eval_model.py) passes this folder to lm-eval as `--include_path` unless
the command names one of its own.

The task's data is read by `load` (the YAML's `custom_dataset`) from the file next to it: `dataset_path: json`
with `data_files` would resolve a relative path against the working directory, not against the YAML.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TASKS_DIR = Path(__file__).resolve().parent / "data" / "lm_eval_tasks"   # data only: no code folder beside the systems'
TASKS = ("splitbench_mc",)


def load(**_: Any) -> Any:
    """The `splitbench_mc` documents as a DatasetDict with one `test` split, built in memory (no download, no
    cache). lm-eval calls it with the task's metadata as keywords, which the data does not depend on."""
    import datasets

    rows = [json.loads(line) for line in (TASKS_DIR / "splitbench_mc.jsonl").read_text().splitlines() if line]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def with_shipped_tasks(argv: list[str]) -> list[str]:
    """lm-eval command-line arguments with this folder as `--include_path`, where the command runs or lists
    tasks and names no include path of its own (lm-eval's CLI takes one; a user's own then wins, and the shipped
    task stays reachable as the file TASKS_DIR/splitbench_mc.yaml)."""
    args = argv[1:]
    if any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        return list(argv)
    if "--tasks" not in args and not any(a.startswith("--tasks=") for a in args) and args[:1] not in (["ls"], ["list"]):
        return list(argv)
    return [*argv, "--include_path", str(TASKS_DIR)]
