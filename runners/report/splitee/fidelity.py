"""Output fidelity against the baseline: paper Table 2 (§7.3.1), from runners/splitee/fidelity.py's runs.

One table per (experiment, model, workload, max_new_tokens, baseline, similarity model, tags); rows are
the ε-taking configuration by ascending ε, then the other configurations in the paper's order. The plot
draws every utility metric against ε, the other configurations as reference lines. Under each table, a
few of its prompts with every configuration's response, departures from the baseline marked (paper
Table 3, example_responses.py).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import configurations
from metrics import names as metric_names
from runners.report.format import fmt_ci, md_table, num, rank, uses_epsilon
from runners.report.plotting import (
    COUNT_LEGEND,
    DASHES,
    Figures,
    crowded_ticklabels,
    legend_entries,
    mark_coincident,
    metric_axis,
    place_labels,
    pyplot,
    save,
    series_style,
)
from runners.report.runs import Run, finished_runs
from runners.report.splitee import example_responses
from runners.report.splitee.fidelity_rows import FidelityGroup, FidelityRow

EXPERIMENT = "fidelity"

# Paper Table 2's row order (Table 1's is the registry's, configurations.NAMES).
ORDER = ("ep1", "epn", "slalom", "t3", "tdx", "cpu", "gpu",
         "stencil", "dx_noise", "dx_stencil", "custext_plus")   # the sanitisers (paper 001) fidelity runs too

# (metrics key, column header) of Table 2, in the paper's order.
UTILITY_METRICS: tuple[tuple[str, str], ...] = (
    ("exact_match", "exact match %"),
    ("token_match_rate", "token match %"),
    ("bleu", "BLEU"),
    ("rouge_l", "ROUGE-L"),
    ("semantic_similarity", "semantic sim. %"),
)

INTRO = ("Each configuration's greedy generations compared per prompt with the baseline configuration's "
         "(paper §7.3.1). Cells are **mean [95% interval]** over prompts, in %: exact match = share of "
         "prompts whose generated ids equal the baseline's; token match = position-wise share of equal "
         "generated ids; BLEU = corpus BLEU (sacrebleu, bootstrap interval); ROUGE-L = mean F1 (rouge-score, "
         "stemmer); semantic sim. = mean cosine × 100 of sentence embeddings. ep1 rows by ascending ε; "
         "epn shows the mean of its per-prompt ε = 1/√n. First divergence = mean first generated position "
         "that differs, over diverging prompts.")


def _sort_key(row: FidelityRow) -> tuple:
    eps = row.epsilon if row.epsilon is not None else math.inf
    return (rank(ORDER, row.configuration), row.configuration, row.variant, eps)


def fidelity_row(run: Run) -> FidelityRow:
    d = run.data
    m = run.metrics
    conf = str(d.get("configuration"))
    eps = num(d.get("epsilon")) if uses_epsilon(conf) else None
    return FidelityRow(run=run, configuration=conf, epsilon=eps, epsilon_mean=num(m.get("epsilon_mean")),
                       variant=run.variant, n_prompts=d.get("n_prompts", m.get("n_prompts")), metrics=m)


def groups(runs: Sequence[Run]) -> list[FidelityGroup]:
    """Group finished fidelity runs into Table-2 tables; rows sorted ep1 by ascending ε, epn, slalom,
    then the rest."""
    by_key: dict[tuple, list[FidelityRow]] = {}
    for run in finished_runs(runs, EXPERIMENT):
        d = run.data
        key = (str(d.get("experiment_name") or "fidelity"), str(d.get("model")), str(d.get("workload")),
               (d.get("generation") or {}).get("max_new_tokens"), d.get("baseline"), d.get("semantic_model"),
               run.tags)
        by_key.setdefault(key, []).append(fidelity_row(run))
    out = [FidelityGroup(*key, rows=sorted(rows, key=_sort_key)) for key, rows in by_key.items()]
    return sorted(out, key=lambda g: (g.tags, g.experiment_name, g.model, g.workload, g.max_new_tokens or 0))


def table_md(group: FidelityGroup) -> str:
    headers = ["configuration", "n", *[h for _, h in UTILITY_METRICS], "first divergence"]
    rows = []
    for row in group.rows:
        cells = [fmt_ci(*row.ci(key)) for key, _ in UTILITY_METRICS]
        rows.append([row.label(group.show_variant), row.n_prompts if row.n_prompts is not None else "—",
                     *cells, _divergence(row.metrics)])
    return md_table(headers, rows)


def _divergence(m: dict[str, Any]) -> str:
    mean = num(m.get("mean_first_divergence"))
    n_div, n = m.get("n_diverging"), m.get("n_prompts")
    if mean is None:
        return "none diverge" if n_div == 0 else "—"
    if n_div is None or n is None:
        return f"{mean:.1f}"
    # With several mask seeds n_diverging is the mean count over seeds: show it as such, not as a long float.
    whole = float(n_div).is_integer()
    count = f"{int(n_div)}/{int(n)} diverge" if whole else f"{float(n_div):.1f}/{int(n)} diverge, mean over mask seeds"
    return f"{mean:.1f} ({count})"


def notes_md(group: FidelityGroup) -> list[str]:
    """Below the table: each row's mask seeds with the spread of exact match across them (with several
    seeds every cell is the mean over seeds), and the wrap-arounds counted in Slalom's modular products."""
    lines = []
    for row in group.rows:
        m, seeds = row.metrics, row.run.data.get("mask_seeds") or []
        if len(seeds) > 1 and num(m.get("exact_match_seed_sd")) is not None:
            lines.append(f"- {row.label()}: mask seeds {', '.join(map(str, seeds))}; exact match across seeds "
                         f"{num(m['exact_match_seed_min']):.2f}–{num(m['exact_match_seed_max']):.2f} % "
                         f"(sd {num(m['exact_match_seed_sd']):.2f})")
        if m.get("slalom_wraps") is not None:
            lines.append(f"- {row.label()}: {int(m['slalom_wraps'])} wrap-arounds of |W_q·x_q| past (q−1)/2 "
                         "counted in its modular products (results.json `slalom`)")
    return lines + [""] if lines else []


