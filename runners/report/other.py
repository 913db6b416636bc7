"""Experiments without a section of their own (sections.py): their headline metrics, generically, so a
new experiment is reported before anyone writes its section."""
from __future__ import annotations

from collections.abc import Collection, Iterable

from runners.report.format import fmt_auto, fmt_eps, md_table, num
from runners.report.runs import Run


def tables_md(runs: Iterable[Run], dedicated: Collection[str]) -> list[tuple[str, str]]:
    """(experiment, markdown) for finished runs of experiments not in `dedicated`: every numeric metric,
    with its interval where one is recorded."""
    by_exp: dict[tuple[str, tuple[str, ...]], list[Run]] = {}
    for run in runs:
        if run.state == "ok" and run.experiment not in dedicated:
            by_exp.setdefault((run.experiment, run.tags), []).append(run)  # tagged runs: a table of their own
    out = []
    for (exp, tags), exp_runs in sorted(by_exp.items()):
        exp = exp + (f" (tagged {', '.join(tags)})" if tags else "")
        names: list[str] = []
        for run in exp_runs:
            for key, value in run.metrics.items():
                if key.endswith(("_ci_lo", "_ci_hi")) or key in names:
                    continue
                if num(value) is not None or isinstance(value, bool):
                    names.append(key)
        rows = []
        for run in sorted(exp_runs, key=lambda r: (str(r.data.get("configuration")), num(r.data.get("epsilon")) or 0)):
            m = run.metrics
            cells = [str(m[k]) if isinstance(m.get(k), bool) else fmt_auto(m.get(k), m.get(f"{k}_ci_lo"), m.get(f"{k}_ci_hi"))
                     for k in names]
            rows.append([run.rel, str(run.data.get("model")), str(run.data.get("configuration")),
                         fmt_eps(run.data.get("epsilon")), ", ".join(run.tags) or "—", *cells])
        out.append((exp, md_table(["run", "model", "configuration", "ε", "tags", *names], rows)))
    return out
