"""Cloud-edge collaborative decoding (paper 003), from runners/collab.py's runs.

One group per (edge model, cloud model, benchmark, number of examples, fusion mode, tags): its runs differ
only in defence and parameter, so they share the floor and the controls.
- a DecodeLeak table (paper Table 1 and Tables A3/A4): utility, Token-ER / ROUGE1-ER / Span-ER / AUC at
  the headline K with floor and excess, inversion ROUGE-1 recall, verdict;
- a matched-utility table: each defence's Token-ER@K at the utility closest to CoVeil's best point;
- runs outside the group's main setting (its most common α and CoVeil pool |C|: the edge alone at α = 0
  for Table A2, other pool sizes for Table A1) are table rows labelled with the difference, not curve points;
- three plots: Token-ER against K for every run with the floor (Figure 3), Token-ER@K against utility
  per defence (Figure 4), and the inversion's ROUGE-1 recall against utility (Figure 5) where it ran.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from attacks.controls import AT_CHANCE, INCONCLUSIVE
from metrics import names
from metrics.equivalence import certifiable_margin, examples_needed, t_interval_sd, zero_spread_bound
from runners.report.format import configuration_label, file_slug, fmt_ci, md_table, num, run_order, tagged
from runners.report.plotting import Figures, mark_coincident, metric_axis, pyplot, save_axes, series_style
from runners.report.roc import table_md as roc_table
from runners.report.runs import Run, finished_runs

EXPERIMENT = "collab"
ORDER = ("collab_none", "coveil", "collab_cogenesis", "collab_dp_logit", "collab_dp_fusion", "collab_custext",
         "collab_ldp_sampler", "collab_invisibleink")
METRICS = (("token_er", "Token-ER"), ("rouge1_er", "ROUGE1-ER"), ("span_er", "Span-ER"), ("auc", "AUC"))
INTRO = ("An edge model holding the private context x_priv and a cloud model holding only the public query "
         "decode together (p = α·p_L + (1−α)·p_S, greedy); the cloud sees the edge's uploaded probabilities "
         "(cloud-side fusion) or the synchronised tokens (edge-side). DecodeLeak (runners/collab.py, "
         "docs/collab.md): % of the private evidence's content tokens / words / spans inside the union of the "
         "per-step top-K exposure sets, and the cloud's reconstruction of x_priv (ROUGE-1 recall). *floor*: the "
         "same metric on the cloud's own top-K along a cloud-only generation (no signal at all); *excess*: the "
         "paired difference, mean [95% interval] over examples (the headline). *Informed*: the signal's sets united "
         "with the cloud's own no-signal guesses; its excess over the floor credits any extra coverage and is not "
         "a leak statistic. *Excess over null* (the verdict's statistic): the informed attacker on the signal "
         "minus the same attacker on the null signal (the same defence and parameter at its own seed, seed + 2, "
         "the edge without x_priv), paired over examples. *Verdict*: leak | at_chance | inconclusive (attacks/controls.classify; "
         "positive control: the undefended run against its own null, dose = the whole private context's "
         "effect on the undefended protocol, lower bound >= the positive margin; it would catch an attacker or "
         "models that cannot see x_priv at all; negative control: a second null signal (seed + 1) against the "
         "null, dose 0, must not read leak; it would catch a statistic that rewards a signal without "
         "information, such as random ids against the floor). at_chance reads the interval the sample earned "
         "(docs/design.md, issue 51): n examples that all agree bound the mean by ±B·CP_U(0, n), 11.6 pp at n = 30 "
         "and B = 100 pp, so a stored at_chance whose interval cannot reach that reads inconclusive here. *Earned "
         "interval*: the interval at_chance reads. *Certifiable margin*: the margin the point's n certifies with 80 % "
         "probability at a true null (metrics/equivalence.certifiable_margin, earned bound included) at the larger "
         "of its own and its negative control's per-example spread, and the n the gate margin needs for that "
         "(examples_needed). Results "
         "from before issue 31 have no excess "
         "over the null (—): their verdicts were read on the informed excess over the floor and are not evidence.")


def reread(stored: dict[str, Any], verdict: str | None, n: int) -> str | None:
    """A stored verdict read under the earned rule (attacks/collab/decodeleak.py, issue 51): results written before
    it hold no earned interval, and their at_chance stands only if the earned interval's floor ±B·CP_U(0, n)
    around the mean (B = the stored per_item_bound_pp, else 100 pp) also lies within ±m. The floor is
    necessary, not sufficient (the sparse-spread part needs the per-example values), so this never makes a
    verdict at_chance."""
    if verdict != AT_CHANCE or "null_excess_token_er_earned_ci" in stored:
        return verdict
    if n < 1 or "null_excess_token_er" not in stored:
        return INCONCLUSIVE
    m, mean = float(stored["gate_margin_pp"]), float(stored["null_excess_token_er"])
    lo, hi = stored["null_excess_token_er_ci"]
    h0 = zero_spread_bound(n, float(stored.get("per_item_bound_pp", 100.0)))
    ok = hi > lo and -m <= min(lo, mean - h0) and max(hi, mean + h0) <= m
    return AT_CHANCE if ok else INCONCLUSIVE


def certifiable(stored: dict[str, Any], n: int) -> str:
    """The margin a point's n examples certify with 80 % probability at a true null, and the n its gate margin
    m needs (metrics/equivalence.certifiable_margin and examples_needed, with the earned bound at the stored
    per_item_bound_pp), in words where n falls short. The spread is the larger of the point's own statistic's
    and its negative control's (a second null against the null), each recovered from its t interval: a
    certification must hold at the spread the point showed and at the one its mechanism shows without x_priv."""
    if n < 2 or "null_excess_token_er_ci" not in stored:
        return "—"
    m, b = float(stored["gate_margin_pp"]), float(stored.get("per_item_bound_pp", 100.0))
    sd = max(t_interval_sd(*stored[key], n) for key in ("null_excess_token_er_ci", "negative_control_excess_token_er_ci")
             if key in stored)
    reach = certifiable_margin(sd, n, per_item_bound=b)
    try:
        need = f"n = {examples_needed(sd, m, per_item_bound=b):,}"
    except ValueError:     # past examples_needed's limit
        need = "more than 10,000,000 examples"
    if reach <= m:
        return f"±{reach:.1f} pp (±{m:g} pp needs {need})"
    return f"n = {n} certifies ±{reach:.1f} pp, not ±{m:g} pp; ±{m:g} pp needs {need}"


@dataclass
class CollabGroup:
    key: tuple
    runs: list[Run]

    @property
    def title(self) -> str:
        edge, cloud, bench, n, fusion, tags = self.key
        return tagged(f"collab: {edge} edge / {cloud} cloud · {bench} · {n} examples · {fusion}-side fusion", tags)

    @property
    def slug(self) -> str:
        return file_slug(f"{self.key[0]}_{self.key[1]}_{self.key[2]}_{self.key[4]}")

    @property
    def k(self) -> str:
        return str(self.runs[0].data["controls"]["verdict_k"])

    @cached_property
    def setting(self) -> dict[str, Any]:
        return _setting(self.runs)

    @cached_property
    def points(self) -> list[Run]:
        """The runs in the group's main setting: the points of the trade-off curves and the matched table."""
        return [r for r in self.runs if not _ablation(r, self.setting)]


