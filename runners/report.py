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
- Table 4 (floating-point error against its bound, per ε, op type, precision and kernel; Down), with a
  plot of error and bound against ε;
- Table 5 (controlled numerical error), with a plot of semantic similarity against mean absolute error;
- the failed and unfinished runs.
The tables come from harness/report_tables.py; this module only draws and writes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import report_attack as ra
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


def plot_fp_error(group: rt.FpErrorGroup, path: Path) -> None:
    """Mean true error and mean bound against ε (log-log), offloaded ops in the headline precision and
    kernel; Down (kept in the TEE) in fp32 and fp64 for contrast; epn at its mean ε."""
    plt = _pyplot()
    prec, kernel = group.headline
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    series = [("offloaded", prec, "mean true error", "o-", "C0"), ("offloaded", prec, "mean bound", "o--", "C0"),
              ("down", "fp32", "Down fp32 error", "s-", "C3"), ("down", "fp32", "Down fp32 bound", "s--", "C3"),
              ("down", "fp64", "Down fp64 error", "^-", "C2"), ("down", "fp64", "Down fp64 bound", "^--", "C2")]
    ep1 = [r for r in group.rows if r.configuration == "ep1" and r.epsilon is not None]
    others = [r for r in group.rows if r not in ep1 and r.x is not None]
    for op, p, label, style, color in series:
        key = "mean_bound" if "bound" in label else "mean_true_error"
        if op == "offloaded":
            label = f"{label} ({p}, {kernel})"
        pts = [(r.epsilon, rt._num((r.cell(p, kernel, op) or {}).get(key))) for r in ep1]
        pts = [(x, y) for x, y in pts if y is not None and y > 0]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], style, color=color, label=label,
                    alpha=1.0 if "error" in label else 0.6)
        for r in others:
            y = rt._num((r.cell(p, kernel, op) or {}).get(key))
            if y is not None and y > 0:
                ax.plot([r.x], [y], "*" if "error" in label else "x", color=color, markersize=10)
    if others:
        ax.plot([], [], "*", color="gray", markersize=10, label="epn (at its mean ε)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε per token")
    ax.set_ylabel("absolute error per output element")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"{group.title}\n(solid: measured mean error; dashed: mean of the proven bound)", fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_controlled(table: rt.ControlledTable, path: Path) -> None:
    """Semantic similarity (95% interval) against mean absolute error (log x); T3 (zero error) as a
    horizontal line; the natural level marked. Token match where no similarity was computed."""
    plt = _pyplot()
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
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(table.title, fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_k_curve(group: ra.AttackGroup, path: Path) -> None:
    """Bayes top-1 recovery against the number k of submissions of the same prompt (fresh masks each),
    measured (95% interval) and predicted for σ/√k, one colour per configuration and ε."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    colors = plt.get_cmap("tab10").colors
    for i, curve in enumerate(ra.k_curves(group)):
        c = colors[i % len(colors)]
        pts = [(k, *v) for k, v in zip(curve.ks, curve.top1) if v[0] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=curve.label)
        bars = [p for p in pts if p[2] is not None and p[3] is not None]
        ax.errorbar([p[0] for p in bars], [p[1] for p in bars], yerr=[[p[1] - p[2] for p in bars],
                    [p[3] - p[1] for p in bars]], fmt="none", ecolor=c, capsize=3)
        pred = [(k, v) for k, v in zip(curve.ks, curve.predicted) if v is not None]
        if pred:
            ax.plot([p[0] for p in pred], [p[1] for p in pred], "x--", color=c, alpha=0.7)
    ax.plot([], [], "x--", color="gray", label="predicted for σ/√k")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("submissions of the same prompt, k (exposures averaged)")
    ax.set_ylabel("Bayes top-1 token recovery (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"{group.title}\nlayer-0 QKV, maximum-likelihood attacker", fontsize=8)
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
    fp_groups = rt.fp_error_groups(runs)
    controlled = rt.controlled_tables(runs)
    others = rt.other_tables_md(runs)
    attacks = ra.attack_groups(runs)
    written: list[Path] = []

    def figure(kind: str, i: int, item: Any, plot: Callable[[Any, Path], None], alt: str) -> list[str]:
        """Draw `item` (a table or group with .slug and .title) into its PNG next to report.md, remember the
        file, and return the markdown that shows it."""
        png = out / f"{PNG_PREFIX}{kind}_{i}_{item.slug}.png"
        plot(item, png)
        written.append(png)
        return [f"![{alt}: {item.title}]({png.name})", ""]

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
            md += figure("fidelity", i, group, plot_fidelity, "utility metrics against ε")

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
            md += figure("timing", i, table, plot_timing, "time per prompt by component")

    if fp_groups:
        md += ["## Floating-point error of unmasking (paper Table 4)", "",
               "Per output element of every offloaded op instance (q, k, v, o, gate, up per layer and the LM head), "
               "over `trials` draws of a captured real input vector, a weight row and a fresh mask η ~ N(0, σ²I) "
               "with the op's σ (paper §7.3.2): the true error |fl(⟨w,x+η⟩) − fl(⟨w,η⟩) − ⟨w,x⟩| against an "
               "exact reference, and the proven bound of docs/fp_bound.md (input rounding, both dot products, "
               "the final subtraction). *bound / error* = mean bound ÷ mean true error (the paper reports about "
               "4); *bound violation* = share of trials whose error exceeds the bound, 0 wherever the kernel "
               "follows the bound's model; *first-order* = γ_d·(Σ|w||x+η| + Σ|w||η|) alone, not a proven bound. "
               "95% interval: t over op instances' mean errors.", ""]
        for i, group in enumerate(fp_groups, 1):
            md += [f"### {group.title}", "", rt.fp_table4_md(group), "",
                   f"Per op type, mean true error / mean bound ({group.headline[0]}, {group.headline[1]} kernel; "
                   "Down is not offloaded, shown for reference):", "", rt.fp_by_op_md(group), ""]
            down = rt.fp_down_md(group)
            if down:
                md += ["Down projection (paper §6.3): its Δ after the gated activation (docs/fp_bound.md §6) "
                       "makes σ, and so the error, orders of magnitude larger; fp64 brings it back down:", "",
                       down, ""]
            md += ["Every working precision and kernel (*library* = torch's F.linear as the engine calls it; "
                   "*sequential* = recursive summation in the working precision, the bound's model; *accumulates "
                   "in* = the accumulator the bound assumed; the bound is ∞ where d·u ≥ 1):", "",
                   rt.fp_precision_md(group), ""]
            probes = rt.fp_probes_md(group)
            if probes:
                md += ["How torch's kernels accumulate here (harness/split/fp_error.probe_accumulation):", "",
                       probes, ""]
            md += figure("fp_error", i, group, plot_fp_error, "error and bound against ε")

    if controlled:
        md += ["## Controlled numerical error (paper Table 5)", "",
               "Every offloaded op call's natural error pattern (the configuration's unmasked output minus T3's "
               "output for the same input) rescaled to a target mean absolute error, generation compared with "
               "T3's (paper §7.3.2). The error column is the error actually realised; the natural row is the "
               "configuration itself. Cells are **mean [95% interval]** over prompts, in %.", ""]
        for i, table in enumerate(controlled, 1):
            md += [f"### {table.title}", "", rt.controlled_table5_md(table), "",
                   *figure("controlled_error", i, table, plot_controlled,
                           "semantic similarity against mean absolute error")]

    if attacks:
        md += ["## Prompt reconstruction (paper Table 6)", "",
               "Can the accelerator rebuild the prompt from what it sees (paper §7.4)? A learned inverter (a decoder "
               "LM reading the exposed vectors through a trained projection, attacks/inversion.py) per attacker "
               "setting and exposed component: *noise-free* = trained and evaluated on unmasked (t3) inputs; "
               "*noise-oblivious* = that attacker on masked inputs; *noise-aware* = trained on inputs masked "
               "with the same mechanism and ε. Token precision / recall / F1: multiset overlap of "
               "reconstruction and prompt tokens, macro over prompts; text metrics on the decoded texts. Cells "
               "are **mean [95% interval]** over the evaluation prompts, in %. *Chance floor*: the token F1 an "
               "unrelated evaluation prompt scores (mean over all pairs). *Gate*: pass when both controls hold and "
               "the upper bound of token F1 is within the stated margin of the floor; a run whose positive control "
               "(the noise-free attacker on t3) or negative control (trained on shuffled pairs) fails is "
               "*invalid*, not private.", ""]
        for i, group in enumerate(attacks, 1):
            md += [f"### {group.title}", "", ra.table6_md(group), "", "Controls:", "", ra.controls_md(group), ""]
            bayes = ra.bayes_md(group)
            if bayes:
                md += ["Bayes-optimal token attacker on the layer-0 QKV exposure (no training: nearest codeword "
                       "LN(E[t]) to the exposure, i.e. maximum likelihood under the Gaussian mask; attacks/bayes.py). "
                       "Top-1 / top-5: % of prompt positions recovered; *k*: the same prompt submitted k times with "
                       "fresh masks and the exposures averaged, beside the recovery predicted for σ/√k:", "", bayes, ""]
            acc = ra.accounting_md(group)
            if acc:
                md += ["Privacy accounting (harness/accounting.py): the per-token ε the paper quotes, and the "
                       "Gaussian-DP composition over every exposure one prompt token reaches (every op, layer, later "
                       "position and decode step), with its (ε, δ)-DP equivalent (dp-accounting):", "", acc, ""]
            if ra.k_curves(group):
                md += figure("attack_k", i, group, plot_k_curve, "Bayes recovery against repeated submissions")

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
    return {"report": report, "pngs": written, "selection": selection, "fidelity": fidelity, "timing": timing,
            "fp_error": fp_groups, "controlled_error": controlled}


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
    for group in result.get("fp_error", []):
        lines.append(f"  {group.title}")
        for row in group.rows:
            c = row.cell(*group.headline, "offloaded") or {}
            lines.append(f"    {row.label():<28} error {rt.fmt_auto(c.get('mean_true_error')):>10}  bound "
                         f"{rt.fmt_auto(c.get('mean_bound')):>10}  violations {rt.fmt_pct(c.get('bound_violation_rate'))}%")
    for table in result.get("controlled_error", []):
        lines.append(f"  {table.title}")
        for r in table.rows:
            lines.append(f"    {r.label(table.configuration):<20} MAE {rt.fmt_auto(r.mae):>10}  semantic "
                         f"{rt.fmt_ci(r.ci('semantic_similarity')[0]):>7}")
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
