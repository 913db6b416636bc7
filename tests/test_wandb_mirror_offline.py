"""The W&B mirror with no network: an online mirror that cannot reach its host goes offline at once (one
line), and a runner's step history reaches wandb.log. A fake wandb.init: nothing leaves the machine."""
from __future__ import annotations

import socket

import pytest
from omegaconf import OmegaConf

from harness import wandb_mirror


class _Run:
    def __init__(self) -> None:
        self.summary: dict = {}
        self.logged: list = []

    def log(self, data, step=None):
        self.logged.append((step, data))
        self.summary.update(data)   # as wandb does: a logged key's last value is its summary

    def finish(self):
        pass


def _cfg(mode: str):
    return OmegaConf.create({
        "logger": {"name": "wandb", "project": "splitbench", "entity": None, "mode": mode, "group": None,
                   "connect_timeout_s": 2},
        "experiment_name": "splitft", "runner": "splitft", "tags": [], "seed": 0,
    })


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there, so connect is refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def init_calls(monkeypatch):
    import wandb

    calls: list = []
    run = _Run()
    monkeypatch.setattr(wandb, "init", lambda **kw: calls.append(kw) or run)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return calls, run


def test_online_mirror_with_no_route_goes_offline_with_one_line(tmp_path, monkeypatch, capsys, init_calls):
    calls, _ = init_calls
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    assert wandb_mirror.mirror(_cfg("online"), tmp_path, {"metrics": {"loss": 1.0}}, [], name="x")
    assert calls[0]["mode"] == "offline"
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unreachable; mirroring offline" in line and "wandb sync" in line


def test_online_mirror_with_a_listening_host_stays_online(tmp_path, monkeypatch, capsys, init_calls):
    calls, _ = init_calls
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert wandb_mirror.mirror(_cfg("online"), tmp_path, {"metrics": {}}, [], name="x")
    assert calls[0]["mode"] == "online" and capsys.readouterr().err == ""


def test_offline_mode_opens_no_connection(tmp_path, monkeypatch, init_calls):
    calls, _ = init_calls
    monkeypatch.setattr(wandb_mirror, "unreachable", lambda t: pytest.fail("offline mode must not probe"))
    assert wandb_mirror.mirror(_cfg("offline"), tmp_path, {"metrics": {}}, [], name="x")
    assert calls[0]["mode"] == "offline"


def test_step_history_is_logged_at_its_steps(tmp_path, init_calls):
    _, run = init_calls
    history = [{"step": 0, "loss": 2.5, "round": 1}, {"step": 1, "loss": 2.0, "round": 1, "note": "text"}]
    assert wandb_mirror.mirror(_cfg("offline"), tmp_path, {"metrics": {}}, [], name="x", history=history)
    assert run.logged == [(0, {"loss": 2.5, "round": 1}), (1, {"loss": 2.0, "round": 1})]


def test_step_history_merges_series_by_step():
    from runners.common import step_history

    assert step_history({"loss/a": [3.0, 2.0], "loss/b": [4.0]}) == [
        {"step": 0, "loss/a": 3.0, "loss/b": 4.0}, {"step": 1, "loss/a": 2.0}]


def test_paired_history_merges_series_by_their_own_steps():
    from runners.common import paired_history

    assert paired_history({"a": [(50, 3.0), (100, 2.0)], "b": [(25, 9.0), (100, 1.0)]}) == [
        {"step": 25, "b": 9.0}, {"step": 50, "a": 3.0}, {"step": 100, "a": 2.0, "b": 1.0}]


def test_loss_history_holds_each_attackers_losses_at_its_validation_steps():
    """The training and validation loss of each learned attacker of a run by role (SpliTEE's attack, a
    sanitiser's decoder); an attacker with no curve (None) logs nothing. tests/splitee/test_attacks.py and
    tests/sanitize/test_sanitize.py run it end to end."""
    from runners.common import loss_history

    curves = {"attacker": {"train_history": [(50, 3.0), (100, 2.0)], "val_history": [(50, 3.5), (100, 2.5)]},
              "positive_control": None,
              "negative_control": {"train_history": [(50, 6.0)], "val_history": [(50, 6.5)]}}
    assert loss_history(curves) == [
        {"step": 50, "attacker/train_loss": 3.0, "attacker/val_loss": 3.5, "negative_control/train_loss": 6.0,
         "negative_control/val_loss": 6.5},
        {"step": 100, "attacker/train_loss": 2.0, "attacker/val_loss": 2.5}]


