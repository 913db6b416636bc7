"""Split federated fine-tuning (paper 002), from runners/splitft.py's runs.

One group per model, data, cut and federation (runs in one group differ only in defence and strength):
- utility against leakage per defence and strength: held-out CE / perplexity / top-1 of the final model,
  H and H_A, the label attack, the EIA inversion, BiSR(f) and (when run) the learned inverter with their
  references and verdicts;
- held-out CE paired over the same blocks: the gain over the pretrained model, and against split fine-tuning
  without a defence and centralised fine-tuning (runs that recorded their blocks);
- H and H_A per round of every run;
- the DP baselines' ε(δ) composed over the run beside their per-step ε (when a group has one);
- two plots: leakage (label token F1) against held-out CE, and H against H_A — the paper's claim is that
  PrivPair moves H_A without moving H, where a perturbation moves both together.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.splitft.config import variant_label
from metrics.intervals import paired_difference_ci
from runners.report.format import ci, configuration_label, file_slug, fmt_auto, fmt_ci, md_table, num, run_order, tagged
from runners.report.plotting import Figures, mark_coincident, metric_axis, pyplot, save_axes
from runners.report.roc import table_md as roc_table
from runners.report.runs import Run, finished_runs

EXPERIMENT = "splitft"
ORDER = ("splitft_central", "splitft_none", "privpair", "smashed_dp_gaussian", "smashed_dp_laplace",
         "embedding_dx", "nopeek")
INTRO = ("N clients fine-tune A and C of the model cut A | B | C around the server's frozen B; FedAvg over A "
         "and C on Flower's simulation runtime (runners/splitft.py, docs/splitft.md). Utility is the final "
         "model f = C∘B∘A on held-out blocks; leakage is what the server recovers from what crossed, under "
         "the strong threat model (it knows the clients' weights after every step). Cells are **mean [95% "
         "interval]** over held-out blocks or attacked examples; *ref* is the attacker's own score with the "
         "wrong example's exposure, the verdict's reference (for the label attack the larger of that and the "
         "constant most-frequent-label guess, whose top-1 is the floor beside label top-1). *Controls*: "
         "positive = the same attacker on the undefended s_A / s_B of the same steps (dose: everything the "
         "defence hides), lower bound ≥ ref + the positive margin; it would catch an attacker that cannot read "
         "even the plain exposure. Negative: by construction for the untrained attackers (dose 0: nothing links "
         "a guess to its example but the exposure); the learned inverter's is trained on shuffled pairs and "
         "would catch an inverter that learnt the text prior rather than the exposure.")


@dataclass
class SplitFtGroup:
    key: tuple
    runs: list[Run]

    @property
    def title(self) -> str:
        model, workload, split, tags = self.key
        k, m, n, lora = split
        return tagged(f"splitft: {model} · {workload} · k={k} m={m} · {n} clients{' · LoRA' if lora else ''}", tags)

    @property
    def slug(self) -> str:
        return file_slug(f"{self.key[0]}_{self.key[1]}_k{self.key[2][0]}_m{self.key[2][1]}")


def _label(run: Run) -> str:
    label = configuration_label(str(run.data.get("configuration")), num(run.data.get("epsilon")), None, compact=True)
    extra = _variant(run)
    return f"{label} + {extra}" if extra else label


def _variant(run: Run) -> str:
    """'' for the configuration as defined; else its grad_up guard or frozen A."""
    return variant_label(run.data.get("grad_up"), _train_head(run))


def _train_head(run: Run) -> bool:
    return bool((run.data.get("split") or {}).get("train_head", True))   # runs from before the option trained A


def _order(run: Run) -> tuple:
    guard = run.data.get("grad_up") or {}
    return (*run_order(ORDER, run.data), not _train_head(run), bool(guard), guard.get("clip", 0.0),
            guard.get("noise_multiplier", 0.0))


def groups(runs: Sequence[Run]) -> list[SplitFtGroup]:
    by: dict[tuple, list[Run]] = {}
    for run in finished_runs(runs, EXPERIMENT):
        d = run.data
        s = d.get("split") or {}
        key = (d.get("model"), d.get("workload"), (s.get("k"), s.get("m"), s.get("n_clients"), bool(s.get("lora"))),
               run.tags)
        by.setdefault(key, []).append(run)
    return [SplitFtGroup(k, sorted(v, key=_order)) for k, v in sorted(by.items(), key=lambda kv: str(kv[0]))]


def _g(value: Any) -> str:
    """H and H_A span many decades (0 without a defence, 1e-4 to 1e3 with one): three significant digits."""
    v = num(value)
    return "—" if v is None else f"{v:.3g}"


def _ci(m: dict[str, Any], key: str, digits: int = 2) -> str:
    return fmt_ci(*ci(m, key), digits)


def utility_leakage_md(group: SplitFtGroup) -> str:
    headers = ["defence", "held-out CE", "perplexity", "held-out top-1 %", "H", "H_A", "label top-1 % (constant-guess floor)",
               "label token F1 % (ref)", "BiSR(b) label token F1 % (ref)",
               "BiSR(b) at the round-start C, label token F1 % (ref)", "EIA token F1 % (ref)",
               "BiSR(f) token F1 % (ref)",
               "inverter token F1 % (ref)", "weight-update label set F1 % (ref)", "verdict"]
    rows = []
    for run in group.runs:
        m = run.data.get("metrics") or {}
        attacks = [f"{_ci(m, f'{a}_token_f1')} ({fmt_auto(m.get(f'{a}_reference_token_f1'))})"
                   if m.get(f"{a}_token_f1") is not None else "—" for a in ("label", "bisr_b", "bisr_b_round_start", "eia", "bisr", "inverter",
                                                                          "weights_label")]
        rows.append([_label(run), _ci(m, "heldout_ce", 3), fmt_auto(m.get("heldout_ppl")), _ci(m, "heldout_top1"),
                     _g(m.get("H")), _g(m.get("H_A")),
                     (_ci(m, "label_top1") + (f" ({fmt_auto(m['label_top1_floor'])})"
                                               if m.get("label_top1_floor") is not None else " (—)"))
                     if m.get("label_top1") is not None else "—", *attacks,
                     m.get("verdict") or "— (no server)"])
    return md_table(headers, rows)


def _blocks(run: Run) -> dict[str, list[float]] | None:
    blocks = run.data.get("heldout_blocks_ce")   # runs from before it was recorded have none
    return blocks if isinstance(blocks, dict) and blocks.get("final") else None


def _paired(a: list[float], b: list[float]) -> str:
    """mean of a − b over blocks with its bootstrap interval; the same blocks scored by two models."""
    e = paired_difference_ci(a, b)
    return fmt_ci(e.mean, e.lo, e.hi, 3)


def paired_utility_md(group: SplitFtGroup) -> str | None:
    """Held-out CE differences paired over the same blocks (the between-block spread cancels): the gain of
    fine-tuning over the pretrained model, and each run's CE against split fine-tuning without a defence and
    against centralised fine-tuning. Runs are paired only when the pretrained model scored their blocks the
    same (the same held-out blocks); None when no run recorded its blocks."""
    runs = [r for r in group.runs if _blocks(r)]
    if not runs:
        return None

    def reference(conf: str) -> Run | None:
        return next((r for r in runs if r.data.get("configuration") == conf and not _variant(r)), None)

    def same_blocks(a: Run, b: Run) -> bool:
        x, y = _blocks(a)["initial"], _blocks(b)["initial"]
        return len(x) == len(y) and all(abs(u - v) <= 1e-4 * max(1.0, abs(u)) for u, v in zip(x, y))

    refs = [(name, reference(conf)) for name, conf in (("split, no defence", "splitft_none"),
                                                        ("centralised", "splitft_central"))]
    headers = ["defence", "blocks", "CE removed by fine-tuning (nats)",
               *[f"CE − {name}'s (nats; + = worse)" for name, ref in refs if ref is not None]]
    rows = []
    for run in runs:
        b = _blocks(run)
        cells = [_label(run), str(len(b["final"])), _ci(run.data.get("metrics") or {}, "heldout_ce_gain", 3)]
        for _, ref in refs:
            if ref is None:
                continue
            paired = ref is not run and same_blocks(run, ref)
            cells.append(_paired(b["final"], _blocks(ref)["final"]) if paired else "—")
        rows.append(cells)
    return md_table(headers, rows)


PAIRED_NOTE = ("Held-out CE paired over the same blocks (mean [95% interval] of the per-block difference): the "
               "spread between blocks cancels, so these tell a small change from zero where the CE column's "
               "intervals over blocks cannot.")


def rounds_md(group: SplitFtGroup) -> str:
    n = max((len(r.data.get("rounds") or []) for r in group.runs), default=0)
    headers = ["defence", *[f"round {i} H / H_A / CE" for i in range(1, n + 1)]]
    rows = []
    for run in group.runs:
        cells = [f"{_g(r.get('H'))} / {_g(r.get('H_A'))} / {_g(r.get('heldout_ce'))}"
                 for r in run.data.get("rounds") or []]
        rows.append([_label(run), *cells, *[""] * (n - len(cells))])
    return md_table(headers, rows)


def accounting_md(group: SplitFtGroup) -> str | None:
    """The DP baselines' ε over the run beside their per-step ε (harness/splitft/accounting.py), or None."""
    headers = ["defence", "δ", "per-step ε (row)", "sends K (bound)", "ε(δ) per row, K sends",
               "ε(δ) per example, K sends", "accountant"]
    rows = []
    for run in group.runs:
        a = run.data.get("privacy_accounting")
        if not a:
            continue
        rows.append([_label(run), _g(a.get("delta")), _g(a.get("epsilon_step")),
                     f"{a.get('max_sends')} ({a.get('sends_bound')})", _g(a.get("epsilon_row")),
                     _g(a.get("epsilon_example")), str(a.get("accountant"))])
    return md_table(headers, rows) if rows else None


