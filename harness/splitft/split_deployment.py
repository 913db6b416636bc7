"""A split deployment of split federated fine-tuning (paper 002 §III): the frozen body B lives in the
ServerApp's process, and every crossing of harness/splitft/step.py goes between a client and the server
as a Flower message (flwr 1.42's Message API), each step:

    server ──train.split_forward (round, local step; A and C with the round's first message)──▶ client
    client  s'_A = send(A(embed(x)))                     ──s'_A (+ θ_A, θ_C of a recorded step)──▶ server
    server  s'_B = B(s'_A)                               ──train.split_tail: s'_B──▶ client
    client  L = ℓ(C(recover(s'_B)), y); backward to C    ──∂L/∂s'_B──▶ server
    server  backward through frozen B                    ──train.split_finish: ∂L/∂s'_A──▶ client
    client  backward through send() and A; optimiser step (the round's last step replies A, C and the
            round metrics; the server averages them with the FedAvg of harness/splitft/federation.py)

Tensors travel as ArrayRecords. The server records what it received and computed, with the channels and
step ids of the simulation's view (step.py): θ_A, θ_C of a recorded step (`client_weights`: the strong
threat model gives the server the client's weights after every step; here the client sends them with
that step's s'_A, so the deployed server really holds them), s'_A, s'_B, ∂L/∂s'_B, ∂L/∂s'_A.

A client process never holds B: it loads the model and moves B's blocks to the meta device. A deployed
SuperNode runs each message in a fresh `flwr-clientapp` process, so a client's step is resumable: between
its three messages everything it needs (A and C, the optimiser's state, the round's random streams, the
batch, C's gradients) is in a session file on the client's machine that the node's `context.state`
names (`_session_path`), and the last message recomputes A's forward from
the saved stream state to backpropagate through it. The same functions run in Flower's simulation
(`simulate_split`, Ray actors) and under `flwr run` on a SuperLink (module-level `serverapp`,
`clientapp`; docs/splitft.md "Running split across machines").

The measurement path. An obfuscating defence (smashed-data DP, embedding dχ, PrivPair) sends s'_A ≠ s_A, so H and the
attacks' truth need the plain s_B = B(s_A) of the clean batch, which the client cannot compute (it holds no
B) and the protocol must not give the server. On a measured step (`measured`: a recorded step, or the
round's last, where H is taken) the server asks for it on a message of its own, `query.split_measure`,
after the step's s'_A has arrived:

    server ──query.split_measure──▶ client ──measurement: the clean s_A (= A(embed(x)), no defence)──▶ server
    server  `Evaluator`: s_B = B(s_A), no gradient    ──train.split_tail: s'_B, and measurement: s_B──▶ client

The clean s_A goes to the `Evaluator`, an object in the server's process apart from the protocol's
server: it holds B (the same frozen weights, so B stays in the server's process and no client machine needs
it), writes nothing into the sink, and its output goes back to the client, which computes H and writes the
truth to `recipe.truth_dir` as before. The adversary view is what the protocol's server records from
`train.*` messages only; the `query.*` message and the `measurement` records are the benchmark's
instrument, the trusted evaluator's channel that a real deployment would not run (docs/splitft.md "Running
split across machines"). Putting a copy of B in the client's process instead would have kept the clean s_A on the
client's machine but made every client load B again, the very cost this deployment removes.

PrivPair's bursts (harness/splitft/privpair.py PrivPair.burst) cross too: before a local step the burst
schedule gives adapter steps (`burst_steps`), each three message rounds on a D_align batch (public):

    server ──train.align_forward (round, local, i; A and C if it opens the round)──▶ client
    client  s_A = A(x_align), s'_A = W1(s_A)                         ──s_A, s'_A──▶ server
    server  s_B = B(s_A), s'_B = B(s'_A)                             ──train.align_tail: s_B, s'_B──▶ client
    client  PrivPair.losses on them (`_RemoteB`)                     ──∂L_W1/∂s'_B──▶ server
    server  B's backward                                             ──train.align_finish: ∂L_W1/∂s'_A──▶ client
    client  the losses again, ∂L_W1/∂s'_A in place of B's backward (`_Crossing`); W1 and W2 step

recorded as the simulation's `align_up` / `align_down` crossings (step.ALIGN_OPS) on recorded steps. W1 and
W2 stay on the client (the session within a round, the node's `context.state` across rounds).

Scope: `splitft_none`, `nopeek` (s_A sent unchanged; no measurement message), `smashed_dp_gaussian`,
`smashed_dp_laplace`, `embedding_dx`, `privpair`. `splitft_central` splits nothing; asking for it here is a
one-line error that says why (harness/splitft/config.py NOT_SPLIT). The runner takes this path with
`splitft.runtime=split_deployment`.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from harness.errors import UserError
from harness.splitft import trainable
from harness.splitft.client import (
    MAX_SENDS,
    ClientTrainer,
    Recipe,
    make_defence,
    step_id,
)
from harness.splitft.config import SPLIT_DEPLOYMENT_CONFIGURATIONS, split_deployment_refusal
from harness.splitft.defences import GradientGuard
from harness.splitft.federation import (
    Sink,
    _recipe_from_run_config,
    _recording_fedavg,
    quiet_flower,
    round_bar,
    show_round,
)
from harness.splitft.privpair import burst_length, sq_norm, token_ce
from harness.splitft.step import (
    ALIGN_OPS,
    CLIENT_WEIGHTS,
    GRAD_DOWN,
    GRAD_UP,
    SMASHED_DOWN,
    SMASHED_UP,
)

FORWARD, TAIL, FINISH = "split_forward", "split_tail", "split_finish"     # ClientApp train actions
MEASURE = "split_measure"            # the measurement path's query action: never part of the adversary view
ALIGN_FORWARD, ALIGN_TAIL, ALIGN_FINISH = "align_forward", "align_tail", "align_finish"   # PrivPair's bursts
SPLIT_CONFIGURATIONS = SPLIT_DEPLOYMENT_CONFIGURATIONS
NODE_WAIT_S, REPLY_TIMEOUT_S = 600.0, 1200.0


def check_supported(recipe: Recipe) -> None:
    if refusal := split_deployment_refusal(recipe.configuration):
        raise UserError(refusal)


def recorded(section: Any, rnd: int, local: int) -> bool:
    """Bounded recording (`splitft.record`), as harness/splitft/client.py applies it."""
    return (rnd > int(section["rounds"]) - int(section["record"]["last_rounds"])
            and local >= int(section["local_steps"]) - int(section["record"]["steps_per_round"]))


def burst_steps(configuration: str, section: Any, steps_done: int) -> int:
    """PrivPair's adapter steps before the client's local step number `steps_done` (0-based over the run):
    PrivPair.burst's schedule (privpair.burst_length), which the server drives here (every client has taken
    the same number of steps); 0 for every other defence."""
    return burst_length(section["privpair"], steps_done) if configuration == "privpair" else 0


def measured(obfuscates: bool, section: Any, rnd: int, local: int) -> bool:
    """Whether a step needs the plain s_B from the measurement path: the defence changes what crosses, and
    the step is recorded (the attacks' truth) or the round's last (H), as split_step's `plain` is computed."""
    return obfuscates and (recorded(section, rnd, local) or local == int(section["local_steps"]) - 1)


# -- the client's half ------------------------------------------------------------------------------------
class _Crossing(torch.autograd.Function):
    """s'_B = B(s'_A) computed on the server: forward gives what the server sent, backward what it sent back
    for ∂/∂s'_A (PrivPair's burst: W1 trains through B)."""

    @staticmethod
    def forward(ctx: Any, s_a_obf: torch.Tensor, received: torch.Tensor, remote: Any) -> torch.Tensor:
        ctx.remote = remote
        return received.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.remote.grad_a is None:
            raise RuntimeError("the server's ∂L_W1/∂s'_A has not arrived: B's backward cannot run on the client")
        return ctx.remote.grad_a, None, None


class _RemoteB:
    """The partition PrivPair.losses computes on, with B across the network: head and tail are the client's;
    its two calls of body, in losses' order (the plain s_A under no_grad, then s'_A), return the server's s_B
    and s'_B, the second wired to W1 through `_Crossing`. PrivPair.losses itself, unchanged, so the burst's
    numbers are the simulation's."""

    def __init__(self, part: Any, s_b: torch.Tensor, s_b_obf: torch.Tensor, grad_a: torch.Tensor | None) -> None:
        self._part, self._received, self.grad_a = part, [s_b, s_b_obf], grad_a
        self.s_b_obf: torch.Tensor | None = None

    def head(self, ids: torch.Tensor) -> Any:
        return self._part.head(ids)

    def tail(self, hidden: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self._part.tail(hidden, ctx)

    def body(self, hidden: torch.Tensor, ctx: Any) -> torch.Tensor:
        received = self._received.pop(0)
        if self._received:           # the first call: the plain s_B of public data, no gradient
            return received
        self.s_b_obf = _Crossing.apply(hidden, received, self)
        return self.s_b_obf


class SplitClient:
    """A client's model without B, and the three phases of its split step over a saved session."""

    def __init__(self, recipe: Recipe) -> None:
        check_supported(recipe)
        self.recipe = recipe
        self.trainer = ClientTrainer(recipe)
        self.part, self.names, self.section = self.trainer.part, self.trainer.names, self.trainer.section
        for module in self.part.body_modules():    # the client holds no B: any use of it would fail
            module.to("meta")

    def _defence(self, session: dict[str, Any], generator: torch.Generator) -> Any:
        defence = make_defence(self.recipe.configuration, self.recipe.epsilon, self.section)
        vars(defence).update(session["defence"])
        defence.generator = generator
        return defence

    def _restore(self, session: dict[str, Any]) -> tuple[torch.optim.Optimizer, torch.Generator, Any]:
        trainable.load(self.trainer.model, self.names, session["weights"])
        self.trainer.model.train()
        optimizer = self.trainer.optimizer()
        optimizer.load_state_dict(session["optimizer"])
        generator = torch.Generator()
        generator.set_state(session["generator"])
        return optimizer, generator, self._defence(session, generator)

    def _save(self, session: dict[str, Any], optimizer: torch.optim.Optimizer, generator: torch.Generator,
              defence: Any = None) -> None:
        if defence is not None:      # PrivPair's W1 and W2 move in its bursts
            session["defence"] = {k: v for k, v in vars(defence).items() if k != "generator"}
        session["weights"] = trainable.state(self.trainer.model, self.names)
        session["optimizer"] = optimizer.state_dict()
        session["generator"] = generator.get_state()

    def _forward_a(self, defence: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        e = defence.embed(self.part.embed(ids))
        s_a = self.part.run_layers(e, self.part.context(e), 0, self.part.k)
        return e, s_a, defence.send(s_a)

    def start_round(self, client: int, rnd: int, global_state: dict[str, torch.Tensor], steps_done: int,
                    sends: torch.Tensor | None, adapters: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """The round's set-up of ClientTrainer.run_round: the global A and C, a fresh optimiser, the
        round's random streams, the defence calibrated on D_align."""
        s, r = self.section, self.recipe
        trainable.load(self.trainer.model, self.names, global_state)
        generator = torch.Generator().manual_seed(int(r.seed) * 1_000_003 + client * 10_007 + rnd)
        align = torch.tensor(r.align, dtype=torch.long)
        defence = make_defence(r.configuration, r.epsilon, s)
        defence.setup(self.part, align[: int(s.privpair.align_batch_size)], generator)
        defence.load_state(adapters or {})       # PrivPair's W1, W2 from the client's previous round
        noise = torch.Generator().manual_seed(int(r.seed) * 1_000_003 + client * 10_007 + rnd + 7_919)
        blocks = torch.tensor(r.clients[client], dtype=torch.long)
        session = {"client": client, "round": rnd, "steps_done": steps_done, "noise": noise.get_state(),
                   "defence": {k: v for k, v in vars(defence).items() if k != "generator"},
                   "sends": torch.zeros(blocks.shape[0], dtype=torch.long) if sends is None else sends.clone(),
                   "losses": [], "measured": None, "regulariser": 0.0, "truth": []}
        self._save(session, self.trainer.optimizer(), generator)
        return session

    # -- PrivPair's burst, one adapter step in three messages (PrivPair.burst with B across the network) ----------
    def align_forward(self, session: dict[str, Any], i: int) -> dict[str, torch.Tensor]:
        """Burst step i, phase 1: draw a D_align batch from the round's stream; its s_A and s'_A = W1(s_A)
        go up (public data: the server may see the plain s_A and return the plain s_B)."""
        optimizer, generator, defence = self._restore(session)
        if i == 0:
            session["burst"] = {"opt1": None, "opt2": None}
        align = torch.tensor(self.recipe.align, dtype=torch.long)
        n = min(int(defence.s.align_batch_size), align.shape[0])
        session["align_rows"] = torch.randint(0, align.shape[0], (n,), generator=generator)
        with torch.no_grad():
            s_a, _ = self.part.head(align[session["align_rows"]])
            s_a_obf = defence.w1(s_a)
        self._save(session, optimizer, generator, defence)
        return {"s_a": s_a, "s_a_obf": s_a_obf}

    def _align_losses(self, defence: Any, session: dict[str, Any], grad_a: torch.Tensor | None
                      ) -> tuple[dict[str, torch.Tensor], _RemoteB]:
        ids = torch.tensor(self.recipe.align, dtype=torch.long)[session["align_rows"]]
        remote = _RemoteB(self.part, session["align_s_b"], session["align_s_b_obf"], grad_a)
        return defence.losses(remote, ids), remote

    def align_tail(self, session: dict[str, Any], s_b: torch.Tensor, s_b_obf: torch.Tensor) -> torch.Tensor:
        """Phase 2: PrivPair's losses on the server's s_B and s'_B; ∂L_W1/∂s'_B goes up."""
        optimizer, generator, defence = self._restore(session)
        session.update(align_s_b=s_b, align_s_b_obf=s_b_obf)
        out, remote = self._align_losses(defence, session, None)
        (g_b,) = torch.autograd.grad(out["l_w1"], remote.s_b_obf)
        self._save(session, optimizer, generator, defence)
        return g_b

    def align_finish(self, session: dict[str, Any], grad_a: torch.Tensor) -> None:
        """Phase 3: the losses again, the server's ∂L_W1/∂s'_A in place of B's backward; W1 steps on
        ∂L_W1, W2 on ∂L_W2, as PrivPair.burst's loop body (Adam's state carried through the burst)."""
        optimizer, generator, defence = self._restore(session)
        out, _ = self._align_losses(defence, session, grad_a)
        burst, lr = session["burst"], float(defence.s.align_lr)
        opt1 = torch.optim.Adam(defence.w1.parameters(), lr=lr)
        opt2 = torch.optim.Adam(defence.w2.parameters(), lr=lr)
        for opt, state in ((opt1, burst["opt1"]), (opt2, burst["opt2"])):
            if state is not None:
                opt.load_state_dict(state)
        g1 = torch.autograd.grad(out["l_w1"], list(defence.w1.parameters()), retain_graph=not defence.identity_w2)
        for param, g in zip(defence.w1.parameters(), g1):
            param.grad = g
        opt1.step()
        if not defence.identity_w2:
            g2 = torch.autograd.grad(out["l_w2"], list(defence.w2.parameters()))
            for param, g in zip(defence.w2.parameters(), g2):
                param.grad = g
            opt2.step()
        burst.update(opt1=opt1.state_dict(), opt2=opt2.state_dict())
        # the round metrics report the round's last burst's last step, as run_round does
        session["align_metrics"] = {k: float(v.detach()) for k, v in out.items() if v.dim() == 0}
        for key in ("align_rows", "align_s_b", "align_s_b_obf"):
            session.pop(key)
        self._save(session, optimizer, generator, defence)

    def adapters(self, session: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The defence's state the client keeps across rounds (PrivPair's W1, W2; never uploaded)."""
        return self._defence(session, torch.Generator()).state()

    def forward(self, session: dict[str, Any], local: int) -> dict[str, torch.Tensor]:
        """Phase 1: draw the batch, run A, send s'_A (and θ_A, θ_C when the step is recorded)."""
        s, r = self.section, self.recipe
        optimizer, generator, defence = self._restore(session)
        blocks = torch.tensor(r.clients[session["client"]], dtype=torch.long)
        rows = torch.randint(0, blocks.shape[0], (min(int(s.batch_size), blocks.shape[0]),), generator=generator)
        out = {}
        if recorded(s, session["round"], local):
            out["theta"] = trainable.flat(self.trainer.model, self.names)
        session.update(local=local, rows=rows, before_a=generator.get_state())
        with torch.no_grad():
            if measured(defence.obfuscates, s, session["round"], local):
                # the clean s_A of the same batch and weights, kept for the measurement path (`measure`)
                session["plain_s_a"], _ = self.part.head(blocks[rows])
            _, s_a, s_a_sent = self._forward_a(defence, blocks[rows])
        session.update(s_a=s_a, up=s_a_sent)
        self._save(session, optimizer, generator)
        out["s_a"] = s_a_sent
        return out

    def measure(self, session: dict[str, Any]) -> torch.Tensor:
        """The measurement path's reply: the clean s_A of this step's batch, for the evaluator's B only."""
        return session["plain_s_a"]

    def tail(self, session: dict[str, Any], s_b: torch.Tensor, plain_s_b: torch.Tensor | None = None
             ) -> torch.Tensor | None:
        """Phase 2: C's forward and loss on what came down, backward to C and to the cut m; the guarded
        ∂L/∂s'_B to send up (None with A frozen: then the step ends here). `plain_s_b`: the evaluator's
        B(s_A) on a measured step of a defence that obfuscates s_A; otherwise the plain s_B is what came down."""
        s = self.section
        optimizer, generator, defence = self._restore(session)
        ids = torch.tensor(self.recipe.clients[session["client"]], dtype=torch.long)[session["rows"]]
        down = s_b.detach().clone().requires_grad_(True)
        s_b_hat = defence.recover(down, session["s_a"], session["up"])
        loss = token_ce(self.part.tail(s_b_hat, self.part.context(down)), ids).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        session["losses"].append(float(loss.detach()))
        session["down"] = down.detach()
        if plain_s_b is not None:
            session["plain_s_b"] = plain_s_b
        if session["local"] == int(s.local_steps) - 1:   # split_step's `measure`
            s_a = session.get("plain_s_a", session["s_a"])
            s_b_plain = session.get("plain_s_b", down.detach())
            session["measured"] = {"H": float(sq_norm(s_b_hat.detach() - s_b_plain)),
                                   "H_recv": float(sq_norm(down.detach() - s_b_plain)),
                                   "H_A": float(sq_norm(session["up"] - s_a)),
                                   "s_a_sq": float(sq_norm(s_a)), "s_b_sq": float(sq_norm(s_b_plain))}
        if not bool(s.train_head):
            optimizer.step()
            self._end_step(session, ids)
            self._save(session, optimizer, generator)
            return None
        noise = torch.Generator()
        noise.set_state(session["noise"])
        guard = GradientGuard(s.grad_up.clip, s.grad_up.noise_multiplier, noise)
        grad_m = guard(down.grad)
        session["noise"] = noise.get_state()
        session["grads"] = {n: p.grad.detach().clone() for n, p in self.trainer.model.named_parameters()
                            if n in set(self.names) and p.grad is not None}
        self._save(session, optimizer, generator)
        return grad_m

    def finish(self, session: dict[str, Any], grad_k: torch.Tensor) -> None:
        """Phase 3: A's forward again from the stream state phase 1 started from (the same s'_A), then
        the backward through send() and A (+ the regulariser) on top of C's gradients, and the step."""
        optimizer, generator, defence = self._restore(session)
        params = dict(self.trainer.model.named_parameters())
        for n in self.names:
            params[n].grad = session["grads"].get(n)
        ids = torch.tensor(self.recipe.clients[session["client"]], dtype=torch.long)[session["rows"]]
        generator.set_state(session["before_a"])
        e, s_a, s_a_sent = self._forward_a(defence, ids)
        reg = defence.regulariser(e, s_a)
        if reg is None:
            s_a_sent.backward(grad_k)
        else:
            torch.autograd.backward([s_a_sent, reg], [grad_k, torch.ones_like(reg)])
        session["regulariser"] = float(reg.detach()) if reg is not None else 0.0
        optimizer.step()
        self._end_step(session, ids)
        self._save(session, optimizer, generator)

    def _end_step(self, session: dict[str, Any], ids: torch.Tensor) -> None:
        n_blocks = session["sends"].shape[0]
        session["sends"] += torch.bincount(session["rows"], minlength=n_blocks)
        session["steps_done"] += 1
        if recorded(self.section, session["round"], session["local"]):
            # the evaluator's truth: the measurement path's clean s_A and B(s_A) under a defence that obfuscates s_A;
            # with s_A sent unchanged, what crossed
            r = self.recipe
            session["truth"].append({
                "step": step_id(session["round"], session["client"], session["local"], r.n_clients,
                                int(self.section.local_steps)),
                "ids": ids.detach().clone(), "s_a": session.get("plain_s_a", session["s_a"]),
                "s_b": session.get("plain_s_b", session["down"])})
        for key in ("rows", "before_a", "s_a", "up", "down", "grads", "plain_s_a", "plain_s_b"):
            session.pop(key, None)

    def round_metrics(self, session: dict[str, Any]) -> dict[str, float]:
        """ClientTrainer.run_round's round metrics."""
        last, losses = session["measured"], session["losses"]
        return {"train_loss": sum(losses) / len(losses), "H": last["H"], "H_A": last["H_A"],
                "H_recv": last["H_recv"], "H_recv_rel": last["H_recv"] / max(last["s_b_sq"], 1e-12),
                "H_rel": last["H"] / max(last["s_b_sq"], 1e-12), "H_A_rel": last["H_A"] / max(last["s_a_sq"], 1e-12),
                "regulariser": session["regulariser"], "num-examples": float(session["sends"].shape[0]),
                MAX_SENDS: float(session["sends"].max()),
                **{f"align_{k}": v for k, v in (session.get("align_metrics") or {}).items()}}


_CLIENTS: dict[int, SplitClient] = {}
_SERVERS: dict[int, ClientTrainer] = {}


def _cached(cache: dict[int, Any], recipe: Recipe, make: Any) -> Any:
    """One model per recipe and process (a Ray actor serves several clients in turn)."""
    if id(recipe) not in cache:
        cache.clear()
        cache[id(recipe)] = make(recipe)
    return cache[id(recipe)]


def _session_path(context: Any) -> Path:
    """Where a client keeps its step's session between messages: a file on the client's machine, named in
    the node's `context.state`. The session holds A, C and the optimiser's moments (about 77 MB
    for the tiny test model); carried in `context.state` itself it travels through the SuperNode's runtime
    API after every message, and on a loaded machine that push did not arrive, the task expired and the
    SuperNode failed the next message (docs/splitft.md "Running split across machines")."""
    return Path(tempfile.gettempdir()) / "splitbench-splitft-sessions" / f"run{context.run_id}_node{context.node_id}.pt"


def _save_session(context: Any, session: dict[str, Any]) -> None:
    from harness.results import atomic_torch_save

    path = _session_path(context)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(session, path)
    context.state["split"] = ConfigRecord({"session": str(path)})


def _load_session(context: Any) -> dict[str, Any]:
    return torch.load(str(context.state["split"]["session"]), weights_only=False)


def split_client_app(recipe: Recipe | None = None) -> Any:
    """The ClientApp of the split deployment; without a recipe it reads the run config's `recipe` path."""
    app = ClientApp()

    def setup(context: Context) -> tuple[Recipe, SplitClient, int]:
        r = recipe or _recipe_from_run_config(context)
        return r, _cached(_CLIENTS, r, SplitClient), int(context.node_config["partition-id"])

    def reply(msg: Message, client: int, tensors: dict[str, torch.Tensor] | None = None,
              extra: dict[str, Any] | None = None) -> Message:
        content = RecordDict({"config": ConfigRecord({"client": client}), **(extra or {})})
        if tensors:
            content["tensors"] = ArrayRecord(torch_state_dict={k: v.detach().contiguous() for k, v in tensors.items()})
        return Message(content=content, reply_to=msg)

    def session_of(msg: Message, context: Context, me: SplitClient, client: int) -> dict[str, Any]:
        """The step's session; the round's first message (it carries the global A and C) starts it."""
        if "arrays" not in msg.content:
            return _load_session(context)
        state = context.state
        steps = int(state["progress"]["steps"]) if "progress" in state else 0
        sends = state["sends"].to_torch_state_dict()["count"] if "sends" in state else None
        adapters = state["adapters"].to_torch_state_dict() if "adapters" in state else None
        return me.start_round(client, int(msg.content["config"]["round"]), msg.content["arrays"].to_torch_state_dict(),
                              steps, sends, adapters)

    @app.train(ALIGN_FORWARD)
    def align_forward(msg: Message, context: Context) -> Message:
        _, me, client = setup(context)
        session = session_of(msg, context, me, client)
        out = me.align_forward(session, int(msg.content["config"]["i"]))
        _save_session(context, session)
        return reply(msg, client, out)

    @app.train(ALIGN_TAIL)
    def align_tail(msg: Message, context: Context) -> Message:
        _, me, client = setup(context)
        session = _load_session(context)
        got = msg.content["tensors"].to_torch_state_dict()
        grad = me.align_tail(session, got["s_b"], got["s_b_obf"])
        _save_session(context, session)
        return reply(msg, client, {"grad_s_b_obf": grad})

    @app.train(ALIGN_FINISH)
    def align_finish(msg: Message, context: Context) -> Message:
        _, me, client = setup(context)
        session = _load_session(context)
        me.align_finish(session, msg.content["tensors"].to_torch_state_dict()["grad_s_a_obf"])
        _save_session(context, session)
        return reply(msg, client)

    @app.train(FORWARD)
    def forward(msg: Message, context: Context) -> Message:
        _, me, client = setup(context)
        session = session_of(msg, context, me, client)
        out = me.forward(session, int(msg.content["config"]["local"]))
        _save_session(context, session)
        return reply(msg, client, out)

    @app.query(MEASURE)
    def measure(msg: Message, context: Context) -> Message:
        """The measurement path: the clean s_A goes up in a `measurement` record, to the evaluator."""
        _, me, client = setup(context)
        s_a = me.measure(_load_session(context))
        return reply(msg, client, None, {"measurement": ArrayRecord(torch_state_dict={"s_a": s_a.contiguous()})})

    @app.train(TAIL)
    def tail(msg: Message, context: Context) -> Message:
        r, me, client = setup(context)
        session = _load_session(context)
        plain = msg.content["measurement"].to_torch_state_dict()["s_b"] if "measurement" in msg.content else None
        grad_m = me.tail(session, msg.content["tensors"].to_torch_state_dict()["s_b"], plain)
        return _after(msg, context, r, me, client, session, None if grad_m is None else {"grad_s_b": grad_m})

    @app.train(FINISH)
    def finish(msg: Message, context: Context) -> Message:
        r, me, client = setup(context)
        session = _load_session(context)
        me.finish(session, msg.content["tensors"].to_torch_state_dict()["grad_s_a"])
        return _after(msg, context, r, me, client, session, None)

    def _after(msg: Message, context: Context, r: Recipe, me: SplitClient, client: int, session: dict[str, Any],
               tensors: dict[str, torch.Tensor] | None) -> Message:
        """Save the session; after the round's last step, reply A, C and the round metrics for FedAvg."""
        if tensors is not None or session.get("local", -1) < int(me.section.local_steps) - 1:
            _save_session(context, session)
            return reply(msg, client, tensors)
        _session_path(context).unlink(missing_ok=True)       # the round is over; what persists is below
        del context.state["split"]
        context.state["sends"] = ArrayRecord(torch_state_dict={"count": session["sends"]})
        context.state["progress"] = ConfigRecord({"steps": int(session["steps_done"])})
        if adapters := me.adapters(session):
            context.state["adapters"] = ArrayRecord(torch_state_dict=adapters)
        if r.truth_dir and session["truth"]:
            torch.save(session["truth"], Path(r.truth_dir) / f"client{client}_round{session['round']}.pt")
        return reply(msg, client, None, {"arrays": ArrayRecord(torch_state_dict=trainable.state(me.trainer.model, me.names)),
                                         "metrics": MetricRecord(me.round_metrics(session))})

    return app


# -- the server's half ------------------------------------------------------------------------------------
class Evaluator:
    """The measurement path's B (module docstring): s_B = B(s_A) on a client's clean s_A, without gradient.
    It shares the server's frozen B (nothing of B leaves the server's process) but not its record: it has
    no sink, so nothing it receives or returns enters the adversary view."""

    def __init__(self, part: Any) -> None:
        self._part = part

    def plain_s_b(self, s_a: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._part.body(s_a, self._part.context(s_a)).detach()


def _server_trainer(recipe: Recipe) -> ClientTrainer:
    check_supported(recipe)
    return ClientTrainer(recipe)     # the pretrained A and C (round 1's global state) and the frozen B


def split_server_app(recipe: Recipe | None, sink: Sink, initial: dict[str, torch.Tensor] | None = None,
                     evaluate: Any = None) -> Any:
    """The ServerApp: B, the message rounds of every step, FedAvg over A and C after each round, and the
    record of what the server received (`sink.exposures`, the simulation's format)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        r = recipe or _recipe_from_run_config(context)
        with round_bar(int(r.section["rounds"])) as bar:
            rounds(grid, context, r, bar)

    def rounds(grid: Grid, context: Context, r: Recipe, bar: Any) -> None:
        server = _cached(_SERVERS, r, _server_trainer)
        part, section = server.part, server.section
        global_state = initial if initial is not None else server.initial_state()
        nodes = _wait_for_nodes(grid, r.n_clients)
        strategy = _recording_fedavg(sink, r.n_clients)
        n_steps = int(section.local_steps)
        obfuscates = make_defence(r.configuration, r.epsilon, section).obfuscates
        evaluator = Evaluator(part)

        def exchange(action: str, contents: dict[int, RecordDict], rnd: int, kind: str = "train") -> dict[int, Any]:
            messages = [Message(content=c, dst_node_id=n, message_type=f"{kind}.{action}", group_id=str(rnd))
                        for n, c in contents.items()]
            replies = list(grid.send_and_receive(messages, timeout=REPLY_TIMEOUT_S))
            errors = [m.error.reason for m in replies if m.has_error()]
            sink.errors += errors
            if errors or len(replies) != len(messages):
                raise RuntimeError(f"split deployment: {action} in round {rnd}: {len(replies)} of {len(messages)} "
                                   f"replies, errors {errors}")
            return {m.metadata.src_node_id: m for m in replies}

        def burst_step(contents: dict[int, RecordDict], rnd: int, local: int, view: bool) -> None:
            """One adapter step of PrivPair's burst before step `local`: B's forward on the public s_A and
            s'_A, and B's backward of ∂L_W1/∂s'_B; recorded (ALIGN_OPS) with the step's id when it is."""
            ups = exchange(ALIGN_FORWARD, contents, rnd)
            held, downs = {}, {}
            for n, msg in ups.items():
                client = int(msg.content["config"]["client"])
                got = msg.content["tensors"].to_torch_state_dict()
                with torch.no_grad():
                    s_b = part.body(got["s_a"], part.context(got["s_a"]))
                up = got["s_a_obf"].requires_grad_(True)
                s_b_obf = part.body(up, part.context(up))
                step = step_id(rnd, client, local, r.n_clients, n_steps)
                held[n] = (client, step, up, s_b_obf)
                if view:
                    for (channel, op), tensor in zip(ALIGN_OPS[:4], (got["s_a"], up, s_b, s_b_obf)):
                        _record(sink, channel, op, None, tensor, step, client, rnd)
                downs[n] = RecordDict({"tensors": ArrayRecord(torch_state_dict={"s_b": s_b, "s_b_obf": s_b_obf.detach()})})
            replies = exchange(ALIGN_TAIL, downs, rnd)
            grads = {}
            for n, msg in replies.items():
                client, step, up, s_b_obf = held[n]
                g_b = msg.content["tensors"].to_torch_state_dict()["grad_s_b_obf"]
                (g_a,) = torch.autograd.grad(s_b_obf, up, grad_outputs=g_b)    # the backward through frozen B
                if view:
                    for (channel, op), tensor in zip(ALIGN_OPS[4:], (g_b, g_a)):
                        _record(sink, channel, op, None, tensor, step, client, rnd)
                grads[n] = RecordDict({"tensors": ArrayRecord(torch_state_dict={"grad_s_a_obf": g_a})})
            exchange(ALIGN_FINISH, grads, rnd)

        for rnd in range(1, int(section.rounds) + 1):
            arrays = ArrayRecord(torch_state_dict=global_state)
            for local in range(n_steps):
                first = {"arrays": arrays} if local == 0 else {}     # with the round's first message
                view = recorded(section, rnd, local)
                for i in range(burst_steps(r.configuration, section, (rnd - 1) * n_steps + local)):
                    burst_step({n: RecordDict({"config": ConfigRecord({"round": rnd, "local": local, "i": i}),
                                                         **first}) for n in nodes}, rnd, local, view)
                    first = {}
                cfg = ConfigRecord({"round": rnd, "local": local})
                ups = exchange(FORWARD, {n: RecordDict({"config": cfg, **first}) for n in nodes}, rnd)
                held, downs = {}, {}
                for n, msg in ups.items():
                    client = int(msg.content["config"]["client"])
                    got = msg.content["tensors"].to_torch_state_dict()
                    up = got["s_a"].requires_grad_(True)                    # what the server received
                    s_b = part.body(up, part.context(up))                   # B, frozen
                    step = step_id(rnd, client, local, r.n_clients, n_steps)
                    held[n] = (client, step, view, up, s_b)
                    if view:
                        _record(sink, CLIENT_WEIGHTS, "theta_a_c", None, got["theta"], step, client, rnd)
                        _record(sink, SMASHED_UP, "s_a", part.k, up, step, client, rnd)
                        _record(sink, SMASHED_DOWN, "s_b", part.m, s_b, step, client, rnd)
                    downs[n] = RecordDict({"tensors": ArrayRecord(torch_state_dict={"s_b": s_b.detach()})})
                if measured(obfuscates, section, rnd, local):
                    # the measurement path, after the protocol's s'_A is in and recorded: the clean s_A goes to
                    # the evaluator only, and its B(s_A) rides down beside s'_B in a `measurement` record
                    clean = exchange(MEASURE, {n: RecordDict({"config": cfg}) for n in nodes}, rnd, kind="query")
                    for n, msg in clean.items():
                        s_b_plain = evaluator.plain_s_b(msg.content["measurement"].to_torch_state_dict()["s_a"])
                        downs[n]["measurement"] = ArrayRecord(torch_state_dict={"s_b": s_b_plain})
                replies = exchange(TAIL, downs, rnd)
                if bool(section.train_head):
                    grads = {}
                    for n, msg in replies.items():
                        client, step, view, up, s_b = held[n]
                        grad_m = msg.content["tensors"].to_torch_state_dict()["grad_s_b"]
                        s_b.backward(grad_m)                                 # the backward through frozen B
                        if view:
                            _record(sink, GRAD_UP, "grad_s_b", part.m, grad_m, step, client, rnd)
                            _record(sink, GRAD_DOWN, "grad_s_a", part.k, up.grad, step, client, rnd)
                        grads[n] = RecordDict({"tensors": ArrayRecord(torch_state_dict={"grad_s_a": up.grad})})
                    replies = exchange(FINISH, grads, rnd)
            # the last step's replies carry A, C and the metrics: Flower's FedAvg, in client order
            ordered = sorted(replies.values(), key=lambda m: int(m.content["config"]["client"]))
            for m in ordered:
                del m.content["config"]
            new, _ = strategy.aggregate_train(rnd, ordered)
            global_state = new.to_torch_state_dict()
            if evaluate is not None:
                sink.evaluations[rnd] = evaluate(global_state)
            show_round(bar, sink.rounds.get(rnd, {}), sink.evaluations.get(rnd, {}))
        sink.final = global_state
        if recipe is None and context.run_config.get("sink"):   # deployment: the caller reads it from disk
            import dataclasses

            torch.save(dataclasses.asdict(sink), str(context.run_config["sink"]))

    return app


def _record(sink: Sink, channel: str, op: str, layer: int | None, tensor: torch.Tensor, step: int, client: int,
            rnd: int) -> None:
    sink.exposures.append({"channel": channel, "op": op, "layer": layer, "step": step, "client": client,
                           "round": rnd, "tensor": tensor.detach().clone()})


def _wait_for_nodes(grid: Any, n: int) -> list[int]:
    deadline = time.monotonic() + NODE_WAIT_S
    while len(nodes := sorted(grid.get_node_ids())) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"split deployment: {len(nodes)} of {n} SuperNodes connected after {NODE_WAIT_S:.0f} s")
        time.sleep(1.0)
    return nodes[:n]


def simulate_split(recipe: Recipe, initial: dict[str, torch.Tensor] | None = None, evaluate: Any = None) -> Sink:
    """The split deployment's apps on Flower's Simulation Runtime (Ray backend), N virtual SuperNodes."""
    from flwr.simulation import run_simulation  # imports Ray (seconds): only where a simulation runs

    quiet_flower()
    sink = Sink()
    cpus = int(recipe.section.get("ray_cpus") or recipe.n_clients)
    run_simulation(server_app=split_server_app(recipe, sink, initial, evaluate),
                   client_app=split_client_app(recipe), num_supernodes=recipe.n_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cpus, "include_dashboard": False,
                                                 "logging_level": "ERROR", "log_to_driver": False}})
    rounds = int(recipe.section["rounds"])
    missing = [r for r in range(1, rounds + 1) if sink.replies.get(r, 0) < recipe.n_clients]
    if sink.final is None or missing:
        raise RuntimeError(f"Flower simulation of the split deployment did not complete: rounds {missing or 'all'} "
                           f"lack client replies (errors {sink.errors}; see the client errors logged above)")
    return sink


# The deployment's app objects, named in a Flower app's pyproject.toml `[tool.flwr.app.components]`:
#     serverapp = "harness.splitft.split_deployment:serverapp"
#     clientapp = "harness.splitft.split_deployment:clientapp"
# with run config keys `recipe` and `sink` as harness/splitft/deployment.py's.
clientapp = split_client_app()
serverapp = split_server_app(None, Sink())
