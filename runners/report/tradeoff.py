"""One privacy–utility chart for every system: each run's `tradeoff` block (runners/common.tradeoff).

A point is one (system, model, configuration, privacy parameter, point label, setting): its leakage is the
strongest attacker over every run that attacked it (SpliTEE's attack, sequential and restore runs, a
sanitiser's attacks, the server's attacks in split fine-tuning, ...), its utility per utility metric the
lowest over every run that measured it. Taking the worst of each keeps a point from looking better than
any one measurement of it. The strongest attacker is the one with the largest excess over its own
no-signal floor (score − floor), not the highest score: attackers differ in what nothing scores (the
sequential MAP attacker's floor, the victim model's prior alone, names a third of a prompt's tokens; an
unrelated prompt's token F1 is 15-25 %), so the highest score could crown an attacker that read nothing.
The x axis is that excess, in points. An attacker without a floor competes by its score (floor 0) and is
listed, not drawn. There is one chart per utility metric (semantic similarity of generations to
the unprotected baseline, task accuracy, ...), so a chart never mixes two kinds of utility on its y axis;
a point appears on every chart whose metric it has. Points without a leakage or a utility measurement are
listed, not drawn.

A run that measures both halves on one benchmark and mode names it as its `setting` (collab's benchmark,
fusion mode and α; a sanitiser's lm-eval tasks; split fine-tuning's data and split; the gradient audit's
text): runs of different settings never join, so a point never pairs one benchmark's leakage with another's
utility, and each (system, setting) is its own series. A run without a setting that would otherwise join
(a sanitiser's fidelity run, which measures semantic similarity on the workload's prompts) joins every
setting's point of its configuration. Runs from before results.json recorded the setting get it from their
own fields (`_legacy_setting`).

Leakage metrics still differ between systems (token F1 of a prompt reconstruction, top-1 of a label
attack, token exposure rate): the table names each point's metric and attacker, and the chart keeps one
colour and marker per system and setting so that a reader compares within a metric first.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks import controls
from harness import configurations
from harness.collab import config as collab_config
from harness.sanitize import config as sanitize_config
from harness.splitft import config as splitft_config
from metrics import names
from runners.report.format import file_slug, fmt_ci, md_table, num, tagged
from runners.report.plotting import Figures, PointLabel, coincident, metric_axis, pyplot, save_axes, series_style
from runners.report.runs import Run

EXPERIMENT = "tradeoff"   # no runner writes it: the section reads every experiment's runs

INTRO = ("Every configuration of every system on the same axes: reconstruction by the strongest attacker run "
         "against it, as its score's excess over that attacker's own no-signal floor (x, points; higher = more "
         "leaked, 0 = the attacker read nothing beyond what it gets from no signal) and the utility it kept (y, "
         "%; higher = better), each **value [95% interval]** over examples. A point joins the runs of one "
         "system, model, configuration and privacy parameter: the attacker with the largest excess over its "
         "floor and the lowest utility any of them measured. Runs measured "
         "on different settings (a benchmark and mode: collab's benchmark, fusion mode and α; a sanitiser's "
         "tasks; split fine-tuning's data and split) never join: each setting is its own series, named after "
         "the system. The floor is the attacker's no-signal score (what it reaches from nothing).")


@dataclass
class Point:
    system: str
    model: str
    configuration: str
    parameter: str                       # "η=0.5", "ε=1", "" where the configuration has no knob
    label_extra: str = ""                # the runs' `tradeoff.point` (e.g. a sanitiser's window)
    setting: str = ""                    # the runs' `tradeoff.setting` (e.g. "dolly · cloud-side · α=0.3")
    leakage: dict[str, Any] | None = None
    utilities: dict[str, dict[str, Any]] = field(default_factory=dict)   # utility metric → the worst measured
    runs: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(x for x in (self.configuration, self.parameter, self.label_extra) if x)

    @property
    def series(self) -> str:
        """The chart's series (one colour and marker) and the table's first column: the system and setting."""
        return " · ".join(x for x in (self.system, self.setting) if x)


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
        """Both halves measured and the leakage's floor known, so the point has an x (its excess)."""
        return excess(point.leakage) is not None and self.utility(point) is not None


def excess(leak: dict[str, Any] | None) -> float | None:
    """The attacker's score minus its no-signal floor, in points; None without a score or a floor."""
    if not leak or num(leak.get("value")) is None or num(leak.get("floor")) is None:
        return None
    return num(leak["value"]) - num(leak["floor"])


def _strength(leak: dict[str, Any]) -> float:
    """What decides the strongest attacker (attacks.controls.strength): the excess over its floor."""
    return controls.strength(num(leak.get("value")), num(leak.get("floor")))


def _parameter(run: Run) -> str:
    name = str(run.data.get("configuration"))
    if name not in configurations.REGISTRY:
        return ""
    return configurations.parameter_label(name, num(run.data.get("epsilon")))


