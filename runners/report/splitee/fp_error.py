"""Floating-point error of unmasking: paper Table 4 (§7.3.2), from runners/splitee/fp_error.py's runs.

Per ε, the mean true error against the mean bound (docs/fp_bound.md), their ratio and the violation rate;
then per op type, per precision × kernel, and Down (§6.3). The plot draws error and bound against ε.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.report.format import (
    configuration_label,
    file_slug,
    fmt_auto,
    fmt_pct,
    md_table,
    num,
    rank,
    tagged,
    uses_epsilon,
)
from runners.report.plotting import Figures, pyplot, save_axes
from runners.report.runs import Run, finished_runs

EXPERIMENT = "fp_error"

# Table 4's row order: the masked configurations, then t3 (no mask: the reference).
ORDER = ("ep1", "epn", "t3")

# Paper order of the op types (§7.3.2), Down last: it is not offloaded, only a reference.
FP_OPS: tuple[tuple[str, str], ...] = (
    ("q", "Q"), ("k", "K"), ("v", "V"), ("o", "O"), ("gate", "Gate"), ("up", "Up"), ("lm_head", "LM head"),
    ("down", "Down (TEE)"),
)

INTRO = ("Per output element of every offloaded op instance (q, k, v, o, gate, up per layer and the LM head), "
         "over `trials` draws of a captured real input vector, a weight row and a fresh mask η ~ N(0, σ²I) "
         "with the op's σ (paper §7.3.2): the true error |fl(⟨w,x+η⟩) − fl(⟨w,η⟩) − ⟨w,x⟩| against an "
         "exact reference, and the proven bound of docs/fp_bound.md (input rounding, both dot products, "
         "the final subtraction). *bound / error* = mean bound ÷ mean true error (the paper reports about "
         "4); *bound violation* = share of trials whose error exceeds the bound, 0 wherever the kernel "
         "follows the bound's model; *first-order* = γ_d·(Σ|w||x+η| + Σ|w||η|) alone, not a proven bound. "
         "95% interval: t over op instances' mean errors.")


@dataclass
class FpErrorRow:
    run: Run
    configuration: str
    epsilon: float | None
    epsilon_mean: float | None
    table: list[dict[str, Any]]

    def label(self) -> str:
        return configuration_label(self.configuration, self.epsilon, self.epsilon_mean)

    @property
    def x(self) -> float | None:
        """Where the row sits on an ε axis: the knob's ε, else the mean per-prompt ε (epn)."""
        return self.epsilon if self.epsilon is not None else self.epsilon_mean

    def cell(self, precision: str, kernel: str, op: str) -> dict[str, Any] | None:
        for r in self.table:
            if (r.get("precision"), r.get("kernel"), r.get("op")) == (precision, kernel, op):
                return r
        return None


@dataclass
class FpErrorGroup:
    experiment_name: str
    model: str
    workload: str
    n_prompts: Any
    headline: tuple[str, str]
    variant: str
    tags: tuple[str, ...]
    rows: list[FpErrorRow]

    @property
    def title(self) -> str:
        parts = [self.model, self.workload, f"{self.n_prompts} prompts",
                 f"headline {self.headline[0]} · {self.headline[1]} kernel"]
        if self.variant and self.variant != "default":
            parts.append(f"overrides {self.variant}")
        return tagged(f"{self.experiment_name}: " + " · ".join(str(p) for p in parts), self.tags)

    @property
    def slug(self) -> str:
        raw = "_".join(str(x) for x in (self.experiment_name, self.model, self.workload, *self.tags))
        return file_slug(raw)

    def pairs(self) -> list[tuple[str, str]]:
        """Every (precision, kernel) any row has, in the order the runs list them."""
        seen: list[tuple[str, str]] = []
        for row in self.rows:
            for r in row.table:
                key = (str(r.get("precision")), str(r.get("kernel")))
                if key not in seen:
                    seen.append(key)
        return seen


def _sort_key(row: FpErrorRow) -> tuple:
    return (rank(ORDER, row.configuration), row.epsilon if row.epsilon is not None else math.inf)


