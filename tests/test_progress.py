"""Progress a person can see: the loops one waits on draw a bar (tokens, tokens/s, ETA) on a terminal, and
nothing at all when stderr is a pipe or a log file."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness.models import load_model
from harness.split.engine import EngineSettings, SplitEngine

from .conftest import run_cli

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
BAR = re.compile(r"\d+%\||\d+/\d+ \[")   # tqdm's "42%|" or "12/48 [" (both absent from our own messages)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def tiny():
    return load_model(OmegaConf.load(CONF / "tiny-llama.yaml"))


def _generate(tiny, stderr, monkeypatch) -> str:
    monkeypatch.setattr("sys.stderr", stderr)
    engine = SplitEngine(tiny.model, EngineSettings("ep1", epsilon=1.0))
    prompts = [torch.arange(3, 23).tolist(), torch.arange(5, 20).tolist()]
    engine.generate(prompts, 6, pad_token_id=tiny.tokenizer.pad_token_id)
    return stderr.getvalue()


def test_generation_draws_a_token_bar_on_a_terminal(tiny, monkeypatch):
    drawn = _generate(tiny, _Terminal(), monkeypatch)
    assert "ep1: generate" in drawn and "token" in drawn
    assert "/12" in drawn   # 2 prompts x 6 new tokens, counted as they come


def test_generation_is_silent_when_stderr_is_not_a_terminal(tiny, monkeypatch):
    assert _generate(tiny, io.StringIO(), monkeypatch) == ""


def test_a_cli_run_into_a_pipe_prints_no_bar(tmp_path):
    res = run_cli(["experiment=smoke", "workload.n_prompts=2", "generation.max_new_tokens=3",
                   "generation.batch_size=1"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    # Neither ours (batches, tokens) nor the libraries' (transformers' weight loading of the similarity model).
    assert not BAR.search(res.stderr), res.stderr


def test_library_bars_are_off_in_a_pipe_and_ours_still_draw_on_a_terminal():
    """runners/run.py main() switches third-party bars off through the environment before tqdm is imported
    (lm-eval's, datasets', transformers' GGUF conversion): a bar of tqdm's own defaults prints nothing into
    the pipe, while our progress() (disable=None) still draws on a terminal."""
    import subprocess
    import sys

    code = """
import io, sys
from harness.progress import LIBRARY_BAR_SWITCHES, progress, quiet_bars_in_environment
quiet_bars_in_environment()
import os
assert all(os.environ[k] == "1" for k in LIBRARY_BAR_SWITCHES)
from tqdm import tqdm
for _ in tqdm(range(5), desc="library bar"):
    pass
class Terminal(io.StringIO):
    def isatty(self):
        return True
real, sys.stderr = sys.stderr, Terminal()
for _ in progress(range(5), desc="our bar"):
    pass
drawn, sys.stderr = sys.stderr.getvalue(), real
print("ours drew" if "our bar" in drawn else "ours silent")
"""
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("TQDM_DISABLE",)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert res.returncode == 0, res.stderr
    assert "library bar" not in res.stderr and not BAR.search(res.stderr), res.stderr
    assert res.stdout.strip() == "ours drew"