def _system(run: Run) -> str:
    conf = configurations.REGISTRY.get(str(run.data.get("configuration")))
    return str(run.data.get("system") or (conf.system if conf is not None else "?"))


def _legacy_parts(run: Run) -> tuple[str | None, str | None]:
    """(setting, point) of a run from before results.json's `tradeoff.setting`, from its own fields: the same
    helpers the runners call now, so old and new runs of one setting join."""
    d, system = run.data, _system(run)
    if system == configurations.COLLAB:
        unit = str((d.get("privacy_parameter") or {}).get("unit") or "")
        return (collab_config.tradeoff_setting((d.get("benchmark") or {}).get("name"), d.get("fusion"),
                                               num(d.get("alpha")), str(d.get("model")), d.get("cloud_model")),
                collab_config.tradeoff_point(str(d.get("configuration")), d.get("candidates"), "per token" in unit))
    if system == configurations.SANITIZE and d.get("experiment") == "sanitize":
        return sanitize_config.tradeoff_setting(d.get("tasks") or {}), None
    if system == configurations.SPLITFT:
        return splitft_config.tradeoff_setting(str(d.get("workload")), d.get("split") or {}), None
    if system == configurations.GRAD_AUDIT:
        return str(d.get("workload")), None
    return None, None


def _parts(run: Run, block: dict[str, Any]) -> tuple[str, str]:
    """The run's (setting, point label); a block without the `setting` key predates it."""
    if "setting" in block:
        return str(block.get("setting") or ""), str(block.get("point") or "")
    setting, point = _legacy_parts(run)
    return str(setting or ""), str(block.get("point") or point or "")


def _join(point: Point, run: Run, block: dict[str, Any]) -> None:
    """Add one run's halves to a point: the strongest attacker (largest excess over its floor), the lowest
    utility per metric."""
    point.runs.append(run.rel)
    leak, util = block.get("leakage"), block.get("utility")
    if leak and (point.leakage is None or _strength(leak) > _strength(point.leakage)):
        point.leakage = leak
    if util:
        metric = str(util.get("metric"))
        held = point.utilities.get(metric)
        if held is None or num(util.get("value")) < num(held.get("value")):
            point.utilities[metric] = util


def groups(runs: Sequence[Run]) -> list[Chart]:
    """One chart per (tag set, model, utility metric), its points joined over every finished run carrying a
    tradeoff; points with no utility at all go to a chart of metric "" (listed only)."""
    points: dict[tuple, Point] = {}
    unset: list[tuple[tuple, Run, dict[str, Any]]] = []   # runs without a setting: joined once all settings are known
    for run in runs:
        block = run.data.get("tradeoff") if run.state == "ok" else None
        if not isinstance(block, dict):
            continue
        model, system, conf = str(run.data.get("model")), _system(run), str(run.data.get("configuration"))
        (setting, extra), parameter = _parts(run, block), _parameter(run)
        base = (run.tags, model, system, conf, parameter, extra)
        if not setting:
            unset.append((base, run, block))
            continue
        _join(points.setdefault((*base, setting), Point(system, model, conf, parameter, extra, setting)), run, block)
    for base, run, block in unset:
        targets = [p for key, p in points.items() if key[:-1] == base and key[-1]]
        tags, model, system, conf, parameter, extra = base
        for point in targets or [points.setdefault((*base, ""), Point(system, model, conf, parameter, extra))]:
            _join(point, run, block)
    charts: dict[tuple, Chart] = {}
    for (tags, model, *_), point in points.items():
        for metric in sorted(point.utilities) or [""]:
            charts.setdefault((tags, model, metric), Chart(tags, model, metric, [])).points.append(point)
    for chart in charts.values():
        chart.points.sort(key=lambda p: (configurations.SYSTEMS.index(p.system) if p.system in configurations.SYSTEMS
                                         else 99, p.setting, p.configuration, p.parameter, p.label_extra))
    # The semantic-similarity chart first (the one every system's generations can share), the list last.
    order = {"semantic_similarity": 0, "": 2}
    return [charts[k] for k in sorted(charts, key=lambda k: (k[0], k[1], order.get(k[2], 1), k[2]))]


LABEL_LIMIT = 8   # past this many places on a chart, points are labelled by their row number in the table


def _cell(part: dict[str, Any] | None) -> str:
    if not part:
        return "—"
    lo, hi = _interval(part)
    return fmt_ci(part.get("value"), lo, hi, digits=1)


def _interval(part: dict[str, Any]) -> tuple[float | None, float | None]:
    """A half's interval, its ends clipped to its metric's range (metrics/names.py)."""
    lo, hi = part.get("ci") or (None, None)
    return names.clip(str(part.get("metric")), num(lo), num(hi))


def _places(chart: Chart) -> list[list[Point]]:
    """The drawn points grouped by where they land (coincident: the position the table prints, one decimal)."""
    drawn = [p for p in chart.points if chart.complete(p)]
    xy = [(excess(p.leakage), num(chart.utility(p)["value"])) for p in drawn]
    # equal as the table prints them (one decimal): such points share one label
    return [[drawn[i] for i in group] for group in coincident(xy, tol=0.05)]


