"""Finding the runs a report covers: every results.json under a directory, classified and filtered.

- `scan(root)` finds every results.json under a directory and classifies the run: finished ("ok":
  status ok *and* `.done`, harness/results.py), "failed", "unfinished" (results.json without `.done`, or
  a `.lock` without results.json: interrupted or still running) or "unreadable" (results.json torn or not a
  JSON object, its metrics not one, or a `.done` without results.json: a corrupt run).
- `data_problems(runs)`: one line per corrupt run and per metric of the wrong type, which splitbench-report
  and splitbench-export print as errors (exit code 2) rather than drop without a word.
- `select(runs, include_tags)` drops runs carrying a tag that is not included (by default every run
  tagged `smoke`): a smoke run on a random tiny model must never sit in a table beside real results.
  The tag set is also part of every table's group key, so even included tagged runs never share a
  table with untagged ones.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results import DONE, LOCK, RESULTS

DEFAULT_EXCLUDED_TAGS = frozenset({"smoke"})


@dataclass
class Run:
    """One run directory: where it is, what its results.json says, and whether it finished."""

    path: Path
    rel: str
    state: str                      # "ok" | "failed" | "unfinished" | "unreadable"
    data: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    @property
    def experiment(self) -> str:
        return str(self.data.get("experiment") or "?")

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(sorted(str(t) for t in (self.data.get("tags") or [])))

    @property
    def metrics(self) -> dict[str, Any]:
        return self.data.get("metrics") or {}

    @property
    def provenance(self) -> dict[str, Any]:
        return self.data.get("provenance") or {}

    @property
    def variant(self) -> str:
        """The run directory's override component (conf/hydra/default.yaml: .../eps=<ε>/<overrides>),
        "default" when there were none; "" when the directory does not follow that layout."""
        parts = Path(str(self.data.get("run_dir") or self.rel)).parts
        if len(parts) >= 2 and parts[-2].startswith("eps="):
            return parts[-1]
        return ""


def scan(root: Path) -> list[Run]:
    """Every run under `root` (recursively), sorted by relative path."""
    root = Path(root)
    runs: list[Run] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__"))
        here = Path(dirpath)
        rel = str(here.relative_to(root)) if here != root else "."
        if RESULTS in filenames:
            runs.append(_load(here, rel, done=DONE in filenames))
        elif DONE in filenames:
            runs.append(Run(here, rel, "unreadable", reason="results.json is missing beside .done"))
        elif LOCK in filenames:
            runs.append(Run(here, rel, "unfinished", reason="no results.json yet (running, or interrupted)"))
    return sorted(runs, key=lambda r: r.rel)


def _load(path: Path, rel: str, done: bool) -> Run:
    try:
        data = json.loads((path / RESULTS).read_text())
    except (OSError, ValueError) as exc:
        return Run(path, rel, "unreadable", reason=f"results.json: {type(exc).__name__}: {exc}")
    if not isinstance(data, dict):
        return Run(path, rel, "unreadable", reason="results.json is not a JSON object")
    status = data.get("status")
    if status == "failed":
        return Run(path, rel, "failed", data, reason=str(data.get("error") or "status failed"))
    if status != "ok":
        return Run(path, rel, "unfinished", data, reason=f"status {status!r}")
    if not done:
        return Run(path, rel, "unfinished", data, reason="status ok but no .done marker (interrupted while writing)")
    if not isinstance(data.get("metrics", {}), dict):
        return Run(path, rel, "unreadable", reason="results.json's metrics is not a JSON object")
    return Run(path, rel, "ok", data)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {str: "text", bool: "a flag", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def data_problems(runs: Iterable[Run]) -> list[str]:
    """One line per run or value a report or an export cannot use and would otherwise drop without a word:
    a run whose results.json cannot be read (state "unreadable": torn, not a JSON object, missing beside
    .done) and a metric of a finished run that should be a number and is not. A metric should be a number
    when it carries an interval (`<name>_ci_lo`/`_ci_hi`/`_ci`) or when another finished run of the same
    experiment stores a number under its name (a number per k, `{"1": v, "5": w}`, is one too); text and
    flags that are such in every run (verdicts, signatures, gates) are what they should be."""
    runs = list(runs)
    lines = [f"{r.rel}: {r.reason}: a corrupt run, left out (recompute it with rerun=true)"
             for r in runs if r.state == "unreadable"]
    finished = [r for r in runs if r.state == "ok"]
    numeric: dict[str, set[str]] = {}
    for r in finished:
        numeric.setdefault(r.experiment, set()).update(k for k, v in r.metrics.items() if _number(v))
    for r in finished:
        m = r.metrics
        for name, value in m.items():
            if value is None or _number(value) or (
                    isinstance(value, dict) and all(v is None or _number(v) for v in value.values())):
                continue   # a number, or one per k (collab's curves: {"1": v, "5": w})
            has_interval = any(f"{name}{suffix}" in m for suffix in ("_ci_lo", "_ci_hi", "_ci"))
            if has_interval or name in numeric[r.experiment]:
                lines.append(f"{r.rel}: metrics.{name} is {_kind(value)} ({json.dumps(value)[:40]}), not a number: "
                             "left out")
    return lines


@dataclass
class Selection:
    finished: list[Run]
    problems: list[Run]             # failed / unfinished / unreadable, after the tag filter
    skipped_tagged: list[Run]       # left out because of a tag that was not included
    included_tags: frozenset[str]

    @property
    def skipped_tags(self) -> list[str]:
        """The excluded tags that left runs out (for the hint that names `--include-tagged`)."""
        return sorted({t for r in self.skipped_tagged for t in r.tags} & DEFAULT_EXCLUDED_TAGS)


def select(runs: Iterable[Run], include_tags: Iterable[str] = ()) -> Selection:
    """Leave out runs carrying an excluded tag (`smoke` unless it is in `include_tags`)."""
    included = frozenset(include_tags)
    excluded = DEFAULT_EXCLUDED_TAGS - included
    finished, problems, skipped = [], [], []
    for run in runs:
        if excluded & set(run.tags):
            skipped.append(run)
        elif run.state == "ok":
            finished.append(run)
        else:
            problems.append(run)
    return Selection(finished, problems, skipped, included)


def finished_runs(runs: Iterable[Run], experiment: str) -> list[Run]:
    """The finished runs of one experiment (what a report section reads)."""
    return [r for r in runs if r.state == "ok" and r.experiment == experiment]


def cpu_fallback(run: Run) -> bool:
    """True when the run's accelerator side ran on the CPU (no CUDA) — its numbers compare CPU with CPU."""
    engines = run.provenance.get("engines") or {}
    if any(isinstance(e, dict) and e.get("accelerator_is_cpu_fallback") for e in engines.values()):
        return True
    if any(isinstance(r, dict) and r.get("device_is_cpu_fallback") for r in run.data.get("table") or []):
        return True
    return any("no CUDA" in str(n) for n in run.data.get("notes") or [])
