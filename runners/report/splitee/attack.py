"""Prompt reconstruction: paper Table 6 (§7.4) and its companions, from runners/splitee/attack.py's runs.

- `groups(runs)`: one group per (experiment name, model, workload, number of prompts, tags); a group's
  rows are its runs, sorted t3 first, then ep1 by ascending ε, then epn; within a configuration
  noise-free, noise-oblivious, noise-aware; then by component.
- `table6_md`: settings × components with token precision / recall / F1, semantic similarity, BLEU,
  ROUGE-L and exact match as "mean [95% interval]", the verdicts per run (learned attacker, Bayes attacker,
  the run's worst), and the chance-floor row.
- `verdicts_md`: the verdict per configuration and ε, the worst over every attacker run against it
  (every setting and component, learned and Bayes) among the selected runs.
- `controls_md`, `bayes_md`, `accounting_md`: the controls per run; the Bayes attacker and its
  repeated-submission curve per configuration and ε; the privacy accounting per configuration and ε.
- `k_curves(group)` and `plot`: the k-exposure plot.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks import controls
from harness import configurations
from runners.report.format import (
    ci,
    configuration_label,
    file_slug,
    fmt_ci,
    fmt_eps,
    gaussian,
    md_table,
    num,
    rank,
    tagged,
)
from runners.report.plotting import Figures, mark_coincident, metric_axis, pyplot, save_axes
from runners.report.roc import table_md as roc_table
from runners.report.runs import Run, finished_runs
from runners.report.splitee import sequential_attack

EXPERIMENT = "attack"

# Table 6's display orders.
ORDER = ("t3", "ep1", "epn")
SETTING_ORDER = ("noise_free", "noise_oblivious", "noise_aware")
COMPONENT_ORDER = ("qkv", "composite", "o", "gate_up", "lm_head")
SETTING_LABEL = {"noise_free": "noise-free", "noise_oblivious": "noise-oblivious", "noise_aware": "noise-aware"}
COMPONENT_LABEL = {"qkv": "QKV", "composite": "composite (QKV+O+Gate/Up)", "o": "O", "gate_up": "Gate/Up",
                   "lm_head": "LM head"}
TABLE6_METRICS = (("token_precision", "token precision %"), ("token_recall", "token recall %"),
                  ("token_f1", "token F1 %"), ("semantic_similarity", "semantic sim. %"), ("bleu", "BLEU"),
                  ("rouge_l", "ROUGE-L"), ("exact_match", "exact match %"))

INTRO = ("Can the accelerator rebuild the prompt from what it sees (paper §7.4)? A learned inverter (a decoder "
         "LM reading the exposed vectors through a trained projection, plus by default an evidence head "
         "that scores each position's projected exposure against every token's embedding; "
         "attacks/inversion.py) per attacker setting and exposed component: *noise-free* = trained and evaluated on unmasked (t3) inputs; "
         "*noise-oblivious* = that attacker on masked inputs; *noise-aware* = trained on inputs masked "
         "with the same mechanism and ε. Token precision / recall / F1: multiset overlap of "
         "reconstruction and prompt tokens, macro over prompts; text metrics on the decoded texts. Cells "
         "are **mean [95% interval]** over the evaluation prompts, in %. *Chance floor*: the token F1 an "
         "unrelated evaluation prompt scores (mean over all pairs). *Verdict* (attacks/controls.py), with m the "
         "run's margin (`gate_margin_pp`) and [lo, hi] the 95% interval of token F1: **leak** when lo > floor + m "
         "(and the negative control, an attacker trained on shuffled pairs, stays at the floor); *at chance* "
         "when the whole interval lies within floor ± m and both controls hold (the positive control: the "
         "noise-free attacker on t3 reaches the floor + its margin); *inconclusive* otherwise: below the floor "
         "(the attacker failed, which says nothing about the masks), an interval reaching past floor ± m, or a "
         "failed control. The Bayes attacker gets the same rule against the F1 its guesses score on the other "
         "prompts. A run's verdict is the worst of its attackers (leak > inconclusive > at chance), and a "
         "configuration's the worst over every run against it: a weak learned attacker at chance is no "
         "evidence of privacy when the Bayes attacker recovers the prompt.")
VERDICTS_INTRO = ("Verdict per configuration and ε: the worst over every attacker run against it here (each "
                  "setting and component, learned and Bayes, and, where the root holds its runs for the same model "
                  "and workload, the sequential all-exposure attacker: MAP judged against the prior alone and the "
                  "likelihood alone, its strongest run shown; leak > inconclusive > at chance), for one submission "
                  "of each prompt. The last column is another threat model, the same prompt submitted k times with "
                  "fresh masks: the fewest k whose averaged exposures give the Bayes attacker a top-1 lower bound "
                  "above the top-1 of truth-independent guesses + the margin:")
BAYES_INTRO = ("Bayes-optimal token attacker on the layer-0 QKV exposure (no training: nearest codeword "
               "LN(E[t]) to the exposure, i.e. maximum likelihood under the Gaussian mask; attacks/splitee/bayes.py). "
               "Top-1 / top-5: % of prompt positions recovered; *k*: the same prompt submitted k times with "
               "fresh masks and the exposures averaged, beside the recovery predicted for σ/√k:")
ACCOUNTING_INTRO = ("Privacy accounting (harness/splitee/accounting.py): the per-token ε the paper quotes, and the "
                    "Gaussian-DP composition over every exposure one prompt token reaches (every op, layer, later "
                    "position and decode step), with its (ε, δ)-DP equivalent (dp-accounting):")


@dataclass
class AttackRow:
    run: Run

    @property
    def data(self) -> dict[str, Any]:
        return self.run.data

    @property
    def m(self) -> dict[str, Any]:
        return self.run.metrics

    @property
    def configuration(self) -> str:
        return str(self.data.get("configuration"))

    @property
    def epsilon(self) -> float | None:
        return num(self.data.get("epsilon"))

    @property
    def setting(self) -> str:
        return str((self.data.get("attack") or {}).get("setting"))

    @property
    def component(self) -> str:
        return str((self.data.get("attack") or {}).get("component"))

    @property
    def layer(self) -> Any:
        return (self.data.get("attack") or {}).get("layer")

    def privacy_label(self) -> str:
        return configuration_label(self.configuration, self.epsilon, num(self.m.get("epsilon_mean")), compact=True)

    def sort_key(self) -> tuple:
        eps = self.epsilon if self.epsilon is not None else -math.inf
        return (rank(ORDER, self.configuration), eps, rank(SETTING_ORDER, self.setting),
                rank(COMPONENT_ORDER, self.component), str(self.layer))

    def ci(self, key: str) -> tuple[float | None, float | None, float | None]:
        return ci(self.m, key)

    @property
    def learned_verdict(self) -> str | None:
        """leak | at_chance | inconclusive; results from before the three-way verdict are re-derived
        (attacks.controls.recompute), so an old below-floor "pass" reads inconclusive."""
        return controls.recompute(self.m)

    @property
    def bayes_verdict(self) -> str | None:
        return controls.recompute_bayes(self.m)

    @property
    def verdict(self) -> str | None:
        """The run's verdict: the worst of its learned and its Bayes attacker."""
        return controls.worst([self.learned_verdict, self.bayes_verdict])