def groups(runs: Sequence[Run]) -> list[FpErrorGroup]:
    """Finished fp_error runs grouped into Table-4 tables: rows ep1 by ascending ε, then epn, then t3."""
    by_key: dict[tuple, list[FpErrorRow]] = {}
    for run in finished_runs(runs, EXPERIMENT):
        d = run.data
        head = d.get("headline") or {}
        key = (str(d.get("experiment_name") or "fp_error"), str(d.get("model")), str(d.get("workload")),
               d.get("n_prompts"), (str(head.get("precision")), str(head.get("kernel"))), run.variant, run.tags)
        conf = str(d.get("configuration"))
        eps = num(d.get("epsilon")) if uses_epsilon(conf) else None
        by_key.setdefault(key, []).append(FpErrorRow(run, conf, eps, num(run.metrics.get("epsilon_mean")),
                                                     d.get("table") or []))
    out = [FpErrorGroup(*key, rows=sorted(rows, key=_sort_key)) for key, rows in by_key.items()]
    return sorted(out, key=lambda g: (g.tags, g.experiment_name, g.model, g.workload, g.variant))


def _bound(c: dict[str, Any], key: str = "mean_bound") -> str:
    """A bound cell: ∞ where the bound does not exist (d·u ≥ 1; stored as null)."""
    if c.get("bound_finite") is False:
        return "∞ (d·u ≥ 1)"
    return fmt_auto(c.get(key))


def _times(value: Any) -> str:
    v = num(value)
    if v is None:
        return "—"
    return f"{v:,.0f}×" if v >= 100 else f"{v:.2f}×"


def table4_md(group: FpErrorGroup) -> str:
    """Paper Table 4: per ε, over every offloaded op instance, in the headline precision and kernel."""
    prec, kernel = group.headline
    headers = ["configuration", "op instances", "trials", "mean true error [95% CI]", "mean bound", "bound / error",
               "bound violation %", "first-order violation %"]
    rows = []
    for row in group.rows:
        c = row.cell(prec, kernel, "offloaded") or {}
        ci = c.get("instance_error_ci") or (None, None)
        rows.append([row.label(), c.get("n_instances", "—"), c.get("n_trials", "—"),
                     fmt_auto(c.get("mean_true_error"), *ci), _bound(c),
                     _times(c.get("bound_ratio")), fmt_pct(c.get("bound_violation_rate")),
                     fmt_pct(c.get("first_order_violation_rate"))])
    return md_table(headers, rows)


def by_op_md(group: FpErrorGroup) -> str:
    """Mean true error / mean bound per op type and ε (headline precision and kernel)."""
    prec, kernel = group.headline
    ops = [(k, h) for k, h in FP_OPS if any(r.cell(prec, kernel, k) for r in group.rows)]
    headers = ["configuration", *[h for _, h in ops]]
    rows = []
    for row in group.rows:
        cells = []
        for key, _ in ops:
            c = row.cell(prec, kernel, key)
            cells.append("—" if c is None else f"{fmt_auto(c.get('mean_true_error'))} / {_bound(c)}")
        rows.append([row.label(), *cells])
    return md_table(headers, rows)


def precision_md(group: FpErrorGroup) -> str:
    """Every precision × kernel, offloaded ops and Down, per ε: the bound's model against each kernel."""
    headers = ["configuration", "precision", "kernel", "accumulates in", "ops", "mean true error", "mean bound",
               "bound / error", "bound violation %", "overflow %"]
    rows = []
    for row in group.rows:
        for prec, kernel in group.pairs():
            for op in ("offloaded", "down"):
                c = row.cell(prec, kernel, op)
                if c is None:
                    continue
                n, over = c.get("n_trials") or 0, c.get("n_overflow") or 0
                rows.append([row.label(), prec, kernel, c.get("accumulate", "—"), "Down (TEE)" if op == "down" else op,
                             fmt_auto(c.get("mean_true_error")), _bound(c),
                             _times(c.get("bound_ratio")), fmt_pct(c.get("bound_violation_rate")),
                             fmt_pct(over / (n + over) if n + over else None)])
    return md_table(headers, rows, align="lllll" + "r" * 5)


def down_md(group: FpErrorGroup) -> str:
    """Why Down stays in the TEE (§6.3): its Δ and error next to the offloaded ops', fp32 and fp64."""
    kernel = group.headline[1]
    headers = ["configuration", "mean Δ offloaded", "mean Δ Down", "offloaded fp32 error", "Down fp32 error",
               "Down fp32 bound", "Down fp64 error", "Down fp64 bound"]
    rows = []
    for row in group.rows:
        off = row.cell("fp32", kernel, "offloaded") or {}
        d32 = row.cell("fp32", kernel, "down") or {}
        d64 = row.cell("fp64", kernel, "down") or {}
        if not d32 and not d64:
            continue
        rows.append([row.label(), fmt_auto(off.get("delta_mean")), fmt_auto((d32 or d64).get("delta_mean")),
                     fmt_auto(off.get("mean_true_error")), fmt_auto(d32.get("mean_true_error")),
                     _bound(d32), fmt_auto(d64.get("mean_true_error")), _bound(d64)])
    return md_table(headers, rows) if rows else ""


