"""BiSR's backward attack, BiSR(b) (Chen et al. 2024, arXiv 2409.00960; paper 002 ref. [23]), on split FT's
recorded view: recover the labels, which in LLM fine-tuning are the next tokens, from the gradient the client
sends up at cut m. The server holds s'_B (it computed it), the client's C as of the step (the strong threat
model) and the intercepted g = ∂L/∂s'_B (`grad_up`); the gradient matching itself, and what we chose for it,
is attacks/labels.py `match_labels`, which the gradient audit's attacker shares.

- Against PrivPair the gradient was taken at the client's ŝ_B = W2(s'_B, δ_A) and W2 never leaves the
  client, so the server differentiates f_C at s'_B: a mismatch the defence's design relies on.

The positive control needs the undefended gradient of the same step and weights: the evaluator computes
it from the truth (`undefended_gradients`), the only place where labels meet this attack.
"""
from __future__ import annotations

from typing import Any

import torch

from attacks.labels import match_labels
from attacks.splitft.white_box import ServerCopy
from harness.adversary_view import AdversaryView, Exposure
from harness.splitft.privpair import token_ce
from harness.splitft.step import GRAD_UP, SMASHED_DOWN


def _smashed_down(view: AdversaryView) -> dict[int, torch.Tensor]:
    return {e.step: e.tensor for e in view.select(channel=SMASHED_DOWN)}


def bisr_backward(copy: ServerCopy, *, steps: int, lr: float, beta: float, temperature: float,
                  max_examples: int, prior: bool = True, weights: str = "step") -> list[tuple[int, int, list[int]]]:
    """(step, row, label guesses for positions 0..T-2) for up to `max_examples` rows of the recorded
    gradients, in the view's order (the order BiSR(f) reads s'_A in); `prior`: match_labels'. `weights`:
    the C it differentiates, `step` the client's C as of the step (the strong threat model) or
    `round_start` the global C the round started from (what a server that only runs FedAvg holds; every
    step's round start must be in the view: white_box.ServerCopy.round_start)."""
    down = _smashed_down(copy.view)
    guard = copy.view.meta["splitft"].get("grad_up")
    out: list[tuple[int, int, list[int]]] = []
    for exposure in copy.view.select(channel=GRAD_UP):
        if len(out) >= max_examples:
            break
        grad = exposure.tensor
        rows = min(grad.shape[0], max_examples - len(out))
        n_tokens = grad.shape[0] * (grad.shape[1] - 1)
        source = exposure.step if weights == "step" else copy.round_start(exposure.step)
        guesses = match_labels(copy.at(source), down[exposure.step][:rows], grad[:rows], n_tokens,
                               steps=steps, lr=lr, beta=beta, temperature=temperature, guard=guard, prior=prior)
        out += [(exposure.step, row, ids) for row, ids in enumerate(guesses)]
    return out


def undefended_gradients(view: AdversaryView, copy: ServerCopy, truth: dict[int, dict[str, Any]],
                         max_examples: int) -> AdversaryView:
    """`view` (the control's: it holds the undefended s_B, attacks/splitft/suite.plain_view) with the
    `grad_up` exposures bisr_backward reads (up to `max_examples` rows, in the view's order) replaced by
    ∂ℓ/∂s_B of the undefended s_B under the true labels and the step's weights (from `copy`): what the
    client would have sent without a defence or guard, the positive control's input. The view's meta
    publishes no guard."""
    exposures, rows = [], 0
    for e in view.exposures:
        if e.channel == GRAD_UP and rows < max_examples:
            rows += e.tensor.shape[0]
            part = copy.at(e.step)
            s = truth[e.step]["s_b"].detach().clone().requires_grad_(True)
            with torch.enable_grad():
                loss = token_ce(part.tail(s, part.context(s)), truth[e.step]["ids"]).mean()
                (g,) = torch.autograd.grad(loss, s)
            e = Exposure(e.op, e.layer, e.step, e.shape, g.detach(), e.channel)
        exposures.append(e)
    return AdversaryView(exposures, unguarded(view.meta))


def unguarded(meta: dict[str, Any]) -> dict[str, Any]:
    """A view meta that publishes no guard on `grad_up` (BiSR(b) then matches the gradient as it is)."""
    return {**meta, "splitft": {**meta["splitft"], "grad_up": None}}
