"""Federated rounds on Flower (flwr 1.42's Message API): a ClientApp that runs a client's round of split
steps (harness/splitft/client.py) and a ServerApp whose FedAvg averages the clients' A and C.

- Simulation (`simulate`): Flower's Simulation Runtime, `flwr.simulation.run_simulation`, with its Ray
  backend (the only backend flwr 1.42 ships): N virtual SuperNodes, each client's data by its
  `partition-id`, the ServerApp in a thread of this process. Ray actors hold one CPU each, so
  `splitft.ray_cpus` bounds how many clients train at once (on 2 cores: 2).
- Deployment: the same `client_app()` / `server_app(None, sink)` objects (harness/splitft/deployment.py),
  reading the recipe file named in the run config, run under `flwr run` on a SuperLink and SuperNodes
  across machines (docs/splitft.md "Deployment runtime"; tested on loopback, marked slow).

What the server saw comes back in each reply: besides the averaged `arrays` (A and C after the round)
and `metrics`, the record `view` (the recorded steps' crossings, harness/splitft/step.py) and
`view-meta` (their channels, ops and step ids). The server-side FedAvg (`RecordingFedAvg`) takes them out
before averaging, so the strategy itself is Flower's. PrivPair's adapters stay in the client's
`context.state` (never uploaded); the evaluator's truth is written to `recipe.truth_dir`, never sent.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from harness.splitft.client import MAX_SENDS, Recipe, load_recipe, trainer_for

VIEW, VIEW_META = "view", "view-meta"


def client_app(recipe: Recipe | None = None) -> Any:
    """The ClientApp; without a recipe it reads one from the run config's `recipe` path (deployment)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        r = recipe or _recipe_from_run_config(context)
        client = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        adapters = context.state["adapters"].to_torch_state_dict() if "adapters" in context.state else {}
        steps = int(context.state["progress"]["steps"]) if "progress" in context.state else 0
        sends = context.state["sends"].to_torch_state_dict()["count"] if "sends" in context.state else None
        out = trainer_for(r).run_round(client, rnd, msg.content["arrays"].to_torch_state_dict(), adapters, steps,
                                       sends)
        if out.adapters:
            context.state["adapters"] = ArrayRecord(torch_state_dict=out.adapters)
        context.state["sends"] = ArrayRecord(torch_state_dict={"count": out.sends})
        context.state["progress"] = ConfigRecord({"steps": out.steps_done})
        if r.truth_dir and out.truth:
            torch.save(out.truth, Path(r.truth_dir) / f"client{client}_round{rnd}.pt")
        meta = [{k: v for k, v in e.items() if k != "tensor"} | {"client": client, "round": rnd}
                for e in out.exposures]
        content = RecordDict({
            "arrays": ArrayRecord(torch_state_dict=out.state),
            "metrics": MetricRecord(out.metrics),
            VIEW: ArrayRecord(torch_state_dict={f"e{i}": e["tensor"] for i, e in enumerate(out.exposures)}),
            VIEW_META: ConfigRecord({"json": json.dumps(meta)}),
        })
        return Message(content=content, reply_to=msg)

    return app


@dataclass
class Sink:
    """What the ServerApp hands back to the caller: the view's exposures, per-round metrics, the final A/C."""

    exposures: list[dict[str, Any]] = field(default_factory=list)
    rounds: dict[int, dict[str, float]] = field(default_factory=dict)
    evaluations: dict[int, dict[str, float]] = field(default_factory=dict)
    replies: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)      # the failed replies' reasons (a client's error, a dead Ray actor)
    final: dict[str, torch.Tensor] | None = None


def _recording_fedavg(sink: Sink, n_clients: int) -> Any:
    class RecordingFedAvg(FedAvg):
        """FedAvg that first takes what the server saw (`view`) out of each reply."""

        def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> Any:
            replies = list(replies)
            ok = [m for m in replies if not m.has_error()]
            sink.replies[server_round] = len(ok)
            sink.errors += [m.error.reason for m in replies if m.has_error()]
            for msg in ok:
                content = msg.content
                if VIEW in content:
                    view = content[VIEW].to_torch_state_dict()
                    for i, meta in enumerate(json.loads(content[VIEW_META]["json"])):
                        sink.exposures.append({**meta, "tensor": view[f"e{i}"]})
                    del content[VIEW]
                    del content[VIEW_META]
            most_sends = max((float(m.content["metrics"].get(MAX_SENDS, 0.0)) for m in ok), default=0.0)
            arrays, metrics = super().aggregate_train(server_round, ok)
            if metrics is not None:
                sink.rounds[server_round] = {k: float(v) for k, v in metrics.items()} | {MAX_SENDS: most_sends}
            return arrays, metrics

    return RecordingFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n_clients,
                           min_available_nodes=n_clients, min_evaluate_nodes=0)


