"""Token sanitisers (paper 001): one table per model × workload × task set, and accuracy against Pr@5 (the
paper's Fig. 2; its σ sweep, Fig. 3, and odd against even L, Fig. 4, are series of the same plot).

A row is one run: a mechanism at one parameter (η, ε; none for Stencil) with its window L and σ; cells are
**mean [95% interval]** over prompts (attacks) or examples (accuracy), in %.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from metrics import names
from runners.report.format import ci, file_slug, fmt_ci, md_table, num, tagged
from runners.report.plotting import Figures, mark_coincident, metric_axis, pyplot, save_axes
from runners.report.roc import table_md as roc_table
from runners.report.runs import Run, finished_runs

EXPERIMENT = "sanitize"
WINDOWED = ("stencil", "dx_stencil")
SYMBOL = {"eta": "η", "epsilon": "ε"}
INTRO = ("Each run sanitises the workload's prompts (text tokens only) and the inputs of each lm-eval task, then "
         "attacks the sanitised tokens: **Pr@5** (the paper's: the original among the 5 nearest neighbours of the "
         "substituted token), the mechanism-aware **Bayes** attacker (top-1 / top-5 of its posterior) and, for "
         "the window mechanisms, the **window** inverter, the **learned** ridge inverter and the attack suite's "
         "learned **decoder** (the victim model, frozen, with a trained projection and evidence head; top-1 = its "
         "greedy decoding), both trained on public text the attacker sanitised itself (— where not run), and the "
         "**contextual** reconstruction (the Bayes posterior times the victim LM's prior over the sequence, beam "
         "search; Tong et al., NAACL 2025), judged against the LM's **prior alone** (its top-1 given the true prefix "
         "and no view) on the same positions: the gain is paired per prompt, in percentage points. "
         "Accuracy is lm-eval zero-shot on the sanitised inputs "
         "(unsanitised: the same model and template on the original inputs). The verdict is the worst over the "
         "attackers (leak > inconclusive > at_chance), each against its own exposure-free reference. *Controls*: "
         "positive = the neighbour attacker on the unsanitised text (dose: the whole prompt), lower bound ≥ "
         "reference + the positive margin; it would catch a scoring that cannot see a channel that carries the "
         "prompt. Negative = each attacker on a deranged view (prompt i scored on prompt i+1's sanitised tokens, "
         "dose 0), lower bound ≤ reference + margin; it would catch an attacker that reads anything but the view.")


@dataclass
class SanitizeTable:
    tags: tuple[str, ...]
    model: str
    workload: str
    tasks: tuple[str, ...]
    runs: list[Run]

    @property
    def title(self) -> str:
        return tagged(f"{self.model} · {self.workload} prompts · tasks {', '.join(self.tasks)}", self.tags)

    @property
    def slug(self) -> str:
        return file_slug(f"{self.model}_{self.workload}_{'_'.join(self.tasks)}_{'_'.join(self.tags)}")


def groups(runs: Sequence[Run]) -> list[SanitizeTable]:
    tables: dict[tuple, SanitizeTable] = {}
    for run in finished_runs(runs, EXPERIMENT):
        d = run.data
        key = (run.tags, str(d.get("model")), str(d.get("workload")), tuple(d.get("tasks") or ()))
        tables.setdefault(key, SanitizeTable(*key, runs=[])).runs.append(run)
    for t in tables.values():
        t.runs.sort(key=_order)
    return [tables[k] for k in sorted(tables)]


def _mech(run: Run) -> dict[str, Any]:
    return run.data.get("mechanism") or {}


def _order(run: Run) -> tuple:
    m = _mech(run)
    return (str(run.data.get("configuration")), int(m.get("window") or 0), float(m.get("sigma") or 0),
            num(run.data.get("epsilon")) or 0.0, run.rel)


def _parameter(run: Run) -> str:
    p = run.data.get("privacy_parameter") or {}
    value = num(p.get("value"))
    return "—" if value is None else f"{SYMBOL.get(p.get('name'), p.get('name'))}={value:g}"


def _cell(m: dict[str, Any], key: str) -> str:
    if m.get(key) is None:
        return "—"
    return fmt_ci(*ci(m, key), digits=1)


def series_label(run: Run) -> str:
    """The plot's series: a mechanism, and for the window mechanisms its L (parity) and σ."""
    name = str(run.data.get("configuration"))
    if name not in WINDOWED:
        return name
    m = _mech(run)
    window = int(m.get("window") or 0)
    return f"{name} L={window} ({'even' if window % 2 == 0 else 'odd'}) σ={float(m.get('sigma') or 0):g}"


