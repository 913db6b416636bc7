"""The returned-gradient audit (paper 004), from runners/grad_audit.py's runs.

- `groups(runs)`: one table per (experiment name, model, corpus, tags); its rows are the runs, by
  configuration (the trainer as audited first, then its mitigation), then delegated layers and D.
- `audit_md`: per run the topology, the partition (zero-support agreement and frames identified, the
  norm-rank attacker against its chance agreement), the frequent-token probe (pooled paired effect, the
  Bonferroni–Wilson gate statistic, the gate, the controls), the utility gate and the verdict.
- `mitigation_md`: per topology run with both configurations, the mitigation's cost in nats (its held-out
  CE minus the trainer's, same seeds and held-out blocks) and what it removed.
- `arms_md`: the probe's pooled effect per arm (forward payload, returned gradient, both).
- `bisr_md`: BiSR's backward stage on the returned gradient (runs that ran it): top-1 against the constant
  guess, the cloud's decoding alone, the controls, the verdict and the cost.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runners.report.format import ci, fmt_ci, md_table, num, tagged
from runners.report.plotting import Figures
from runners.report.roc import table_md as roc_table
from runners.report.runs import Run, finished_runs

EXPERIMENT = "grad_audit"
ORDER = ("decoy_trainer", "decoy_mitigated")

INTRO = ("Paper 004 audits a two-node split-LLM trainer whose forward payload goes through a bottleneck, a "
         "rotation, a row permutation, clipping, noise and decoy rows, and whose loss ignores the decoys, so "
         "the gradient returned to the cloud is exactly zero on them. *Zero-support agreement*: the share of "
         "rows whose real/decoy label the rule \"non-zero gradient ⇒ real\" gets right (paper: 1.000, "
         "4,096/4,096 frames); *norm rank*: the n_real rows of largest gradient norm, against the agreement of "
         "a random guess. *Probe*: a frequent-token probe on the real rows against the constant most-frequent-"
         "token guess, the paired effect pooled over the scored seeds (DerSimonian–Laird, 95% interval); "
         "*gate statistic*: the largest Bonferroni–Wilson upper bound of the probe's accuracy over the "
         "constant guess's, the privacy gate failing above the locked margin (+1.0 pp). *Utility*: held-out "
         "cross-entropy of the split pipeline minus the unsplit model's (gate: ≤ 0.35 nats; `unknown` when a "
         "seed's held-out CE was still falling by more than train.flat_nats over its last curve segment). "
         "Verdicts as in attacks/controls.py; the run's is the worst of the probe's, the partition's and, where it "
         "ran, BiSR's backward stage's. The "
         "protocol (protocol.json) was locked before the scored seeds ran. Since issue 31 the gate is moved "
         "down by each cell's shuffled-label probe effect when that is negative (the probe's bias). *Controls*: "
         "negative = the probe on shuffled labels (dose 0; it would catch a probe that finds a label link "
         "without one); positive = the gradient arm made to sit at the floor with a token code worth each "
         "listed dose (pp) to a perfect reader (it would catch a gate that cannot see a leak of its own size). "
         "Runs from before issue 31 had a positive control injected at a 50 % row share into the live arm "
         "(about +13 pp), which said nothing about sensitivity at +1 pp.")


@dataclass
class AuditGroup:
    experiment_name: str
    model: str
    workload: str
    tags: tuple[str, ...]
    runs: list[Run]

    @property
    def title(self) -> str:
        return tagged(f"{self.experiment_name}: {self.model} · {self.workload}", self.tags)


def _topology(run: Run) -> dict[str, Any]:
    return run.data.get("topology") or {}


def _key(run: Run) -> tuple:
    t = _topology(run)
    conf = str(run.data.get("configuration"))
    return (t.get("delegated_layers") or 0, t.get("latent_dim") or 0,
            ORDER.index(conf) if conf in ORDER else len(ORDER), conf)


def groups(runs: Sequence[Run]) -> list[AuditGroup]:
    by_key: dict[tuple, list[Run]] = {}
    for run in finished_runs(runs, EXPERIMENT):
        d = run.data
        key = (str(d.get("experiment_name") or EXPERIMENT), str(d.get("model")), str(d.get("workload")), run.tags)
        by_key.setdefault(key, []).append(run)
    return [AuditGroup(*key, runs=sorted(rs, key=_key)) for key, rs in by_key.items()]


def _pp(value: Any) -> str:
    v = num(value)
    return "—" if v is None else f"{v:+.2f}"


def _topo_label(run: Run) -> str:
    t = _topology(run)
    start = " · least-squares start" if t.get("init") == "least_squares" else ""   # older runs: random
    return (f"{t.get('cut_after')}→{t.get('resume_at')} ({t.get('delegated_layers')}) · D={t.get('latent_dim')}"
            f" · {t.get('frames')} frames{start}")


def _config_label(run: Run) -> str:
    """The configuration, with its clip where it is mitigated: a clip sweep's runs share a topology, and this
    is what tells their rows apart."""
    config = str(run.data.get("configuration"))
    mit = run.data.get("mitigation") or {}
    if config != "decoy_mitigated" or not mit:
        return config
    q = num(mit.get("clip_quantile"))
    return f"{config} (clip q={q:g})" if q is not None else f"{config} (clip {mit.get('grad_clip')})"


def _dose_text(m: dict, n_seeds: int) -> str:
    """Where the dosed positive control fired: on how many scored seeds per dose (its pass needs every seed
    silent at 0 and firing at each dose), or, for runs that predate the count, whether it fired on all."""
    doses = m.get("positive_control_doses_pp")
    if not doses:
        return ""
    keys = [f"positive_control_{d:g}".replace(".", "p") + "pp_gate_fires" for d in doses]
    if all(f"{k}_seeds" in m for k in keys):
        return " (fires at " + ", ".join(f"+{d:g}: {m[f'{k}_seeds']}/{n_seeds}" for d, k in zip(doses, keys)) + " seeds)"
    return " (fires at " + ", ".join(f"+{d:g}: {'yes' if m.get(k) else 'no'}" for d, k in zip(doses, keys)) + " pp)"


def audit_md(group: AuditGroup) -> str:
    rows = []
    for run in group.runs:
        m = run.metrics
        zs = num(m.get("zero_support_agreement"))
        n_seeds = len(run.data.get("seeds") or [])
        controls_ = (f"{'✓' if m.get('negative_control_pass') else '✗'} / "
                     f"{'✓' if m.get('positive_control_pass') else '✗'}{_dose_text(m, n_seeds)}")
        rows.append([
            _config_label(run), _topo_label(run), n_seeds,
            "—" if zs is None else f"{zs:.3f} ({m.get('zero_support_frames_identified')}/{m.get('frames_scored')})",
            f"{num(m.get('norm_rank_agreement_pct')) or 0:.1f} vs {num(m.get('partition_chance_agreement_pct')) or 0:.1f}",
            fmt_ci(*ci(m, "probe_effect_pp")) + f" ({m.get('probe_arm')})", _pp(m.get("probe_upper_bound_pp")),
            m.get("gate"), controls_, fmt_ci(*ci(m, "heldout_ce_increase"), digits=3), m.get("utility_gate"),
            f"**{m.get('verdict')}** (probe {m.get('probe_verdict')}, partition {m.get('partition_verdict')})"])
    return md_table(["configuration", "cut a→b (delegated) · D · training", "scored seeds", "zero-support agreement (frames)",
                     "norm rank vs chance %", "probe effect pp [95%] (arm)", "gate statistic pp", "gate",
                     "controls −/+", "held-out CE increase nats", "utility gate", "verdict"], rows,
                    align="llrrrrrlcrll")


def _clip_order(run: Run) -> tuple:
    """A clip sweep's order: quantile clips by quantile, then fixed clips by size."""
    mit = run.data.get("mitigation") or {}
    q = num(mit.get("clip_quantile"))
    return (0, q) if q is not None else (1, num(mit.get("grad_clip")) or 0.0)


