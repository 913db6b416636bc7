"""verdicts.json (issue 31 item 2): the SpliTEE verdict of every configuration and ε of a sweep, as a file.

The verdict of a configuration and ε is the worst (attacks/controls.worst: leak > inconclusive > at_chance)
over every attacker run against it among the reported runs: the learned and the Bayes attacker of each
`attack` run (runners/report/splitee/attack.py, the report's "Verdict per configuration and ε" table) and the MAP and
likelihood attackers of each `sequential_attack` run (attacks/sequential.summarise). Runs are grouped by
model, configuration, ε and tag set (a smoke run never decides a real configuration). Each entry names the
run(s) and attacker(s) whose verdict decided it and, for every inconclusive attacker, its reason. One kind of
verdict is set aside, and listed as such: a free-running sequential run's inconclusive where a
teacher-forced run of the same attacker is there, which bounds it (sequential_attack.set_aside).

`splitbench-report DIR` writes it (atomically) beside report.md, at the sweep root unless --out says
otherwise; it is rewritten from the runs each time, so it is never staler than the report.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attacks import controls
from harness.results import atomic_write_json
from runners.report.format import num
from runners.report.runs import Run
from runners.report.splitee import sequential_attack
from runners.report.splitee.attack import AttackRow, _why_bayes, _why_learned

FILE = "verdicts.json"
SET_ASIDE = ("free-running and inconclusive, bounded by a teacher-forced run of the same attacker "
             "(runners/report/splitee/sequential_attack.set_aside)")


def attackers(run: Run) -> list[dict[str, Any]]:
    """Every attacker verdict one finished run holds: {attacker, verdict, reason} (reason: why an
    inconclusive is inconclusive, or the sequential attacker's own sentence; None where none is recorded)."""
    out: list[dict[str, Any]] = []
    if run.experiment == "attack":
        row = AttackRow(run)
        for name, verdict, why in (("learned", row.learned_verdict, _why_learned),
                                   ("bayes", row.bayes_verdict, _why_bayes)):
            if verdict is not None:
                out.append({"attacker": name, "verdict": verdict, "reason": why(row)})
    elif run.experiment == "sequential_attack":
        out = sequential_attack.attacker_verdicts(run)
    return out


def collect(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One entry per (model, configuration, ε, tags) with at least one attacker verdict (module docstring)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        if run.state != "ok":
            continue
        for a in attackers(run):
            d = run.data
            key = (str(d.get("model")), str(d.get("configuration")), num(d.get("epsilon")), run.tags)
            groups.setdefault(key, []).append({"run": run.rel, "experiment": run.experiment, **a})
    out = []
    for (model, configuration, epsilon, tags), found in groups.items():
        count = sequential_attack.counted(found)
        worst = controls.worst([a["verdict"] for a in count])
        out.append({
            "model": model, "configuration": configuration, "epsilon": epsilon, "tags": list(tags),
            "verdict": worst,
            "decided_by": [{"run": a["run"], "attacker": a["attacker"], "reason": a["reason"]}
                           for a in count if a["verdict"] == worst],
            "inconclusive": [{"run": a["run"], "attacker": a["attacker"], "reason": a["reason"]}
                             for a in count if a["verdict"] == controls.INCONCLUSIVE],
            "set_aside": [{"run": a["run"], "attacker": a["attacker"], "reason": SET_ASIDE}
                          for a in sequential_attack.set_aside(found)],
            "attackers": found,
        })
    return sorted(out, key=lambda e: (e["tags"], e["model"], e["configuration"],
                                      -1.0 if e["epsilon"] is None else e["epsilon"]))


def write(runs: Sequence[Run], out: Path) -> Path:
    """out/verdicts.json (atomic) from the runs; written even when no run holds a verdict (then with no
    configurations), so that a file left by an earlier report never outlives its runs."""
    path = Path(out) / FILE
    atomic_write_json(path, {
        "description": "per (model, configuration, epsilon, tags): the worst verdict over every attacker run "
                       "against it (leak > inconclusive > at_chance), the run(s) and attacker(s) that decided it, "
                       "each inconclusive attacker's reason, and the verdicts set aside (a free-running "
                       "inconclusive bounded by a teacher-forced run of the same attacker)",
        "configurations": collect(runs),
    })
    return path
