"""The scripts behind committed results (scripts/cross_system_chart.sh, collab_paper_runs.sh,
grad_audit_runs.sh, splitft_long_runs.sh, splitft_privpair_schedule.sh) need local data; without it each stops before running anything,
with one line and exit code 2."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, missing", [("cross_system_chart.sh", "dolly_prompts.jsonl"),
                                             ("collab_paper_runs.sh", "ori_pqal.json"),
                                             ("grad_audit_runs.sh", "wiki.test.raw"),
                                             ("splitft_long_runs.sh", "wiki.test.raw"),
                                             ("splitft_privpair_schedule.sh", "wiki.test.raw")])
def test_missing_data_is_one_line_and_exit_2(tmp_path, script, missing):
    env = {**os.environ, "DATA": str(tmp_path / "nowhere")}
    res = subprocess.run(["bash", str(ROOT / "scripts" / script), str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{missing} not found" in lines[0] and "DATA=" in lines[0]
    assert not (tmp_path / "out").exists() and not res.stdout
