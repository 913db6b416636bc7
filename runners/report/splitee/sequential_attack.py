"""The report section of experiment=sequential_attack (issues 32, 36; attacks/splitee/sequential.py): per
configuration and ε, the likelihood-only and MAP attackers' top-1 against their references (the prior alone
for MAP, paired on the same positions; the same attacker on another prompt's view for the likelihood), the
pruning recall that says whether pruning or the mask decided, and the verdict with its reason."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attacks import controls
from runners.report.format import ci, md_table, tagged
from runners.report.plotting import Figures, mark_coincident, metric_axis, pyplot, save_axes, series_style
from runners.report.roc import table_md as roc_table
from runners.report.runs import Run, finished_runs

EXPERIMENT = "sequential_attack"
INTRO = ("The sequential all-exposure attacker reads every QKV, O and Gate/Up exposure of a prompt position at "
         "every used layer and scores candidate tokens by the mask's Gaussian likelihood (*likelihood*) or by "
         "that likelihood plus the victim model's own next-token log-probability (*MAP*). MAP is judged against "
         "the prior alone (the model's top-1 given the same prefix, no view): the statistic is the paired "
         "difference on the same positions with Newcombe's interval. *at chance* needs that interval within "
         "±margin, the teacher-forced mode and a pruning recall ≥ the configured minimum at every stage "
         "(docs/sequential_attack.md). Intervals over positions treat positions as independent.")
_ATTACKERS = (("likelihood", "sequential_top1", "sequential_pruning_recall_min"),
              ("MAP", "sequential_map_top1", "sequential_map_pruning_recall_min"))
# each attacker's verdict keys in a run's metrics (attacks/splitee/sequential.summarise)
VERDICT_KEYS = {"map": ("verdict_map", "verdict_map_reason"),
                "likelihood": ("verdict_likelihood", "verdict_likelihood_reason")}


def attacker_verdicts(run: Run) -> list[dict[str, Any]]:
    """Every attacker verdict one sequential run holds: {attacker, verdict, reason, mode}, MAP's and the
    likelihood's; the run's own verdict when neither MAP nor a null view ran."""
    m, mode = run.metrics, run.data.get("mode")
    out = [{"attacker": f"sequential_{name}", "verdict": m[key], "reason": m.get(reason), "mode": mode}
           for name, (key, reason) in VERDICT_KEYS.items() if m.get(key) is not None]
    if not out and m.get("verdict") is not None:
        out.append({"attacker": "sequential", "verdict": m["verdict"], "reason": m.get("verdict_reason"), "mode": mode})
    return out


def set_aside(found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attacker verdicts of one configuration and ε that its verdict does not count: a free-running run's
    *inconclusive* where a teacher-forced run of the same attacker is among them. Teacher forcing gives the
    attacker the true prefix, so it bounds the free-running attacker from above (docs/sequential_attack.md):
    the free-running run can add no evidence for privacy, and its rule forbids it to certify at_chance, so
    counting it would keep every configuration attacked in both modes inconclusive whatever the masks do.
    Its leak still counts (what was recovered was recovered), and so does its inconclusive where no
    teacher-forced run of its attacker is there. Entries without a mode (the attack runs') are never set aside."""
    forced = {a["attacker"] for a in found if a.get("mode") == "teacher_forced"}
    return [a for a in found if a.get("mode") == "free_running" and a["verdict"] == controls.INCONCLUSIVE
            and a["attacker"] in forced]