def plot(group: FidelityGroup, path: Path) -> None:
    """Each utility metric against ε (log x) for the ε-taking configuration with its 95% band; every
    other configuration as a horizontal reference line with its band."""
    plt = pyplot()
    from matplotlib.ticker import NullFormatter

    metrics = [(k, h) for k, h in UTILITY_METRICS if any(r.ci(k)[0] is not None for r in group.rows)]
    if not metrics:
        metrics = list(UTILITY_METRICS)
    # constrained layout keeps the figure legend below the panels clear of their x labels
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.6), squeeze=False, layout="constrained")
    swept = [r for r in group.rows if r.epsilon is not None]
    refs = [r for r in group.rows if r.epsilon is None]
    eps_values = sorted({r.epsilon for r in swept})
    xlim = (min(eps_values) / 1.6, max(eps_values) * 1.6) if eps_values else (0.3, 20.0)
    series: dict[tuple[str, str], list[FidelityRow]] = {}
    for r in swept:
        series.setdefault((r.configuration, r.variant if group.show_variant else ""), []).append(r)
    # One short label per panel: the privacy parameter of the configurations this group sweeps, by its own name.
    names = sorted({conf for conf, _ in series})
    symbols = dict.fromkeys(configurations.SYMBOLS.get(p, p) for p in
                            ((configurations.REGISTRY[n].parameter_name if n in configurations.REGISTRY else None)
                             or "epsilon" for n in names))
    x_label = f"{' / '.join(symbols) or 'ε'} ({', '.join(names)})" if names else "ε"
    counts: list[list] = []   # per panel, the "×n" labels of points drawn on one another
    for ax, (key, header) in zip(axes[0], metrics):
        color_i = 0
        drawn: list[tuple[float, float]] = []
        for (conf, variant), rows in series.items():
            rows = sorted(rows, key=lambda r: r.epsilon)
            xs = [r.epsilon for r in rows]
            ys = [r.ci(key) for r in rows]
            pts = [(x, m, lo, hi) for x, (m, lo, hi) in zip(xs, ys) if m is not None]
            if not pts:
                continue
            style = series_style(color_i)
            c = style["color"]
            color_i += 1
            label = conf + (f" · {variant}" if variant else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", **style, label=label, zorder=3)
            drawn += [(p[0], p[1]) for p in pts]
            bars = [p for p in pts if p[2] is not None and p[3] is not None]
            ax.errorbar([p[0] for p in bars], [p[1] for p in bars],
                        yerr=[[p[1] - p[2] for p in bars], [p[3] - p[1] for p in bars]], fmt="none", ecolor=c,
                        capsize=3, zorder=3)
            if bars:
                ax.fill_between([p[0] for p in bars], [p[2] for p in bars], [p[3] for p in bars], color=c,
                                alpha=0.2, linewidth=0)
        for j, r in enumerate(refs):
            m, lo, hi = r.ci(key)
            if m is None:
                continue
            style = series_style(color_i)
            c = style["color"]
            color_i += 1
            # Reference lines often coincide (several at 100): later ones thinner and differently dashed, and
            # marked at the panel's edges with the series' marker, so each stays visible and told apart.
            ax.axhline(m, color=c, linestyle=DASHES[j % len(DASHES)], linewidth=max(1.0, 3.0 - 0.6 * j),
                       marker=style["marker"], markevery=[0, 1], label=r.label(group.show_variant), zorder=2)
            if lo is not None and hi is not None:
                ax.axhspan(lo, hi, color=c, alpha=0.12, linewidth=0)
        ax.set_xscale("log")
        ax.set_xlim(*xlim)
        if eps_values:
            ax.set_xticks(eps_values)
            ax.set_xticklabels([f"{e:g}" for e in eps_values])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(x_label)
        # the panel's title is the metric's name (metrics/names.py) and its axis fixed to 0–100
        metric_axis(ax, "y", key, label="")
        ax.set_title(metric_names.label(key))
        ax.grid(True, which="both", alpha=0.3)
        # two swept configurations at the same ε and value: one marker hides the other
        counts.append(mark_coincident(ax, drawn, legend=False))
    if any(counts):
        axes[0][0].plot([], [], " ", label=COUNT_LEGEND)
    handles, labels = legend_entries(axes[0][0])
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), frameon=False)
    fig.suptitle(f"{group.title}\n(mean over prompts, shaded: 95% interval)", fontsize=10)
    fig.draw_without_rendering()   # the final layout, which the tick labels' spacing is measured in
    for ax, panel in zip(axes[0], counts):
        crowded_ticklabels(ax)
        place_labels(ax, panel)
    save(fig, path)


