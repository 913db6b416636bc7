"""Inference time per prompt: paper Table 1 / Fig. 4 (§7.1-7.2), from runners/splitee/timing.py's runs.

One table per timing run: configuration × output limit → seconds per prompt, broken into the paper's
components, with ratios to TDX and T3 at the same limit; stacked bars per output limit.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import configurations
from runners.report.format import (
    configuration_label,
    file_slug,
    fmt_ratio,
    fmt_seconds,
    md_table,
    num,
    tagged,
    uses_epsilon,
)
from runners.report.plotting import Figures, pyplot, save
from runners.report.runs import Run, cpu_fallback, finished_runs

EXPERIMENT = "timing"

# (component key, header) of Fig. 4. "other" is *derived* (total minus the five before it), so a row
# sums to its total and, as in the paper, "other" holds everything kept in the TEE: the Down projection
# (§6.3), norms, RoPE, softmax, residuals, sampling, bank refills.
TIMING_COMPONENTS: tuple[tuple[str, str], ...] = (
    ("attention_proj", "attention proj."),
    ("ffn_proj", "FFN proj. (gate/up)"),
    ("lm_head", "LM head"),
    ("masking", "masking"),
    ("crossing", "crossing"),
    ("other", "other"),
)

INTRO = ("Average seconds per prompt over the workload, in batches, every configuration measured side by "
         "side in one process (paper §7.1-7.2). *other* = total minus the five columns before it: "
         "everything kept in the TEE, the Down projection and the bounded noise bank's refills included "
         "(both shown separately in brackets), as in the paper's Fig. 4. ÷ TDX and ÷ T3 are the time "
         "divided by that configuration's at the same output limit (below 1 = faster). *Bank precompute* "
         "is the noise bank's preparation before the generation, outside the total (the paper precomputes "
         "it offline). Tokens/s counts every generated token of the batch over the generation's wall time.")
MODES = {"prefix": "Each batch was generated once to the largest limit, each smaller limit read as the generation "
                   "passed it (timing.mode=prefix: greedy, no early stop, so its first L steps are the L-token "
                   "generation), every batch through every configuration in rotated order.",
         "separate": "One generation per batch and limit (timing.mode=separate), every batch through every "
                     "configuration in rotated order."}


@dataclass
class TimingRow:
    configuration: str
    max_new_tokens: int
    seconds_per_prompt: float | None
    components: dict[str, float | None]    # TIMING_COMPONENTS keys; "other" = total − the rest
    down_proj: float | None                # part of "other": the Down projection stays in the TEE
    bank_precompute: float | None          # outside the total (the paper precomputes the bank offline)
    epsilon_mean: float | None
    bank_refill: float | None = None       # part of "other": the bounded bank's refills during the generation
    tokens_per_second: float | None = None
    batch_seconds: list[float] | None = None   # each batch's seconds per prompt, in batch order
    vs_tdx: float | None = None
    vs_t3: float | None = None

    def label(self, epsilon: float | None = None) -> str:
        """`epsilon` is the run's knob, shown only where this configuration takes it."""
        return configuration_label(self.configuration, epsilon if uses_epsilon(self.configuration) else None,
                                   self.epsilon_mean)


@dataclass
class TimingTable:
    run: Run
    rows: list[TimingRow]

    @property
    def epsilon(self) -> float | None:
        return num(self.run.data.get("epsilon"))

    @property
    def limits(self) -> list[int]:
        return sorted({r.max_new_tokens for r in self.rows})

    @property
    def configurations(self) -> list[str]:
        """The run's configurations in registry order (the paper's Table 1 order), unknown names last."""
        seen = {r.configuration for r in self.rows}
        order = configurations.NAMES
        return [c for c in order if c in seen] + sorted(seen - set(order))

    def cell(self, configuration: str, limit: int) -> TimingRow | None:
        for r in self.rows:
            if r.configuration == configuration and r.max_new_tokens == limit:
                return r
        return None

    @property
    def title(self) -> str:
        d = self.run.data
        parts = [str(d.get("model")), str(d.get("workload")), f"{d.get('n_prompts')} prompts",
                 f"batch {(d.get('generation') or {}).get('batch_size')}"]
        # The timed configurations that the knob sets (ep1), not every system's that take one.
        takers = [c for c in self.configurations if uses_epsilon(c)]
        if self.epsilon is not None and takers:
            parts.append(f"{'/'.join(takers)} ε={self.epsilon:g}")
        return tagged(f"{d.get('experiment_name') or 'timing'}: " + " · ".join(parts), self.run.tags)

    @property
    def slug(self) -> str:
        raw = self.run.rel if self.run.rel != "." else str(self.run.data.get("run_dir") or "timing")
        return file_slug(raw)


