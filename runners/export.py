"""`splitbench-export DIR` (or `python -m runners.export DIR`): every finished run under DIR as one tidy table.

    splitbench-export outputs/fidelity                # outputs/fidelity/splitbench_export.{parquet,csv}
    splitbench-export outputs --out /tmp/sweep        # /tmp/sweep.parquet and /tmp/sweep.csv (so does --out /tmp/sweep.csv)
    splitbench-export outputs --tag paper             # only the runs tagged `paper`

One row per run × metric: what the run was (system, experiment, configuration, the privacy parameter by its
own name and its value, the run directory's other overrides (`variant`: "default", "collab.fusion=edge"),
model, workload, seed (an integer) and mask seeds, tags, and where it came from: its config hash, the commit
that computed it (`-dirty` with uncommitted edits) and its date, UTC) and one number of its results.json
`metrics` with its 95% interval (`<name>_ci_lo`/`_ci_hi`, or a `<name>_ci` pair) where it has one. A metric
held per k (`{"1": v, "5": w}`, the collab curves) becomes one row per k, named `<name>[k]`. So an attack's ROC
(metrics/roc.py, docs/design.md "ROC of the attacks") is the rows `auc` (DeLong's interval) and
`tpr_at_fpr[1]`, `tpr_at_fpr[10]`, … (FPR in %, Clopper–Pearson), each with its test's prefix where a run has
several (`bayes_auc`); a TPR at an FPR its negatives cannot resolve is null in results.json and has no row. Non-numeric
entries (signatures, verdicts, flags) stay in results.json. Runs are found as `splitbench-report` finds them
(runners/report/runs.py): finished ones only (status ok and `.done`), smoke runs included, with their tags
in a column so they can be filtered out (or `--tag NAME`: only runs carrying NAME; repeated, every one).

Nothing is dropped without a word: a corrupt run (results.json unreadable) and a metric that should be a
number and is not (runs.data_problems) each get one `error:` line on stderr, and the exit code is 2, after
the table of everything else is written (so a sweep with one damaged run still exports, and a script sees
the loss).

Load it with one line of pandas: `pd.read_parquet("outputs/fidelity/splitbench_export.parquet")` (or
`pd.read_csv(...csv)`).
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

from harness import configurations
from harness.results import atomic_path, atomic_write_bytes
from runners.report.runs import Run, data_problems, scan

PROG = "splitbench-export"
STEM = "splitbench_export"
COLUMNS = ("system", "experiment", "experiment_name", "configuration", "parameter", "parameter_value", "variant",
           "model", "workload", "seed", "mask_seeds", "tags", "metric", "value", "ci_lo", "ci_hi", "run_dir",
           "config_hash", "commit", "date")
_NUMERIC = frozenset({"parameter_value", "value", "ci_lo", "ci_hi"})
_INTEGER = frozenset({"seed"})
_DATE = frozenset({"date"})
_SUFFIXES = (".parquet", ".csv")
_CI_SUFFIXES = ("_ci_lo", "_ci_hi", "_ci")


class ExportError(Exception):
    """A mistake the user can fix (no such directory, no finished run): one line, exit code 2."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _pair(value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _number(value[0]), _number(value[1])
    return None, None


def metric_rows(metrics: dict[str, Any]) -> Iterator[tuple[str, float, float | None, float | None]]:
    """(metric, value, ci_lo, ci_hi) for every numeric metric; interval keys ride on their metric's row."""
    for name, value in metrics.items():
        if name.endswith(_CI_SUFFIXES) and any(name[: -len(s)] in metrics for s in _CI_SUFFIXES if name.endswith(s)):
            continue
        if isinstance(value, dict):
            cis = metrics.get(f"{name}_ci") if isinstance(metrics.get(f"{name}_ci"), dict) else {}
            for k, v in value.items():
                if (x := _number(v)) is not None:
                    yield (f"{name}[{k}]", x, *_pair(cis.get(k)))
            continue
        if (x := _number(value)) is None:
            continue
        lo, hi = _number(metrics.get(f"{name}_ci_lo")), _number(metrics.get(f"{name}_ci_hi"))
        if lo is None and hi is None:
            lo, hi = _pair(metrics.get(f"{name}_ci"))
        yield name, x, lo, hi


def _parameter(data: dict[str, Any]) -> tuple[str | None, float | None]:
    """The privacy parameter by its own name (ε, η, λ, …) and its value; (None, None) where there is none."""
    value = _number(data.get("epsilon"))
    conf = configurations.REGISTRY.get(str(data.get("configuration")))
    if value is None:
        return None, None
    return (conf.parameter_name if conf is not None and conf.parameter_name else "epsilon"), value


def _system(data: dict[str, Any]) -> str | None:
    conf = configurations.REGISTRY.get(str(data.get("configuration")))
    return data.get("system") or (conf.system if conf is not None else None)


