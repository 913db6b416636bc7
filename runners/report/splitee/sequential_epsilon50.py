"""The ε at which the sequential all-exposure attacker reaches 50 % top-1 (issue 32 item 2), beside the
layer-0 Bayes attacker's (read from a committed Table 6 report) and beside what the composed μ-GDP
accounting (harness/splitee/accounting.py) allows.

Measured crossings. Per attacker, the teacher-forced (or free-running) ep1 runs that use every layer give
top-1 (%) at each ε; the crossing is interpolated linearly in log ε between the two adjacent ε whose top-1
brackets 50 % (the first ε at or above 50 % and the one before it). The same interpolation on the lower
and on the upper ends of the pointwise 95 % Wilson intervals gives a bracket (the upper end crosses
first); it is a pointwise, not a simultaneous, band. A curve already at or above 50 % at its smallest ε
reads "≤ ε_min", one never reaching it "> ε_max".

The accounting's bound. Every exposure is ε-GDP with respect to its input (paper Prop. 6) and one prompt
token at position i of an n-token prompt reaches K(n, i) exposures of one prefill-only submission
(harness/splitee/accounting.py exposure_count, max_new_tokens = 1, offload qkv, o, gate_up: what the sequential
runner's engine records), so the submission is μ-GDP in that token with μ = ε·√K(n, i) (Prop. 7). For an
f-DP mechanism no reconstruction attack whose prior guesses right with probability κ succeeds with
probability above 1 − f(κ) (Kaissis, Hayes, Ziller, Rueckert 2023, "Bounding data reconstruction attacks
with the hypothesis testing interpretation of differential privacy"); for μ-GDP, f(α) = Φ(Φ⁻¹(1 − α) − μ),
so the bound is Φ(Φ⁻¹(κ) + μ). Averaged over the attacked positions, it reaches 50 % at the ε solved here
(bisection in log ε): no attacker can reach 50 % top-1 below it. κ = 1/V is an attacker with no prior
(the likelihood attacker's case); κ = the prior alone's measured top-1 is a plug-in for MAP's (the prior's
own probability of its top guess is not recorded).

    python -m runners.report.splitee.sequential_epsilon50 OUT/sequential_attack --table6 docs/results/table6/report.md \
        --out docs/results/sequential/dolly10x32/epsilon50.md
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import UserError

PROG = "splitbench"
TARGET = 50.0
ATTACKERS = (("likelihood", "sequential_top1"), ("MAP", "sequential_map_top1"), ("prior alone", "prior_top1"))


def crossing(points: Sequence[tuple[float, float]], target: float = TARGET) -> tuple[str, float | None]:
    """(relation, ε) where the curve (ε, top-1 %) first reaches `target`: ("=", ε) interpolated linearly in
    log ε between the bracketing points, ("≤", ε_min) when already there at the smallest ε, (">", ε_max)
    when never; ("", None) for no points."""
    pts = sorted((float(e), float(y)) for e, y in points)
    if not pts:
        return "", None
    for i, (eps, y) in enumerate(pts):
        if y >= target:
            if i == 0:
                return "≤", eps
            e0, y0 = pts[i - 1]
            t = (target - y0) / (y - y0)
            return "=", math.exp(math.log(e0) + t * (math.log(eps) - math.log(e0)))
    return ">", pts[-1][0]


def gdp_bound(epsilon: float, exposures: Sequence[int], kappa: float) -> float:
    """Mean over positions of Φ(Φ⁻¹(κ) + ε·√K): the μ-GDP reconstruction bound (module docstring), in %."""
    from scipy import stats

    base = float(stats.norm.ppf(kappa))
    return 100.0 * sum(float(stats.norm.cdf(base + epsilon * math.sqrt(k))) for k in exposures) / len(exposures)


def gdp_crossing(exposures: Sequence[int], kappa: float, target: float = TARGET) -> float:
    """The ε at which gdp_bound reaches `target` (bisection in log ε; 0 when the prior alone is there)."""
    if gdp_bound(0.0, exposures, kappa) >= target:
        return 0.0
    lo, hi = 1e-9, 1e9
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if gdp_bound(mid, exposures, kappa) >= target else (mid, hi)
    return math.sqrt(lo * hi)


def table6_bayes(report: Path) -> list[tuple[float, float, float, float]]:
    """(ε, top-1 %, lo, hi) of the layer-0 Bayes attacker, ep1 rows of the Table 6 report's Bayes table (the
    table after the paragraph that opens "Bayes-optimal token attacker")."""
    text = Path(report).read_text()
    start = text.find("Bayes-optimal token attacker")
    if start < 0:
        raise UserError(f"{report} holds no Bayes attacker table (no paragraph 'Bayes-optimal token attacker')")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            m = re.match(r"\| ep1 ε=([0-9.e+]+) \| [^|]+ \| ([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", line)
            if m:
                rows.append(tuple(float(x) for x in m.groups()))
        elif rows:
            break
    if not rows:
        raise UserError(f"{report}: the Bayes attacker table has no ep1 rows")
    return rows


def curves(root: Path) -> dict[str, list[Any]]:
    """The finished ep1 sequential runs under `root` that use every layer and, per mode, attack the most
    positions, by mode, sorted by ε."""
    from harness import configurations
    from runners.report.runs import finished_runs, scan

    # ep1: the one configuration whose masks follow the `epsilon` knob itself (its rule, not its name)
    runs = [r for r in finished_runs(scan(root), "sequential_attack")
            if getattr(configurations.REGISTRY.get(str(r.data.get("configuration"))), "epsilon_rule", None)
            == configurations.CONSTANT and not r.tags]
    if not runs:
        raise UserError(f"no finished ep1 sequential_attack run under {root}")
    full = max(len(r.data.get("layers_used") or ()) for r in runs)
    out: dict[str, list[Any]] = {}
    for r in runs:
        if len(r.data.get("layers_used") or ()) == full:
            out.setdefault(str(r.data.get("mode")), []).append(r)
    # per mode, the runs that attack the most positions: a shorter all-layer run is a layer curve's point
    longest = {mode: max(int(r.metrics.get("n_positions") or 0) for r in rs) for mode, rs in out.items()}
    return {mode: sorted((r for r in rs if int(r.metrics.get("n_positions") or 0) == longest[mode]),
                         key=lambda r: float(r.data["epsilon"])) for mode, rs in out.items()}


def exposures_per_position(run: Any) -> list[int]:
    """K(n, i) of every attacked position of `run` (harness/splitee/accounting.py exposure_count; the prompt lengths
    from its recorded workload and tokenizer: results.json records the positions, not the lengths)."""
    from omegaconf import OmegaConf

    from harness.models import load_tokenizer
    from harness.splitee.accounting import exposure_count
    from harness.workloads import load_workload

    cfg = OmegaConf.create(run.provenance["config"])
    tokenizer = load_tokenizer(cfg.model, cache_dir=cfg.paths.cache_dir)
    workload = load_workload(cfg.workload, tokenizer, int(run.provenance["seed"]))
    lengths = {p.id: len(p.input_ids) for p in workload.prompts}
    n_layers = len(run.data["layers_used"])
    offload = [op for op in cfg.engine.offload if op != "lm_head"]   # the runner's engine: prefill, no LM head
    out = []
    for line in (run.path / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        out += [exposure_count(lengths[row["id"]], p, n_layers, 1, offload).total for p in row["positions"]]
    return out


def _eps(relation: str, eps: float | None) -> str:
    if eps is None:
        return "—"
    return f"{'' if relation == '=' else relation + ' '}{eps:.3g}"


def _row(label: str, pts: Sequence[tuple[float, float, float, float]]) -> list[str]:
    mid = crossing([(e, y) for e, y, _, _ in pts])
    early = crossing([(e, hi) for e, _, _, hi in pts])
    late = crossing([(e, lo) for e, _, lo, _ in pts])
    grid = ", ".join(f"{e:g}" for e, *_ in pts)
    return [label, _eps(*mid), f"[{_eps(*early)}, {_eps(*late)}]", grid]


def build(root: Path, table6: Path | None) -> tuple[str, dict[str, Any]]:
    from runners.report.format import md_table

    by_mode = curves(root)
    body, record = [], {"target_top1_pct": TARGET, "measured": [], "gdp": []}
    for mode in ("teacher_forced", "free_running"):
        for label, key in ATTACKERS:
            if mode not in by_mode or (label == "prior alone" and mode != "teacher_forced"):
                continue
            pts = [(float(r.data["epsilon"]), r.metrics[key], r.metrics[f"{key}_ci_lo"], r.metrics[f"{key}_ci_hi"])
                   for r in by_mode[mode] if r.metrics.get(key) is not None]
            row = _row(f"sequential {label}, {mode.replace('_', '-')}, all layers", pts)
            body.append(row)
            record["measured"].append(dict(zip(("attacker", "epsilon50", "bracket", "grid"), row)))
    if table6 is not None:
        pts = table6_bayes(table6)
        row = _row(f"layer-0 Bayes (committed Table 6, {table6})", pts)
        body.append(row)
        record["measured"].append(dict(zip(("attacker", "epsilon50", "bracket", "grid"), row)))
    teacher = by_mode.get("teacher_forced") or next(iter(by_mode.values()))
    ref = teacher[0]
    ks = exposures_per_position(ref)
    prior = sum(r.metrics["prior_top1"] for r in teacher) / len(teacher) / 100.0
    vocab = int(ref.data["sequential"]["vocab"])
    gdp_rows = []
    for label, kappa in ((f"no prior (κ = 1/V = 1/{vocab})", 1.0 / vocab),
                         (f"the prior alone's top-1 (κ = {prior:.3f}, plug-in)", prior)):
        for what, k in (("K(n, i) of each attacked position", ks), ("K = 90, the exposures the attacker reads", None)):
            use = ks if k is not None else [len(ref.data["sequential"]["sigma_per_op_layer"])] * len(ks)
            eps = gdp_crossing(use, kappa)
            gdp_rows.append([label, what, f"{eps:.3g}"])
            record["gdp"].append({"kappa": kappa, "exposures": what, "epsilon50_lower_bound": eps})
    record["exposures_min_max"] = [min(ks), max(ks)]
    md = [f"ε at which top-1 reaches {TARGET:g} % (ep1; `python -m runners.report.splitee.sequential_epsilon50`; "
          "log-linear interpolation between the bracketing ε; bracket: the same on the pointwise 95 % interval's "
          "upper and lower ends):", "",
          md_table(["attacker", "ε at 50 % top-1", "bracket", "ε measured"], body, align="lrrl"), "",
          f"What the composed μ-GDP accounting allows: the ε below which no attacker's top-1 can reach {TARGET:g} % "
          f"(Φ(Φ⁻¹(κ) + ε·√K) averaged over the {len(ks)} attacked positions; K(n, i) from "
          "harness/splitee/accounting.py "
          f"for one prefill-only submission, {min(ks)}–{max(ks)} here):", "",
          md_table(["prior", "exposures", "ε lower bound"], gdp_rows, align="llr"), ""]
    return "\n".join(md), record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG,
                                     description="the ε of 50 % top-1 (runners/report/splitee/sequential_epsilon50.py)")
    parser.add_argument("root", type=Path, help="a sweep directory holding sequential_attack runs")
    parser.add_argument("--table6", type=Path, default=None, help="a Table 6 report.md (the layer-0 Bayes attacker)")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here (and .json beside it)")
    args = parser.parse_args(argv)
    try:
        md, record = build(args.root, args.table6)
    except (UserError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if args.out is not None:
        from harness.results import atomic_write_bytes, atomic_write_json

        atomic_write_bytes(args.out, md.encode())
        atomic_write_json(args.out.with_suffix(".json"), record)
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
