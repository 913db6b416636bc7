"""The report section of experiment=privacy_audit (issue 52; attacks/splitee/privacy_audit.py, metrics/auditing.py,
docs/privacy_audit.md): per model, configuration and setting, each ε's games (worst-case and typical neighbour,
the null) per submission and per exposure: the empirical μ lower bound, the Gaussian fit's μ with its interval,
the pair's own μ and the accountant's, TPR at the target FPRs with Clopper–Pearson intervals; a figure of μ
against ε (log axes) and one of the ROC curves against the accountant's μ-GDP trade-off."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.report.format import file_slug, md_table, tagged
from runners.report.plotting import Figures, legend_outside, pyplot, save
from runners.report.roc import table_md as roc_table
from runners.report.runs import Run, finished_runs

EXPERIMENT = "privacy_audit"
SCOPES = (("submission", "whole submission"), ("exposure", "one exposure"))
GAME_COLOURS = {"worst_case": "C3", "typical": "C0"}   # the pairs the μ figure draws (not the null)
INTRO = ("Two prompts that differ in one token (A, and B: its worst-case neighbour, whose exposures differ most, or "
         "its typical one, the model's likeliest other token there) are submitted through the split engine, a fair "
         "coin choosing for each trial, and the auditor scores every view by the log-likelihood ratio of A against B "
         "over every exposure the token influences (*whole submission*) or over its first exposure alone (*one "
         "exposure*). **μ lower** is what the trials certify at 95%: μ ≥ Φ⁻¹(TPR_lo) − Φ⁻¹(FPR_hi) with "
         "Clopper–Pearson bounds, thresholds set on half the trials and read on the other, the best of the target "
         "FPRs (Bonferroni); 0 means nothing certified. **μ fit** is the Gaussian trade-off the LLR's two "
         "distributions fit (an estimate with its 95% interval, not a bound). **pair μ** is the mechanism's exact μ for "
         "this pair, √Σ‖a−b‖²/σ²; **accountant μ** the composition the label claims, √Σ(Δ/σ)². The audit cannot "
         "certify more than its trials allow (**cap**: a test that separates every trial; 4.7 at 2,000 trials a "
         "pair), however large μ is. The *null* game "
         "submits A under both labels and must certify nothing. TPR cells are % at the target FPR (%) with their "
         "95% interval (docs/privacy_audit.md).")


@dataclass
class AuditGroup:
    """The runs of one model, configuration and setting, one per ε."""

    model: str
    configuration: str
    variant: str
    tags: tuple[str, ...]
    runs: list[Run]

    @property
    def slug(self) -> str:
        return file_slug(f"{self.model}_{self.configuration}_{self.variant}")

    @property
    def title(self) -> str:
        return tagged(f"privacy audit, {self.model} · {self.configuration}"
                      + ("" if self.variant in ("", "default") else f" · {self.variant}"), self.tags)


def _eps(run: Run) -> float:
    value = run.data.get("epsilon")
    return -1.0 if value is None else float(value)


def groups(runs: Sequence[Run]) -> list[AuditGroup]:
    by: dict[tuple, list[Run]] = {}
    for run in finished_runs(runs, EXPERIMENT):
        key = (str(run.data.get("model")), str(run.data.get("configuration")), run.variant, run.tags)
        by.setdefault(key, []).append(run)
    return [AuditGroup(*key, sorted(rs, key=_eps)) for key, rs in sorted(by.items())]


def _games(run: Run) -> dict[str, Any]:
    return (run.data.get("privacy_audit") or {}).get("games") or {}


def _fmt(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _tpr(point: dict) -> str:
    lo, hi = point["tpr_ci_pct"]
    return f"{point['tpr_pct']:.1f} [{lo:.1f}, {hi:.1f}]"


def table_md(group: AuditGroup) -> str:
    targets = [p["fpr_target_pct"] for p in next(iter(_games(group.runs[0]).values()))["submission"]["tpr_at_fpr"]]
    headers = ["ε", "game", "B (A →)", "scope", "μ lower", "cap", "μ fit [95% CI]", "pair μ", "accountant μ",
               *[f"TPR @ FPR {t:g}%" for t in targets]]
    rows = []
    for run in group.runs:
        eps = run.data.get("epsilon")
        for game, entry in _games(run).items():
            for scope, label in SCOPES:
                e = entry[scope]
                lo, hi = e["mu_estimate_ci"]
                # the null game submits A under both labels (runs before the fix recorded the first pair's B)
                swap = "itself" if game == "null" else f"`{entry['text_b']!r}`"
                rows.append([f"{eps:g}" if eps is not None else "—", game, f"`{entry['text_a']!r}` → {swap}", label, _fmt(e["empirical_mu_lower"]),
                             _fmt(e.get("mu_cap"), 2),
                             f"{e['mu_estimate']:.3f} [{lo:.3f}, {hi:.3f}]", _fmt(e["pair_mu"]),
                             _fmt(e["accountant_mu"]), *[_tpr(p) for p in e["tpr_at_fpr"]]])
    return md_table(headers, rows)


def plot_mu(group: AuditGroup, path: Path) -> None:
    """μ against ε, log axes, one panel per scope: the accountant's μ, each pair's own μ, Gaussian fit (95%
    interval) and empirical lower bound (a bound of 0 cannot be drawn on a log axis and is left out; an interval
    reaching 0 is cut at the panel's floor). The null game's μ is 0: the table shows it."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.0), sharey=True)
    values = [v for r in group.runs for game, entry in _games(r).items() if game != "null" for scope, _ in SCOPES
              for v in (entry[scope]["pair_mu"], entry[scope]["mu_estimate"], entry[scope]["empirical_mu_lower"],
                        entry[scope]["accountant_mu"]) if v and v > 0]
    floor = min(values, default=1.0) / 3
    for ax, (scope, label) in zip(axes, SCOPES):
        eps = [_eps(r) for r in group.runs]
        acc = [next(iter(_games(r).values()))[scope]["accountant_mu"] for r in group.runs]
        ax.plot(eps, acc, "s-", color="black", markersize=4, label="accountant μ")
        for game, colour in GAME_COLOURS.items():
            rows = [(_eps(r), _games(r)[game][scope]) for r in group.runs if game in _games(r)]
            if not rows:
                continue
            ax.plot([x for x, _ in rows], [e["pair_mu"] for _, e in rows], "x--", color=colour,
                    label=f"{game}: pair μ")
            fit = [(x, e["mu_estimate"], *e["mu_estimate_ci"]) for x, e in rows if e["mu_estimate"] > 0]
            if fit:
                ax.errorbar([f[0] for f in fit], [f[1] for f in fit],
                            yerr=[[f[1] - max(f[2], floor) for f in fit], [f[3] - f[1] for f in fit]],
                            fmt="o", color=colour, capsize=3, markersize=4, label=f"{game}: μ fit (95% CI)")
            low = [(x, e["empirical_mu_lower"]) for x, e in rows if e["empirical_mu_lower"] > 0]
            if low:
                ax.plot([x for x, _ in low], [y for _, y in low], "^", color=colour, markersize=8,
                        markerfacecolor="none", label=f"{game}: μ lower bound (95%)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor)
        ax.set_xlabel("ε (per exposure)")
        ax.set_title(label, fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("μ (Gaussian DP)")
    # one legend for both panels: a series missing from one (a fit ≤ 0) is still named
    named = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    axes[1].legend(named.values(), named.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                   borderaxespad=0.0, frameon=False)
    fig.suptitle(group.title, fontsize=8)
    fig.tight_layout()
    save(fig, path)


def plot_roc(group: AuditGroup, path: Path) -> None:
    """The first pair's ROC curves of the whole submission at each ε (log axes), each beside the trade-offs
    TPR = Φ(Φ⁻¹(FPR) + μ) of the pair's own μ (dashed: what the mechanism gives this pair) and of the
    accountant's μ (dotted: what the label allows), and chance."""
    from scipy import stats

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.5))
    grid = [10 ** (k / 20) for k in range(-80, 1)]
    for i, run in enumerate(group.runs):
        games = _games(run)
        game = next((g for g in games if g != "null"), None)
        curve = ((run.data.get("roc") or {}).get(game) or {}).get("submission")
        if curve is None:
            continue
        colour = f"C{i % 10}"
        pts = [(f / 100, t / 100) for f, t in zip(curve["fpr_pct"], curve["tpr_pct"]) if f > 0 and t > 0]
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color=colour,
                label=f"ε={_eps(run):g}: {game}")
        for key, style, name in (("pair_mu", "--", "the pair"), ("accountant_mu", ":", "accountant")):
            mu = games[game]["submission"][key]
            ax.plot(grid, [max(1e-4, float(stats.norm.cdf(stats.norm.ppf(f) + mu))) for f in grid], style,
                    color=colour, lw=0.9, label=f"ε={_eps(run):g}: {name}'s μ = {mu:.3g}")
    ax.plot(grid, grid, "-", color="gray", lw=0.8, label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1e-4, 1)
    ax.set_ylim(1e-4, 1.05)
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax, size=7)
    ax.set_title(group.title, fontsize=8)
    fig.tight_layout()
    save(fig, path)