def timing_row(raw: dict[str, Any]) -> TimingRow:
    """One row of results.json's `table` (runners/splitee/timing.py). Reads `components_s` (the engine's full
    breakdown) and falls back on the flat `<component>_s` keys."""
    comps = raw.get("components_s") or {}

    def get(name: str) -> float | None:
        return num(comps.get(name, raw.get(f"{name}_s")))

    total = num(raw.get("seconds_per_prompt"))
    if total is None:
        total = num(comps.get("total"))
    shown = {key: get(key) for key, _ in TIMING_COMPONENTS if key != "other"}
    known = sum(v for v in shown.values() if v is not None)
    other = max(0.0, total - known) if total is not None else get("other")
    return TimingRow(configuration=str(raw.get("configuration")), max_new_tokens=int(raw.get("max_new_tokens") or 0),
                     seconds_per_prompt=total, components={**shown, "other": other}, down_proj=get("down_proj"),
                     bank_precompute=get("bank_precompute"), epsilon_mean=num(raw.get("epsilon_mean")),
                     bank_refill=get("bank_refill"), tokens_per_second=num(raw.get("tokens_per_second")),
                     batch_seconds=[float(x) for x in raw["batch_seconds_per_prompt"]]
                     if raw.get("batch_seconds_per_prompt") else None)


def groups(runs: Sequence[Run]) -> list[TimingTable]:
    """One table per finished timing run; ratios to TDX and to T3 at the same output limit."""
    out = []
    for run in finished_runs(runs, EXPERIMENT):
        rows = [timing_row(r) for r in run.data.get("table") or []]
        for row in rows:
            for ref, attr in (("tdx", "vs_tdx"), ("t3", "vs_t3")):
                base = next((r for r in rows if r.configuration == ref and r.max_new_tokens == row.max_new_tokens), None)
                if base is not None and base.seconds_per_prompt and row.seconds_per_prompt is not None:
                    setattr(row, attr, row.seconds_per_prompt / base.seconds_per_prompt)
        table = TimingTable(run, rows)
        order = {c: i for i, c in enumerate(table.configurations)}
        table.rows.sort(key=lambda r: (r.max_new_tokens, order[r.configuration]))
        out.append(table)
    return sorted(out, key=lambda t: (t.run.tags, t.run.rel))


def overview_md(table: TimingTable, value=lambda r: fmt_seconds(r.seconds_per_prompt)) -> str:
    """configuration × output limit: seconds per prompt (the bar heights of Fig. 4), or `value` of a row."""
    headers = ["configuration", *[f"{n} tokens" for n in table.limits]]
    rows = []
    for conf in table.configurations:
        cells = []
        for limit in table.limits:
            r = table.cell(conf, limit)
            cells.append("—" if r is None else value(r))
        label = next((r.label(table.epsilon) for r in table.rows if r.configuration == conf), conf)
        rows.append([label, *cells])
    return md_table(headers, rows)


def breakdown_md(table: TimingTable) -> str:
    headers = ["output limit", "configuration", "s / prompt", *[h for _, h in TIMING_COMPONENTS],
               "(Down, in other)", "(bank refills, in other)", "÷ TDX", "÷ T3", "bank precompute"]
    rows = []
    for r in table.rows:
        rows.append([r.max_new_tokens, r.label(table.epsilon), fmt_seconds(r.seconds_per_prompt),
                     *[fmt_seconds(r.components.get(k)) for k, _ in TIMING_COMPONENTS], fmt_seconds(r.down_proj),
                     fmt_seconds(r.bank_refill), fmt_ratio(r.vs_tdx), fmt_ratio(r.vs_t3), fmt_seconds(r.bank_precompute)])
    return md_table(headers, rows, align="rl" + "r" * (len(headers) - 2))