def _seeds(value: Any) -> str | None:
    if isinstance(value, (list, tuple)):
        return ",".join(str(s) for s in value) or None
    return None if value is None else str(value)


def _seed(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _commit(code: Any) -> str | None:
    """The commit that computed the run, `-dirty` where the checkout had uncommitted edits (git describe's mark)."""
    if not isinstance(code, dict) or not code.get("commit"):
        return None
    return f"{code['commit']}{'-dirty' if code.get('dirty') else ''}"


def _date(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value)).astimezone(timezone.utc) if value else None
    except ValueError:
        return None


def run_rows(run: Run) -> list[dict[str, Any]]:
    """The tidy rows of one finished run."""
    d, prov = run.data, run.provenance
    parameter, parameter_value = _parameter(d)
    head = {"system": _system(d), "experiment": d.get("experiment"), "experiment_name": d.get("experiment_name"),
            "configuration": d.get("configuration"), "parameter": parameter, "parameter_value": parameter_value,
            "variant": run.variant or None, "model": d.get("model"), "workload": d.get("workload"),
            "seed": _seed(d.get("seed", prov.get("seed"))), "mask_seeds": _seeds(d.get("mask_seeds")),
            "tags": ",".join(run.tags) or None, "run_dir": str(d.get("run_dir") or run.rel),
            "config_hash": d.get("config_hash"), "commit": _commit(prov.get("code")), "date": _date(prov.get("timestamp"))}
    return [{**head, "metric": m, "value": v, "ci_lo": lo, "ci_hi": hi} for m, v, lo, hi in metric_rows(run.metrics)]


def table(root: Path, tags: Sequence[str] = ()) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Every finished run's rows under `root` (of the runs carrying every tag of `tags`), how many runs were
    left out as failed or unfinished, and one line per corrupt run and per metric of the wrong type
    (runs.data_problems)."""
    if not root.is_dir():
        raise ExportError(f"{root} is not a directory")
    runs = [r for r in scan(root) if set(tags) <= set(r.tags) or r.state == "unreadable"]
    finished = [r for r in runs if r.state == "ok"]
    if not finished:
        tagged = f" tagged {', '.join(tags)}" if tags else ""
        raise ExportError(f"no finished run{tagged} (results.json with status ok and .done) under {root}")
    left_out = sum(r.state in ("failed", "unfinished") for r in runs)
    return [row for run in finished for row in run_rows(run)], left_out, data_problems(runs)


def _csv_bytes(rows: list[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({**r, **{c: r[c].isoformat() for c in _DATE if r[c] is not None}} for r in rows)
    return buf.getvalue().encode()


def write(rows: list[dict[str, Any]], base: Path) -> list[Path]:
    """base.parquet and base.csv, each atomically; a base that already ends in .csv or .parquet names both
    (`--out t.csv` writes t.csv and t.parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if base.suffix in _SUFFIXES:
        base = base.with_suffix("")
    parquet_path, csv_path = base.with_name(base.name + ".parquet"), base.with_name(base.name + ".csv")
    schema = pa.schema([(c, pa.float64() if c in _NUMERIC else pa.int64() if c in _INTEGER
                         else pa.timestamp("s", tz="UTC") if c in _DATE else pa.string()) for c in COLUMNS])
    with atomic_path(parquet_path) as tmp:
        pq.write_table(pa.table({c: [r[c] for r in rows] for c in COLUMNS}, schema=schema), tmp)
    atomic_write_bytes(csv_path, _csv_bytes(rows))
    return [parquet_path, csv_path]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's default adds a usage block)
        print(f"{PROG}: error: {message} (see {PROG} --help)", file=sys.stderr, flush=True)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description="Every finished splitbench run under DIR as one tidy table "
                                            "(one row per run × metric), Parquet and CSV.")
    parser.add_argument("dir", type=Path, help="a run or sweep directory (searched recursively for results.json)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"path of the table, with or without .csv/.parquet: both are written (default: DIR/{STEM})")
    parser.add_argument("--tag", action="append", default=[], metavar="NAME",
                        help="only the runs tagged NAME (repeat it: runs carrying every one)")
    args = parser.parse_args(argv)
    try:
        rows, left_out, problems = table(args.dir, args.tag)
        paths = write(rows, args.out or args.dir / STEM)
    except ExportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except OSError as exc:
        print(f"{PROG}: error: cannot write the table: {exc.strerror or exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    runs = len({r["run_dir"] for r in rows})
    print(f"{PROG}: wrote {' and '.join(str(p) for p in paths)}: {len(rows)} rows from {runs} finished run(s)"
          + (f"; {left_out} failed/unfinished run(s) left out" if left_out else ""), flush=True)
    for line in problems:
        print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