def mitigation_md(group: AuditGroup) -> str | None:
    """One row per mitigated run against the trainer at its topology: a clip sweep
    (grad_audit.mitigation.clip_quantile=0.1,0.5,0.9) is one row per clip."""
    by_topo: dict[tuple, dict[str, list[Run]]] = {}
    for run in group.runs:
        t = _topology(run)
        by_topo.setdefault((t.get("cut_after"), t.get("resume_at"), t.get("latent_dim")), {}).setdefault(
            str(run.data.get("configuration")), []).append(run)
    rows = []
    for runs in by_topo.values():
        if not set(ORDER) <= set(runs):
            continue
        a = runs["decoy_trainer"][0]
        for b in sorted(runs["decoy_mitigated"], key=_clip_order):
            rows.append(_mitigation_row(a, b))
    if not rows:
        return None
    return md_table(["topology", "gradient clip / noise multiplier", "frames identified", "probe effect pp",
                     "cost (held-out CE, nats; over)"], rows)


def _mitigation_row(a: Run, b: Run) -> list[str]:
    cost, shared = _mitigation_cost(a, b)
    mit = b.data.get("mitigation") or {}
    clip = (f"q={mit['clip_quantile']:g} (median {num(b.metrics.get('grad_clip_median')) or 0:.2g}, "
            f"{100 * (num(b.metrics.get('clipped_fraction')) or 0):.0f} % clipped)"
            if mit.get("clip_quantile") is not None else f"{mit.get('grad_clip')}")
    return [_topo_label(a), f"{clip} / {mit.get('noise_multiplier')}",
            f"{a.metrics.get('zero_support_frames_identified')}/{a.metrics.get('frames_scored')} → "
            f"{b.metrics.get('zero_support_frames_identified')}/{b.metrics.get('frames_scored')}",
            f"{_pp(a.metrics.get('probe_effect_pp'))} → {_pp(b.metrics.get('probe_effect_pp'))}",
            f"{cost:+.3f} ({shared})"]


