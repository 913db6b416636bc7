"""One split training step (paper 002 §III, §V-A): A on the client, B on the server, C on the client, and
every tensor that crosses the two cuts, in the order the protocol sends it.

    client  e = embed(x) (→ dχ noise) ; s_A = A(e) ; s'_A = send(s_A)          ──s'_A──▶ server  [smashed_up]
    server  s'_B = B(s'_A)                                                     ◀──s'_B── client  [smashed_down]
    client  ŝ_B = recover(s'_B, s_A, s'_A) ; L = ℓ(C(ŝ_B), y) ; backward to C and ∂L/∂s'_B (→ guard)
                                                                               ──∂L/∂s'_B──▶ server [grad_up]
    server  backward through the frozen B: ∂L/∂s'_A                            ◀──∂L/∂s'_A── client [grad_down]
    client  backward through send() and A (+ the regulariser's gradient); optimiser step on A and C
    the server knows the client's weights after every step (the strong threat model); the recorded
    steps store θ_A, θ_C as of the step's start (after the previous one): the weights that computed its
    crossings                                                                            [client_weights]

The server's half runs in the client's process (one machine), on its own detached copies of what it
received, so nothing but those tensors links the two halves' autograd graphs: a gradient the client did
not send cannot reach B, and B's output reaches C only as the leaf the client received.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.splitft.privpair import sq_norm, token_ce

# Channels of the adversary view (harness/adversary_view.py Exposure.channel); the server sees them all.
SMASHED_UP, SMASHED_DOWN = "smashed_up", "smashed_down"
GRAD_UP, GRAD_DOWN = "grad_up", "grad_down"
CLIENT_WEIGHTS, ALIGN_UP, ALIGN_DOWN = "client_weights", "align_up", "align_down"
CHANNELS = (SMASHED_UP, SMASHED_DOWN, GRAD_UP, GRAD_DOWN, CLIENT_WEIGHTS, ALIGN_UP, ALIGN_DOWN)
# what crosses in one step of PrivPair's burst on D_align (harness/splitft/privpair.py PrivPair.burst), in order
ALIGN_OPS = ((ALIGN_UP, "s_a_public"), (ALIGN_UP, "s_a_obf_public"), (ALIGN_DOWN, "s_b_public"),
             (ALIGN_DOWN, "s_b_obf_public"), (ALIGN_UP, "grad_s_b_obf_public"), (ALIGN_DOWN, "grad_s_a_obf_public"))


@dataclass
class Recorder:
    """The crossings of the recorded steps of one client and round (what goes into the view), and the
    evaluator's truth beside them (token ids, the plain s_A and s_B), which never reaches the server."""

    step: int = 0
    exposures: list[dict[str, Any]] = field(default_factory=list)
    truth: list[dict[str, Any]] = field(default_factory=list)

    def add(self, channel: str, op: str, layer: int | None, tensor: torch.Tensor) -> None:
        # What the server sees is recorded as it crosses: on the CPU, a floating tensor in float32 (the model's
        # dtype stays inside its blocks: harness/partition.py).
        t = tensor.detach().to(device="cpu", dtype=torch.float32 if tensor.is_floating_point() else tensor.dtype,
                               copy=True)
        self.exposures.append({"channel": channel, "op": op, "layer": layer, "step": self.step, "tensor": t})

    def align(self, *tensors: torch.Tensor) -> None:
        """Every crossing of one burst step, in ALIGN_OPS' order."""
        assert len(tensors) == len(ALIGN_OPS)
        for (channel, op), t in zip(ALIGN_OPS, tensors):
            self.add(channel, op, None, t)


def split_step(part: Any, defence: Any, ids: torch.Tensor, optimizer: torch.optim.Optimizer, *,
               record: Recorder | None = None, measure: bool = False,
               guard: Callable[[torch.Tensor], torch.Tensor] | None = None,
               send_gradient: bool = True) -> dict[str, float]:
    """One step on a batch of token blocks `ids` (batch, seq); returns the loss and, with `measure`,
    H = E‖ŝ_B − s_B‖² and H_A = E‖s'_A − s_A‖² (per token vector, mean over tokens; s_B = B(s_A) plain).
    `guard` (harness/splitft/defences.GradientGuard) changes ∂L/∂s'_B before it goes up; A then trains on
    what the server's backward makes of the guarded gradient. `send_gradient` false (A frozen,
    `splitft.train_head=false`): nothing goes back up; only C (and PrivPair's adapters, in their bursts)
    train."""
    plain = None
    if record is not None or (measure and defence.obfuscates):
        with torch.no_grad():   # the undefended crossings of the same batch and weights: the positive controls
            plain_a, _ = part.head(ids)
            plain = (plain_a, part.body(plain_a, part.context(plain_a)))
    e = defence.embed(part.embed(ids))
    ctx = part.context(e)
    s_a = part.run_layers(e, ctx, 0, part.k)
    s_a_sent = defence.send(s_a)
    up = s_a_sent.detach().requires_grad_(True)            # what the server received
    s_b_srv = part.body(up, ctx)
    down = s_b_srv.detach().requires_grad_(True)           # what the client received
    s_b_hat = defence.recover(down, s_a.detach(), up.detach())
    loss = token_ce(part.tail(s_b_hat, ctx), ids).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()                                         # C, and ∂L/∂s'_B at cut m
    reg = defence.regulariser(e, s_a)
    grad_m = grad_k = None
    if send_gradient:
        grad_m = down.grad if guard is None else guard(down.grad)
        s_b_srv.backward(grad_m)                            # the server's backward through frozen B
        grad_k = up.grad
        if reg is None:
            s_a_sent.backward(grad_k)
        else:
            torch.autograd.backward([s_a_sent, reg], [grad_k, torch.ones_like(reg)])
    elif reg is not None:   # config.validate refuses NoPeek with A frozen: its regulariser acts on A
        raise ValueError("a regulariser on A needs A to train (send_gradient=True)")
    optimizer.step()
    out = {"loss": float(loss.detach()), "regulariser": float(reg.detach()) if reg is not None else 0.0}
    if measure:
        with torch.no_grad():
            s_a_plain, s_b_plain = plain if plain is not None else (s_a.detach(), down.detach())
            # H_recv = E‖s'_B − s_B‖²: what C would get without a recovery (PrivPair's W2), beside H
            out.update(H=float(sq_norm(s_b_hat.detach() - s_b_plain)), H_recv=float(sq_norm(down.detach() - s_b_plain)),
                       H_A=float(sq_norm(up.detach() - s_a_plain)),
                       s_a_sq=float(sq_norm(s_a_plain)), s_b_sq=float(sq_norm(s_b_plain)))
    if record is not None:
        record.add(SMASHED_UP, "s_a", part.k, up)
        record.add(SMASHED_DOWN, "s_b", part.m, down)
        if send_gradient:
            record.add(GRAD_UP, "grad_s_b", part.m, grad_m)
            record.add(GRAD_DOWN, "grad_s_a", part.k, grad_k)
        record.truth.append({"step": record.step, "ids": ids.detach().clone(), "s_a": plain[0], "s_b": plain[1]})
    return out
