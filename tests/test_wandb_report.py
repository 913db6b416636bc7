"""`splitbench-report --wandb ENTITY/PROJECT` offline: the report definition of a sweep (Table 2 metric vs
ε per configuration, the Table 2 and Table 6 panels), written with the W&B view spec it would save, and
the one-line errors. Nothing here reaches W&B (WANDB_MODE=offline or disabled)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from runners.report import cli, wandb_report
from runners.report.runs import scan

from .conftest import run_cli_in_process


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
    assert headings == ["Table 2: output fidelity (table2-sweep)", "Table 6: prompt reconstruction (attack)",
                        "timing (timing)"]   # every other experiment gets a generic section
    table2, table6, timing = plan["sections"]
    assert timing["panels"] == []   # the timing run here reports no numeric metric
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
    res = run_cli_in_process(["experiment=smoke", "workload.n_prompts=1", "generation.max_new_tokens=2",
                              "generation.batch_size=1", "semantic_model=null"], out, tmp_path / "cache")
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


def _mirrored(root: Path, rel: str, experiment: str, project: str, **metrics) -> None:
    _run(root, rel, experiment=experiment, experiment_name=experiment, configuration="t3", epsilon=None,
         metrics=metrics, provenance={"config": {"runner": experiment, "logger": {
             "name": "wandb", "entity": None, "project": project, "group": None}}})


def test_every_system_gets_a_generic_section(tmp_path):
    """A split fine-tuning sweep (no Table 2/6 runs) is a report too: its shared numeric metrics per configuration."""
    _mirrored(tmp_path, "splitft/a", "splitft", "proj", train_loss=2.0, H=0.1, note_only_here=1.0)
    _mirrored(tmp_path, "splitft/b", "splitft", "proj", train_loss=1.5, H=0.2)
    (section,) = wandb_report.plan(scan(tmp_path), "team", "proj", str(tmp_path))["sections"]
    assert section["heading"] == "splitft (splitft)"
    assert section["panels"][0]["metrics"] == ["H", "train_loss"]
    assert section["runsets"][0]["filters"].startswith("JobType = 'splitft' and Group = 'splitft'")


def test_a_project_the_runs_were_not_mirrored_to_is_refused(tmp_path, monkeypatch, capsys):
    _mirrored(tmp_path / "runs", "splitft/a", "splitft", "proj", train_loss=2.0)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(SystemExit) as stop:
        cli.main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--wandb", "team/other"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("splitbench-report: error: the runs were mirrored to ENTITY/proj, not team/other; "
                    "give --wandb ENTITY/proj")
    assert not (tmp_path / "rep").exists()   # refused before anything is written


def test_offline_message_gives_the_sync_command_for_offline_runs(tmp_path, monkeypatch, capsys):
    _mirrored(tmp_path / "runs", "splitft/a", "splitft", "proj", train_loss=2.0)
    offline = tmp_path / "runs" / "splitft" / "a" / "wandb" / "offline-run-20261204_000000-abc"
    offline.mkdir(parents=True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert cli.main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--wandb", "team/proj"]) == 0
    definition = tmp_path / "rep" / wandb_report.DEFINITION_FILE
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(
        f"push it from a machine with W&B access: wandb sync --entity team --project proj {offline} && "
        f"splitbench-report --wandb-push {definition}")


def test_mirror_replays_never_mirrored_runs_into_offline_wandb_runs(tmp_path, monkeypatch, capsys):
    """--mirror: a finished logger=none run becomes an offline W&B run (the real wandb, WANDB_MODE=offline)
    under its directory, and the sync command names it."""
    root = tmp_path / "runs"
    _run(root, "splitft/a", experiment="splitft", experiment_name="splitft", configuration="t3", epsilon=None,
         metrics={"train_loss": 2.0}, provenance={"config": {
             "runner": "splitft", "experiment_name": "splitft", "tags": [], "seed": 0,
             "logger": {"name": "none", "entity": None, "project": "splitbench", "mode": "offline", "group": None}}})
    (root / "splitft" / "a" / "samples.jsonl").write_text('{"id": "p0", "ce": 1.5}\n')
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert cli.main([str(root), "--out", str(tmp_path / "rep"), "--wandb", "team/proj", "--mirror"]) == 0
    (offline,) = wandb_report.offline_runs(root)
    assert offline.parent == root / "splitft" / "a" / "wandb"
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2] == "splitbench-report: mirrored 1 never-mirrored run(s) offline"
    assert f"wandb sync --entity team --project proj {offline} && splitbench-report --wandb-push" in out[-1]
    # A second --mirror finds it mirrored already and replays nothing.
    assert cli.main([str(root), "--out", str(tmp_path / "rep"), "--wandb", "team/proj", "--mirror"]) == 0
    assert "mirrored 0 never-mirrored" in capsys.readouterr().out and len(wandb_report.offline_runs(root)) == 1
