"""PrivPair's burst schedules against its default, from the runs of scripts/splitft_privpair_schedule.sh
(issue 33 item 4): per run the utility, H, H_A and every attacker's reading with its verdict; then each
schedule minus the default, same seed and data, as differences with 95% intervals.

- Held-out CE and top-1: per held-out block (results.json heldout_blocks_ce / heldout_blocks_top1), paired
  by block within a seed (the held-out blocks depend only on the seed), pooled over seeds, Student t
  (metrics.intervals.mean_t_ci, the interval a decision reads).
- An attacker's token F1: per attacked example (samples.jsonl, rescored with the suite's token_prf). The
  schedule changes which batch rows a client draws (the bursts draw their D_align rows from the same
  generator), so the attacked examples of two arms are in general not the same text: where every example
  of a seed matches (step, row and truth), the difference is paired; otherwise it is the difference of the
  two arms' means per seed, averaged over seeds, with a Welch–Satterthwaite t interval.
- H/‖s_B‖², H_A/‖s_A‖² (last round) are one number per run: per schedule their mean over seeds with a Student t
  interval over seeds, and the per-seed differences (schedule − default) with theirs; one seed gives no interval.
- Verdicts: per schedule, the runs (seed, attacker or the run's verdict) whose verdict differs from the default's.

    python scripts/splitft_privpair_schedule.py /work/runs/ppair2/runs --out docs/results/splitft_privpair_schedule/table.md
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attacks.controls import PRF_MODE  # noqa: E402
from metrics.intervals import mean_t_ci  # noqa: E402
from metrics.privacy import token_prf  # noqa: E402

ATTACKERS = ["label", "bisr_b", "bisr_b_round_start", "eia", "bisr"]
DEFAULT = (4, 2)


def load(root: Path) -> dict[tuple[int, int, int], dict]:
    runs = {}
    for res in sorted(root.glob("p*s*_seed*/**/results.json")):
        m = re.search(r"p(\d+)s(\d+)_seed(\d+)", str(res))
        if m is None or not (res.parent / ".done").exists():
            continue
        key = tuple(int(x) for x in m.groups())
        data = json.loads(res.read_text())
        rows = [json.loads(line) for line in (res.parent / "samples.jsonl").read_text().splitlines() if line]
        data["_examples"] = {a: [((r["step"], r["row"]), tuple(r["truth_ids"]),
                                  token_prf(r["truth_ids"], r["guess_ids"], mode=PRF_MODE)[2])
                                 for r in rows if r["attacker"] == a] for a in ATTACKERS}
        data["_path"] = str(res.parent)
        runs[key] = data
    return runs


def fmt(x: float, nd: int = 2) -> str:
    return f"{x:.{nd}f}"


def ci(lo: float, hi: float, nd: int = 2) -> str:
    return f"[{lo:.{nd}f}, {hi:.{nd}f}]"


def welch_stratified(pairs: list[tuple[list[float], list[float]]]) -> tuple[float, float, float]:
    """Mean over seeds of (mean a − mean b) with a Welch–Satterthwaite t interval (a, b independent samples)."""
    k = len(pairs)
    diff = sum(np.mean(a) - np.mean(b) for a, b in pairs) / k
    parts = [np.var(x, ddof=1) / len(x) / k**2 for a, b in pairs for x in (a, b)]
    dfs = [len(x) - 1 for a, b in pairs for x in (a, b)]
    var = sum(parts)
    if var == 0:
        return diff, diff, diff
    df = var**2 / sum(p**2 / d for p, d in zip(parts, dfs) if d > 0)
    half = float(stats.t.ppf(0.975, df)) * math.sqrt(var)
    return diff, diff - half, diff + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = load(args.root)
    seeds = sorted({s for *_, s in runs})
    schedules = sorted({(p, s) for p, s, _ in runs}, key=lambda x: (x != DEFAULT, x))
    name = {sch: f"P={sch[0]}, {sch[1]} burst step{'s' if sch[1] > 1 else ''}" + (" (default)" if sch == DEFAULT else "")
            for sch in schedules}
    lines = ["Per run (reduced experiment=splitft, PrivPair λ = 1; token F1 % with its 95% interval over the attacked "
             "examples, (reference), verdict):", "",
             "| schedule | seed | held-out CE | held-out top-1 % | H/‖s_B‖² | H_A/‖s_A‖² | "
             + " | ".join(ATTACKERS) + " | run verdict | train s | attack s |",
             "| --- " * (9 + len(ATTACKERS)) + "|"]
    for sch in schedules:
        for seed in seeds:
            r = runs.get((*sch, seed))
            if r is None:
                continue
            m = r["metrics"]
            cells = []
            for a in ATTACKERS:
                if f"{a}_token_f1" not in m:
                    cells.append("—")
                    continue
                cells.append(f"{fmt(m[f'{a}_token_f1'], 1)} {ci(m[f'{a}_token_f1_ci_lo'], m[f'{a}_token_f1_ci_hi'], 1)} "
                             f"({fmt(m[f'{a}_reference_token_f1'], 1)}) {m[f'{a}_verdict']}")
            lines.append(f"| {name[sch]} | {seed} | {fmt(m['heldout_ce'], 4)} | {fmt(m['heldout_top1'], 2)} | "
                         f"{m['H_rel']:.3g} | {m['H_A_rel']:.3g} | " + " | ".join(cells)
                         + f" | {m['verdict']} | {r['timings']['train_seconds']:.0f} | {r['timings']['attack_seconds']:.0f} |")
    lines += ["", "Each schedule minus the default, same seeds and data (95% intervals; n = pairs or examples "
              "per arm pooled over seeds; positive = higher under the schedule):", "",
              "| schedule | quantity | difference [95% CI] | n | how |", "| --- | --- | --- | --- | --- |"]
    summary, over_seeds = {}, {}
    lines_h = ["", "H over seeds (mean, 95% Student t interval over the seeds' runs; one run gives no interval):", "",
               "| schedule | quantity | mean [95% CI] | seeds |", "| --- | --- | --- | --- |"]
    for sch in schedules:
        for q in ("H_rel", "H_A_rel"):
            vals = [runs[(*sch, s)]["metrics"][q] for s in seeds if (*sch, s) in runs]
            e = mean_t_ci(vals)
            over_seeds.setdefault(name[sch], {})[q] = [e.mean, e.lo, e.hi, e.n] if e.n > 1 else [e.mean, None, None, 1]
            lines_h.append(f"| {name[sch]} | {q} | {e.mean:.3g} " + (f"[{e.lo:.3g}, {e.hi:.3g}]" if e.n > 1 else "(no interval)")
                           + f" | {e.n} |")
    for sch in schedules:
        if sch == DEFAULT:
            continue
        both = [s for s in seeds if (*sch, s) in runs and (*DEFAULT, s) in runs]
        if not both:
            continue
        out = summary.setdefault(name[sch], {})
        for q, key in (("held-out CE (nats)", "heldout_blocks_ce"), ("held-out top-1 (pp)", "heldout_blocks_top1")):
            if not all(key in runs[(*x, s)] for s in both for x in (sch, DEFAULT)):
                lines.append(f"| {name[sch]} | {q} | — (not in these results.json) | | |")
                continue
            d = [a - b for s in both for a, b in zip(runs[(*sch, s)][key]["final"], runs[(*DEFAULT, s)][key]["final"])]
            e = mean_t_ci(d)
            out[q] = [e.mean, e.lo, e.hi, e.n]
            lines.append(f"| {name[sch]} | {q} | {e.mean:+.4f} {ci(e.lo, e.hi, 4)} | {e.n} blocks | paired by block |")
        for a in ATTACKERS:
            ex = [(runs[(*sch, s)]["_examples"][a], runs[(*DEFAULT, s)]["_examples"][a]) for s in both]
            if not all(x and y for x, y in ex):
                continue
            paired = all([(k, t) for k, t, _ in x] == [(k, t) for k, t, _ in y] for x, y in ex)
            if paired:
                e = mean_t_ci([fx - fy for x, y in ex for (_, _, fx), (_, _, fy) in zip(x, y)])
                diff, lo, hi, how = e.mean, e.lo, e.hi, "paired by example"
            else:
                diff, lo, hi = welch_stratified([([f for *_, f in x], [f for *_, f in y]) for x, y in ex])
                same = sum(sum(1 for (k, t, _) in x if (k, t) in {(k2, t2) for k2, t2, _ in y}) for x, y in ex)
                how = f"per-seed means, Welch ({same} of {sum(len(x) for x, _ in ex)} examples the same text)"
            out[f"{a} token F1 (pp)"] = [diff, lo, hi, sum(len(x) for x, _ in ex)]
            lines.append(f"| {name[sch]} | {a} token F1 (pp) | {diff:+.2f} {ci(lo, hi)} | "
                         f"{sum(len(x) for x, _ in ex)} per arm | {how} |")
        for q in ("H_rel", "H_A_rel"):
            d = [runs[(*sch, s)]["metrics"][q] - runs[(*DEFAULT, s)]["metrics"][q] for s in both]
            e = mean_t_ci(d)
            out[q] = {"per_seed": d, "mean_ci": [e.mean, e.lo, e.hi, e.n] if e.n > 1 else None}
            lines.append(f"| {name[sch]} | {q} (per seed: " + ", ".join(f"{x:+.3g}" for x in d) + ") | "
                         + (f"{e.mean:+.3g} [{e.lo:+.3g}, {e.hi:+.3g}]" if e.n > 1 else "— (one seed, no interval)")
                         + f" | {len(d)} seeds | paired by seed, Student t over seeds |")
        differ = [f"seed {s} {v}: {runs[(*DEFAULT, s)]['metrics'][v]} → {runs[(*sch, s)]['metrics'][v]}"
                  for s in both for v in [f"{a}_verdict" for a in ATTACKERS] + ["verdict"]
                  if runs[(*sch, s)]["metrics"].get(v) != runs[(*DEFAULT, s)]["metrics"].get(v)]
        out["verdicts differing"] = differ
        lines.append(f"| {name[sch]} | verdicts differing from the default's | " + ("; ".join(differ) or "none")
                     + f" | {len(both)} seeds | every attacker's and the run's verdict |")
    text = "\n".join(lines + lines_h) + "\n"
    provenance = {f"{name[(p, s)]} seed {seed}": r["_path"] for (p, s, seed), r in sorted(runs.items())}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"differences": summary, "H over seeds": over_seeds, "runs": provenance}, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