def _mitigation_cost(trainer: Run, mitigated: Run) -> tuple[float, str]:
    """Held-out CE of the mitigated pipeline minus the trainer's, over the scored seeds both ran (a seed
    fixes the secrets and the data order, so the difference is paired); over each run's own seeds when they
    share none."""
    def by_seed(run: Run) -> dict[int, float]:
        return {int(s["seed"]): float(s["ce_split"]) for s in run.data.get("seeds") or [] if "ce_split" in s}

    a, b = by_seed(trainer), by_seed(mitigated)
    shared = sorted(set(a) & set(b))
    if shared:
        return sum(b[s] - a[s] for s in shared) / len(shared), f"seeds {', '.join(map(str, shared))}"
    cost = (num(mitigated.metrics.get("heldout_ce_split")) or 0) - (num(trainer.metrics.get("heldout_ce_split")) or 0)
    return cost, "each run's own seeds"


def arms_md(group: AuditGroup) -> str:
    arms = ("forward", "gradient", "joint")
    rows = [[_config_label(run), _topo_label(run),
             *[fmt_ci(*ci(run.metrics, f"probe_effect_pp_{a}")) for a in arms]] for run in group.runs]
    return md_table(["configuration", "topology", *[f"{a} effect pp [95%]" for a in arms]], rows)


def bisr_md(group: AuditGroup) -> str | None:
    rows = []
    for run in group.runs:
        m = run.metrics
        if "bisr_b_verdict" not in m:
            continue
        rows.append([_config_label(run), _topo_label(run), m.get("bisr_b_positions"),
                     fmt_ci(*ci(m, "bisr_b_top1")), f"{num(m.get('bisr_b_top1_floor')) or 0:.2f}",
                     fmt_ci(*ci(m, "bisr_b_minus_floor_pp")), fmt_ci(*ci(m, "bisr_b_decode_top1")),
                     fmt_ci(*ci(m, "bisr_b_minus_decode_pp")),
                     f"{'✓' if m.get('bisr_b_negative_pass') else '✗'} / {'✓' if m.get('bisr_b_positive_pass') else '✗'}"
                     f" ({_pp(m.get('bisr_b_null_minus_floor_pp'))} / {_pp(m.get('bisr_b_positive_minus_floor_pp'))})",
                     f"**{m.get('bisr_b_verdict')}**", f"{num(m.get('bisr_b_seconds')) or 0:.0f}"])
    if not rows:
        return None
    return md_table(["configuration", "topology", "label positions", "BiSR(b) top-1 % [95%]", "floor %",
                     "minus floor pp [95%]", "decoding alone % [95%]", "BiSR − decoding pp [95%]",
                     "controls −/+ (pp over floor)", "verdict", "seconds"], rows, align="llrrrrrrcll")


def markdown(items: Sequence[AuditGroup], figure: Figures) -> list[str]:
    md = ["## Returned-gradient audit (paper 004)", "", INTRO, ""]
    for group in items:
        md += [f"### {group.title}", "", audit_md(group), ""]
        mit = mitigation_md(group)
        if mit:
            md += ["The mitigation (per-row clip of the returned gradient plus proportional Gaussian noise on "
                   "every row), against the trainer as audited at the same topology; the cost is paired over the "
                   "scored seeds both ran:", "", mit, ""]
        md += ["The probe per arm (what the cloud sees: the forward payload, the returned gradient, both):", "",
               arms_md(group), ""]
        md += roc_table(group.runs, _config_label)
        bisr = bisr_md(group)
        if bisr:
            md += ["BiSR's backward stage run by the cloud on the returned gradient (it holds s_B and the public "
                   "frozen tail; attacks/grad_audit/bisr_backward.py): next-token top-1 on the real rows of the "
                   "attacked frames against the constant most-frequent-token guess on the same labels (paired, "
                   "Newcombe 95%); *decoding alone*: the cloud's argmax of the tail at s_B, BiSR's start, so "
                   "*BiSR − decoding* is what the gradient adds. Controls: negative = BiSR on the gradient of "
                   "shuffled labels through the same mitigation (dose 0; it would catch labels read from "
                   "anything but the gradient's label content), positive = BiSR on the undefended gradient of "
                   "the same frames (it would catch an attacker that cannot read an unmitigated gradient).", "",
                   bisr, ""]
    return md


def summary(items: Sequence[AuditGroup]) -> list[str]:
    lines = []
    for group in items:
        lines.append(f"  {group.title}")
        for run in group.runs:
            m = run.metrics
            lines.append(f"    {run.data.get('configuration'):<16} {_topo_label(run):<22} zero-support "
                         f"{num(m.get('zero_support_agreement')) or 0:.3f}  probe {_pp(m.get('probe_effect_pp'))} pp  "
                         f"gate {m.get('gate')}  ΔCE {num(m.get('heldout_ce_increase')) or 0:.3f}  {m.get('verdict')}")
    return lines
