"""`splitbench-report DIR` (or `python -m runners.report DIR`): a run or sweep directory → report.md + PNGs.

    splitbench-report outputs/fidelity
    splitbench-report outputs --out docs/results/table2
    splitbench-report outputs/smoke --include-tagged smoke

Walks DIR for results.json, keeps finished runs (status ok and `.done`), leaves out runs tagged `smoke`
unless `--include-tagged smoke`, and writes report.md (atomically) with:
- a provenance header (models, workloads, prompts, git hashes, devices and TEE kind, dates, commands);
- Table 2 of the paper (fidelity vs the baseline, "mean [95% interval]"), one table per comparable group,
  with a plot of every utility metric against ε;
- Table 1 / Fig. 4 (seconds per prompt by configuration, output limit and component), with stacked bars;
- the failed and unfinished runs.
The tables come from harness/report_tables.py; this module only draws and writes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from harness import report_tables as rt

PROG = "splitbench-report"
REPORT = "report.md"
PNG_PREFIX = "report_"  # PNGs this command owns in the output dir (stale ones are removed on rewrite)


class ReportError(Exception):
    """A mistake the user can make (missing directory, nothing finished to report)."""


# ---------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _atomic(path: Path, write) -> None:
    """`write(tmp_path)` into a temp file beside `path`, then os.replace: a reader never sees half a
    file. The file gets the usual umask permissions (mkstemp's 0600 would hide a report from its readers)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _save(fig, path: Path) -> None:
    _atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))


_DASHES = ("--", ":", "-.", (0, (6, 2, 1, 2)), (0, (1, 3)))