def counted(found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attacker verdicts that decide a configuration and ε: `found` less `set_aside(found)`."""
    aside = [id(a) for a in set_aside(found)]
    return [a for a in found if id(a) not in aside]


def strongest(runs: Sequence[Run]) -> Run | None:
    """The run of one configuration and ε whose reading Table 6 shows: teacher-forced first (the family's
    upper bound), then the most layers, then the most positions."""
    return max(runs, key=lambda r: (r.data.get("mode") == "teacher_forced", len(_layers(r)), _positions(r)),
               default=None)


def _key(run: Run) -> tuple:
    eps = run.data.get("epsilon")
    return (str(run.data.get("model")), str(run.data.get("configuration")), -1.0 if eps is None else float(eps),
            str(run.data.get("mode")), -len(_layers(run)), _layers(run), run.rel)


def _layers(run: Run) -> tuple[int, ...]:
    return tuple(int(x) for x in run.data.get("layers_used") or ())


def _first_n(run: Run) -> int | None:
    """n when the run used layers 0..n−1 (the layer curve's runs), else None."""
    layers = _layers(run)
    return len(layers) if layers and layers == tuple(range(len(layers))) else None


def _layers_label(run: Run) -> str:
    layers, n = _layers(run), _first_n(run)
    if not layers:
        return "—"
    return f"0–{n - 1} ({n})" if n is not None and n > 1 else f"[{', '.join(map(str, layers))}]"


@dataclass
class SequentialGroup:
    """One model's runs: the configurations and ε it was attacked at."""

    model: str
    rows: list[Run]

    @property
    def slug(self) -> str:
        return self.model.replace("/", "_")

    @property
    def title(self) -> str:
        return f"sequential attacker, {self.model}"


def groups(runs: Sequence[Run]) -> list[SequentialGroup]:
    by_model: dict[str, list[Run]] = {}
    for run in sorted(finished_runs(runs, EXPERIMENT), key=_key):
        by_model.setdefault(str(run.data.get("model")), []).append(run)
    return [SequentialGroup(model, rows) for model, rows in by_model.items()]


def _ci(m: dict[str, Any], key: str) -> str:
    v, lo, hi = m.get(key), m.get(f"{key}_ci_lo"), m.get(f"{key}_ci_hi")
    if v is None:
        return "—"
    return f"{v:.1f}" + ("" if lo is None or hi is None else f" [{lo:.1f}, {hi:.1f}]")


def _setting(run: Run) -> str:
    eps = run.data.get("epsilon")
    return f"{run.data.get('configuration')}" + ("" if eps is None else f" ε={eps:g}")


def table_md(rows: Sequence[Run]) -> str:
    body = []
    for run in rows:
        m = run.data.get("metrics", {})
        body.append([tagged(_setting(run), run.tags), str(run.data.get("mode", "—")), str(m.get("n_positions", "—")),
                     _ci(m, "sequential_top1"), _ci(m, "sequential_map_top1"), _ci(m, "prior_top1"),
                     _ci(m, "map_minus_prior"),
                     " / ".join("—" if m.get(k) is None else f"{m[k]:.2f}" for _, _, k in _ATTACKERS),
                     f"**{m.get('verdict', '—')}**" if m.get("verdict") == "leak" else str(m.get("verdict", "—")),
                     str(m.get("verdict_reason", "")), _layers_label(run),
                     "—" if m.get("seconds_per_position") is None else f"{m['seconds_per_position']:.2f}"])
    return md_table(["setting", "mode", "positions", "likelihood top-1 %", "MAP top-1 %", "prior top-1 %",
                     "MAP − prior pp", "min. pruning recall (lik. / MAP)", "verdict", "reason", "layers used",
                     "s / position"], body, align="llrrrrrrllrr")


def _positions(run: Run) -> int:
    return int(run.data.get("metrics", {}).get("n_positions") or 0)


def _full(group: SequentialGroup) -> list[Run]:
    """The ε curve's runs: those with an ε that use the most layers of any run of the group and, among them,
    attack the most positions of their mode (a shorter run belongs to a layer curve, not to this one)."""
    pts = [r for r in group.rows if r.data.get("epsilon") is not None]
    most = max((len(_layers(r)) for r in pts), default=0)
    pts = [r for r in pts if len(_layers(r)) == most]
    longest: dict[str, int] = {}
    for r in pts:
        mode = str(r.data.get("mode"))
        longest[mode] = max(longest.get(mode, 0), _positions(r))
    return [r for r in pts if _positions(r) == longest[str(r.data.get("mode"))]]


def _series(ax, runs: Sequence[Run], x, key: str, label: str, i: int, linestyle: str) -> list[tuple[float, float]]:
    """Draw one attacker's top-1 against x with its interval; returns the points drawn."""
    xs, ys, lo, hi = [], [], [], []
    for r in sorted(runs, key=x):
        mean, low, high = ci(r.data["metrics"], key)   # ends clipped to 0–100
        if mean is None:
            continue
        xs.append(x(r))
        ys.append(mean)
        lo.append(mean - (low if low is not None else mean))
        hi.append((high if high is not None else mean) - mean)
    if xs:
        ax.errorbar(xs, ys, yerr=[lo, hi], linestyle=linestyle, capsize=3, label=label, **series_style(i))
    return list(zip(xs, ys))


def plot(group: SequentialGroup, path: Path) -> None:
    """Top-1 against ε for the likelihood attacker, MAP and the prior alone (issue 36's figure), 95% Wilson
    intervals: the runs with an ε that use the most layers; teacher-forced solid, free-running dashed (the
    prior alone always reads the true prefix: drawn once)."""
    pts = _full(group)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    modes = sorted({str(r.data.get("mode")) for r in pts}, key=lambda m: m != "teacher_forced")
    drawn: list[tuple[float, float]] = []
    for j, mode in enumerate(modes):
        runs = [r for r in pts if str(r.data.get("mode")) == mode]
        suffix = "" if len(modes) == 1 else f" ({mode.replace('_', '-')})"
        for i, (label, key) in enumerate((("likelihood", "sequential_top1"), ("MAP", "sequential_map_top1"),
                                          ("prior alone", "prior_top1"))):
            if label == "prior alone" and mode != "teacher_forced":
                continue
            drawn += _series(ax, runs, lambda r: float(r.data["epsilon"]), key, label + suffix, i,
                             "-" if j == 0 else "--")
    ax.set_xscale("log")
    ax.set_xlabel("ε per exposure")
    metric_axis(ax, "y", "sequential_top1", label="top-1 recovery (%)")
    counts = mark_coincident(ax, drawn)   # the free-running attackers reach 100 % where the teacher-forced ones do
    save_axes(fig, ax, path, group.title, labels=counts)


@dataclass
class LayerCurve:
    """The runs of one configuration, ε, mode and number of positions that use layers 0..n−1 for at least
    two n."""

    model: str
    setting: str
    mode: str
    rows: list[Run]

    @property
    def slug(self) -> str:
        return (f"{self.model}_{self.setting}_{self.mode}_{_positions(self.rows[0])}"
                .replace("/", "_").replace(" ", "_").replace("=", "").replace("ε", "eps"))

    @property
    def title(self) -> str:
        return (f"sequential attacker, {self.model}, {self.setting}, {self.mode.replace('_', '-')}, "
                f"{_positions(self.rows[0])} positions")


def layer_curves(group: SequentialGroup) -> list[LayerCurve]:
    by: dict[tuple[str, str, int], list[Run]] = {}
    for r in group.rows:
        if _first_n(r) is not None:
            by.setdefault((_setting(r), str(r.data.get("mode")), _positions(r)), []).append(r)
    return [LayerCurve(group.model, setting, mode, rows) for (setting, mode, _), rows in by.items()
            if len({_first_n(r) for r in rows}) >= 2]


def plot_layers(curve: LayerCurve, path: Path) -> None:
    """Top-1 against the number of layers used (layers 0..n−1), likelihood, MAP and the prior alone."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    drawn: list[tuple[float, float]] = []
    for i, (label, key) in enumerate((("likelihood", "sequential_top1"), ("MAP", "sequential_map_top1"),
                                      ("prior alone", "prior_top1"))):
        drawn += _series(ax, curve.rows, lambda r: float(_first_n(r)), key, label, i, "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("layers used (0..n−1)")
    metric_axis(ax, "y", "sequential_top1", label="top-1 recovery (%)")
    counts = mark_coincident(ax, drawn)
    save_axes(fig, ax, path, curve.title, labels=counts)


def markdown(items: Sequence[SequentialGroup], figure: Figures) -> list[str]:
    md = ["## Sequential all-exposure attacker (issues 32, 36)", "", INTRO, ""]
    for i, group in enumerate(items):
        md += [f"### {group.model}", "", table_md(group.rows), ""]
        md += roc_table(group.rows, _setting)
        if any(r.data.get("epsilon") is not None for r in group.rows):
            md += figure("sequential", i, group, plot, "top-1 against ε: likelihood, MAP and the prior alone")
        for j, curve in enumerate(layer_curves(group)):
            md += figure("sequential_layers", i * 100 + j, curve, plot_layers,
                         "top-1 against the number of layers used")
    return md


def summary(items: Sequence[SequentialGroup]) -> list[str]:
    lines = []
    for group in items:
        for run in group.rows:
            m = run.data.get("metrics", {})
            lines.append(f"  {_setting(run):<14} MAP {_ci(m, 'sequential_map_top1')} vs prior {_ci(m, 'prior_top1')}: "
                         f"{m.get('verdict', '—')}")
    return lines
