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