def _knob(run: Run, key: str) -> Any:
    """α or CoVeil's pool size |C| of a run: results.json's field, else (runs from before results recorded
    the pool size) the resolved config in its provenance; None where it does not apply."""
    d = run.data
    if key == "candidates" and d.get("configuration") != "coveil":
        return None
    if d.get(key) is not None:
        return d[key]
    return ((run.provenance.get("config") or {}).get("collab") or {}).get(key)


def _setting(runs: Sequence[Run]) -> dict[str, Any]:
    """The group's main setting: the most common fusion weight α and CoVeil pool size |C| among its runs."""
    def common(key: str) -> Any:
        values = [v for r in runs if (v := _knob(r, key)) is not None]
        return Counter(values).most_common(1)[0][0] if values else None
    return {"alpha": common("alpha"), "candidates": common("candidates")}


def _ablation(run: Run, setting: dict[str, Any]) -> list[str]:
    """What sets a run apart from its group's main setting (Table A2's edge alone at α = 0, Table A1's pool
    sizes): such runs are table rows, not points of the trade-off curves."""
    out = []
    alpha, candidates = _knob(run, "alpha"), _knob(run, "candidates")
    if alpha is not None and alpha != setting["alpha"]:
        out.append(f"α={float(alpha):g}")
    if candidates is not None and candidates != setting["candidates"]:
        out.append(f"|C|={int(candidates)}")
    return out


def _label(run: Run, setting: dict[str, Any]) -> str:
    base = configuration_label(str(run.data.get("configuration")), num(run.data.get("epsilon")), None, compact=True)
    return " ".join([base, *_ablation(run, setting)])


def _order(run: Run) -> tuple:
    return run_order(ORDER, run.data)