@dataclass
class AttackGroup:
    experiment_name: str
    model: str
    workload: str
    n_prompts: Any
    tags: tuple[str, ...]
    rows: list[AttackRow]
    # the sequential attacker's runs (experiment=sequential_attack) of the same model, workload and tags,
    # per (configuration, ε): they join the verdict per configuration (issue 32 item 3)
    sequential: dict[tuple[str, float | None], list[Run]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return tagged(f"{self.experiment_name}: {self.model} · {self.workload} · {self.n_prompts} evaluation prompts",
                      self.tags)

    @property
    def slug(self) -> str:
        raw = "_".join(str(x) for x in (self.experiment_name, self.model, self.workload, *self.tags))
        return file_slug(raw)

    def floors(self) -> list[float]:
        return sorted({round(v, 6) for r in self.rows if (v := num(r.m.get("chance_floor_token_f1"))) is not None})

    def pairs(self) -> list[tuple[tuple[str, float | None], list[AttackRow]]]:
        """Every run of each (configuration, ε), in display order."""
        out: dict[tuple[str, float | None], list[AttackRow]] = {}
        for r in self.rows:
            out.setdefault((r.configuration, r.epsilon), []).append(r)
        return list(out.items())

    def by_privacy(self) -> list[AttackRow]:
        """The first run of every (configuration, ε): the Bayes attacker and the accounting are per
        configuration and ε, the same in every run of that pair."""
        seen, out = set(), []
        for r in self.rows:
            key = (r.configuration, r.epsilon)
            if key not in seen:
                seen.add(key)
                out.append(r)
        return out


def groups(runs: Sequence[Run]) -> list[AttackGroup]:
    by_key: dict[tuple, list[AttackRow]] = {}
    for run in finished_runs(runs, EXPERIMENT):
        d = run.data
        key = (str(d.get("experiment_name") or "attack"), str(d.get("model")), str(d.get("workload")),
               d.get("n_prompts"), run.tags)
        by_key.setdefault(key, []).append(AttackRow(run))
    out = [AttackGroup(*key, rows=sorted(rows, key=AttackRow.sort_key)) for key, rows in by_key.items()]
    for run in finished_runs(runs, sequential_attack.EXPERIMENT):
        d = run.data
        for g in out:
            if (g.model, g.workload, g.tags) == (str(d.get("model")), str(d.get("workload")), run.tags):
                g.sequential.setdefault((str(d.get("configuration")), num(d.get("epsilon"))), []).append(run)
    return sorted(out, key=lambda g: (g.tags, g.experiment_name, g.model, g.workload))


VERDICT_LABEL = {controls.LEAK: "**leak**", controls.AT_CHANCE: "at chance", controls.INCONCLUSIVE: "inconclusive"}


def _label(verdict: str | None, why: str | None = None) -> str:
    if verdict is None:
        return "—"
    text = VERDICT_LABEL.get(verdict, verdict)
    return f"{text} ({why})" if why else text


def _why_learned(row: AttackRow) -> str | None:
    """Why the learned attacker is inconclusive: a failed control, wholly below floor − margin, or an
    interval reaching past floor ± margin."""
    m = row.m
    if row.learned_verdict != controls.INCONCLUSIVE:
        return None
    if not (m.get("positive_control_pass") and m.get("negative_control_pass")):
        return "control failed"
    lo, hi = _certified(m, "token_f1")
    floor, margin = num(m.get("chance_floor_token_f1")), num(m.get("gate_margin_pp"))
    return _why_interval(lo, hi, floor, margin, "floor")


def _certified(m: dict, key: str) -> tuple[float | None, float | None]:
    """The interval the verdict's at_chance read: the earned one where the run stored it (issue 51), else the data's."""
    if f"{key}_earned_ci_lo" in m:
        return num(m.get(f"{key}_earned_ci_lo")), num(m.get(f"{key}_earned_ci_hi"))
    return num(m.get(f"{key}_ci_lo")), num(m.get(f"{key}_ci_hi"))


def _why_interval(lo: float | None, hi: float | None, reference: float | None, margin: float | None,
                  name: str) -> str:
    """An inconclusive interval's reason in the table's words (attacks.controls.interval_case)."""
    if None in (lo, hi, reference, margin):
        return f"interval past {name} ± margin"
    return {"below": f"below {name}", "above": f"above {name}, not clear of {name} + margin",
            "wide": f"interval past {name} ± margin"}[controls.interval_case(lo, hi, reference, margin)]


def _why_bayes(row: AttackRow) -> str | None:
    m = row.m
    if row.bayes_verdict != controls.INCONCLUSIVE:
        return None
    if "bayes_verdict" not in m:
        return "old run: no Bayes control"
    if not m.get("bayes_positive_control_pass"):
        return "control failed"
    lo, hi = _certified(m, "bayes_token_f1")
    return _why_interval(lo, hi, num(m.get("bayes_token_f1_chance")), num(m.get("gate_margin_pp")), "chance")


def table6_md(group: AttackGroup) -> str:
    """One row per run; beside the learned attacker's metrics and verdict, the Bayes attacker's token
    recovery and verdict under the same configuration and ε (it reads layer-0 QKV whatever the row's
    component, so it repeats down a pair), and the run's verdict, the worst of the two. An inconclusive
    verdict says why (a failed control, below the floor, or an interval reaching past floor ± margin)."""
    headers = ["configuration", "attacker", "component", *[h for _, h in TABLE6_METRICS], "learned verdict",
               "Bayes top-1 % (layer-0 QKV)", "Bayes verdict", "verdict"]
    rows = []
    for r in group.rows:
        comp = COMPONENT_LABEL.get(r.component, r.component)
        if r.component != "lm_head" and r.layer not in (None, 0):
            comp += f" (layer {r.layer})"
        rows.append([r.privacy_label(), SETTING_LABEL.get(r.setting, r.setting), comp,
                     *[fmt_ci(*r.ci(k)) for k, _ in TABLE6_METRICS], _label(r.learned_verdict, _why_learned(r)),
                     fmt_ci(*r.ci("bayes_top1")), _label(r.bayes_verdict, _why_bayes(r)), _label(r.verdict)])
    floors = group.floors()
    floor = (f"{floors[0]:.2f}" if len(floors) == 1 else f"{floors[0]:.2f} … {floors[-1]:.2f}") if floors else "—"
    floor_row = ["chance floor", "an unrelated evaluation prompt", "—"] + ["—"] * (len(headers) - 3)
    floor_row[3 + [k for k, _ in TABLE6_METRICS].index("token_f1")] = floor
    rows.append(floor_row)
    return md_table(headers, rows, align="lll" + "r" * (len(headers) - 3))


def pair_verdict(runs: Sequence[AttackRow], sequential: Sequence[Run] = ()) -> str | None:
    """The verdict of a configuration and ε: the worst over its runs' learned and Bayes attackers and the
    sequential attacker's runs against it (less a free-running inconclusive that a teacher-forced run of the
    same attacker bounds, sequential_attack.set_aside)."""
    return controls.worst([v for r in runs for v in (r.learned_verdict, r.bayes_verdict)]
                          + [a["verdict"] for a in _sequential_counted(sequential)])


def _sequential_counted(runs: Sequence[Run]) -> list[dict]:
    """The sequential runs' attacker verdicts that count for their configuration and ε."""
    return sequential_attack.counted([a for s in runs for a in sequential_attack.attacker_verdicts(s)])


def _sequential_cell(runs: Sequence[Run]) -> str:
    """The sequential attacker's reading of one configuration and ε: its strongest run's difference MAP's verdict
    read (MAP − prior, or MAP − MAP on a null view; the likelihood's top-1 when MAP did not run) and the worst
    verdict over its runs, with the reason."""
    best = sequential_attack.strongest(runs)
    if best is None:
        return "—"
    found = _sequential_counted(runs)
    worst = controls.worst([a["verdict"] for a in found])
    why = next((a["reason"] for a in found if a["verdict"] == worst and worst == controls.INCONCLUSIVE), None)
    m, n = best.metrics, best.metrics.get("n_positions")
    # the difference MAP's verdict read (map_reference: the prior alone, or MAP on a null view)
    key, what = ((m.get("verdict_map_reads", "map_minus_prior"),
                  "MAP − MAP on a null view" if m.get("verdict_map_reads") == "map_minus_null" else "MAP − prior")
                 if m.get("map_minus_prior") is not None else ("sequential_top1", "likelihood top-1"))
    lo, hi = m.get(f"{key}_ci_lo"), m.get(f"{key}_ci_hi")
    value = "" if m.get(key) is None else (f"{what} {m[key]:+.1f}" + ("" if lo is None else f" [{lo:+.1f}, {hi:+.1f}]")
                                            + f" pp on {n} positions; ")
    return value + _label(worst, why)


def verdicts_md(group: AttackGroup) -> str:
    """One row per (configuration, ε): the worst verdict over every attacker run against it among the
    selected runs (each run's learned attacker and its Bayes attacker, and the sequential attacker's runs of
    the same model and workload), and which attackers give it."""
    with_sequential = bool(group.sequential)
    headers = ["configuration", "verdict", "runs", "learned attackers", "Bayes attacker"]
    headers += ["sequential attacker (all exposures)"] if with_sequential else []
    headers += ["worst from", "repeated submissions (Bayes, not in the verdict)"]
    rows = []
    for (configuration, epsilon), runs in group.pairs():
        learned = [r.learned_verdict for r in runs]
        bayes = [r.bayes_verdict for r in runs]
        sequential = group.sequential.get((configuration, epsilon), [])
        worst = pair_verdict(runs, sequential)
        counts = ", ".join(f"{learned.count(v)} {VERDICT_LABEL[v].strip('*')}" for v in reversed(controls.VERDICTS)
                           if learned.count(v))
        culprits = [f"{SETTING_LABEL.get(r.setting, r.setting)} {COMPONENT_LABEL.get(r.component, r.component)}"
                    for r in runs if worst is not None and r.learned_verdict == worst]
        if worst is not None and worst in bayes:
            culprits.append("Bayes")
        if worst is not None and any(a["verdict"] == worst for a in _sequential_counted(sequential)):
            culprits.append("sequential")
        if worst == controls.AT_CHANCE:
            culprits = ["every attacker"]
        row = [runs[0].privacy_label(), _label(worst), len(runs) + len(sequential), counts or "—",
               _label(controls.worst(bayes))]
        row += [_sequential_cell(sequential)] if with_sequential else []
        rows.append(row + ["; ".join(culprits) or "—", _repeats(runs)])
    return md_table(headers, rows, align="llrll" + "l" * with_sequential + "ll")


def _repeats(runs: Sequence[AttackRow]) -> str:
    """From which k the averaged exposures of k submissions of one prompt leak (attacks.controls.repeat_leak_k)."""
    leaks = [k for r in runs if (k := controls.repeat_leak_k(r.m)) is not None]
    if leaks:
        return f"**leak** from k={min(leaks)}"
    ks = [k for r in runs for k in k_values_of(r) if k > 1]
    return f"none up to k={max(ks)}" if ks else "—"


def _training(row: AttackRow) -> str:
    """How long the attacker this row evaluates was trained (the noise-free one for noise-oblivious rows)."""
    steps, minutes = row.m.get("train_steps"), num(row.m.get("train_minutes"))
    if steps is None:
        return "—"
    return f"{steps}" + (f" ({minutes:.1f})" if minutes is not None else "")


def controls_md(group: AttackGroup) -> str:
    headers = ["configuration", "attacker", "component", "token F1 %", "positive control (t3) F1 %",
               "negative control (shuffled) F1 %", "chance floor %", "valid", "training steps (minutes)"]
    rows = []
    for r in group.rows:
        pos = fmt_ci(*r.ci("positive_control_token_f1")) + ("" if r.m.get("positive_control_pass") else " ✗")
        neg = fmt_ci(*r.ci("negative_control_token_f1")) + ("" if r.m.get("negative_control_pass") else " ✗")
        rows.append([r.privacy_label(), SETTING_LABEL.get(r.setting, r.setting),
                     COMPONENT_LABEL.get(r.component, r.component), fmt_ci(*r.ci("token_f1")), pos, neg,
                     fmt_ci(r.m.get("chance_floor_token_f1")), "yes" if r.m.get("attack_valid") else "**no**",
                     _training(r)])
    return md_table(headers, rows, align="lll" + "r" * (len(headers) - 3))


def k_values_of(row: AttackRow) -> list[int]:
    """The k of the run's repeated-submission curve."""
    return sorted(int(key[len("bayes_top1_k"):]) for key in row.m
                  if key.startswith("bayes_top1_k") and key[len("bayes_top1_k"):].isdigit())


def k_values(group: AttackGroup) -> list[int]:
    return sorted({k for r in group.rows for k in k_values_of(r)})


def bayes_md(group: AttackGroup) -> str | None:
    rows_in = [r for r in group.by_privacy() if r.m.get("bayes_top1") is not None]
    if not rows_in:
        return None
    ks = [k for k in k_values(group) if k > 1]
    headers = ["configuration", "σ (mean)", "top-1 %", "top-5 %", "token F1 %", "token F1 from other prompts %",
               "chance top-1 %", "verdict", *[f"top-1 at k={k} (predicted)" for k in ks]]
    rows = []
    for r in rows_in:
        cells = []
        for k in ks:
            got = r.m.get(f"bayes_top1_k{k}")
            pred = num(r.m.get(f"bayes_top1_k{k}_predicted"))
            cells.append("—" if got is None else fmt_ci(*r.ci(f"bayes_top1_k{k}"))
                         + (f" ({pred:.2f})" if pred is not None else ""))
        sigma = num(r.m.get("bayes_sigma_mean"))
        rows.append([r.privacy_label(), "0" if not sigma else f"{sigma:.4g}", fmt_ci(*r.ci("bayes_top1")),
                     fmt_ci(*r.ci("bayes_top5")), fmt_ci(*r.ci("bayes_token_f1")),
                     fmt_ci(r.m.get("bayes_token_f1_chance")), fmt_ci(r.m.get("bayes_top1_chance"), digits=3),
                     _label(r.bayes_verdict, _why_bayes(r)), *cells])
    return md_table(headers, rows)


# Why a configuration has no per-token ε: no mask at all, or a mask that is not DP noise.
_NO_EPSILON = {"plain": "— (no noise)", "slalom": "— (one-time pad mod q, not DP noise)"}


def accounting_md(group: AttackGroup) -> str | None:
    headers = ["configuration", "ε per token (nominal)", "exposures one token reaches", "composed μ-GDP",
               "composed (ε, δ)-DP", "new tokens"]
    rows = []
    for r in group.by_privacy():
        m = r.m
        acc = r.data.get("accounting") or {}
        mu, eps = num(m.get("gdp_mu_composed")), num(m.get("dp_epsilon_composed"))
        delta = num(m.get("dp_delta"))
        nominal = (fmt_eps(m.get("epsilon_nominal")) if m.get("epsilon_nominal") is not None
                   else _NO_EPSILON.get(configurations.get(str(r.data.get("configuration"))).mechanism, "—"))
        rows.append([r.privacy_label(), nominal, m.get("gdp_exposures_composed") or "—",
                     "—" if mu is None else f"{mu:.4g}",
                     "—" if eps is None else f"({eps:.4g}, {delta:g})", acc.get("max_new_tokens", "—")])
    return md_table(headers, rows)


@dataclass
class KCurve:
    label: str
    ks: list[int]
    top1: list[tuple[float | None, float | None, float | None]]
    predicted: list[float | None]


def k_curves(group: AttackGroup) -> list[KCurve]:
    """Measured top-1 (with interval) and predicted top-1 against k, one curve per noisy (configuration, ε)."""
    ks = k_values(group)
    out = []
    for r in group.by_privacy():
        if not gaussian(r.configuration) or r.m.get("bayes_top1") is None:
            continue
        have = [k for k in ks if r.m.get(f"bayes_top1_k{k}") is not None]
        if len(have) < 2:
            continue
        out.append(KCurve(r.privacy_label(), have, [r.ci(f"bayes_top1_k{k}") for k in have],
                          [num(r.m.get(f"bayes_top1_k{k}_predicted")) for k in have]))
    return out


def plot(group: AttackGroup, path: Path) -> None:
    """Bayes top-1 recovery against the number k of submissions of the same prompt (fresh masks each),
    measured (95% interval) and predicted for σ/√k, one colour per configuration and ε."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    colors = plt.get_cmap("tab10").colors
    drawn: list[tuple[float, float]] = []
    for i, curve in enumerate(k_curves(group)):
        c = colors[i % len(colors)]
        pts = [(k, *v) for k, v in zip(curve.ks, curve.top1) if v[0] is not None]
        drawn += [(float(p[0]), p[1]) for p in pts]
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
    metric_axis(ax, "y", "bayes_top1")
    counts = mark_coincident(ax, drawn)   # ε = 1 and epn both at 0 %: one curve hides the other
    save_axes(fig, ax, path, f"{group.title}\nlayer-0 QKV, maximum-likelihood attacker", labels=counts)


def markdown(items: Sequence[AttackGroup], figure: Figures) -> list[str]:
    md = ["## Prompt reconstruction (paper Table 6)", "", INTRO, ""]
    for i, group in enumerate(items, 1):
        md += [f"### {group.title}", "", table6_md(group), "", VERDICTS_INTRO, "", verdicts_md(group), "",
               "Controls:", "", controls_md(group), ""]
        bayes = bayes_md(group)
        if bayes:
            md += [BAYES_INTRO, "", bayes, ""]
        labels = {id(r.run): f"{r.privacy_label()} · {r.setting} · {r.component}" for r in group.rows}
        md += roc_table([r.run for r in group.rows], lambda run: labels[id(run)])
        acc = accounting_md(group)
        if acc:
            md += [ACCOUNTING_INTRO, "", acc, ""]
        if k_curves(group):
            md += figure("attack_k", i, group, plot, "Bayes recovery against repeated submissions")
    return md


def summary(items: Sequence[AttackGroup]) -> list[str]:
    """The attack tables are too wide for a terminal (report.md holds them): one line per group with the
    verdict per configuration and ε."""
    lines = []
    for group in items:
        verdicts = [f"{runs[0].privacy_label()}: {_label(pair_verdict(runs, group.sequential.get(key, []))).strip('*')}"
                    for key, runs in group.pairs()]
        lines.append(f"{group.title}: verdict " + "; ".join(verdicts))
    return lines