def numbered(chart: Chart) -> bool:
    """Whether the chart labels its points by their # in the table: more places than names fit beside."""
    return len(_places(chart)) > LABEL_LIMIT


def table_md(chart: Chart) -> str:
    rows = [[p.series, p.label, _cell(p.leakage),
             "—" if not p.leakage else f"{p.leakage.get('metric')} · {p.leakage.get('attacker')}",
             "—" if not p.leakage or p.leakage.get("floor") is None else f"{num(p.leakage['floor']):.1f}",
             "—" if excess(p.leakage) is None else f"{excess(p.leakage):+.1f}",
             _cell(chart.utility(p)),
             "—" if not chart.utility(p) else f"{chart.metric} vs {chart.utility(p).get('reference')}"]
            for p in chart.points]
    headers = ["system · setting", "configuration", "leakage %", "leakage metric · attacker", "floor %",
               "over floor (x) pp", "utility %", "utility metric"]
    if numbered(chart):   # the chart's labels
        return md_table(["#", *headers], [[i, *row] for i, row in enumerate(rows, 1)], align="rl" + "r" * (len(headers) - 1))
    return md_table(headers, rows)


def plot(chart: Chart, path: Path) -> None:
    """Leakage (x: the strongest attacker's excess over its no-signal floor) against utility (y, a proportion on
    0–100) with both intervals, one colour and marker per system and setting (the legend names both), each point
    labelled with its configuration (or, on a crowded chart, its # in the table); points that land on one place
    share one label; the floor is the vertical line at 0."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    series = list(dict.fromkeys(p.series for p in chart.points if chart.complete(p)))
    for i, name in enumerate(series):
        pts = [p for p in chart.points if chart.complete(p) and p.series == name]
        xs = [excess(p.leakage) for p in pts]
        ys = [num(chart.utility(p)["value"]) for p in pts]
        # The score's interval shifted by the floor (a fixed reference here, as the verdicts read it).
        scores = [num(p.leakage["value"]) for p in pts]
        leak = [_interval(p.leakage) for p in pts]
        util = [_interval(chart.utility(p)) for p in pts]
        xerr = [[s - (lo if lo is not None else s) for s, (lo, _) in zip(scores, leak)],
                [(hi if hi is not None else s) - s for s, (_, hi) in zip(scores, leak)]]
        yerr = [[y - (lo if lo is not None else y) for y, (lo, _) in zip(ys, util)],
                [(hi if hi is not None else y) - y for y, (_, hi) in zip(ys, util)]]
        style = series_style(i)
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt=style["marker"], color=style["color"], capsize=2, label=name,
                    alpha=0.9)
    if series:
        ax.axvline(0.0, ls=":", lw=1.0, color="grey", label="each attacker's no-signal floor")
    ax.set_xlabel("leakage: strongest attacker's score minus its no-signal floor (points)")
    metric_axis(ax, "y", chart.metric, label=f"utility kept: {names.label(chart.metric)}")
    by_number = numbered(chart)
    row = {id(p): i for i, p in enumerate(chart.points, 1)}
    colour = {name: series_style(i)["color"] for i, name in enumerate(series)}
    labels = []
    for place in _places(chart):
        text = ", ".join(str(row[id(p)]) if by_number else p.label for p in place)
        # one label per place: points drawn on one another are named together, in the colour of the first
        labels.append(PointLabel(excess(place[0].leakage), num(chart.utility(place[0])["value"]), text,
                                 colour[place[0].series]))
    title = chart.title + ("\n(points labelled by their # in the table; several: drawn at one place)" if by_number
                           else "")
    save_axes(fig, ax, path, title, labels=labels)


def markdown(items: Sequence[Chart], figure: Figures) -> list[str]:
    md = ["## Privacy–utility across systems", "", INTRO, ""]
    for i, chart in enumerate(items):
        md += [f"### {chart.title}", "", table_md(chart), ""]
        if any(chart.complete(p) for p in chart.points):
            md += figure("tradeoff", i, chart, plot, "privacy–utility chart")
        missing = [f"{p.label} ({p.setting})" if p.setting else p.label for p in chart.points
                   if not chart.complete(p) and (p.leakage is None or chart.utility(p) is None)]
        if missing:
            md += [f"Not drawn (one half not measured yet): {', '.join(missing)}.", ""]
        floorless = [p.label for p in chart.points if p.leakage is not None and chart.utility(p) is not None
                     and excess(p.leakage) is None]
        if floorless:
            md += [f"Not drawn (the attacker has no no-signal floor, so no excess): {', '.join(floorless)}.", ""]
    return md


def summary(items: Sequence[Chart]) -> list[str]:
    n = sum(c.complete(p) for c in items for p in c.points)
    return [f"privacy–utility: {n} point(s) with both halves across {len(items)} chart(s)"] if items else []
