"""The ROC table every attack section shows (issue 52 item 4): one row per run and test of its results.json `roc`
(metrics/roc.py), AUC with its 95 % interval and TPR at 1 % and 10 % FPR with Clopper–Pearson intervals. A TPR
at an FPR below 1/n_neg is not measurable and says so."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from runners.report.format import md_table
from runners.report.runs import Run

SHOWN_FPR_PCT = (1.0, 10.0)
NOTE = ("ROC of each attack that scores trials (metrics/roc.py): **AUC** = P(a positive trial scores above a "
        "negative one) with DeLong's 95% interval; **TPR @ FPR** in % with its Clopper–Pearson 95% interval, at the "
        "threshold that at most that share of negatives exceed; *n/a* where the negatives are too few to resolve "
        "that FPR (below 1/n_neg). Positives and negatives per test: docs/design.md, \"ROC of the attacks\".")


def records(roc: Any, name: str = "") -> Iterator[tuple[str, dict]]:
    """(test name, record) of a results.json `roc`, nested by test (`{"bayes": rec}`) or deeper (the privacy
    audit's `{game: {scope: rec}}`, named "game · scope")."""
    if not isinstance(roc, dict):
        return
    if "auc" in roc:
        yield name, roc
        return
    for key, value in roc.items():
        yield from records(value, f"{name} · {key}" if name else str(key))


def auc_cell(record: dict) -> str:
    lo, hi = record["auc_ci"]
    return f"{record['auc']:.3f} [{lo:.3f}, {hi:.3f}]"


def tpr_cell(record: dict, fpr_pct: float) -> str:
    row = next((r for r in record.get("tpr_at_fpr", []) if r["fpr_target_pct"] == fpr_pct), None)
    if row is None:
        return "—"
    if row["tpr_pct"] is None:
        return f"n/a (< 1/{record['negatives']})"
    lo, hi = row["tpr_ci_pct"]
    return f"{row['tpr_pct']:.1f} [{lo:.1f}, {hi:.1f}]"


def line(name: str, record: dict) -> str:
    """One test in one line (a terminal summary): AUC [CI] · TPR@1% [CP] · TPR@10% [CP]."""
    return (f"{name}: AUC {auc_cell(record)}" + "".join(f" · TPR@{t:g}% {tpr_cell(record, t)}" for t in SHOWN_FPR_PCT)
            + f" ({record['positives']} vs {record['negatives']} trials)")


def table_md(runs: Sequence[Run], label: Callable[[Run], str]) -> list[str]:
    """The ROC table of `runs` (each labelled by `label`), with its note; [] when none has a `roc`."""
    rows = [[label(run), name, f"{rec['positives']} / {rec['negatives']}", auc_cell(rec),
             *[tpr_cell(rec, t) for t in SHOWN_FPR_PCT]]
            for run in runs for name, rec in records(run.data.get("roc"))]
    if not rows:
        return []
    headers = ["run", "test", "trials (pos / neg)", "AUC [95% CI]", *[f"TPR @ FPR {t:g}%" for t in SHOWN_FPR_PCT]]
    return [NOTE, "", md_table(headers, rows), ""]
