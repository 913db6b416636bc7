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
from harness.splitee.engine import EngineSettings, SplitEngine

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


@pytest.mark.parametrize("asked, terminal, drawn", [("1", False, True), ("0", True, False), ("", True, True)])
def test_splitbench_progress_asks_for_bars_or_silences_them(tiny, monkeypatch, asked, terminal, drawn):
    """SPLITBENCH_PROGRESS=1 draws the bars into a pipe or a log one follows; =0 silences them on a terminal."""
    monkeypatch.setenv("SPLITBENCH_PROGRESS", asked)
    out = _generate(tiny, _Terminal() if terminal else io.StringIO(), monkeypatch)
    assert ("ep1: generate" in out) == drawn


def test_a_cli_run_into_a_pipe_prints_no_bar(tmp_path):
    res = run_cli(["experiment=smoke", "workload.n_prompts=2", "generation.max_new_tokens=3",
                   "generation.batch_size=1"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    # Neither ours (batches, tokens) nor the libraries' (transformers' weight loading of the similarity model).
    assert not BAR.search(res.stderr), res.stderr
    # Stdout opens with the run's own table, no library's INFO lines above it (sentence-transformers' device
    # and model path, issue 34 item 7).
    assert res.stdout.splitlines()[0].startswith("smoke: tiny-llama"), res.stdout


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


def _log_during(bar_context, term) -> list[str]:
    """The lines written to `term` while a log line prints inside `bar_context` (a bar on `term`)."""
    import logging

    log = logging.getLogger("flwr")
    handler, level = logging.StreamHandler(term), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with bar_context as bar:
            bar.update(1)
            bar.refresh()
            log.info("aggregated train_loss 2.5")
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return term.getvalue().split("\n")


def test_a_log_line_prints_above_the_round_bar_not_on_it(monkeypatch):
    """Flower's rounds (harness/splitft/federation.py round_bar, harness.progress.progress_with_logs): a log
    line written while the bar is open clears the bar's line and prints on its own; with a plain bar the same
    line lands after the bar's text. The bar counts rounds and shows the round's loss."""
    import contextlib

    from harness.progress import progress
    from harness.splitft.federation import round_bar, show_round

    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    lines = _log_during(round_bar(3), term)
    assert "aggregated train_loss 2.5" in [line.split("\r")[-1] for line in lines]   # a clean line of its own

    plain = _Terminal()
    monkeypatch.setattr("sys.stderr", plain)
    lines = _log_during(contextlib.closing(progress(desc="federated rounds", total=3, unit="round")), plain)
    spoilt = [line.split("\r")[-1] for line in lines if "aggregated" in line]
    assert spoilt and spoilt[0].startswith("federated rounds") and spoilt[0].endswith("aggregated train_loss 2.5")

    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    with round_bar(3) as bar:
        show_round(bar, {"train_loss": 2.5}, {"heldout_ce": 3.25})
    assert re.search(r"federated rounds: +33%\|.*\| 1/3 .*train_loss=2\.5, heldout_ce=3\.25", term.getvalue())


def test_the_round_bar_is_silent_off_a_terminal(monkeypatch):
    from harness.splitft.federation import round_bar, show_round

    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    with round_bar(2) as bar:
        show_round(bar, {"train_loss": 1.0}, {})
    assert pipe.getvalue() == ""


def test_flower_runs_drop_rays_accelerator_tip_and_nothing_else():
    """harness/splitft/federation.py quiet_flower (before every Flower simulation): Ray's per-run FutureWarning tip
    is dropped by its text; another FutureWarning, and a DeprecationWarning, still show."""
    import warnings

    from harness.splitft.federation import quiet_flower

    tip = ("Tip: In future versions of Ray, Ray will no longer override accelerator visible devices env var if "
           "num_gpus=0 or num_gpus=None (default). To enable this behavior and turn off this error message, set "
           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_flower()
        warnings.warn(tip, FutureWarning)
        warnings.warn("Pydantic v1 is deprecated and will no longer be supported", FutureWarning)
        warnings.warn(tip, DeprecationWarning)
    assert [(w.category, str(w.message)[:20]) for w in caught] == [
        (FutureWarning, "Pydantic v1 is depre"), (DeprecationWarning, tip[:20])]


def test_flower_runs_drop_their_two_notices_and_keep_other_warnings():
    """quiet_flower: Flower's logger drops the run_simulation deprecation notice and FedAvg's skipped-evaluation
    notice (printed on every run, once on stdout and once on stderr); its other warnings still reach a handler."""
    import logging

    from harness.splitft.federation import quiet_flower

    quiet_flower()
    log, seen = logging.getLogger("flwr"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)
    try:
        log.warning("DEPRECATED FEATURE: The `run_simulation` function is deprecated")
        log.warning("fraction_evaluate is set to 0.0. Federated evaluation will be skipped.")
        log.warning("ClientApp raised an exception")
        log.info("[ROUND 1/3]")
    finally:
        log.removeHandler(handler)
    assert seen == ["ClientApp raised an exception"]