def groups(runs: Sequence[Run]) -> list[CollabGroup]:
    by: dict[tuple, list[Run]] = {}
    for run in finished_runs(runs, EXPERIMENT):
        d = run.data
        key = (d.get("model"), d.get("cloud_model"), (d.get("benchmark") or {}).get("name"), d.get("n_prompts"),
               d.get("fusion"), run.tags)
        by.setdefault(key, []).append(run)
    return [CollabGroup(k, sorted(v, key=_order)) for k, v in sorted(by.items(), key=lambda kv: str(kv[0]))]


def _cell(d: dict[str, Any], name: str, k: str) -> str:
    lo, hi = (d.get(f"{name}_ci") or {}).get(k, [None, None]) if isinstance(d.get(f"{name}_ci"), dict) else (None, None)
    # DecodeLeak's rates (and AUC, a mean of Token-ER) are percentages, their excesses differences of two
    lo, hi = names.clip("excess_pp" if "excess" in name else "token_er_at_1", num(lo), num(hi))
    return fmt_ci((d.get(name) or {}).get(k), lo, hi, 1)


def table_md(group: CollabGroup) -> list[str]:
    k = group.k
    head = ["defence", group.runs[0].data["utility"]["metric"]]
    for _, label in METRICS:
        head += [f"{label}@{k}", "floor", "excess"]
    head += ["inversion R-1 recall (floor)", f"informed excess Token-ER@{k}", "excess over null (verdict)",
             "earned interval (at_chance reads)", "verdict", "certifiable margin (80 %)"]
    rows = []
    for run in group.runs:
        d = run.data
        u = d["utility"]
        row = [_label(run, group.setting), fmt_ci(u["value"], *names.clip(str(u["metric"]), *u["ci"]), 1)]
        for m, _ in METRICS:
            row += [_cell(d, f"{m}_at_k", k), f"{num(d[f'floor_{m}_at_k'][k]):.1f}", _cell(d, f"excess_{m}_at_k", k)]
        inv = d.get("inversion_rouge1_recall")
        row.append("—" if inv is None else f"{inv:.1f} ({d['floor_inversion_rouge1_recall']:.1f})")
        row.append(_cell(d, "informed_excess_token_er_at_k", k) if "informed_excess_token_er_at_k" in d else "—")
        c = d.get("controls") or {}
        row.append(fmt_ci(c["null_excess_token_er"], *c["null_excess_token_er_ci"], 1)
                   if "null_excess_token_er" in c else "—")
        earned = c.get("null_excess_token_er_earned_ci")
        row.append("—" if earned is None else f"[{earned[0]:.1f}, {earned[1]:.1f}]")
        n = int(d.get("n_prompts") or 0)
        # re-read under the earned rule (issue 51): a stored at_chance from a zero-width or too-small sample is not one
        row.append(reread(c, d.get("verdict"), n) if c else d.get("verdict"))
        row.append(certifiable(c, n))
        rows.append(row)
    u = group.runs[0].data["utility"]
    note = f"The cloud alone: {u['metric']} {u['cloud_only']:.1f}"
    if u.get("constant_answer_floor") is not None:
        note += (f"; the constant-answer floor (always the most frequent gold option) {u['constant_answer_floor']:.1f}: "
                 "accuracy at or below it shows no skill, and a defence cannot lower it measurably")
    return [md_table(head, rows), "", note + "."]


def matched_md(group: CollabGroup) -> list[str]:
    """Each defence's Token-ER@K at the utility nearest to CoVeil's highest-utility point."""
    k = group.k
    points = group.points
    coveil = [r for r in points if r.data["configuration"] == "coveil"]
    if not coveil:
        return []
    target = max(coveil, key=lambda r: (r.data["utility"]["value"], -r.data["token_er_at_k"][k]))
    u0 = target.data["utility"]["value"]
    rows = []
    for name in dict.fromkeys(r.data["configuration"] for r in points):
        runs = [r for r in points if r.data["configuration"] == name]
        best = min(runs, key=lambda r: (abs(r.data["utility"]["value"] - u0), r.data["token_er_at_k"][k]))
        informed = (_cell(best.data, "informed_excess_token_er_at_k", k)
                    if "informed_excess_token_er_at_k" in best.data else "—")
        rows.append([_label(best, group.setting), f"{best.data['utility']['value']:.1f}", _cell(best.data, "token_er_at_k", k),
                     _cell(best.data, "excess_token_er_at_k", k), informed])
    return [f"Matched utility: each defence's point nearest to CoVeil's {group.runs[0].data['utility']['metric']} "
            f"{u0:.1f} ({_label(target, group.setting)}):", "",
            md_table(["defence (point)", "utility", f"Token-ER@{k}", "excess", "informed excess"], rows)]


