"""Controlled numerical error: paper Table 5 (§7.3.2), from runners/splitee/controlled_error.py's runs.

One table per run: per error level, the mean absolute error actually realised and the fidelity metrics
against T3; the plot draws semantic similarity against that error.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.report.format import ci, file_slug, fmt_auto, fmt_ci, md_table, num, tagged
from runners.report.plotting import Figures, metric_axis, pyplot, save_axes
from runners.report.runs import Run, finished_runs

EXPERIMENT = "controlled_error"

CE_METRICS: tuple[tuple[str, str], ...] = (
    ("semantic_similarity", "semantic sim. %"),
    ("exact_match", "exact match %"),
    ("token_match_rate", "token match %"),
    ("bleu", "BLEU"),
    ("rouge_l", "ROUGE-L"),
)

INTRO = ("Every offloaded op call's natural error pattern (the configuration's unmasked output minus T3's "
         "output for the same input) rescaled to a target mean absolute error, generation compared with "
         "T3's (paper §7.3.2). The error column is the error actually realised; the natural row is the "
         "configuration itself. Cells are **mean [95% interval]** over prompts, in %.")


@dataclass
class ControlledRow:
    level: str
    slug: str
    target: float | None
    mae: float | None
    data: dict[str, Any]

    def label(self, configuration: str) -> str:
        if self.slug == "t3":
            return "T3"
        if self.slug == "natural":
            return f"{configuration.upper()} (natural)"
        return f"CE {self.target:.3g}" if self.target is not None else self.level

    def ci(self, key: str) -> tuple[float | None, float | None, float | None]:
        return ci(self.data, key)


@dataclass
class ControlledTable:
    run: Run
    rows: list[ControlledRow]

    @property
    def configuration(self) -> str:
        return str(self.run.data.get("configuration"))

    @property
    def title(self) -> str:
        d = self.run.data
        eps = num(d.get("epsilon"))   # recorded only where the configuration takes ε
        parts = [str(d.get("model")), str(d.get("workload")), f"{d.get('n_prompts')} prompts",
                 f"{(d.get('generation') or {}).get('max_new_tokens')} new tokens",
                 f"{self.configuration}" + (f" ε={eps:g}" if eps is not None else ""), "reference t3"]
        return tagged(f"{d.get('experiment_name') or 'controlled_error'}: " + " · ".join(parts), self.run.tags)

    @property
    def slug(self) -> str:
        raw = self.run.rel if self.run.rel != "." else str(self.run.data.get("run_dir") or "controlled_error")
        return file_slug(raw)


def groups(runs: Sequence[Run]) -> list[ControlledTable]:
    """One Table 5 per finished controlled_error run, rows by ascending mean absolute error (T3 first)."""
    out = []
    for run in finished_runs(runs, EXPERIMENT):
        rows = [ControlledRow(str(r.get("level")), str(r.get("slug")), num(r.get("target_mae")),
                              num(r.get("realised_mae")), r) for r in run.data.get("table") or []]
        rows.sort(key=lambda r: (r.slug != "t3", r.mae if r.mae is not None else math.inf))
        out.append(ControlledTable(run, rows))
    return sorted(out, key=lambda t: (t.run.tags, t.run.rel))


def table5_md(table: ControlledTable) -> str:
    headers = ["setting", "mean absolute error", *[h for _, h in CE_METRICS]]
    rows = [[r.label(table.configuration), "0" if r.mae == 0 else fmt_auto(r.mae),
             *[fmt_ci(*r.ci(k)) for k, _ in CE_METRICS]] for r in table.rows]
    return md_table(headers, rows)


def plot(table: ControlledTable, path: Path) -> None:
    """Semantic similarity (95% interval) against mean absolute error (log x); T3 (zero error) as a
    horizontal line; the natural level marked. Token match where no similarity was computed."""
    plt = pyplot()
    key, ylabel = "semantic_similarity", "semantic similarity to T3 (%)"
    if all(r.ci(key)[0] is None for r in table.rows):
        key, ylabel = "token_match_rate", "token match with T3 (%) — no similarity model"
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    pts = [(r.mae, *r.ci(key), r) for r in table.rows if r.mae and r.mae > 0 and r.ci(key)[0] is not None]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="C0", label="controlled error (CE)", zorder=3)
        bars = [p for p in pts if p[2] is not None and p[3] is not None]
        ax.errorbar([p[0] for p in bars], [p[1] for p in bars], yerr=[[p[1] - p[2] for p in bars],
                    [p[3] - p[1] for p in bars]], fmt="none", ecolor="C0", capsize=3, zorder=3)
        for p in pts:
            if p[4].slug == "natural":
                ax.plot([p[0]], [p[1]], "*", color="C3", markersize=14, zorder=4,
                        label=f"{table.configuration} natural error ({p[0]:.3g})")
    for r in table.rows:
        if r.slug == "t3" and r.ci(key)[0] is not None:
            ax.axhline(r.ci(key)[0], color="gray", linestyle="--", label="T3 (zero error)")
    ax.set_xscale("log")
    ax.set_xlabel("mean absolute error of every offloaded op output")
    metric_axis(ax, "y", key, label=ylabel)
    save_axes(fig, ax, path, table.title)


def markdown(items: Sequence[ControlledTable], figure: Figures) -> list[str]:
    md = ["## Controlled numerical error (paper Table 5)", "", INTRO, ""]
    for i, table in enumerate(items, 1):
        md += [f"### {table.title}", "", table5_md(table), "",
               *figure("controlled_error", i, table, plot, "semantic similarity against mean absolute error")]
    return md


def summary(items: Sequence[ControlledTable]) -> list[str]:
    lines = []
    for table in items:
        lines.append(f"  {table.title}")
        for r in table.rows:
            lines.append(f"    {r.label(table.configuration):<20} MAE {fmt_auto(r.mae):>10}  semantic "
                         f"{fmt_ci(r.ci('semantic_similarity')[0]):>7}")
    return lines