def table_md(table: SanitizeTable) -> str:
    heads = ["mechanism", "parameter", "L", "σ", *[f"accuracy {t} %" for t in table.tasks], "Pr@5 %", "Bayes top-1 %",
             "Bayes top-5 %", "window top-1 %", "learned top-1 %", "decoder top-1 %", "contextual top-1 %",
             "prior-alone top-1 %", "contextual − prior (pp)", "strongest token F1 %",
             "unchanged %", "verdict"]
    rows = []
    for run in table.runs:
        m, mech = run.metrics, _mech(run)
        windowed = run.data.get("configuration") in WINDOWED
        tradeoff = (run.data.get("tradeoff") or {}).get("leakage") or {}
        lo, hi = names.clip(str(tradeoff.get("metric")), *(tradeoff.get("ci") or [None, None]))
        rows.append([run.data.get("configuration"), _parameter(run), mech.get("window") if windowed else "—",
                     mech.get("sigma") if windowed else "—", *[_cell(m, f"accuracy_{t}") for t in table.tasks],
                     _cell(m, "pr_at_5"), _cell(m, "bayes_top1"), _cell(m, "bayes_top5"), _cell(m, "window_top1"),
                     _cell(m, "learned_top1"), _cell(m, "decoder_top1"), _cell(m, "contextual_top1"),
                     _cell(m, "contextual_prior_top1"), _gain_cell(m),
                     f"{fmt_ci(tradeoff.get('value'), lo, hi, digits=1)} ({tradeoff.get('attacker')})",
                     _cell(m, "unchanged_rate"), m.get("verdict")])
    first = table.runs[0].metrics
    clean = [f"{t}: {_cell(first, f'accuracy_unsanitized_{t}')}" + _floor_note(first, t) for t in table.tasks]
    text = md_table(heads, rows) + f"\n\nUnsanitised accuracy ({table.runs[0].data.get('model')}): {'; '.join(clean)}."
    if any(first.get(f"accuracy_skill_{t}") is False for t in table.tasks):
        text += (" A task marked *no skill* is one where the unsanitised model's interval does not clear the "
                 "constant-answer floor (always the most frequent gold answer): there sanitising cannot lower "
                 "the accuracy measurably, so its column says nothing about a mechanism's cost, and the "
                 "privacy–utility chart pools accuracy over the other tasks only.")
    return text


def _gain_cell(m: dict[str, Any]) -> str:
    """The contextual attacker's paired gain over the prior alone, with its verdict ('—' where not run)."""
    if m.get("contextual_prior_gain") is None:
        return "—"
    _, lo, hi = ci(m, "contextual_prior_gain")   # a difference of two percentages: within ±100 pp
    return f"{m['contextual_prior_gain']:+.1f} [{lo:+.1f}, {hi:+.1f}] ({m.get('contextual_verdict')})"


def _floor_note(m: dict, task: str) -> str:
    """' (floor 30.0, *no skill*)' after a task's unsanitised accuracy; '' for runs made before floors existed."""
    floor = num(m.get(f"accuracy_floor_{task}"))
    if floor is None:
        return ""
    return f" (floor {floor:.1f}{', *no skill*' if m.get(f'accuracy_skill_{task}') is False else ''})"