def plot_fidelity(group: rt.FidelityGroup, path: Path) -> None:
    """Each utility metric against ε (log x) for ep1 with its 95% band; every other configuration as a
    horizontal reference line with its band."""
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter

    metrics = [(k, h) for k, h in rt.UTILITY_METRICS if any(r.ci(k)[0] is not None for r in group.rows)]
    if not metrics:
        metrics = list(rt.UTILITY_METRICS)
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.4), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    ep1 = [r for r in group.rows if r.configuration == "ep1" and r.epsilon is not None]
    refs = [r for r in group.rows if not (r.configuration == "ep1" and r.epsilon is not None)]
    eps_values = sorted({r.epsilon for r in ep1})
    xlim = (min(eps_values) / 1.6, max(eps_values) * 1.6) if eps_values else (0.3, 20.0)
    series: dict[str, list[rt.FidelityRow]] = {}
    for r in ep1:
        series.setdefault(r.variant if group.show_variant else "", []).append(r)
    for ax, (key, header) in zip(axes[0], metrics):
        color_i = 0
        for variant, rows in series.items():
            rows = sorted(rows, key=lambda r: r.epsilon)
            xs = [r.epsilon for r in rows]
            ys = [r.ci(key) for r in rows]
            pts = [(x, m, lo, hi) for x, (m, lo, hi) in zip(xs, ys) if m is not None]
            if not pts:
                continue
            c = colors[color_i % len(colors)]
            color_i += 1
            label = "ep1" + (f" · {variant}" if variant else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=label, zorder=3)
            bars = [p for p in pts if p[2] is not None and p[3] is not None]
            ax.errorbar([p[0] for p in bars], [p[1] for p in bars],
                        yerr=[[p[1] - p[2] for p in bars], [p[3] - p[1] for p in bars]], fmt="none", ecolor=c,
                        capsize=3, zorder=3)
            band = [p for p in pts if p[2] is not None and p[3] is not None]
            if band:
                ax.fill_between([p[0] for p in band], [p[2] for p in band], [p[3] for p in band], color=c,
                                alpha=0.2, linewidth=0)
        for j, r in enumerate(refs):
            m, lo, hi = r.ci(key)
            if m is None:
                continue
            c = colors[color_i % len(colors)]
            color_i += 1
            # Reference lines often coincide (several at 100): later ones thinner and differently dashed,
            # so each stays visible.
            ax.axhline(m, color=c, linestyle=_DASHES[j % len(_DASHES)], linewidth=max(1.0, 3.0 - 0.6 * j),
                       label=r.label(group.show_variant), zorder=2)
            if lo is not None and hi is not None:
                ax.axhspan(lo, hi, color=c, alpha=0.12, linewidth=0)
        ax.set_xscale("log")
        ax.set_xlim(*xlim)
        if eps_values:
            ax.set_xticks(eps_values)
            ax.set_xticklabels([f"{e:g}" for e in eps_values])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ε per token (ep1)")
        ax.set_title(header)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), bbox_to_anchor=(0.5, -0.08),
                   frameon=False)
    fig.suptitle(f"{group.title}\n(mean over prompts, shaded: 95% interval)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_timing(table: rt.TimingTable, path: Path) -> None:
    """Stacked bars of seconds per prompt by component and configuration, one panel per output limit."""
    plt = _pyplot()
    limits = table.limits
    confs = table.configurations
    fig, axes = plt.subplots(1, len(limits), figsize=(max(4.0, 0.55 * len(confs) + 1.5) * len(limits), 3.8),
                             squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, limit in zip(axes[0], limits):
        bottoms = [0.0] * len(confs)
        for ci, (key, header) in enumerate(rt.TIMING_COMPONENTS):
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
    note = " · accelerator = CPU fallback" if rt.cpu_fallback(table.run) else ""
    fig.suptitle(f"{table.title}{note}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------


def build(root: Path, out: Path, include_tags: Sequence[str] = (), command: str | None = None) -> dict:
    """Write out/report.md and its PNGs from the runs under `root`. Returns a summary for the terminal."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory")
    selection = rt.select(rt.scan(root), include_tags)
    if not selection.finished:
        found = len(selection.finished) + len(selection.problems) + len(selection.skipped_tagged)
        hint = ""
        if selection.skipped_tagged:
            tags = sorted({t for r in selection.skipped_tagged for t in r.tags} & rt.DEFAULT_EXCLUDED_TAGS)
            hint = (f"; {len(selection.skipped_tagged)} run(s) tagged {', '.join(tags)} left out "
                    f"(pass --include-tagged {','.join(tags)})")
        raise ReportError(f"no finished runs under {root} ({found} run director{'y' if found == 1 else 'ies'} "
                          f"found, {len(selection.problems)} failed or unfinished{hint})")

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create the output directory {out}: {exc.strerror or exc}") from None
    runs = selection.finished
    fidelity = rt.fidelity_groups(runs)
    timing = rt.timing_tables(runs)
    others = rt.other_tables_md(runs)
    written: list[Path] = []

    md: list[str] = ["# splitbench report", ""]
    tagged_in = sorted({t for r in runs for t in r.tags} & set(selection.included_tags))
    if tagged_in:
        md += [f"> **Includes runs tagged {', '.join(tagged_in)}** (`--include-tagged {','.join(tagged_in)}`). "
               "Smoke runs use a tiny random model and a few prompts: they test the pipeline and say nothing "
               "about the scheme. Tagged runs are kept in tables of their own, never mixed with untagged ones.", ""]
    md += [f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from `{root}`"
           + (f" by `{command}`" if command else "") + ".", "", "## Provenance", "",
           rt.provenance_md(runs, selection.included_tags), ""]

    if fidelity:
        md += ["## Output fidelity against the baseline (paper Table 2)", "",
               "Each configuration's greedy generations compared per prompt with the baseline configuration's "
               "(paper §7.3.1). Cells are **mean [95% interval]** over prompts, in %: exact match = share of "
               "prompts whose generated ids equal the baseline's; token match = position-wise share of equal "
               "generated ids; BLEU = corpus BLEU (sacrebleu, bootstrap interval); ROUGE-L = mean F1 (rouge-score, "
               "stemmer); semantic sim. = mean cosine × 100 of sentence embeddings. ep1 rows by ascending ε; "
               "epn shows the mean of its per-prompt ε = 1/√n. First divergence = mean first generated position "
               "that differs, over diverging prompts.", ""]
        for i, group in enumerate(fidelity, 1):
            md += [f"### {group.title}", ""]
            details = [f"similarity model `{group.semantic_model}`" if group.semantic_model
                       else "no similarity model (semantic similarity not computed)"]
            if not group.show_variant and group.variants and group.variants[0] not in ("", "default"):
                details.append(f"overrides `{group.variants[0]}`")
            text = "; ".join(details)
            md += [text[0].upper() + text[1:] + ".", "", rt.fidelity_table_md(group), ""]
            png = out / f"{PNG_PREFIX}fidelity_{i}_{group.slug}.png"
            plot_fidelity(group, png)
            written.append(png)
            md += [f"![utility metrics against ε: {group.title}]({png.name})", ""]

    if timing:
        md += ["## Inference time per prompt (paper Table 1 / Fig. 4)", "",
               "Average seconds per prompt over the workload, in batches, every configuration measured side by "
               "side in one process (paper §7.1-7.2). *other* = total minus the five columns before it: "
               "everything kept in the TEE, the Down projection included (shown separately in brackets), as "
               "in the paper's Fig. 4. ÷ TDX and ÷ T3 are the time divided by that configuration's at the same "
               "output limit (below 1 = faster). *Bank precompute* is the noise bank's preparation, outside the "
               "total (the paper precomputes it offline).", ""]
        for i, table in enumerate(timing, 1):
            md += [f"### {table.title}", ""]
            if rt.cpu_fallback(table.run):
                md += ["**Accelerator = CPU fallback** (no CUDA): the device side ran on the CPU, so these "
                       "ratios compare CPU against CPU and do not reproduce the paper's GPU speed-ups.", ""]
            md += ["Seconds per prompt:", "", rt.timing_overview_md(table), "", "By component (seconds per prompt):",
                   "", rt.timing_breakdown_md(table), ""]
            png = out / f"{PNG_PREFIX}timing_{i}_{table.slug}.png"
            plot_timing(table, png)
            written.append(png)
            md += [f"![time per prompt by component: {table.title}]({png.name})", ""]

    for exp, table_md in others:
        md += [f"## Other experiment: {exp}", "", table_md, ""]

    md += ["## Runs in this report", "", rt.runs_md(runs), ""]
    md += ["## Failed and unfinished runs", ""]
    md += [rt.problems_md(selection.problems) if selection.problems else "None.", ""]
    if selection.skipped_tagged:
        tags = sorted({t for r in selection.skipped_tagged for t in r.tags} & rt.DEFAULT_EXCLUDED_TAGS)
        md += [f"{len(selection.skipped_tagged)} run(s) tagged {', '.join(tags)} left out "
               f"(`--include-tagged {','.join(tags)}` to report them, in tables of their own).", ""]

    report = out / REPORT
    _atomic(report, lambda tmp: Path(tmp).write_text("\n".join(md) + "\n", encoding="utf-8"))
    keep = {p.name for p in written}
    for stale in out.glob(f"{PNG_PREFIX}*.png"):
        if stale.name not in keep:
            stale.unlink()
    return {"report": report, "pngs": written, "selection": selection, "fidelity": fidelity, "timing": timing}


def summary_text(result: dict) -> str:
    sel: rt.Selection = result["selection"]
    lines = [f"{PROG}: wrote {result['report']} and {len(result['pngs'])} PNG(s) from {len(sel.finished)} "
             f"finished run(s); {len(sel.problems)} failed/unfinished, {len(sel.skipped_tagged)} tagged run(s) left out"]
    for group in result["fidelity"]:
        lines.append(f"  {group.title}")
        lines.append(f"    {'configuration':<28}{'n':>4}" + "".join(f"{h.split()[0][:8]:>10}" for _, h in rt.UTILITY_METRICS))
        for row in group.rows:
            vals = "".join(f"{rt.fmt_ci(row.ci(k)[0]):>10}" for k, _ in rt.UTILITY_METRICS)
            lines.append(f"    {row.label(group.show_variant)[:27]:<28}{str(row.n_prompts):>4}{vals}")
    for table in result["timing"]:
        lines.append(f"  {table.title} · seconds per prompt")
        lines.append(f"    {'configuration':<24}" + "".join(f"{n:>9}" for n in table.limits))
        for conf in table.configurations:
            cells = [table.cell(conf, n) for n in table.limits]
            lines.append(f"    {conf:<24}" + "".join(f"{rt.fmt_seconds(c.seconds_per_prompt if c else None):>9}"
                                                     for c in cells))
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's default adds a usage block)
        print(f"{PROG}: error: {message} (see {PROG} --help)", file=sys.stderr, flush=True)
        sys.exit(2)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog=PROG, description="Aggregate splitbench runs into report.md + PNGs.")
    parser.add_argument("dir", type=Path, help="a run or sweep directory (searched recursively for results.json)")
    parser.add_argument("--out", type=Path, default=None, help="where report.md and the PNGs go (default: DIR)")
    parser.add_argument("--include-tagged", action="append", default=[], metavar="TAG[,TAG]",
                        help="also report runs with these tags (default: runs tagged smoke are left out)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tags = [t.strip() for item in args.include_tagged for t in item.split(",") if t.strip()]
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    try:
        result = build(args.dir, args.out or args.dir, tags, command=command)
    except ReportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(summary_text(result), flush=True)
    return 0


if __name__ == "__main__":
    main()
