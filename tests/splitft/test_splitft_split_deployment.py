"""The split deployment (harness/splitft/split_deployment.py): B in the server's process, every crossing a
Flower message. What its server records equals the view of the one-process path (ClientTrainer.run_round,
what the simulation's ClientApp runs) on the same seed, in Flower's simulation and, marked slow, on a
SuperLink and two SuperNodes on 127.0.0.1."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness.models import load_model
from harness.splitft.client import ClientTrainer, Recipe, write_recipe
from harness.splitft.data import load_split_data

from ..conftest import CONF
from ..conftest import model_cfg as _model_cfg
from . import test_splitft

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# the smoke's tiny model and data; 1 round of 2 local steps, both recorded
OVERRIDES = {"rounds": 1, "local_steps": 2, "record": {"last_rounds": 1, "steps_per_round": 2}, "threads": 1}
FP32 = {"rtol": 1e-5, "atol": 1e-6}
# PrivPair: W1's gradient at s'_A sums B's backward (here the server's, arriving as a message) and the client's
# own paths through δ_A in another order than one autograd graph does, so the bursts' crossings differ from the
# one-process run's by float32 rounding (≤ 3e-8 on this test's run) and A's and C's first AdamW step, which
# divides by √v, carries that to ≤ 8e-6 on weights of order 1 (measured by hand on the test's recipe)
PRIVPAIR_TOL = {"rtol": 1e-4, "atol": 5e-5}


def _recipe(configuration: str, epsilon: float | None, tmp_path: Path, **extra) -> Recipe:
    model_cfg = _model_cfg()
    smoke = OmegaConf.load(CONF / "experiment" / "splitft_smoke.yaml").splitft
    section = OmegaConf.merge(OmegaConf.load(CONF / "splitft" / "default.yaml"), smoke, OVERRIDES, extra)
    section = OmegaConf.to_container(section, resolve=True)
    data = load_split_data(OmegaConf.create(section["data"]), load_model(model_cfg).tokenizer, 2, 0)
    truth = tmp_path / "truth"
    truth.mkdir(exist_ok=True)
    return Recipe(model_cfg, None, configuration, epsilon, section, 0, data.clients, data.align, data.heldout,
                  str(truth))


def _reference(recipe: Recipe, truth: dict | None = None) -> tuple[list[dict], dict[int, dict]]:
    """Round 1 of the one-process path for both clients: its crossings and round metrics (and, into `truth`,
    the evaluator's truth by step id)."""
    trainer = ClientTrainer(recipe)
    start = trainer.initial_state()
    exposures, metrics = [], {}
    for client in range(recipe.n_clients):
        out = trainer.run_round(client, 1, start, {}, 0)
        exposures += [e | {"client": client, "round": 1} for e in out.exposures]
        metrics[client] = out.metrics
        if truth is not None:
            truth.update({int(item["step"]): item for item in out.truth})
    return exposures, metrics


def _assert_same_truth(got: dict[int, dict], want: dict[int, dict], tol: dict = FP32) -> None:
    """The evaluator's truth (harness/splitft/experiment.py load_truth): the same steps, ids, plain s_A and s_B."""
    assert sorted(got) == sorted(want) and want
    for step, w in want.items():
        assert torch.equal(got[step]["ids"], w["ids"]), step
        for k in ("s_a", "s_b"):
            torch.testing.assert_close(got[step][k], w[k], **tol, msg=f"truth {k} of step {step}")


def _assert_view_holds_no_truth(exposures: list[dict], truth: dict[int, dict]) -> None:
    """A noising defence's server never records the clean s_A or B(s_A) that the measurement path carried."""
    plain = [item[k] for item in truth.values() for k in ("s_a", "s_b")]
    for e in exposures:
        assert not any(e["tensor"].shape == p.shape and torch.allclose(e["tensor"], p, rtol=1e-3, atol=1e-4)
                       for p in plain), (e["channel"], e["step"])


def _keyed(exposures: list[dict]) -> dict[tuple, dict]:
    """Each exposure by (client, step, channel, op, n): n counts the earlier ones of the same client, step,
    channel and op (PrivPair's burst steps before one step share its step id), in the order recorded."""
    seen: dict[tuple, int] = {}
    out = {}
    for e in exposures:
        base = (e["client"], e["step"], e["channel"], e["op"])
        seen[base] = seen.get(base, -1) + 1
        out[(*base, seen[base])] = e
    return out


def _assert_same_view(got: list[dict], want: list[dict], channels: set[str] = frozenset(
        {"client_weights", "smashed_up", "smashed_down", "grad_up", "grad_down"}), tol: dict = FP32) -> None:
    got_by, by_key = _keyed(got), _keyed(want)
    assert sorted(got_by) == sorted(by_key) and len(got_by) == len(got) == len(want)
    assert {e["channel"] for e in want} == channels
    for k, e in got_by.items():
        w = by_key[k]
        assert (e["layer"], e["round"]) == (w["layer"], w["round"])
        assert e["tensor"].shape == w["tensor"].shape, k
        torch.testing.assert_close(e["tensor"], w["tensor"], **tol, msg=f"{k} differs")


GUARD = {"grad_up": {"clip": 0.01, "noise_multiplier": 0.5}}
NOISING = ("smashed_dp_gaussian", "smashed_dp_laplace", "embedding_dx", "privpair")
ALIGN = {"align_up", "align_down"}


# Each variant is a Flower simulation (~35 s on 2 cores): they run with -m slow; the default suite keeps the
# two-round comparison with federation.simulate below (splitft_none).
@pytest.mark.parametrize("configuration,epsilon,extra", [
    pytest.param("splitft_none", None, {}, marks=pytest.mark.slow),
    pytest.param("nopeek", 0.5, {}, marks=pytest.mark.slow),
    pytest.param("splitft_none", None, {"train_head": False}, marks=pytest.mark.slow),
    pytest.param("splitft_none", None, GUARD, marks=pytest.mark.slow),
    pytest.param("smashed_dp_gaussian", 50.0, {}, marks=pytest.mark.slow),
    pytest.param("smashed_dp_laplace", 50.0, {}, marks=pytest.mark.slow),
    pytest.param("embedding_dx", 100.0, {}, marks=pytest.mark.slow),
    pytest.param("smashed_dp_gaussian", 50.0, {"train_head": False}, marks=pytest.mark.slow),
    pytest.param("privpair", 1.0, {}, marks=pytest.mark.slow)],
                         ids=["none", "nopeek", "a_frozen", "grad_up_guard", "dp_gaussian", "dp_laplace", "embedding_dx",
                              "dp_gaussian_a_frozen", "privpair"])
@pytest.mark.usefixtures("flower_ray")
def test_split_deployment_in_simulation_records_the_one_process_view(configuration, epsilon, extra, tmp_path):
    """Flower's simulation runtime, 2 clients, 2 steps: the server's record equals run_round's view (NoPeek:
    the client's last message replays A's forward from the saved stream state, regulariser draw included;
    A frozen: the step ends at the tail, no gradient crosses; the guard on grad_up: its noise stream carries
    over between steps in the session; the noising defences: the noise drawn in the client's first message is
    drawn again, the same, in its last), the round metrics are FedAvg's of run_round's, and the evaluator's
    truth is run_round's. Under a noising defence H, H_A and the truth come through the measurement path
    (B(s_A) by the server's Evaluator on a query message), and nothing the server recorded is the clean s_A
    or B(s_A)."""
    from harness.splitft.experiment import load_truth
    from harness.splitft.split_deployment import simulate_split

    train_head = extra.get("train_head", True)
    recipe = _recipe(configuration, epsilon, tmp_path, **extra)
    truth: dict[int, dict] = {}
    want, metrics = _reference(recipe, truth)
    sink = simulate_split(recipe)
    channels = {"client_weights", "smashed_up", "smashed_down"} | ({"grad_up", "grad_down"} if train_head else set())
    privpair = configuration == "privpair"
    tol = PRIVPAIR_TOL if privpair else FP32
    _assert_same_view(sink.exposures, want, channels | (ALIGN if privpair else set()), tol)
    assert sink.replies == {1: 2}
    n = [metrics[c]["num-examples"] for c in (0, 1)]
    assert sink.rounds[1].keys() - {"num-examples"} == metrics[0].keys() - {"num-examples"}
    for k in metrics[0].keys() - {"num-examples", "max-sends"}:     # PrivPair's align_* metrics among them
        assert sink.rounds[1][k] == pytest.approx((metrics[0][k] * n[0] + metrics[1][k] * n[1]) / sum(n),
                                                  rel=tol["rtol"]), k
    _assert_same_truth(load_truth(recipe.truth_dir), truth, tol)
    if configuration == "nopeek":
        assert sink.rounds[1]["regulariser"] > 0
    if configuration in NOISING:
        # the defence is on (so the plain s_B could not have been read off what crossed) and measured
        assert sink.rounds[1]["H_A"] > 0 and sink.rounds[1]["H"] > 0
        _assert_view_holds_no_truth(sink.exposures, truth)


# splitft_none in the default suite; with -m slow a noising defence (the measurement path) and PrivPair with a
# burst before every step (align_every 1), so round 2's burst starts from the W1, W2 the client kept from round 1
@pytest.mark.parametrize("configuration,epsilon,extra", [
    ("splitft_none", None, {}), pytest.param("smashed_dp_laplace", 50.0, {}, marks=pytest.mark.slow),
    pytest.param("privpair", 1.0, {"privpair": {"align_every": 1}}, marks=pytest.mark.slow)],
                         ids=["none", "dp_laplace", "privpair"])
@pytest.mark.usefixtures("flower_ray")
def test_split_deployment_equals_the_existing_simulation_over_two_rounds(configuration, epsilon, extra, tmp_path):
    """Two rounds of one recorded step each, against federation.simulate (the runner's path, B in the
    ClientApp) on the same recipe: the same view in both rounds (round 2's from FedAvg's average), the same
    round metrics (H, H_A, PrivPair's burst losses and the DP accounting's max-sends included), the same
    evaluator's truth and the same final A and C."""
    import dataclasses

    from harness.splitft.experiment import load_truth
    from harness.splitft.federation import simulate
    from harness.splitft.split_deployment import simulate_split

    recipe = _recipe(configuration, epsilon, tmp_path, rounds=2, local_steps=1,
                     record={"last_rounds": 2, "steps_per_round": 1}, **extra)
    privpair = configuration == "privpair"
    tol = PRIVPAIR_TOL if privpair else FP32
    split = dataclasses.replace(recipe, truth_dir=str(tmp_path / "truth_split"))
    Path(split.truth_dir).mkdir()
    start = ClientTrainer(recipe).initial_state()
    want, got = simulate(recipe, start), simulate_split(split, start)
    assert {e["round"] for e in want.exposures} == {1, 2}
    channels = {"client_weights", "smashed_up", "smashed_down", "grad_up", "grad_down"}
    _assert_same_view(got.exposures, want.exposures, channels | (ALIGN if privpair else set()), tol)
    if privpair:     # a burst in round 2 too
        assert {(e["round"], e["channel"]) for e in want.exposures} >= {(2, "align_up"), (2, "align_down")}
    assert got.replies == want.replies == {1: 2, 2: 2}
    for rnd in (1, 2):
        assert got.rounds[rnd] == pytest.approx(want.rounds[rnd], rel=tol["rtol"], abs=1e-9), rnd
    _assert_same_truth(load_truth(split.truth_dir), load_truth(recipe.truth_dir), tol)
    assert got.final.keys() == want.final.keys()
    for name, value in want.final.items():
        if not privpair:
            torch.testing.assert_close(got.final[name], value, **tol, msg=f"{name} differs")
            continue
        # AdamW moves a coordinate by up to about lr a step whatever its gradient's size, so a rounding-level
        # difference in a near-zero gradient can move it by up to lr per step (2 steps here): on the run
        # measured by hand, 1 of the embedding's 3.1 M entries differed by 3.8e-4, every other entry by ≤ 2.3e-5
        off = (got.final[name] - value).abs()
        assert off.max() <= 2 * float(recipe.section["lr"]), name
        assert float((off > tol["atol"] + tol["rtol"] * value.abs()).float().mean()) <= 1e-5, name


@pytest.mark.parametrize("configuration,reason", [("splitft_central", "it is the centralised reference")])
def test_split_deployment_refuses_what_it_cannot_split(configuration, reason, tmp_path):
    """Each configuration the split deployment cannot run is refused in one line that says why (the runner's
    validate gives the same line: tests/test_bad_input.py)."""
    from harness.errors import UserError
    from harness.splitft.split_deployment import SplitClient

    with pytest.raises(UserError, match=rf"^splitft.runtime=split_deployment runs splitft_none, nopeek, "
                                        rf"smashed_dp_gaussian, smashed_dp_laplace, embedding_dx, privpair; {configuration} "
                                        rf"cannot be split across processes: {reason}.* \(use splitft.runtime=simulation\)$"):
        SplitClient(_recipe(configuration, 1.0, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("defence", [["configuration=splitft_none"], ["configuration=smashed_dp_gaussian", "epsilon=50"]],
                         ids=["none", "dp_gaussian"])
@pytest.mark.usefixtures("flower_ray")
def test_the_runner_trains_through_the_split_deployment(defence, tmp_path):
    """`splitft.runtime=split_deployment` (experiment=splitft_smoke, 1 round; no defence, and smashed DP, whose H
    and truth come through the measurement path): the runner's results name the runtime, and its rounds'
    training metrics, held-out scores, view channels and the attacks' scores (read against that truth) equal
    the same run's on the default runtime (B in each ClientApp)."""
    import json

    from ..conftest import run_cli_in_process

    base = ["experiment=splitft_smoke", *defence, "splitft.rounds=1"]
    results = {}
    for runtime in ("simulation", "split_deployment"):
        out = tmp_path / runtime
        res = run_cli_in_process([*base, f"splitft.runtime={runtime}"], out, tmp_path / "cache")
        assert res.returncode == 0, res.stderr[-3000:]
        (path,) = list(out.rglob("results.json"))
        results[runtime] = json.loads(path.read_text())
    got, want = results["split_deployment"], results["simulation"]
    assert got["runtime"] == "flwr simulation (ray backend), split deployment: B in the ServerApp"
    assert want["runtime"] == "flwr simulation (ray backend)"
    assert got["view_channels"] == want["view_channels"]
    assert len(got["rounds"]) == len(want["rounds"]) == 1
    for key in ("train_loss", "H", "H_A", "heldout_ce", "heldout_top1"):
        assert got["rounds"][0][key] == pytest.approx(want["rounds"][0][key], rel=1e-5, abs=1e-9), key
    assert got["heldout_blocks_ce"]["final"] == pytest.approx(want["heldout_blocks_ce"]["final"], rel=1e-5)
    attack = [k for k in want["metrics"] if k.endswith("token_f1")]
    assert attack and got["metrics"].keys() == want["metrics"].keys()
    for key in attack:
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-5, abs=1e-9), key


def test_the_split_client_holds_no_b(tmp_path):
    """B's blocks are on the meta device in a client's process: a client that ran B would fail."""
    from harness.splitft.split_deployment import SplitClient

    client = SplitClient(_recipe("splitft_none", None, tmp_path))
    assert all(p.is_meta for m in client.part.body_modules() for p in m.parameters())
    assert not any(p.is_meta for m in client.part.head_modules() + client.part.tail_modules() for p in m.parameters())
    s_a = torch.zeros(1, 4, client.trainer.model.config.hidden_size)
    with pytest.raises(RuntimeError, match="meta"):
        client.part.body(s_a, client.part.context(s_a))


# The deployment test's Flower app (tests/splitft/test_splitft.py), naming the split deployment's apps instead.
APP_TOML = (test_splitft.APP_TOML.replace('name = "splitftapp"', 'name = "splitftsplit"')
            .replace("harness.splitft.deployment:", "harness.splitft.split_deployment:"))


@pytest.mark.slow
def test_split_deployment_on_loopback(tmp_path):
    """A SuperLink and two SuperNodes on 127.0.0.1, `flwr run` on an app naming the split deployment's
    ServerApp (B) and ClientApp (A, C): s'_A, s'_B and both cut gradients cross the SuperLink as messages,
    and the server's record equals the one-process view."""
    recipe = _recipe("splitft_none", None, tmp_path)
    path, sink = tmp_path / "recipe.pt", tmp_path / "sink.pt"
    write_recipe(recipe, path)
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(APP_TOML.format(recipe=path, sink=sink))
    link = test_splitft._free_port()
    home = tmp_path / "flwr"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                      f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    # this checkout's harness first on every process's path (the venv may hold another copy of splitbench)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "FLWR_HOME": str(home), "HF_HUB_OFFLINE": "1", "FLWR_TELEMETRY_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    bin_dir = Path(sys.executable).parent
    logs = [open(tmp_path / f"{name}.log", "w") for name in ("superlink", "supernode0", "supernode1")]  # noqa: SIM115
    procs = []
    try:
        # one HTTP API (Fleet, Control, ServerAppIo) on 127.0.0.1:link; each SuperNode's runtime API on its own port
        procs.append(subprocess.Popen([bin_dir / "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port",
                                       str(link)], env=env, cwd=tmp_path, stdout=logs[0], stderr=subprocess.STDOUT))
        time.sleep(8)
        for partition in (0, 1):
            procs.append(subprocess.Popen(
                [bin_dir / "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link}", "--host", "127.0.0.1",
                 "--port", str(test_splitft._free_port()), "--node-config", f"partition-id={partition} num-partitions=2"],
                env=env, cwd=tmp_path, stdout=logs[1 + partition], stderr=subprocess.STDOUT))
        time.sleep(8)
        done = subprocess.run([bin_dir / "flwr", "run", str(app), "loopback", "--stream"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0 and sink.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()
    got = torch.load(sink, weights_only=False)
    assert got["replies"] == {1: 2}
    want, _ = _reference(recipe)
    _assert_same_view(got["exposures"], want)