def markdown(items: Sequence[FidelityGroup], figure: Figures) -> list[str]:
    md = ["## Output fidelity against the baseline (paper Table 2)", "", INTRO, ""]
    for i, group in enumerate(items, 1):
        md += [f"### {group.title}", ""]
        details = [f"similarity model `{group.semantic_model}`" if group.semantic_model
                   else "no similarity model (semantic similarity not computed)"]
        if not group.show_variant and group.variants and group.variants[0] not in ("", "default"):
            details.append(f"overrides `{group.variants[0]}`")
        text = "; ".join(details)
        md += [text[0].upper() + text[1:] + ".", "", table_md(group), ""] + notes_md(group)
        md += figure("fidelity", i, group, plot, "utility metrics against ε")
        md += example_responses.markdown(group)
    return md


def summary(items: Sequence[FidelityGroup]) -> list[str]:
    lines = []
    for group in items:
        lines.append(f"  {group.title}")
        lines.append(f"    {'configuration':<28}{'n':>4}" + "".join(f"{h.split()[0][:8]:>10}" for _, h in UTILITY_METRICS))
        for row in group.rows:
            vals = "".join(f"{fmt_ci(row.ci(k)[0]):>10}" for k, _ in UTILITY_METRICS)
            lines.append(f"    {row.label(group.show_variant)[:27]:<28}{str(row.n_prompts):>4}{vals}")
    return lines
