"""The scripts behind committed results (scripts/cross_system_chart.sh, collab_paper_runs.sh, collect_runs.sh,
grad_audit_runs.sh, splitft_long_runs.sh, splitft_privpair_schedule.sh, sanitize_fig34_grid.sh) need local data; without it each stops before running anything,
with one line and exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, missing", [("cross_system_chart.sh", "dolly_prompts.jsonl"),
                                             ("collab_paper_runs.sh", "ori_pqal.json"),
                                             ("grad_audit_runs.sh", "wiki.test.raw"),
                                             ("splitft_long_runs.sh", "wiki.test.raw"),
                                             ("splitft_privpair_schedule.sh", "wiki.test.raw"),
                                             ("sanitize_fig34_grid.sh", "dev.tsv")])
def test_missing_data_is_one_line_and_exit_2(tmp_path, script, missing):
    env = {**os.environ, "DATA": str(tmp_path / "nowhere")}
    res = subprocess.run(["bash", str(ROOT / "scripts" / script), str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{missing} not found" in lines[0] and "DATA=" in lines[0]
    assert not (tmp_path / "out").exists() and not res.stdout


def _fake_run(root: Path, tag: str, blocks_ce: list[float], h: float, label_verdict: str, guesses: list[list[int]],
              done: bool = True) -> None:
    """One finished run of scripts/splitft_privpair_schedule.sh as the analysis reads it: results.json (the
    fields it uses), samples.jsonl (label attacker: truth [1, 2] at rows 0, 1 of step 11), .done."""
    import json
    d = root / tag / "splitft" / "m" / "privpair" / "eps=1" / "seed"
    d.mkdir(parents=True)
    m = {"heldout_ce": sum(blocks_ce) / len(blocks_ce), "heldout_top1": 10.0, "H_rel": h, "H_A_rel": h / 2,
         "label_token_f1": 50.0, "label_token_f1_ci_lo": 0.0, "label_token_f1_ci_hi": 100.0,
         "label_reference_token_f1": 5.0, "label_verdict": label_verdict, "verdict": "leak"}
    (d / "results.json").write_text(json.dumps({
        "metrics": m, "timings": {"train_seconds": 1.0, "attack_seconds": 2.0},
        "heldout_blocks_ce": {"initial": [9.0] * len(blocks_ce), "final": blocks_ce},
        "heldout_blocks_top1": {"initial": [0.0] * len(blocks_ce), "final": [10.0] * len(blocks_ce)}}))
    (d / "samples.jsonl").write_text("".join(json.dumps({"attacker": "label", "step": 11, "row": i,
                                                         "truth_ids": [1, 2], "guess_ids": g}) + "\n"
                                             for i, g in enumerate(guesses)))
    if done:
        (d / ".done").write_text("")


def test_privpair_schedule_analysis_pairs_blocks_examples_and_seeds(tmp_path):
    """scripts/splitft_privpair_schedule.py: held-out CE paired by block over seeds, the label attacker's F1
    paired by example, H's per-seed differences with a t interval over seeds, changed verdicts named, and an
    unfinished run (no .done) left out."""
    import json

    from metrics.intervals import mean_t_ci
    runs = tmp_path / "runs"
    right, wrong = [1, 2], [7, 8]           # token F1 100 and 0 against the truth [1, 2]
    _fake_run(runs, "p4s2_seed0", [1.0, 2.0, 3.0], 0.1, "leak", [right, wrong])
    _fake_run(runs, "p8s1_seed0", [1.5, 2.5, 3.5], 0.4, "leak", [right, right])
    _fake_run(runs, "p4s2_seed1", [1.0, 1.0, 1.0], 0.2, "protect", [wrong, wrong])
    _fake_run(runs, "p8s1_seed1", [1.2, 1.4, 1.0], 0.3, "leak", [wrong, wrong])
    _fake_run(runs, "p4s1_seed0", [0.0, 0.0, 0.0], 0.0, "leak", [right, right], done=False)
    out = tmp_path / "doc" / "table.md"
    res = subprocess.run(["python", str(ROOT / "scripts" / "splitft_privpair_schedule.py"), str(runs), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(out.with_suffix(".json").read_text())
    assert not any("P=4, 1" in k for k in got["runs"])          # unfinished: not read
    d = got["differences"]["P=8, 1 burst step"]
    ce = mean_t_ci([0.5, 0.5, 0.5, 0.2, 0.4, 0.0])               # schedule − default, block by block
    assert d["held-out CE (nats)"] == pytest.approx([ce.mean, ce.lo, ce.hi, 6])
    f1 = mean_t_ci([0.0, 100.0, 0.0, 0.0])                       # same step, row and truth: paired by example
    assert d["label token F1 (pp)"] == pytest.approx([f1.mean, f1.lo, f1.hi, 4])
    h = mean_t_ci([0.3, 0.1])
    assert d["H_rel"]["per_seed"] == pytest.approx([0.3, 0.1])
    assert d["H_rel"]["mean_ci"] == pytest.approx([0.2, h.lo, h.hi, 2]) and h.lo < 0 < h.hi
    assert d["verdicts differing"] == ["seed 1 label_verdict: protect → leak"]
    hs = got["H over seeds"]
    assert hs["P=4, 2 burst steps (default)"]["H_rel"][:2] == pytest.approx([0.15, mean_t_ci([0.1, 0.2]).lo])


def test_sanitize_shift_counts_a_neighbours_token_apart_from_unchanged(tmp_path):
    """scripts/sanitize_shift.py: a substitute equal to the original token one position over is counted as a
    neighbour's token, not as unchanged (the even-window shift of docs/results/sanitize_fig4)."""
    import json
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    import sanitize_shift

    # original 1 2 3 4; sanitised 1 (same), 3 (right neighbour), 9 (new), 3 (left neighbour)
    assert sanitize_shift.shares([1, 2, 3, 4], [1, 3, 9, 3]) == (0.25, 0.5)
    assert sanitize_shift.shares([5, 5], [5, 5]) == (1.0, 0.0)   # unchanged wins over a neighbour's copy
    run = tmp_path / "out" / "sanitize" / "m" / "dx_stencil" / "eps=100" / "r"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"status": "ok", "experiment": "sanitize", "mechanism": {
        "mechanism": "dx_stencil", "window": 2, "sigma": 0.75, "parameter": 100.0}}))
    rows = [{"original_text_ids": [1, 2, 3, 4], "text_span": [1, 5], "output_ids": [0, 1, 3, 9, 3]},
            {"original_text_ids": [1, 2, 3, 4], "text_span": [0, 4], "output_ids": [1, 2, 3, 4]}]
    (run / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "sanitize_shift.py"), str(tmp_path / "out"), "--out",
                          str(tmp_path / "shift.md")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no finished" in res.stderr   # no .done yet: no run to read
    (run / ".done").touch()
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "sanitize_shift.py"), str(tmp_path / "out"), "--out",
                          str(tmp_path / "shift.md")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    row = next(line for line in (tmp_path / "shift.md").read_text().splitlines() if line.startswith("| dx_stencil"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["100", "2", "even"]
    assert cells[6].startswith("62.5") and cells[7].startswith("25.0") and cells[8].startswith("87.5")


def test_collect_runs_copies_finished_runs_only(tmp_path):
    """scripts/collect_runs.sh: results.json and .done of each finished run, at its relative path; an
    unfinished run (no .done) and the samples stay behind; a missing OUT is one line and exit code 2."""
    out = tmp_path / "out"
    for run, done in (("a/eps=1/r1", True), ("b/r2", False)):
        (out / run).mkdir(parents=True)
        (out / run / "results.json").write_text("{}")
        (out / run / "samples.jsonl").write_text("")
        if done:
            (out / run / ".done").write_text("")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "collect_runs.sh"), f"{out}/", str(tmp_path / "dest")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    copied = sorted(str(p.relative_to(tmp_path / "dest")) for p in (tmp_path / "dest").rglob("*") if p.is_file())
    assert copied == ["a/eps=1/r1/.done", "a/eps=1/r1/results.json"]
    res = subprocess.run(["bash", str(ROOT / "scripts" / "collect_runs.sh"), str(tmp_path / "none"),
                          str(tmp_path / "dest2")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dest2").exists()


def test_collect_runs_positions_keeps_only_id_and_positions_of_the_samples(tmp_path):
    """--positions (sequential runs): samples.jsonl comes along with only what sequential_epsilon50 reads; the
    prompt's token ids (truth, guesses) stay behind."""
    run = tmp_path / "out" / "r"
    run.mkdir(parents=True)
    (run / "results.json").write_text("{}")
    (run / ".done").write_text("")
    (run / "samples.jsonl").write_text(json.dumps({"id": "p1", "positions": [3, 4], "truth": [11, 12],
                                                   "sequential_guess": [11, 9]}) + "\n")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "collect_runs.sh"), "--positions", str(tmp_path / "out"),
                          str(tmp_path / "dest")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (tmp_path / "dest" / "r" / "samples.jsonl").read_text().splitlines()]
    assert rows == [{"id": "p1", "positions": [3, 4]}]


def test_collect_runs_short_names_each_run_by_its_config_hash(tmp_path):
    """--short (committed folders): the override list in the last component becomes the first 10 hex digits of
    the run's config_hash, `default` stays; two runs that would share a name stop the copy with nothing written."""
    out = tmp_path / "out"
    long_name = "sanitize.attack.contextual_beam=0,sanitize.sigma=0.75,sanitize.task_limit=40,-09c7af688f"
    for run, digest in ((f"x/m/c/eps=1/{long_name}", "abcdef0123456789"), ("x/m/c/eps=1/default", "ffff")):
        (out / run).mkdir(parents=True)
        (out / run / "results.json").write_text(json.dumps({"config_hash": digest, "run_dir": run}))
        (out / run / ".done").write_text("")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "collect_runs.sh"), "--short", str(out),
                          str(tmp_path / "dest")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    copied = sorted(str(p.relative_to(tmp_path / "dest")) for p in (tmp_path / "dest").rglob("*") if p.is_file())
    assert copied == ["x/m/c/eps=1/abcdef0123/.done", "x/m/c/eps=1/abcdef0123/results.json",
                      "x/m/c/eps=1/default/.done", "x/m/c/eps=1/default/results.json"]
    # the original name stays in results.json
    assert json.loads((tmp_path / "dest/x/m/c/eps=1/abcdef0123/results.json").read_text())["run_dir"].endswith(long_name)
    twin = out / "x/m/c/eps=1/other-overrides"
    twin.mkdir()
    (twin / "results.json").write_text(json.dumps({"config_hash": "abcdef0123ffff"}))
    (twin / ".done").write_text("")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "collect_runs.sh"), "--short", str(out),
                          str(tmp_path / "dest2")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "would both be copied to x/m/c/eps=1/abcdef0123" in res.stderr
    assert not (tmp_path / "dest2").exists()