def _plot(task: str):
    def draw(table: SanitizeTable, path) -> None:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        series: dict[str, list[Run]] = {}
        for run in table.runs:
            series.setdefault(series_label(run), []).append(run)
        drawn: list[tuple[float, float]] = []
        for label, runs in sorted(series.items()):
            runs = sorted(runs, key=lambda r: num(r.data.get("epsilon")) or 0.0)
            xs = [num(r.metrics.get("pr_at_5")) for r in runs]
            ys = [num(r.metrics.get(f"accuracy_{task}")) for r in runs]
            cis = [ci(r.metrics, f"accuracy_{task}") for r in runs]
            yerr = [[y - (lo if lo is not None else y) for (_, lo, _), y in zip(cis, ys)],
                    [(hi if hi is not None else y) - y for (_, _, hi), y in zip(cis, ys)]]
            ax.errorbar(xs, ys, yerr=yerr, marker="o", ms=4, capsize=2, lw=1, label=label)
            drawn += [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        clean = num(table.runs[0].metrics.get(f"accuracy_unsanitized_{task}"))
        if clean is not None:
            ax.axhline(clean, color="grey", ls="--", lw=1, label="unsanitised")
        floor = num(table.runs[0].metrics.get(f"accuracy_floor_{task}"))
        if floor is not None:
            ax.axhline(floor, color="grey", ls=":", lw=1, label="constant-answer floor")
        metric_axis(ax, "x", "pr_at_5")
        metric_axis(ax, "y", f"accuracy_{task}")
        counts = mark_coincident(ax, drawn)
        save_axes(fig, ax, path, f"{task}: accuracy vs Pr@5 · {table.title}", legend_size=6, labels=counts)
    return draw


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """y at `x` on the piecewise-linear curve through `points` (x, y), read in x order; None outside its
    x range. Points at the same x are averaged first (a flat stretch of Pr@5 over η)."""
    by_x: dict[float, list[float]] = {}
    for px, py in points:
        by_x.setdefault(px, []).append(py)
    xs = sorted(by_x)
    ys = [sum(by_x[v]) / len(by_x[v]) for v in xs]
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[0]   # a single point, at x


def matched_levels(curves: Sequence[Sequence[tuple[float, float]]], step: float = 10.0) -> list[float]:
    """The Pr@5 values every curve reaches: multiples of `step` inside the common x range, or its midpoint
    when none falls there; [] when the ranges do not overlap or a curve has fewer than two distinct x."""
    ranges = [(min(x for x, _ in c), max(x for x, _ in c)) for c in curves if len({x for x, _ in c}) >= 2]
    if len(ranges) < 2 or len(ranges) != len(curves):
        return []
    lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if lo > hi:
        return []
    levels = [step * i for i in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
    return levels or [(lo + hi) / 2]


def _curve_points(runs: Sequence[Run], y: Callable[[Run], float | None]) -> list[tuple[float, float]]:
    return [(x, v) for r in runs if (x := num(r.metrics.get("pr_at_5"))) is not None and (v := y(r)) is not None]


def _utility(run: Run) -> float | None:
    return num(((run.data.get("tradeoff") or {}).get("utility") or {}).get("value"))


def _strongest(run: Run) -> float | None:
    return num(((run.data.get("tradeoff") or {}).get("leakage") or {}).get("value"))


def matched_md(table: SanitizeTable) -> str | None:
    """Figs. 3 and 4 read at matched privacy: each series' accuracy (the chart's utility) and strongest
    attacker's token F1, interpolated along its η curve at the Pr@5 values every series reaches. None when
    fewer than two series have a curve (two runs at distinct Pr@5) or their ranges do not overlap."""
    series: dict[str, list[Run]] = {}
    for run in table.runs:
        series.setdefault(series_label(run), []).append(run)
    curves = {label: (_curve_points(runs, _utility), _curve_points(runs, _strongest)) for label, runs in series.items()}
    curves = {k: v for k, v in curves.items() if len({x for x, _ in v[0]}) >= 2}
    levels = matched_levels([acc for acc, _ in curves.values()])
    if not levels:
        return None
    heads = ["series", "runs", *[f"accuracy @ Pr@5 = {x:.1f}" for x in levels],
             *[f"strongest F1 @ Pr@5 = {x:.1f}" for x in levels]]
    rows = []
    for label, (acc, f1) in sorted(curves.items()):
        cells = [interpolate(acc, x) for x in levels] + [interpolate(f1, x) for x in levels]
        rows.append([label, len(series[label]), *["—" if v is None else f"{v:.1f}" for v in cells]])
    return ("Matched privacy (Figs. 3 and 4 as curves over η): each series' accuracy (the privacy–utility "
            "chart's utility) and its strongest attacker's token F1, read off the piecewise-linear curve through "
            "its runs at Pr@5 values every series reaches. Point estimates only: the runs' intervals are in "
            "the table above.\n\n" + md_table(heads, rows))


class _TaskView:
    def __init__(self, table: SanitizeTable, task: str) -> None:
        self.table, self.task = table, task
        self.title = f"{task} · {table.title}"
        self.slug = file_slug(f"{task}_{table.slug}")
        self.runs = table.runs
        self.tags = table.tags


def markdown(items: Sequence[SanitizeTable], figure: Figures) -> list[str]:
    md = ["## Token sanitisers (paper 001, Figs. 2–4)", "", INTRO, ""]
    for i, table in enumerate(items):
        md += [f"### {table.title}", "", table_md(table), ""]
        matched = matched_md(table)
        if matched:
            md += [matched, ""]
        md += roc_table(table.runs, lambda run: f"{series_label(run)} · {_parameter(run)}")
        for j, task in enumerate(table.tasks):
            view = _TaskView(table, task)
            md += figure("sanitize", i * 10 + j, view, lambda v, path, t=task: _plot(t)(v.table, path),
                         alt="accuracy against Pr@5")
    return md


def summary(items: Sequence[SanitizeTable]) -> list[str]:
    out = []
    for t in items:
        for run in t.runs:
            m = run.metrics
            out.append(f"{t.title}: {series_label(run)} {_parameter(run)}: accuracy {num(m.get('accuracy')) or 0:.1f}, "
                       f"Pr@5 {num(m.get('pr_at_5')) or 0:.1f}, Bayes top-1 {num(m.get('bayes_top1')) or 0:.1f}, "
                       f"contextual top-1 {_cell(m, 'contextual_top1')}, "
                       f"verdict {m.get('verdict')}")
    return out