ACCOUNTING_NOTE = ("DP accounting of the perturbation baselines: one client's example composed over every time "
                   "it went up (K, the largest count of any example; bound: every draw of every step), no "
                   "subsampling amplification; *row* is one clipped token row of s_A (what the per-step ε "
                   "is calibrated for), *example* the whole block (√T times the ℓ2 sensitivity, T times the "
                   "ℓ1). embedding_dx: pure metric DP, per-step ε = η·2·max‖E_v‖ per token (the worst "
                   "pair), δ = 0. It covers s'_A only: the gradients and client weights the server also "
                   "sees are not noised.")


def plot_tradeoff(group: SplitFtGroup, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    by: dict[str, list[tuple[float, float]]] = {}
    for run in group.runs:
        m = run.data.get("metrics") or {}
        if m.get("label_token_f1") is None or m.get("heldout_ce") is None:
            if m.get("heldout_ce") is not None:
                ax.axvline(float(m["heldout_ce"]), color="gray", linestyle="--", label=_label(run))
            continue
        by.setdefault(str(run.data.get("configuration")), []).append((float(m["heldout_ce"]),
                                                                      float(m["label_token_f1"])))
    for i, (conf, pts) in enumerate(by.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=f"C{i}", label=conf)
    ax.set_xlabel("held-out cross-entropy of the final model (nats; lower = better)")
    metric_axis(ax, "y", "label_token_f1", label="label inference token F1 (%)")
    counts = mark_coincident(ax, [p for pts in by.values() for p in pts])
    save_axes(fig, ax, path, group.title, labels=counts)


def plot_h(group: SplitFtGroup, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    by: dict[str, list[tuple[float, float]]] = {}
    for run in group.runs:
        m = run.data.get("metrics") or {}
        if (m.get("H_A") or 0) > 0 and (m.get("H") or 0) > 0:
            by.setdefault(str(run.data.get("configuration")), []).append((float(m["H_A"]), float(m["H"])))
    for i, (conf, pts) in enumerate(by.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=f"C{i}", label=conf)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("H_A = E‖s'_A − s_A‖² (what crossed at cut k)")
    ax.set_ylabel("H = E‖ŝ_B − s_B‖² (what C received)")
    save_axes(fig, ax, path, group.title)


def markdown(items: Sequence[SplitFtGroup], figure: Figures) -> list[str]:
    md = ["## Split federated fine-tuning (paper 002)", "", INTRO, ""]
    for i, group in enumerate(items, 1):
        md += [f"### {group.title}", "", utility_leakage_md(group), ""]
        paired = paired_utility_md(group)
        if paired is not None:
            md += [PAIRED_NOTE, "", paired, ""]
        md += roc_table(group.runs, _label)
        md += ["H, H_A and held-out CE per round:", "", rounds_md(group), ""]
        accounting = accounting_md(group)
        if accounting is not None:
            md += [ACCOUNTING_NOTE, "", accounting, ""]
        md += figure("splitft_tradeoff", i, group, plot_tradeoff, "label leakage against held-out CE")
        if any((r.data.get("metrics") or {}).get("H_A") for r in group.runs):
            md += figure("splitft_h", i, group, plot_h, "H against H_A")
    return md


def summary(items: Sequence[SplitFtGroup]) -> list[str]:
    lines = []
    for group in items:
        lines.append(f"  {group.title}")
        for run in group.runs:
            m = run.data.get("metrics") or {}
            lines.append(f"    {_label(run):<28} CE {fmt_auto(m.get('heldout_ce')):>8}  label F1 "
                         f"{fmt_auto(m.get('label_token_f1')):>7}  EIA F1 {fmt_auto(m.get('eia_token_f1')):>7}  "
                         f"BiSR F1 {fmt_auto(m.get('bisr_token_f1')):>7}  {m.get('verdict') or '-'}")
    return lines