def test_restore_runs_puts_short_named_copies_back_at_their_run_dir(tmp_path):
    """scripts/restore_runs.py: a committed --short copy goes back to its original folder (results.json's
    run_dir) under the output root, .done with it, so a rerun skips it; a finished run already there is kept,
    an unfinished copy (no .done) is not restored, and a missing folder is one line and exit 2."""
    committed, out = tmp_path / "committed", tmp_path / "out"
    long_name = "x/m/c/eps=1/collab.benchmark.n_examples=30,collab.benchmark.name=dolly-368bb51dde"
    for short, run_dir, done in (("abcdef0123", long_name, True), ("0123456789", "x/m/c/eps=2/y", False)):
        (committed / "x/m/c/eps=1" / short).mkdir(parents=True)
        (committed / "x/m/c/eps=1" / short / "results.json").write_text(json.dumps({"run_dir": run_dir}))
        if done:
            (committed / "x/m/c/eps=1" / short / ".done").write_text("")
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "restore_runs.py"), str(committed), str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "1 runs restored" in res.stdout, res.stderr
    assert (out / long_name / ".done").is_file() and json.loads((out / long_name / "results.json").read_text())
    assert not (out / "x/m/c/eps=2/y").exists()
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "restore_runs.py"), str(committed), str(out)],
                         capture_output=True, text=True, timeout=60)
    assert "0 runs restored" in res.stdout and "1 already there" in res.stdout
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "restore_runs.py"), str(tmp_path / "nope"), str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
