"""One split-FL fine-tuning run end to end, as library calls the runner composes: the recipe from the
config, the federated training on Flower (or the centralised reference), the adversary view of what the
server saw, and the evaluator's truth for scoring the attacks."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness import adversary_view, configurations
from harness.adversary_view import AdversaryView, Exposure
from harness.splitft.client import ClientTrainer, Recipe
from harness.splitft.config import grad_guard
from harness.splitft.evaluate import heldout_scores, summarise

CENTRAL = "splitft_central"


@dataclass
class Training:
    """What a run's training produced."""

    rounds: list[dict[str, Any]]                 # per round: H, H_A, train loss, held-out CE, ...
    initial_scores: dict[str, list[float]]       # per held-out block, of the pretrained model
    final_scores: dict[str, list[float]]         # per held-out block, of the final model
    exposures: list[dict[str, Any]] = field(default_factory=list)
    weight_layout: list[str] = field(default_factory=list)
    runtime: str = ""

    @property
    def initial(self) -> dict[str, float]:
        """The pretrained model's held-out scores."""
        return headline(self.initial_scores)


class ServerEvaluation:
    """The server's copy of the complete model, scoring a global state on the held-out blocks."""

    def __init__(self, recipe: Recipe) -> None:
        self.trainer = ClientTrainer(recipe)
        self.blocks = recipe.heldout

    def scores(self, state: dict[str, torch.Tensor]) -> dict[str, list[float]]:
        from harness.splitft import trainable

        trainable.load(self.trainer.model, self.trainer.names, state)
        return heldout_scores(self.trainer.model, self.blocks)

    def __call__(self, state: dict[str, torch.Tensor]) -> dict[str, float]:
        return headline(self.scores(state))


def headline(scores: dict[str, list[float]]) -> dict[str, float]:
    s = summarise(scores)
    return {k: float(s[k]) for k in ("heldout_ce", "heldout_ppl", "heldout_top1")}


def train(recipe: Recipe) -> Training:
    """Federated split fine-tuning on Flower's simulation runtime (`splitft.runtime`: B in each ClientApp, or
    split_deployment: B in the ServerApp), or (splitft_central) the centralised reference: one party with every
    client's blocks, the whole model, no cut and no FedAvg."""
    evaluation = ServerEvaluation(recipe)
    start = evaluation.trainer.initial_state()
    initial = evaluation.scores(start)
    if recipe.configuration == CENTRAL:
        return _central(recipe, evaluation, start, initial)
    if recipe.section.get("runtime") == "split_deployment":
        from harness.splitft.split_deployment import simulate_split

        sink = simulate_split(recipe, start, evaluate=evaluation)
        runtime = "flwr simulation (ray backend), split deployment: B in the ServerApp"
    else:
        from harness.splitft.federation import simulate

        sink = simulate(recipe, start, evaluate=evaluation)
        runtime = "flwr simulation (ray backend)"
    rounds = [{"round": r, **sink.rounds.get(r, {}), **sink.evaluations.get(r, {})}
              for r in range(1, int(recipe.section["rounds"]) + 1)]
    return Training(rounds, initial, evaluation.scores(sink.final), sink.exposures, evaluation.trainer.names, runtime)


def _central(recipe: Recipe, evaluation: ServerEvaluation, start: dict[str, torch.Tensor],
             initial: dict[str, list[float]]) -> Training:
    """Rounds of the same length and the same examples per round as the federation (batch N× larger)."""
    from harness.progress import progress

    pooled = copy.copy(recipe)
    pooled.clients = [[b for c in recipe.clients for b in c]]
    pooled.section = {**recipe.section, "batch_size": int(recipe.section["batch_size"]) * recipe.n_clients,
                      "record": {**recipe.section["record"], "last_rounds": 0}}
    trainer = ClientTrainer(pooled)
    state, steps, rounds = start, 0, []
    for rnd in progress(range(1, int(recipe.section["rounds"]) + 1), desc="central fine-tuning", unit="round"):
        out = trainer.run_round(0, rnd, state, {}, steps)
        state, steps = out.state, out.steps_done
        rounds.append({"round": rnd, **{k: v for k, v in out.metrics.items() if k != "num-examples"},
                       **evaluation(state)})
    return Training(rounds, initial, evaluation.scores(state), [], evaluation.trainer.names, "in process (no split)")


