"""`splitbench-report --wandb ENTITY/PROJECT` offline: the report definition of a sweep (Table 2 metric vs
ε per configuration, the Table 2 and Table 6 panels), written with the W&B view spec it would save, and
the one-line errors. Nothing here reaches W&B (WANDB_MODE=offline or disabled)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from runners.report import cli, wandb_report
from runners.report.runs import scan

from .conftest import run_cli


def _run(root: Path, rel: str, **data) -> None:
    path = root / rel
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({"status": "ok", "tags": [], **data}))
    (path / ".done").write_text("")


def _sweep(root: Path) -> None:
    """A fidelity sweep over ep1 (two ε) and t3, and two attack runs, as results.json files."""
    for conf, eps in (("ep1", 1.0), ("ep1", 5.0), ("t3", None)):
        _run(root, f"fidelity/m/{conf}/eps={eps or 'na'}/default", experiment="fidelity", experiment_name="fidelity",
             configuration=conf, epsilon=eps, metrics={"exact_match": 90.0},
             provenance={"config": {"logger": {"group": "table2-sweep"}}})
    for conf, eps in (("t3", None), ("ep1", 1.0)):
        _run(root, f"attack/m/{conf}/eps={eps or 'na'}/default", experiment="attack", experiment_name="attack",
             configuration=conf, epsilon=eps, metrics={"token_f1": 40.0})
    _run(root, "timing/m/t3/eps=na/default", experiment="timing", experiment_name="timing", configuration="t3")


def test_plan_lays_out_table2_and_table6_per_group(tmp_path):
    _sweep(tmp_path)
    plan = wandb_report.plan(scan(tmp_path), "team", "splitbench", str(tmp_path))
    headings = [s["heading"] for s in plan["sections"]]
    assert headings == ["Table 2: output fidelity (table2-sweep)", "Table 6: prompt reconstruction (attack)"]
    table2, table6 = plan["sections"]
    # One run set per configuration, selecting the mirror's job type, group and configuration.
    assert [rs["name"] for rs in table2["runsets"]] == ["t3", "ep1"]
    assert table2["runsets"][1]["filters"] == ("JobType = 'fidelity' and Group = 'table2-sweep' and "
                                               "Config('configuration.name') = 'ep1'")
    scatter = [p for p in table2["panels"] if p["type"] == "scatter"]
    assert [p["y"][1] for p in scatter] == [k for k, _ in wandb_report.TABLE2_METRICS]
    assert all(p["x"] == ["config", "epsilon"] for p in scatter)
    bar, = [p for p in table2["panels"] if p["type"] == "bar"]
    assert bar["groupby"] == "configuration.name" and "semantic_similarity" in bar["metrics"]
    assert table6["panels"][0]["groupby"] == "attack.component" and "token_f1" in table6["panels"][0]["metrics"]
    assert table6["runsets"][0]["filters"].startswith("JobType = 'attack' and Group = 'attack'")


def test_definition_file_holds_the_wandb_view_spec_and_round_trips(tmp_path):
    _sweep(tmp_path / "runs")
    plan = wandb_report.plan(scan(tmp_path / "runs"), "team", "splitbench", "runs")
    path = wandb_report.write_definition(plan, tmp_path)
    written = json.loads(path.read_text())
    spec = json.dumps(written["wandb_viewspec"])
    assert written["wandb_viewspec"]["project"] == {"name": "splitbench", "entityName": "team"}
    for key, _ in wandb_report.TABLE2_METRICS:
        assert f'"yAxis": "summary:{key}"' in spec
    assert '"xAxis": "config:epsilon.value"' in spec
    assert wandb_report.load_definition(path) == plan     # what --wandb-push rebuilds from


def test_cli_offline_writes_the_definition_and_says_how_to_push(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    res = run_cli(["experiment=smoke", "workload.n_prompts=1", "generation.max_new_tokens=2", "generation.batch_size=1",
                   "semantic_model=null"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert cli.main([str(out), "--include-tagged", "smoke", "--out", str(tmp_path / "rep"), "--wandb", "team/proj"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    definition = tmp_path / "rep" / wandb_report.DEFINITION_FILE
    assert lines[-1] == (f"splitbench-report: W&B offline (WANDB_MODE=offline): wrote the report definition "
                         f"{definition}; push it from a machine with W&B access: splitbench-report --wandb-push "
                         f"{definition}")
    assert json.loads(definition.read_text())["sections"][0]["heading"] == "Table 2: output fidelity (smoke)"
    # Pushing needs W&B: offline it is a one-line error, exit 2.
    with pytest.raises(SystemExit) as stop:
        cli.main(["--wandb-push", str(definition)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == f"splitbench-report: error: cannot push {definition}: WANDB_MODE=offline"


@pytest.mark.parametrize("argv,message", [
    (["--wandb", "no-slash"], "--wandb takes ENTITY/PROJECT, got 'no-slash'"),
    (["--wandb-push", "missing.json"], "cannot read the report definition missing.json"),
])
def test_bad_wandb_arguments_are_one_line(tmp_path, monkeypatch, capsys, argv, message):
    _sweep(tmp_path / "runs")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    full = argv if argv[0] == "--wandb-push" else [str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), *argv]
    with pytest.raises(SystemExit) as stop:
        cli.main(full)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"splitbench-report: error: {message}")