def probes_md(group: FpErrorGroup) -> str:
    probes: dict[str, dict] = {}
    for row in group.rows:
        for name, pr in (row.run.data.get("accumulation_probes") or {}).items():
            probes.setdefault(name, pr)
    if not probes:
        return ""
    rows = [[name, pr.get("kind"), fmt_pct(pr.get("frac_rounded_once")), fmt_pct(pr.get("frac_sequential")),
             pr.get("torch", "—")] for name, pr in probes.items()]
    return md_table(["precision", "torch F.linear on this machine", "= exactly rounded %", "= recursive summation %",
                     "torch"], rows, align="llrrl")


def plot(group: FpErrorGroup, path: Path) -> None:
    """Mean true error and mean bound against ε (log-log), offloaded ops in the headline precision and
    kernel; Down (kept in the TEE) in fp32 and fp64 for contrast; epn at its mean ε."""
    plt = pyplot()
    prec, kernel = group.headline
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    series = [("offloaded", prec, "mean true error", "o-", "C0"), ("offloaded", prec, "mean bound", "o--", "C0"),
              ("down", "fp32", "Down fp32 error", "s-", "C3"), ("down", "fp32", "Down fp32 bound", "s--", "C3"),
              ("down", "fp64", "Down fp64 error", "^-", "C2"), ("down", "fp64", "Down fp64 bound", "^--", "C2")]
    swept = [r for r in group.rows if r.epsilon is not None]
    others = [r for r in group.rows if r.epsilon is None and r.x is not None]   # at their mean ε
    for op, p, label, style, color in series:
        key = "mean_bound" if "bound" in label else "mean_true_error"
        if op == "offloaded":
            label = f"{label} ({p}, {kernel})"
        pts = [(r.epsilon, num((r.cell(p, kernel, op) or {}).get(key))) for r in swept]
        pts = [(x, y) for x, y in pts if y is not None and y > 0]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], style, color=color, label=label,
                    alpha=1.0 if "error" in label else 0.6)
        for r in others:
            y = num((r.cell(p, kernel, op) or {}).get(key))
            if y is not None and y > 0:
                ax.plot([r.x], [y], "*" if "error" in label else "x", color=color, markersize=10)
    if others:
        names = ", ".join(dict.fromkeys(r.configuration for r in others))
        ax.plot([], [], "*", color="gray", markersize=10, label=f"{names} (at its mean ε)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε per token")
    ax.set_ylabel("absolute error per output element")
    save_axes(fig, ax, path, f"{group.title}\n(solid: measured mean error; dashed: mean of the proven bound)",
              legend_size=7)


def markdown(items: Sequence[FpErrorGroup], figure: Figures) -> list[str]:
    md = ["## Floating-point error of unmasking (paper Table 4)", "", INTRO, ""]
    for i, group in enumerate(items, 1):
        md += [f"### {group.title}", "", table4_md(group), "",
               f"Per op type, mean true error / mean bound ({group.headline[0]}, {group.headline[1]} kernel; "
               "Down is not offloaded, shown for reference):", "", by_op_md(group), ""]
        down = down_md(group)
        if down:
            md += ["Down projection (paper §6.3): its Δ after the gated activation (docs/fp_bound.md §6) "
                   "makes σ, and so the error, orders of magnitude larger; fp64 brings it back down:", "",
                   down, ""]
        md += ["Every working precision and kernel (*library* = torch's F.linear as the engine calls it; "
               "*sequential* = recursive summation in the working precision, the bound's model; *accumulates "
               "in* = the accumulator the bound assumed; the bound is ∞ where d·u ≥ 1):", "",
               precision_md(group), ""]
        probes = probes_md(group)
        if probes:
            md += ["How torch's kernels accumulate here (harness/splitee/numerics/kernels.probe_accumulation):", "",
                   probes, ""]
        md += figure("fp_error", i, group, plot, "error and bound against ε")
    return md


def summary(items: Sequence[FpErrorGroup]) -> list[str]:
    lines = []
    for group in items:
        lines.append(f"  {group.title}")
        for row in group.rows:
            c = row.cell(*group.headline, "offloaded") or {}
            lines.append(f"    {row.label():<28} error {fmt_auto(c.get('mean_true_error')):>10}  bound "
                         f"{fmt_auto(c.get('mean_bound')):>10}  violations {fmt_pct(c.get('bound_violation_rate'))}%")
    return lines