def accounting(section: dict[str, Any], configuration: str, epsilon: float | None, last_round: dict[str, Any],
               model: Any) -> dict[str, Any] | None:
    """ε(δ) over the run of the DP baselines (harness/splitft/accounting.py), from the last round's largest
    count of sends of one example; None for the other configurations."""
    from harness.splitft import accounting as dp
    from harness.splitft.client import MAX_SENDS

    if configuration not in dp.ACCOUNTED:
        return None
    return dp.account(   # the a-priori bound: one example drawn at every draw of every step
        configuration, float(epsilon), sends=int(last_round[MAX_SENDS]),
        sends_bound=int(section["rounds"]) * int(section["local_steps"]) * int(section["batch_size"]),
        seq_len=int(section["data"]["seq_len"]), delta=float(section["dp"]["delta"]),
        vocab_norm_max=float(model.get_input_embeddings().weight.norm(dim=-1).max()))


def metrics(training: Training, accounting: dict[str, Any] | None) -> dict[str, Any]:
    """results.json `metrics` before the attacks: the final model's held-out utility with 95% intervals over
    blocks, the pretrained model's, the gain (paired over the same blocks), the last round's H and loss, and
    the DP baselines' ε(δ)."""
    from metrics.intervals import paired_difference_ci

    out = {**summarise(training.final_scores),
           "initial_heldout_ce": training.initial["heldout_ce"],
           "initial_heldout_top1": training.initial["heldout_top1"],
           # nats the fine-tuning removed, paired over the same blocks
           **paired_difference_ci(training.initial_scores["ce"], training.final_scores["ce"]).flat("heldout_ce_gain")}
    last = training.rounds[-1]
    out.update({k: last.get(k) for k in ("H", "H_A", "H_rel", "H_A_rel", "H_recv", "H_recv_rel", "train_loss")})
    if accounting is not None:
        out.update(dp_epsilon_example=accounting["epsilon_example"], dp_epsilon_row=accounting["epsilon_row"],
                   dp_epsilon_step=accounting["epsilon_step"], dp_delta=accounting["delta"])
    return out


def build_view(cfg: Any, training: Training, section: dict[str, Any]) -> AdversaryView:
    """Everything the server received, as the general adversary view (system splitft), in step order (then
    client): the replies arrive in whatever order Flower's clients finish, and the attacks read the view in
    its order, so the view is sorted to be the same on every run. A step's own exposures keep their order."""
    received = sorted(training.exposures, key=lambda e: (int(e["step"]), int(e["client"])))
    exposures = [Exposure(op=e["op"], layer=e["layer"], step=int(e["step"]), shape=tuple(e["tensor"].shape),
                          tensor=e["tensor"], channel=e["channel"]) for e in received]
    meta = adversary_view.view_meta(cfg, system=configurations.SPLITFT,
                                    epsilon=cfg.epsilon)
    meta["splitft"] = {"k": int(section["k"]), "m": int(section["m"]), "lora": section["lora"],
                       "train_head": bool(section["train_head"]),
                       "grad_up": grad_guard(section),
                       "optimizer": str(section["optimizer"]), "lr": float(section["lr"]),
                       "local_steps": int(section["local_steps"]),
                       "weight_layout": list(training.weight_layout),
                       "steps": {int(e["step"]): {"client": e["client"], "round": e["round"]}
                                 for e in received}}
    return AdversaryView(exposures, meta)


def load_truth(truth_dir: str | Path) -> dict[int, dict[str, torch.Tensor]]:
    """The evaluator's record of the recorded steps (ids, plain s_A, plain s_B), by step id."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for path in sorted(Path(truth_dir).glob("client*_round*.pt")):
        for item in torch.load(path, weights_only=False):
            out[int(item["step"])] = item
    return out