def server_app(recipe: Recipe | None, sink: Sink, initial: dict[str, torch.Tensor] | None = None,
               evaluate: Any = None) -> Any:
    """The ServerApp: FedAvg over A and C for `rounds` rounds, evaluating the global model with
    `evaluate(state) -> dict` (server side: the server holds the complete model) after each."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        r = recipe or _recipe_from_run_config(context)
        start = initial if initial is not None else trainer_for(r).initial_state()

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if evaluate is None:
                return None
            scores = evaluate(arrays.to_torch_state_dict())
            sink.evaluations[server_round] = scores
            return MetricRecord(scores)

        strategy = _recording_fedavg(sink, r.n_clients)
        with round_bar(int(r.section["rounds"])) as bar:
            def evaluate_and_show(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
                out = evaluate_fn(server_round, arrays)
                if server_round > 0:          # round 0 scores the starting model
                    show_round(bar, sink.rounds.get(server_round, {}), sink.evaluations.get(server_round, {}))
                return out

            result = strategy.start(grid=grid, initial_arrays=ArrayRecord(torch_state_dict=start),
                                    num_rounds=int(r.section["rounds"]), evaluate_fn=evaluate_and_show)
        sink.final = result.arrays.to_torch_state_dict()
        if recipe is None and context.run_config.get("sink"):   # deployment: the caller reads it from disk
            torch.save(dataclasses.asdict(sink), str(context.run_config["sink"]))

    return app


def round_bar(rounds: int) -> Any:
    """The bar over a federation's rounds (harness/progress.py: drawn on a terminal only); Flower's and our log
    lines print above it rather than on it."""
    from harness.progress import progress_with_logs

    return progress_with_logs(desc="federated rounds", total=rounds, unit="round", loggers=("flwr",))


def show_round(bar: Any, train: dict[str, float], evaluation: dict[str, float]) -> None:
    """One round done: the bar moves on and shows the round's mean train loss and held-out cross-entropy."""
    shown = {k: f"{v:.4g}" for k, v in (("train_loss", train.get("train_loss")),
                                         ("heldout_ce", evaluation.get("heldout_ce"))) if v is not None}
    bar.update(1)
    bar.set_postfix(shown)      # and draw now: a round takes minutes, far beyond tqdm's redraw interval


# Ray's driver warns on every ray.init that a future Ray will stop overriding CUDA_VISIBLE_DEVICES for actors that
# ask for no GPU (ray/_private/worker.py). Our actors ask for none; the tip is dropped by its text, nothing else.
RAY_ACCELERATOR_TIP = r"Tip: In future versions of Ray, Ray will no longer override accelerator visible devices"


def quiet_flower() -> None:
    """Before a Flower simulation: Flower's logger at WARNING without its per-run deprecation notice, and
    Ray's per-run FutureWarning tip dropped, each matched by its own text (client errors still print)."""
    import warnings

    flwr_log = logging.getLogger("flwr")
    flwr_log.setLevel(logging.WARNING)
    if not any(isinstance(f, _NoDeprecationNotice) for f in flwr_log.filters):
        flwr_log.addFilter(_NoDeprecationNotice())
    warnings.filterwarnings("ignore", message=RAY_ACCELERATOR_TIP, category=FutureWarning)


class _NoDeprecationNotice(logging.Filter):
    """Drops Flower's two notices of every simulated run that say nothing about it: `run_simulation` is deprecated
    in favour of the `flwr run` CLI (the CLI route is harness/splitft/deployment.py's), and FedAvg's "federated
    evaluation will be skipped" (fraction_evaluate=0 is ours: the server evaluates the global model itself,
    harness/splitft/experiment.py). Flower's other warnings, client errors among them, still print."""

    DROPPED = ("DEPRECATED FEATURE", "fraction_evaluate is set to 0.0. Federated evaluation will be skipped")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.DROPPED)


def simulate(recipe: Recipe, initial: dict[str, torch.Tensor], evaluate: Any = None) -> Sink:
    """N clients on Flower's Simulation Runtime (Ray backend) on this machine."""
    from flwr.simulation import run_simulation  # imports Ray (seconds): only where a simulation runs

    quiet_flower()
    sink = Sink()
    cpus = int(recipe.section.get("ray_cpus") or recipe.n_clients)
    run_simulation(server_app=server_app(recipe, sink, initial, evaluate), client_app=client_app(recipe),
                   num_supernodes=recipe.n_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cpus, "include_dashboard": False,
                                                 "logging_level": "ERROR", "log_to_driver": False}})
    rounds = int(recipe.section["rounds"])
    missing = [r for r in range(1, rounds + 1) if sink.replies.get(r, 0) < recipe.n_clients]
    if sink.final is None or missing:
        raise RuntimeError(f"Flower simulation did not complete: rounds {missing or 'all'} lack client replies "
                           f"(errors {sink.errors}; see the client errors logged above)")
    return sink


@functools.lru_cache(maxsize=1)
def _recipe_at(path: str) -> Recipe:
    return load_recipe(path)


def _recipe_from_run_config(context: Any) -> Recipe:
    """Deployment: the recipe file named by the run config key `recipe` (harness/splitft/deployment.py),
    read once per process so the process keeps one ClientTrainer across rounds."""
    return _recipe_at(str(context.run_config["recipe"]))