def batches_md(table: TimingTable) -> str | None:
    """At the largest limit, each batch's seconds per prompt and its ratio to the reference configuration's
    same batch (cpu, else the first): all batches ran every configuration back to back, so a batch whose
    ratios stand out from the others' was slowed by something else on the machine. None for runs that
    predate per-batch times."""
    limit = max(table.limits)
    rows = [r for r in table.rows if r.max_new_tokens == limit]
    if not rows or any(not r.batch_seconds for r in rows):
        return None
    ref = next((r for r in rows if r.configuration == "cpu"), rows[0])
    out = [[r.label(table.epsilon),
            *[f"{s:.2f}" + ("" if r is ref or not base else f" ({s / base:.2f}×)")
              for s, base in zip(r.batch_seconds, ref.batch_seconds)]] for r in rows]
    return (f"Per batch at {limit} tokens: seconds per prompt (÷ {ref.configuration} of the same batch):\n\n"
            + md_table(["configuration", *[f"batch {b + 1}" for b in range(len(ref.batch_seconds))]], out))


def plot(table: TimingTable, path: Path) -> None:
    """Stacked bars of seconds per prompt by component and configuration, one panel per output limit."""
    plt = pyplot()
    limits = table.limits
    confs = table.configurations
    fig, axes = plt.subplots(1, len(limits), figsize=(max(4.0, 0.55 * len(confs) + 1.5) * len(limits), 3.8),
                             squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, limit in zip(axes[0], limits):
        bottoms = [0.0] * len(confs)
        for ci, (key, header) in enumerate(TIMING_COMPONENTS):
            heights = []
            for conf in confs:
                row = table.cell(conf, limit)
                heights.append((row.components.get(key) or 0.0) if row is not None else 0.0)
            ax.bar(range(len(confs)), heights, bottom=bottoms, color=colors[ci % len(colors)], label=header)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        ax.set_xticks(range(len(confs)))
        ax.set_xticklabels(confs, rotation=45, ha="right")
        ax.set_title(f"{limit} new tokens")
        ax.set_ylabel("seconds per prompt")
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.1), frameon=False)
    note = " · accelerator = CPU fallback" if cpu_fallback(table.run) else ""
    fig.suptitle(f"{table.title}{note}", fontsize=10)
    fig.tight_layout()
    save(fig, path)


def markdown(items: Sequence[TimingTable], figure: Figures) -> list[str]:
    md = ["## Inference time per prompt (paper Table 1 / Fig. 4)", "", INTRO, ""]
    for i, table in enumerate(items, 1):
        md += [f"### {table.title}", ""]
        if cpu_fallback(table.run):
            md += ["**Accelerator = CPU fallback** (no CUDA): the device side ran on the CPU, so these "
                   "ratios compare CPU against CPU and do not reproduce the paper's GPU speed-ups.", ""]
        mode = MODES.get(str(table.run.data.get("mode")))
        md += [mode, ""] if mode else []
        md += ["Seconds per prompt:", "", overview_md(table), "",
               "Tokens per second:", "", overview_md(table, lambda r: "—" if r.tokens_per_second is None
                                                     else f"{r.tokens_per_second:.1f}"), "",
               "By component (seconds per prompt):", "", breakdown_md(table), ""]
        batches = batches_md(table)
        md += [batches, ""] if batches else []
        md += figure("timing", i, table, plot, "time per prompt by component")
    return md


def summary(items: Sequence[TimingTable]) -> list[str]:
    lines = []
    for table in items:
        lines.append(f"  {table.title} · seconds per prompt")
        lines.append(f"    {'configuration':<24}" + "".join(f"{n:>9}" for n in table.limits))
        for conf in table.configurations:
            cells = [table.cell(conf, n) for n in table.limits]
            lines.append(f"    {conf:<24}" + "".join(f"{fmt_seconds(c.seconds_per_prompt if c else None):>9}"
                                                     for c in cells))
    return lines
