"""Attack runs → Table 6 of the paper (§7.4) and its companions, for `splitbench-report`.

Pure functions over the results.json files runners/attack.py writes (no torch, no plotting):
- `attack_groups(runs)`: one group per (experiment name, model, workload, number of prompts, tags); a
  group's rows are its runs, sorted t3 first, then ep1 by ascending ε, then epn; within a configuration
  noise-free, noise-oblivious, noise-aware; then by component.
- `table6_md`: settings × components with token precision / recall / F1, semantic similarity, BLEU,
  ROUGE-L and exact match as "mean [95% interval]", the verdict per run, and the chance-floor row.
- `controls_md`, `bayes_md`, `accounting_md`: the controls per run; the Bayes attacker and its
  repeated-submission curve per configuration and ε; the privacy accounting per configuration and ε.
- `k_curves(group)`: the points of the k-exposure plot (runners/report.py draws it).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.report_tables import Run, _num, file_slug, fmt_ci, fmt_eps, md_table

SETTING_ORDER = ("noise_free", "noise_oblivious", "noise_aware")
COMPONENT_ORDER = ("qkv", "composite", "o", "gate_up", "lm_head")
CONFIG_ORDER = ("t3", "ep1", "epn")
SETTING_LABEL = {"noise_free": "noise-free", "noise_oblivious": "noise-oblivious", "noise_aware": "noise-aware"}
COMPONENT_LABEL = {"qkv": "QKV", "composite": "composite (QKV+O+Gate/Up)", "o": "O", "gate_up": "Gate/Up",
                   "lm_head": "LM head"}
TABLE6_METRICS = (("token_precision", "token precision %"), ("token_recall", "token recall %"),
                  ("token_f1", "token F1 %"), ("semantic_similarity", "semantic sim. %"), ("bleu", "BLEU"),
                  ("rouge_l", "ROUGE-L"), ("exact_match", "exact match %"))


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
        return _num(self.data.get("epsilon"))

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
        if self.configuration == "ep1" and self.epsilon is not None:
            return f"ep1 ε={self.epsilon:g}"
        if self.configuration == "epn":
            mean = _num(self.m.get("epsilon_mean"))
            return "epn" + (f" (mean ε={mean:.3g})" if mean is not None else "")
        return self.configuration

    def sort_key(self) -> tuple:
        conf = CONFIG_ORDER.index(self.configuration) if self.configuration in CONFIG_ORDER else len(CONFIG_ORDER)
        eps = self.epsilon if self.epsilon is not None else -math.inf
        setting = SETTING_ORDER.index(self.setting) if self.setting in SETTING_ORDER else len(SETTING_ORDER)
        comp = COMPONENT_ORDER.index(self.component) if self.component in COMPONENT_ORDER else len(COMPONENT_ORDER)
        return (conf, eps, setting, comp, str(self.layer))

    def ci(self, key: str) -> tuple[Any, Any, Any]:
        return self.m.get(key), self.m.get(f"{key}_ci_lo"), self.m.get(f"{key}_ci_hi")


@dataclass
class AttackGroup:
    experiment_name: str
    model: str
    workload: str
    n_prompts: Any
    tags: tuple[str, ...]
    rows: list[AttackRow]

    @property
    def title(self) -> str:
        head = f"{self.experiment_name}: {self.model} · {self.workload} · {self.n_prompts} evaluation prompts"
        return head + (f" · tagged {', '.join(self.tags)}" if self.tags else "")

    @property
    def slug(self) -> str:
        raw = "_".join(str(x) for x in (self.experiment_name, self.model, self.workload, *self.tags))
        return file_slug(raw)

    def floors(self) -> list[float]:
        return sorted({round(v, 6) for r in self.rows if (v := _num(r.m.get("chance_floor_token_f1"))) is not None})

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


def attack_groups(runs: Iterable[Run]) -> list[AttackGroup]:
    groups: dict[tuple, list[AttackRow]] = {}
    for run in runs:
        if run.state != "ok" or run.experiment != "attack":
            continue
        d = run.data
        key = (str(d.get("experiment_name") or "attack"), str(d.get("model")), str(d.get("workload")),
               d.get("n_prompts"), run.tags)
        groups.setdefault(key, []).append(AttackRow(run))
    out = [AttackGroup(*key, rows=sorted(rows, key=AttackRow.sort_key)) for key, rows in groups.items()]
    return sorted(out, key=lambda g: (g.tags, g.experiment_name, g.model, g.workload))


def _verdict(row: AttackRow) -> str:
    v = row.m.get("attack_verdict")
    if v == "pass":
        return "**pass** (at chance)"
    if v == "fail":
        return "fail (above chance)"
    if v == "invalid":
        return "**invalid** (a control failed)"
    return "—"


def _bayes_gate(row: AttackRow) -> str:
    gate = row.m.get("bayes_gate")
    return "—" if gate is None else ("**pass** (at chance)" if gate else "fail (above chance)")


def table6_md(group: AttackGroup) -> str:
    """One row per run; beside the learned attacker's metrics and gate, the Bayes attacker's token recovery
    and gate under the same configuration and ε (it reads layer-0 QKV whatever the row's component, so it
    repeats down a pair). The two gates can disagree: a weak learned attacker at chance is no evidence of
    privacy when the Bayes attacker recovers the prompt."""
    headers = ["configuration", "attacker", "component", *[h for _, h in TABLE6_METRICS], "gate",
               "Bayes top-1 % (layer-0 QKV)", "Bayes gate"]
    rows = []
    for r in group.rows:
        comp = COMPONENT_LABEL.get(r.component, r.component)
        if r.component != "lm_head" and r.layer not in (None, 0):
            comp += f" (layer {r.layer})"
        rows.append([r.privacy_label(), SETTING_LABEL.get(r.setting, r.setting), comp,
                     *[fmt_ci(*r.ci(k)) for k, _ in TABLE6_METRICS], _verdict(r), fmt_ci(*r.ci("bayes_top1")),
                     _bayes_gate(r)])
    floors = group.floors()
    floor = (f"{floors[0]:.2f}" if len(floors) == 1 else f"{floors[0]:.2f} … {floors[-1]:.2f}") if floors else "—"
    floor_row = ["chance floor", "an unrelated evaluation prompt", "—"] + ["—"] * (len(headers) - 3)
    floor_row[3 + [k for k, _ in TABLE6_METRICS].index("token_f1")] = floor
    rows.append(floor_row)
    return md_table(headers, rows, align="lll" + "r" * (len(headers) - 3))


def _training(row: AttackRow) -> str:
    """How long the attacker this row evaluates was trained (the noise-free one for noise-oblivious rows)."""
    steps, minutes = row.m.get("train_steps"), _num(row.m.get("train_minutes"))
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


def k_values(group: AttackGroup) -> list[int]:
    ks = set()
    for r in group.rows:
        for key in r.m:
            tail = key[len("bayes_top1_k"):]
            if key.startswith("bayes_top1_k") and tail.isdigit():
                ks.add(int(tail))
    return sorted(ks)


def bayes_md(group: AttackGroup) -> str | None:
    rows_in = [r for r in group.by_privacy() if r.m.get("bayes_top1") is not None]
    if not rows_in:
        return None
    ks = [k for k in k_values(group) if k > 1]
    headers = ["configuration", "σ (mean)", "top-1 %", "top-5 %", "token F1 %", "chance top-1 %", "gate",
               *[f"top-1 at k={k} (predicted)" for k in ks]]
    rows = []
    for r in rows_in:
        cells = []
        for k in ks:
            got = r.m.get(f"bayes_top1_k{k}")
            pred = _num(r.m.get(f"bayes_top1_k{k}_predicted"))
            cells.append("—" if got is None else fmt_ci(got, r.m.get(f"bayes_top1_k{k}_ci_lo"),
                                                         r.m.get(f"bayes_top1_k{k}_ci_hi"))
                         + (f" ({pred:.2f})" if pred is not None else ""))
        sigma = _num(r.m.get("bayes_sigma_mean"))
        rows.append([r.privacy_label(), "0" if not sigma else f"{sigma:.4g}", fmt_ci(*r.ci("bayes_top1")),
                     fmt_ci(*r.ci("bayes_top5")), fmt_ci(*r.ci("bayes_token_f1")),
                     fmt_ci(r.m.get("bayes_top1_chance"), digits=3),
                     "pass" if r.m.get("bayes_gate") else "fail", *cells])
    return md_table(headers, rows)


def accounting_md(group: AttackGroup) -> str | None:
    rows_in = group.by_privacy()
    headers = ["configuration", "ε per token (nominal)", "exposures one token reaches", "composed μ-GDP",
               "composed (ε, δ)-DP", "new tokens"]
    rows = []
    for r in rows_in:
        m = r.m
        acc = r.data.get("accounting") or {}
        mu, eps = _num(m.get("gdp_mu_composed")), _num(m.get("dp_epsilon_composed"))
        delta = _num(m.get("dp_delta"))
        rows.append([r.privacy_label(), fmt_eps(m.get("epsilon_nominal")) if m.get("epsilon_nominal") is not None
                     else "— (no noise)", m.get("gdp_exposures_composed") or "—",
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
        if r.configuration not in ("ep1", "epn") or r.m.get("bayes_top1") is None:
            continue
        have = [k for k in ks if r.m.get(f"bayes_top1_k{k}") is not None]
        if len(have) < 2:
            continue
        out.append(KCurve(r.privacy_label(), have,
                          [tuple(_num(r.m.get(f"bayes_top1_k{k}{s}")) for s in ("", "_ci_lo", "_ci_hi")) for k in have],
                          [_num(r.m.get(f"bayes_top1_k{k}_predicted")) for k in have]))
    return out
