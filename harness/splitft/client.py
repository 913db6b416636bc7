"""A client's side of one federated round: load the global A and C, run `local_steps` split steps on its
own blocks (PrivPair's bursts in between), and hand back its new A and C, its round metrics, the
crossings of the recorded steps (the server saw them) and the evaluator's truth for those steps.

`Recipe` is everything a client process needs, as plain data, so the same code runs in Flower's
simulation (Ray actors) and on a deployed SuperNode (docs/splitft.md "Deployment runtime").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.splitft import defences, trainable
from harness.splitft.defences import GradientGuard
from harness.splitft.privpair import PrivPair
from harness.splitft.step import CLIENT_WEIGHTS, Recorder, split_step

# round metric: the most times any one block of the client went up so far; FedAvg takes its max over
# clients, not its average (harness/splitft/federation.py): the accounting's K (harness/splitft/accounting.py)
MAX_SENDS = "max-sends"


@dataclass
class Recipe:
    model: dict[str, Any]               # the conf/model entry
    cache_dir: str | None
    configuration: str
    epsilon: float | None               # the defence's strength (the run's effective epsilon)
    section: dict[str, Any]             # the resolved `splitft` config section
    seed: int
    clients: list[list[list[int]]]      # per client, its token blocks
    align: list[list[int]]              # D_align (public)
    heldout: list[list[int]]
    truth_dir: str | None = None        # where clients write the evaluator's truth (never sent)

    @property
    def n_clients(self) -> int:
        return len(self.clients)



def write_recipe(recipe: Recipe, path: str | Path) -> None:
    """The recipe file a deployed federation reads (harness/splitft/deployment.py)."""
    torch.save(dataclasses.asdict(recipe), path)


def load_recipe(path: str | Path) -> Recipe:
    return Recipe(**torch.load(path, weights_only=False))


def make_defence(configuration: str, epsilon: float | None, section: Any) -> defences.Defence:
    """The defence of a splitft configuration at its strength (the run's effective epsilon). Here, beside its
    one caller, rather than in defences.py: PrivPair (privpair.py) builds on defences.Defence."""
    if configuration in ("splitft_none", "splitft_central"):
        return defences.Defence()
    if configuration == "privpair":
        return PrivPair(coupling_weight=float(epsilon), settings=section.privpair)
    if configuration == "smashed_dp_gaussian":
        return defences.SmashedGaussian(float(epsilon), section.dp.clip_norm, section.dp.delta)
    if configuration == "smashed_dp_laplace":
        return defences.SmashedLaplace(float(epsilon), section.dp.clip_norm)
    if configuration == "embedding_dx":
        return defences.EmbeddingDx(float(epsilon))
    if configuration == "nopeek":
        return defences.NoPeek(float(epsilon), section.nopeek.max_tokens)
    raise AssertionError(f"no splitft defence for configuration {configuration!r}")


@dataclass
class RoundOutput:
    state: dict[str, torch.Tensor]
    metrics: dict[str, float]
    adapters: dict[str, torch.Tensor]
    steps_done: int
    exposures: list[dict[str, Any]] = field(default_factory=list)
    truth: list[dict[str, Any]] = field(default_factory=list)
    sends: torch.Tensor | None = None   # per block of the client: times its s_A went up so far (DP accounting)


def make_optimizer(name: str, params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """The clients' optimizer, `splitft.optimizer` (sgd | adamw, torch's defaults otherwise: AdamW's
    weight decay 0.01); the weights attacker's positive control takes one step of the same
    (attacks/splitft/weights_label.py)."""
    return torch.optim.SGD(params, lr=lr) if name == "sgd" else torch.optim.AdamW(params, lr=lr)


def step_id(rnd: int, client: int, local_step: int, n_clients: int, local_steps: int) -> int:
    """A global index of one client's local step: rounds, then clients, then steps."""
    return ((rnd - 1) * n_clients + client) * local_steps + local_step