def markdown(items: Sequence[AuditGroup], figure: Figures) -> list[str]:
    md = ["## Empirical privacy audit of the Gaussian masks", "", INTRO, ""]
    for i, group in enumerate(items, 1):
        first = group.runs[0].data
        audit = first.get("privacy_audit") or {}
        md += [f"### {group.title}", "",
               f"Prompt {audit.get('prompt_id')}: the differing token at position "
               f"{next(iter(audit.get('games', {}).values()), {}).get('position')}, "
               f"{audit.get('accountant_exposures')} exposures influenced; {first['metrics'].get('n_trials')} trials "
               f"a pair; one exposure = {audit.get('exposure')} at the differing position.", "",
               table_md(group), "",
               *roc_table(group.runs, lambda run: f"ε={_eps(run):g}"),
               *figure("privacy_audit_mu", i, group, plot_mu, "μ against ε: audit, pair and accountant"),
               *figure("privacy_audit_roc", i, group, plot_roc, "ROC of the whole submission")]
    return md


def summary(items: Sequence[AuditGroup]) -> list[str]:
    lines = []
    for group in items:
        lines.append(f"  {group.title}")
        for run in group.runs:
            m = run.metrics
            lines.append(f"    ε={_eps(run):g}: μ lower {_fmt(m.get('empirical_mu_lower'))}, fit "
                         f"{_fmt(m.get('mu_estimate'))}, pair {_fmt(m.get('pair_mu'))}, accountant "
                         f"{_fmt(m.get('accountant_mu'))}")
    return lines