def test_controlled_error_history_is_each_levels_rate_per_batch():
    from runners.splitee.controlled_error import speed_history

    assert speed_history({"t3": [10.0, 12.0], "ce_0p01": [8.0, None]}) == [
        {"step": 0, "batch_tokens_per_second/t3": 10.0, "batch_tokens_per_second/ce_0p01": 8.0},
        {"step": 1, "batch_tokens_per_second/t3": 12.0}]


def test_splitft_history_is_the_rounds_then_the_inverters_losses_after_them():
    """Split FT: one step per round, then the learned inverter's (and its shuffled twin's) losses at steps after
    the last round, each with its own training step; steps only increase, as wandb.log needs."""
    from runners.splitft import mirror_history

    rounds = [{"round": 1, "train_loss": 3.0, "H": 0.5}, {"round": 2, "train_loss": 2.5, "H": 0.4}]
    curves = {"inverter": {"train_history": [(1, 6.0), (2, 5.0)], "val_history": [(1, 6.5), (2, 5.5)]},
              "inverter_negative": {"train_history": [(2, 7.0)], "val_history": [(2, 7.5)]}}
    assert mirror_history(rounds, curves) == [
        {"round": 1, "train_loss": 3.0, "H": 0.5, "step": 1},
        {"round": 2, "train_loss": 2.5, "H": 0.4, "step": 2},
        {"step": 4, "attack_train_step": 1, "inverter/train_loss": 6.0, "inverter/val_loss": 6.5},
        {"step": 5, "attack_train_step": 2, "inverter/train_loss": 5.0, "inverter/val_loss": 5.5,
         "inverter_negative/train_loss": 7.0, "inverter_negative/val_loss": 7.5}]
    assert mirror_history(rounds, {}) == [{**r, "step": r["round"]} for r in rounds]   # no inverter: rounds only


@pytest.mark.slow   # a Flower simulation (~40 s); the grad audit test below covers the history path by default
@pytest.mark.usefixtures("flower_ray")
def test_splitft_run_mirrors_one_step_per_round(tmp_path, init_calls):
    """The split fine-tuning runner hands its per-round records to the mirror (logger=wandb, fake init)."""
    import json

    from .conftest import run_cli_in_process

    _, run = init_calls
    res = run_cli_in_process(["experiment=splitft_smoke", "logger=wandb"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    (results,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("results.json")]
    steps = [step for step, _ in run.logged if step is not None]
    assert steps == [r["round"] for r in results["rounds"]] and len(steps) >= 1
    assert all("train_loss" in data for step, data in run.logged if step is not None)


def test_grad_audit_run_mirrors_one_loss_curve_per_scored_seed(tmp_path, init_calls):
    import json

    from .conftest import run_cli_in_process

    _, run = init_calls
    # BiSR(b) logs no history and costs most of the smoke's CPU (tests/grad_audit/test_grad_audit.py runs it)
    res = run_cli_in_process(["experiment=grad_audit_smoke", "logger=wandb", "grad_audit.bisr_backward.enabled=false"],
                             tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    (results,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("results.json")]
    history = [(step, data) for step, data in run.logged if step is not None]
    assert len(history) >= 2 and [step for step, _ in history] == list(range(len(history)))
    keys = {f"loss/{s['phase']}_seed{s['seed']}" for s in results["seeds"]}
    assert set(history[0][1]) == keys
    assert {s["final_loss"] for s in results["seeds"]} == set(history[-1][1].values())


def test_generation_rate_reaches_the_summary(tmp_path, init_calls):
    _, run = init_calls
    assert wandb_mirror.mirror(_cfg("offline"), tmp_path, {"metrics": {"bleu": 1.0}, "tokens_per_second": 42.5},
                               [], name="x")
    assert run.summary["tokens_per_second"] == 42.5 and run.summary["bleu"] == 1.0


def test_a_key_logged_per_step_keeps_the_runs_value_in_the_summary(tmp_path, init_calls):
    """Split FT logs train_loss per round and records the run's own in metrics: the summary shows the run's."""
    _, run = init_calls
    history = [{"step": 1, "train_loss": 3.0}, {"step": 2, "train_loss": 2.0}]
    assert wandb_mirror.mirror(_cfg("offline"), tmp_path, {"metrics": {"train_loss": 2.5}}, [], name="x",
                               history=history)
    assert [data["train_loss"] for _, data in run.logged] == [3.0, 2.0] and run.summary["train_loss"] == 2.5
