"""The floating-point study's trials pooled into Table 4's rows (paper §7.3.2), and the flat metrics of
results.json taken from them."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.splitee.numerics.study import InstanceStats

# Paper order of the op types (§7.3.2: Q, K, V, O, Gate, Up, LM head), Down last (not offloaded).
OP_ORDER = ("q", "k", "v", "o", "gate", "up", "lm_head", "down")

METRIC_DEFINITIONS = {
    "mean_true_error": "mean over trials of |fl(<w,x+eta>) - fl(<w,eta>) - <w,x>| (exact reference), headline "
                       "precision and kernel, offloaded ops; 95% bootstrap interval over op instances' means",
    "mean_bound": "mean over the same trials of the proven bound (docs/fp_bound.md)",
    "bound_ratio": "mean_bound / mean_true_error (the paper reports about 4)",
    "bound_violation_rate": "fraction (0-1) of trials whose error exceeds the bound (plus the reference's own "
                            "tolerance); 0 wherever the kernel follows the bound's model",
    "first_order_violation_rate": "fraction of trials above gamma_d * (sum|w||x+eta| + sum|w||eta|), the two dot "
                                  "products' terms only (not a proven bound)",
    "overflow_rate": "fraction of trials whose working-precision result overflowed (excluded from the means)",
}


@dataclass
class Summary:
    """Trials pooled over a group of instances (Table 4's numbers)."""

    precision: str
    kernel: str
    op: str                        # an op name, "offloaded" (all offloaded instances) or "down"
    accumulate: str
    n_instances: int
    n_trials: int
    n_overflow: int
    mean_true_error: float
    mean_bound: float
    bound_ratio: float             # mean bound / mean true error (the paper: about 4)
    bound_violation_rate: float    # fraction of trials with error > bound
    first_order_bound: float
    first_order_violation_rate: float
    max_error_over_bound: float
    mean_abs_exact: float
    sigma_mean: float
    delta_mean: float | None
    instance_error_ci: tuple[float, float] | None = None   # 95% bootstrap interval over instances' mean errors
    bound_finite: bool = True      # False where d·u_acc ≥ 1: the bound does not exist (results.json has null)
    d: list[int] = field(default_factory=list)


def summarise(stats: Sequence[InstanceStats], precision_name: str, kernel: str, op: str) -> Summary | None:
    """Pool `stats` of one precision and kernel: op = a single op name, "offloaded" or "down"."""
    if op == "offloaded":
        rows = [s for s in stats if s.offloaded]
    else:
        rows = [s for s in stats if s.op == op]
    rows = [s for s in rows if s.precision == precision_name and s.kernel == kernel]
    if not rows:
        return None
    n = sum(s.n for s in rows)
    err = sum(s.sum_error for s in rows)
    bnd = sum(s.sum_bound for s in rows)
    first = sum(s.sum_first_order for s in rows)
    mean_err = err / n if n else math.nan
    mean_bnd = bnd / n if n else math.nan
    ci = None
    means = [s.mean_error for s in rows if s.n]
    if len(means) >= 2:
        from metrics.intervals import mean_ci

        est = mean_ci(means)
        ci = (est.lo, est.hi)
    deltas = [s.delta for s in rows if s.delta is not None]
    return Summary(
        precision=precision_name, kernel=kernel, op=op,
        accumulate="/".join(sorted({s.accumulate for s in rows})),
        n_instances=len(rows), n_trials=n, n_overflow=sum(s.n_overflow for s in rows),
        mean_true_error=mean_err, mean_bound=mean_bnd,
        bound_ratio=mean_bnd / mean_err if n and mean_err > 0 else math.nan,
        bound_violation_rate=sum(s.violations for s in rows) / n if n else math.nan,
        first_order_bound=first / n if n else math.nan,
        first_order_violation_rate=sum(s.violations_first_order for s in rows) / n if n else math.nan,
        max_error_over_bound=max(s.max_error_over_bound for s in rows),
        mean_abs_exact=sum(s.sum_abs_exact for s in rows) / n if n else math.nan,
        sigma_mean=sum(s.sigma_mean for s in rows) / len(rows),
        delta_mean=sum(deltas) / len(deltas) if deltas else None,
        instance_error_ci=ci,
        bound_finite=math.isfinite(bnd),
        d=sorted({s.d for s in rows}),
    )


def summary_table(stats: Sequence[InstanceStats], precisions: Sequence[str], kernels: Sequence[str]) -> list[dict]:
    """One row per (precision, kernel, group): "offloaded" first, then each op in paper order, then down."""
    present = {s.op for s in stats}
    groups = ["offloaded", *[o for o in OP_ORDER if o in present and o != "down"], *(["down"] if "down" in present else [])]
    rows = []
    for p in precisions:
        for k in kernels:
            for g in groups:
                s = summarise(stats, p, k, g)
                if s is not None:
                    rows.append(asdict(s))
    return rows


def _overflow_rate(row: dict[str, Any]) -> float:
    return row["n_overflow"] / max(1, row["n_trials"] + row["n_overflow"])


def flat_metrics(table: Sequence[dict[str, Any]], precision: str, kernel: str) -> dict[str, Any]:
    """results.json's flat `metrics` from `summary_table` rows (METRIC_DEFINITIONS): the headline (this
    precision and kernel over all offloaded instances), then <metric>_<op> per op type at the headline,
    then <metric>_<precision>_<kernel> for every pair, offloaded and down_<metric>_… for Down."""
    m: dict[str, Any] = {}
    rows = {(r["precision"], r["kernel"], r["op"]): r for r in table}
    head = rows.get((precision, kernel, "offloaded"))
    if head is not None:
        ci = head.get("instance_error_ci") or (None, None)
        m.update({
            "mean_true_error": head["mean_true_error"], "mean_true_error_ci_lo": ci[0], "mean_true_error_ci_hi": ci[1],
            "mean_bound": head["mean_bound"], "bound_ratio": head["bound_ratio"],
            "bound_violation_rate": head["bound_violation_rate"],
            "first_order_violation_rate": head["first_order_violation_rate"],
            "max_error_over_bound": head["max_error_over_bound"],
            "overflow_rate": _overflow_rate(head),
            "n_trials": head["n_trials"], "n_instances": head["n_instances"],
        })
    for (p, k, op), r in rows.items():
        if (p, k) == (precision, kernel) and op not in ("offloaded", "down"):
            for key in ("mean_true_error", "mean_bound", "bound_violation_rate"):
                m[f"{key}_{op}"] = r[key]
    for (p, k, op), r in rows.items():
        if op not in ("offloaded", "down"):
            continue
        prefix = "down_" if op == "down" else ""
        for key in ("mean_true_error", "mean_bound", "bound_violation_rate"):
            m[f"{prefix}{key}_{p}_{k}"] = r[key]
        m[f"{prefix}overflow_rate_{p}_{k}"] = _overflow_rate(r)
    return m