class ClientTrainer:
    """The model, its partition and trained parameters in one process (reused across rounds and clients)."""

    def __init__(self, recipe: Recipe) -> None:
        from omegaconf import OmegaConf

        from harness.models import load_model

        self.recipe = recipe
        self.section = OmegaConf.create(recipe.section)
        if self.section.threads:
            torch.set_num_threads(int(self.section.threads))
        self.loaded = load_model(recipe.model, cache_dir=recipe.cache_dir, placement=self.section.placement)
        self.model = self.loaded.model
        self.part, self.names = trainable.make_trainable(self.model, int(self.section.k), int(self.section.m),
                                                         self.section.lora, bool(self.section.train_head))

    def initial_state(self) -> dict[str, torch.Tensor]:
        return trainable.state(self.model, self.names)

    def optimizer(self) -> torch.optim.Optimizer:
        params = dict(self.model.named_parameters())
        return make_optimizer(str(self.section.optimizer), [params[n] for n in self.names], float(self.section.lr))

    def run_round(self, client: int, rnd: int, global_state: dict[str, torch.Tensor],
                  adapters: dict[str, torch.Tensor], steps_done: int,
                  sends: torch.Tensor | None = None) -> RoundOutput:
        s, r = self.section, self.recipe
        trainable.load(self.model, self.names, global_state)
        self.model.train()
        generator = torch.Generator().manual_seed(int(r.seed) * 1_000_003 + client * 10_007 + rnd)
        align = torch.tensor(r.align, dtype=torch.long)
        defence = make_defence(r.configuration, r.epsilon, s)
        defence.setup(self.part, align[: int(s.privpair.align_batch_size)], generator)
        defence.load_state(adapters)
        # the guard's noise from its own stream, so a guarded run draws the same batches as an unguarded one
        noise = torch.Generator().manual_seed(int(r.seed) * 1_000_003 + client * 10_007 + rnd + 7_919)
        guard = GradientGuard(s.grad_up.clip, s.grad_up.noise_multiplier, noise)
        blocks = torch.tensor(r.clients[client], dtype=torch.long)
        sends = torch.zeros(blocks.shape[0], dtype=torch.long) if sends is None else sends.clone()
        optimizer = self.optimizer()
        recorded = rnd > int(s.rounds) - int(s.record.last_rounds)
        first_recorded = int(s.local_steps) - int(s.record.steps_per_round)
        losses, measured, bursts = [], [], []
        exposures, truth = [], []
        for local in range(int(s.local_steps)):
            record = None
            if recorded and local >= first_recorded:
                record = Recorder(step=step_id(rnd, client, local, r.n_clients, int(s.local_steps)))
            burst = defence.burst(steps_done, self.part, align, generator, record)
            if burst:
                bursts.append(burst)
            rows = torch.randint(0, blocks.shape[0], (min(int(s.batch_size), blocks.shape[0]),), generator=generator)
            if record is not None:
                # θ_A, θ_C as the server knows them when this step's s'_A arrives: after the previous step
                # (the strong threat model), i.e. the weights that computed what crosses in this step.
                record.add(CLIENT_WEIGHTS, "theta_a_c", None, trainable.flat(self.model, self.names))
            out = split_step(self.part, defence, blocks[rows], optimizer, record=record,
                             measure=local == int(s.local_steps) - 1, guard=guard,
                             send_gradient=bool(s.train_head))
            sends += torch.bincount(rows, minlength=blocks.shape[0])   # a row drawn twice went up twice
            steps_done += 1
            losses.append(out["loss"])
            if "H" in out:
                measured.append(out)
            if record is not None:
                exposures.extend(record.exposures)
                truth.extend(record.truth)
        self.model.eval()
        last = measured[-1]
        metrics = {"train_loss": sum(losses) / len(losses), "H": last["H"], "H_A": last["H_A"],
                   "H_recv": last["H_recv"], "H_recv_rel": last["H_recv"] / max(last["s_b_sq"], 1e-12),
                   "H_rel": last["H"] / max(last["s_b_sq"], 1e-12), "H_A_rel": last["H_A"] / max(last["s_a_sq"], 1e-12),
                   "regulariser": out["regulariser"], "num-examples": float(blocks.shape[0]),
                   MAX_SENDS: float(sends.max())}
        if bursts:
            metrics.update({f"align_{k}": v for k, v in bursts[-1].items()})
        return RoundOutput(trainable.state(self.model, self.names), metrics, defence.state(), steps_done,
                           exposures, truth, sends)


_TRAINERS: dict[int, ClientTrainer] = {}


def trainer_for(recipe: Recipe) -> ClientTrainer:
    """One ClientTrainer per recipe and process (a Ray actor serves several clients in turn)."""
    key = id(recipe)
    if key not in _TRAINERS:
        _TRAINERS.clear()
        _TRAINERS[key] = ClientTrainer(recipe)
    return _TRAINERS[key]
