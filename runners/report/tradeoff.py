"""One privacy–utility chart for every system: each run's `tradeoff` block (runners/common.tradeoff).

A point is one (system, model, configuration, privacy parameter, point label): its leakage is the
strongest attacker over every run that attacked it (the highest value; SpliTEE's attack and restore runs,
a sanitiser's attacks, the server's attacks in split fine-tuning, ...), its utility per utility metric the
lowest over every run that measured it. Taking the worst of each keeps a point from looking better than
any one measurement of it. There is one chart per utility metric (semantic similarity of generations to
the unprotected baseline, task accuracy, ...), so a chart never mixes two kinds of utility on its y axis;
a point appears on every chart whose metric it has. Points without a leakage or a utility measurement are
listed, not drawn.

Leakage metrics still differ between systems (token F1 of a prompt reconstruction, top-1 of a label
attack, token exposure rate): the table names each point's metric and attacker, and the chart keeps one
colour per system so that a reader compares within a metric first.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import configurations
from runners.report.format import file_slug, fmt_ci, md_table, num, tagged
from runners.report.plotting import Figures, pyplot, save_axes, series_style
from runners.report.runs import Run

EXPERIMENT = "tradeoff"   # no runner writes it: the section reads every experiment's runs

INTRO = ("Every configuration of every system on the same axes: reconstruction by the strongest attacker run "
         "against it (x, %; higher = more leaked) and the utility it kept (y, %; higher = better), each "
         "**value [95% interval]** over examples. A point joins the runs of one system, model, configuration "
         "and privacy parameter: the highest leakage and the lowest utility any of them measured. The floor "
         "is the attacker's no-signal score (what it reaches from nothing).")


@dataclass
class Point:
    system: str
    model: str
    configuration: str
    parameter: str                       # "η=0.5", "ε=1", "" where the configuration has no knob
    label_extra: str = ""                # the runs' `tradeoff.point` (e.g. a sanitiser's window)
    leakage: dict[str, Any] | None = None
    utilities: dict[str, dict[str, Any]] = field(default_factory=dict)   # utility metric → the worst measured
    runs: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(x for x in (self.configuration, self.parameter, self.label_extra) if x)


@dataclass
class Chart:
    tags: tuple[str, ...]
    model: str
    metric: str                          # the utility metric on the y axis ("" for the leakage-only list)
    points: list[Point]

    @property
    def title(self) -> str:
        return tagged(f"privacy–utility: {self.model} · utility = {self.metric or 'not measured'}", self.tags)

    @property
    def slug(self) -> str:
        return file_slug(f"{self.model}_{self.metric}_{'_'.join(self.tags)}")

    def utility(self, point: Point) -> dict[str, Any] | None:
        return point.utilities.get(self.metric)

    def complete(self, point: Point) -> bool:
        return point.leakage is not None and self.utility(point) is not None


def _parameter(run: Run) -> str:
    name = str(run.data.get("configuration"))
    if name not in configurations.REGISTRY:
        return ""
    return configurations.parameter_label(name, num(run.data.get("epsilon")))


def _system(run: Run) -> str:
    conf = configurations.REGISTRY.get(str(run.data.get("configuration")))
    return str(run.data.get("system") or (conf.system if conf is not None else "?"))


def groups(runs: Sequence[Run]) -> list[Chart]:
    """One chart per (tag set, model, utility metric), its points joined over every finished run carrying a
    tradeoff; points with no utility at all go to a chart of metric "" (listed only)."""
    points: dict[tuple, Point] = {}
    for run in runs:
        block = run.data.get("tradeoff") if run.state == "ok" else None
        if not isinstance(block, dict):
            continue
        model, system, conf = str(run.data.get("model")), _system(run), str(run.data.get("configuration"))
        parameter, extra = _parameter(run), str(block.get("point") or "")
        point = points.setdefault((run.tags, model, system, conf, parameter, extra),
                                  Point(system, model, conf, parameter, extra))
        point.runs.append(run.rel)
        leak, util = block.get("leakage"), block.get("utility")
        if leak and (point.leakage is None or num(leak.get("value")) > num(point.leakage.get("value"))):
            point.leakage = leak
        if util:
            metric = str(util.get("metric"))
            held = point.utilities.get(metric)
            if held is None or num(util.get("value")) < num(held.get("value")):
                point.utilities[metric] = util
    charts: dict[tuple, Chart] = {}
    for (tags, model, *_), point in points.items():
        for metric in sorted(point.utilities) or [""]:
            charts.setdefault((tags, model, metric), Chart(tags, model, metric, [])).points.append(point)
    for chart in charts.values():
        chart.points.sort(key=lambda p: (configurations.SYSTEMS.index(p.system) if p.system in configurations.SYSTEMS
                                         else 99, p.configuration, p.parameter, p.label_extra))
    # The semantic-similarity chart first (the one every system's generations can share), the list last.
    order = {"semantic_similarity": 0, "": 2}
    return [charts[k] for k in sorted(charts, key=lambda k: (k[0], k[1], order.get(k[2], 1), k[2]))]


def _cell(part: dict[str, Any] | None) -> str:
    if not part:
        return "—"
    ci = part.get("ci") or (None, None)
    return fmt_ci(part.get("value"), ci[0], ci[1], digits=1)


def table_md(chart: Chart) -> str:
    rows = [[p.system, p.label, _cell(p.leakage),
             "—" if not p.leakage else f"{p.leakage.get('metric')} · {p.leakage.get('attacker')}",
             "—" if not p.leakage or p.leakage.get("floor") is None else f"{num(p.leakage['floor']):.1f}",
             _cell(chart.utility(p)),
             "—" if not chart.utility(p) else f"{chart.metric} vs {chart.utility(p).get('reference')}"]
            for p in chart.points]
    return md_table(["system", "configuration", "leakage %", "leakage metric · attacker", "floor %",
                     "utility %", "utility metric"], rows)


def plot(chart: Chart, path: Path) -> None:
    """Leakage (x) against utility (y) with both intervals, one colour per system, each point labelled."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    systems = list(dict.fromkeys(p.system for p in chart.points if chart.complete(p)))
    any_floor = False
    for i, system in enumerate(systems):
        pts = [p for p in chart.points if chart.complete(p) and p.system == system]
        xs = [num(p.leakage["value"]) for p in pts]
        ys = [num(chart.utility(p)["value"]) for p in pts]
        xerr = [[x - (p.leakage.get("ci") or [x, x])[0] for x, p in zip(xs, pts)],
                [(p.leakage.get("ci") or [x, x])[1] - x for x, p in zip(xs, pts)]]
        yerr = [[y - (chart.utility(p).get("ci") or [y, y])[0] for y, p in zip(ys, pts)],
                [(chart.utility(p).get("ci") or [y, y])[1] - y for y, p in zip(ys, pts)]]
        style = series_style(i)
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt=style["marker"], color=style["color"], capsize=2, label=system,
                    alpha=0.9)
        for x, y, p in zip(xs, ys, pts):
            ax.annotate(p.label, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6, color=style["color"])
            # The attacker's no-signal floor at the same height: leakage metrics differ in what nothing scores
            # (a token F1 of unrelated text is 15-25%), so the distance to the floor is what was read.
            floor = num(p.leakage.get("floor"))
            if floor is not None:
                any_floor = True
                ax.plot([floor, x], [y, y], ls=":", lw=0.8, color=style["color"], alpha=0.7)
                ax.plot([floor], [y], marker="|", ms=8, color=style["color"], alpha=0.7)
    if any_floor:
        ax.plot([], [], ls=":", marker="|", color="grey", label="attacker's no-signal floor")
    ax.set_xlim(left=0)
    ax.set_xlabel("leakage: strongest attacker's score (%)")
    ax.set_ylabel(f"utility kept: {chart.metric} (%)")
    save_axes(fig, ax, path, chart.title)


def markdown(items: Sequence[Chart], figure: Figures) -> list[str]:
    md = ["## Privacy–utility across systems", "", INTRO, ""]
    for i, chart in enumerate(items):
        md += [f"### {chart.title}", "", table_md(chart), ""]
        if any(chart.complete(p) for p in chart.points):
            md += figure("tradeoff", i, chart, plot, "privacy–utility chart")
        missing = [p.label for p in chart.points if not chart.complete(p)]
        if missing:
            md += [f"Not drawn (one half not measured yet): {', '.join(missing)}.", ""]
    return md


def summary(items: Sequence[Chart]) -> list[str]:
    n = sum(c.complete(p) for c in items for p in c.points)
    return [f"privacy–utility: {n} point(s) with both halves across {len(items)} chart(s)"] if items else []