def plot_curves(group: CollabGroup, png: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    floor_done = False
    drawn: list[tuple[float, float]] = []
    for i, run in enumerate(group.runs):
        d = run.data
        ks = [int(x) for x in d["token_er_at_k"]]
        ax.plot(ks, [d["token_er_at_k"][str(x)] for x in ks], ms=4, **series_style(i), label=_label(run, group.setting))
        drawn += [(float(x), float(d["token_er_at_k"][str(x)])) for x in ks]
        if not floor_done:
            ax.plot(ks, [d["floor_token_er_at_k"][str(x)] for x in ks], "k--", label="floor (cloud alone)")
            floor_done = True
    ax.set_xscale("log")
    ax.set_xlabel("K (top-K exposure per step)")
    metric_axis(ax, "y", "token_er_at_1", label="Token-ER@K (%)")
    counts = mark_coincident(ax, drawn)
    save_axes(fig, ax, png, group.title, labels=counts)


def plot_tradeoff(group: CollabGroup, png: Path, inversion: bool = False) -> None:
    """Leakage against utility per defence: Token-ER@K (Figure 4) or, with `inversion`, the cloud's
    reconstruction's ROUGE-1 recall (Figure 5); the no-signal floor dashed, the utility of the cloud alone
    dash-dotted (a defence below it loses what collaborating gains), the constant answer dotted."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    k = group.k

    def leak(d: dict[str, Any]) -> float:
        return d["inversion_rouge1_recall"] if inversion else d["token_er_at_k"][k]

    points = group.points
    for i, name in enumerate(dict.fromkeys(r.data["configuration"] for r in points)):
        runs = [r for r in points if r.data["configuration"] == name]
        style = series_style(i) if name != "collab_none" else {**series_style(i), "marker": "*"}
        ax.plot([leak(r.data) for r in runs], [r.data["utility"]["value"] for r in runs],
                ms=9 if name == "collab_none" else 5, **style, label=name)
    d0 = group.runs[0].data
    ax.axvline(d0["floor_inversion_rouge1_recall"] if inversion else d0["floor_token_er_at_k"][k], color="k", ls="--",
               label="floor")
    ax.axhline(d0["utility"]["cloud_only"], color="tab:brown", ls="-.", lw=1, label="cloud alone (utility)")
    constant = d0["utility"].get("constant_answer_floor")
    if constant is not None:
        ax.axhline(constant, color="grey", ls=":", label="constant-answer floor")
    metric_axis(ax, "x", "inversion_rouge1_recall" if inversion else f"token_er_at_{k}")
    metric_axis(ax, "y", str(d0["utility"]["metric"]))
    counts = mark_coincident(ax, [(float(leak(r.data)), float(r.data["utility"]["value"])) for r in points])
    save_axes(fig, ax, png, group.title, labels=counts)


def plot_inversion_tradeoff(group: CollabGroup, png: Path) -> None:
    plot_tradeoff(group, png, inversion=True)


def _has_inversion(group: CollabGroup) -> bool:
    return all(r.data.get("inversion_rouge1_recall") is not None for r in group.runs)


def markdown(items: Sequence[CollabGroup], figure: Figures) -> list[str]:
    lines = ["## Cloud-edge collaborative decoding (paper 003)", "", INTRO, ""]
    for i, g in enumerate(items):
        lines += [f"### {g.title}", "", *table_md(g), ""]
        matched = matched_md(g)
        lines += [*matched, ""] if matched else []
        lines += roc_table(g.runs, lambda run: _label(run, g.setting))
        lines += figure("collab_curves", i, g, plot_curves, "Token-ER against K")
        lines += figure("collab_tradeoff", i, g, plot_tradeoff, "privacy-utility (evidence recall)")
        if _has_inversion(g):
            lines += figure("collab_inversion", i, g, plot_inversion_tradeoff, "privacy-utility (inversion)")
    return lines


def summary(items: Sequence[CollabGroup]) -> list[str]:
    out = []
    for g in items:
        k = g.k
        for run in g.runs:
            d = run.data
            out.append(f"  collab {d['fusion']}-side {_label(run, g.setting)}: Token-ER@{k} {d['token_er_at_k'][k]:.1f} "
                       f"(floor {d['floor_token_er_at_k'][k]:.1f}), {d['utility']['metric']} "
                       f"{d['utility']['value']:.1f}, {d['verdict']}")
    return out
