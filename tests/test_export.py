"""splitbench-export: finished runs → one tidy table (one row per run × metric), Parquet and CSV.

The runs are test_report.py's trimmed results.json files (no model is loaded); test_runs.py exports a real
smoke run.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest

from runners import export
from tests.test_report import FAILED, FIDELITY, fidelity, sweep, write_run


def _export(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = export.main(args)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_one_row_per_run_and_metric_with_config_columns(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    write_run(tmp_path, "fidelity/smollm2-135m/slalom/eps=na/engine.bank_on_exhaustion=error", FAILED, done=True)
    collab = fidelity("coveil", 4.0, 50.0, 40.0, 60.0, system="collab")
    collab["run_dir"] = "collab/smollm2-135m/coveil/eps=4/default"
    collab["metrics"] = {"utility": 70.0, "utility_ci": [60.0, 80.0], "top1_at_k": {"1": 12.5, "5": 30.0},
                         "top1_at_k_ci": {"1": [5.0, 20.0], "5": [20.0, 40.0]}, "verdict": "leaks", "flag": True}
    write_run(tmp_path, collab["run_dir"], collab)
    code, out, err = _export([str(tmp_path)], capsys)
    assert code == 0 and err == ""
    assert "from 6 finished run(s); 1 failed/unfinished run(s) left out" in out
    df = pd.read_parquet(tmp_path / "splitbench_export.parquet")
    assert list(df.columns) == list(export.COLUMNS)
    assert not df.duplicated(["run_dir", "metric"]).any()
    assert df["run_dir"].nunique() == 6
    ep1 = df[(df.configuration == "ep1") & (df.parameter_value == 0.5)].set_index("metric")
    assert ep1.loc["exact_match", ["value", "ci_lo", "ci_hi"]].tolist() == [66.67, 23.4, 100.0]
    assert ep1.loc["n_diverging", "value"] == 7 and pd.isna(ep1.loc["n_diverging", "ci_lo"])
    assert "bleu_signature" not in ep1.index and "exact_match_ci_lo" not in ep1.index   # text, and interval keys
    row = ep1.iloc[0]
    assert (row.system, row.experiment, row.parameter, row.variant, row.model, row.workload, row.seed) == \
        ("splitee", "fidelity", "epsilon", "default", "smollm2-135m", "dolly", 0)
    # issue 54: the seed is an integer; where a number came from: its config hash, commit and date
    assert df.seed.dtype == "int64"
    assert (row.config_hash, row.commit) == (FIDELITY["config_hash"], "ab3ac9898ad5829bce035763c3aa88eb82af7689-dirty")
    assert row.date == pd.Timestamp("2026-11-29T13:44:33Z")
    epn = df[df.configuration == "epn"]
    assert epn.parameter.isna().all() and epn.parameter_value.isna().all()
    c = df[df.configuration == "coveil"].set_index("metric")
    # coveil's knob is its own λ; a `_ci` pair and a per-k curve ride on their metric's rows; text and flags stay out.
    assert set(c.index) == {"utility", "top1_at_k[1]", "top1_at_k[5]"} and (c.parameter == "lambda").all()
    assert c.loc["utility", ["value", "ci_lo", "ci_hi"]].tolist() == [70.0, 60.0, 80.0]
    assert c.loc["top1_at_k[5]", ["value", "ci_lo", "ci_hi"]].tolist() == [30.0, 20.0, 40.0]
    csv = pd.read_csv(tmp_path / "splitbench_export.csv")
    assert len(csv) == len(df) and list(csv.columns) == list(df.columns)


def test_out_names_the_table(tmp_path: Path, capsys) -> None:
    sweep(tmp_path / "runs")
    code, _, _ = _export([str(tmp_path / "runs"), "--out", str(tmp_path / "t" / "sweep")], capsys)
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["sweep.csv", "sweep.parquet"]


@pytest.mark.parametrize("name", ["sweep.csv", "sweep.parquet"])
def test_out_with_an_extension_names_both_files(tmp_path: Path, capsys, name) -> None:
    """Issue 54: `--out X.csv` wrote X.csv.csv and X.csv.parquet."""
    sweep(tmp_path / "runs")
    code, _, _ = _export([str(tmp_path / "runs"), "--out", str(tmp_path / "t" / name)], capsys)
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["sweep.csv", "sweep.parquet"]


def test_tag_keeps_the_runs_carrying_it(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    write_run(tmp_path, "fidelity/smollm2-135m/t3/eps=na/default", fidelity("t3", None, 50.0, 40.0, 60.0, tags=["paper"]))
    write_run(tmp_path, "fidelity/smollm2-135m/cpu/eps=na/default",
              fidelity("cpu", None, 50.0, 40.0, 60.0, tags=["paper", "smoke"]))
    code, out, _ = _export([str(tmp_path), "--tag", "paper"], capsys)
    assert code == 0 and "from 2 finished run(s)" in out
    df = pd.read_parquet(tmp_path / "splitbench_export.parquet")
    assert set(df.configuration) == {"t3", "cpu"}
    code, _, _ = _export([str(tmp_path), "--tag", "paper", "--tag", "smoke"], capsys)
    assert code == 0 and set(pd.read_parquet(tmp_path / "splitbench_export.parquet").configuration) == {"cpu"}
    code, out, err = _export([str(tmp_path), "--tag", "nope"], capsys)
    assert code == 2 and out == "" and err.strip() == (
        f"splitbench-export: error: no finished run tagged nope (results.json with status ok and .done) under {tmp_path}")


def test_a_corrupt_run_and_a_metric_of_the_wrong_type_are_reported_and_exit_2(tmp_path: Path, capsys) -> None:
    """Issue 54: a truncated results.json beside .done was counted as failed/unfinished, and a metric stored as
    text where a number belongs was dropped (45 -> 44 rows), both with exit 0. Now one line each, exit 2, and the
    table of everything else written."""
    sweep(tmp_path)
    wrong = fidelity("ep1", 15.0, 99.0, 98.0, 100.0)
    write_run(tmp_path, "fidelity/smollm2-135m/ep1/eps=15/default", wrong)
    code, _, _ = _export([str(tmp_path)], capsys)
    rows = len(pd.read_parquet(tmp_path / "splitbench_export.parquet"))
    torn = write_run(tmp_path, "fidelity/smollm2-135m/t3/eps=na/default", fidelity("t3", None, 50.0, 40.0, 60.0))
    (torn / "results.json").write_text((torn / "results.json").read_text()[:200])
    wrong["metrics"]["bleu"] = "99.0"
    write_run(tmp_path, "fidelity/smollm2-135m/ep1/eps=15/default", wrong)
    marker_only = tmp_path / "fidelity/smollm2-135m/cpu/eps=na/default"
    marker_only.mkdir(parents=True)
    (marker_only / ".done").write_bytes(b"")
    code, out, err = _export([str(tmp_path)], capsys)
    assert code == 2 and "from 6 finished run(s)" in out and "failed/unfinished" not in out
    missing, corrupt, wrong_type = err.splitlines()
    assert missing == ("splitbench-export: error: fidelity/smollm2-135m/cpu/eps=na/default: results.json is missing "
                       "beside .done: a corrupt run, left out (recompute it with rerun=true)")
    assert corrupt.startswith("splitbench-export: error: fidelity/smollm2-135m/t3/eps=na/default: results.json: "
                              "JSONDecodeError: ")
    assert corrupt.endswith(": a corrupt run, left out (recompute it with rerun=true)")
    assert wrong_type == ("splitbench-export: error: fidelity/smollm2-135m/ep1/eps=15/default: metrics.bleu is text "
                          "(\"99.0\"), not a number: left out")
    df = pd.read_parquet(tmp_path / "splitbench_export.parquet")
    assert len(df) == rows - 1 and "bleu" not in set(df[df.parameter_value == 15].metric)


@pytest.mark.parametrize("make, expected", [
    (lambda root: root / "missing", "is not a directory"),
    (lambda root: root, "no finished run"),
    (lambda root: write_run(root, "r", {**copy.deepcopy(FAILED)}).parent, "no finished run"),
])
def test_nothing_to_export_is_one_line_exit_2_and_no_file(tmp_path: Path, capsys, make, expected) -> None:
    target = make(tmp_path)
    code, out, err = _export([str(target)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("splitbench-export: error:") and expected in err
    assert not list(tmp_path.rglob("splitbench_export*"))


def test_a_tests_roc_becomes_rows_and_an_unresolvable_tpr_none(tmp_path: Path, capsys) -> None:
    """Issue 52 item 4: a test's ROC in metrics (metrics/roc.py flat) is rows `auc` and `tpr_at_fpr[<FPR %>]` with
    their intervals; a TPR at an FPR below 1/n_neg is null in results.json: no row, and no error line."""
    from metrics import roc

    small = fidelity("coveil", 4.0, 50.0, 40.0, 60.0, system="collab")
    small["run_dir"] = "collab/m/coveil/eps=4/default"
    record = roc.roc([0.9, 0.8, 0.7, 0.2] * 5, [0.1, 0.3, 0.5, 0.6] * 5)       # 20 negatives: FPR ≥ 5 %
    small["metrics"] = {"utility": 70.0, **roc.flat(record)}
    write_run(tmp_path, small["run_dir"], small)
    code, _, err = _export([str(tmp_path)], capsys)
    assert code == 0 and err == ""
    rows = pd.read_parquet(tmp_path / "splitbench_export.parquet").set_index("metric")
    assert rows.loc["auc", ["value", "ci_lo", "ci_hi"]].tolist() == [record["auc"], *record["auc_ci"]]
    ten = record["tpr_at_fpr"][2]
    assert rows.loc["tpr_at_fpr[10]", ["value", "ci_lo", "ci_hi"]].tolist() == [ten["tpr_pct"], *ten["tpr_ci_pct"]]
    assert "tpr_at_fpr[1]" not in rows.index and "tpr_at_fpr[0.1]" not in rows.index
