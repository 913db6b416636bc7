"""scripts/gpu_check.sh on a machine without CUDA: one line on stdout, exit 0, no summary written."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would run the check")
def test_without_cuda_one_line_and_exit_0(tmp_path):
    out = tmp_path / "gpu_check.md"
    env = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(tmp_path / "no-such-dir")}
    res = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [res.stdout.strip()] and res.stdout.startswith("gpu_check.sh: no CUDA"), res.stdout
    assert res.stderr == ""
    # nothing written, and WHEELS (which would fail to install) was not even tried
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_python_without_torch_counts_as_no_cuda(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    res = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "x.md")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": str(fake)}, timeout=60)
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 1 and not (tmp_path / "x.md").exists()
