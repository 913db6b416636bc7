"""Labels as next tokens, read back from a gradient: what the gradient attackers of split training share
(split FT's BiSR(b), attacks/splitft/bisr_backward.py; the gradient audit's, attacks/grad_audit/bisr_backward.py),
and their floor, the constant most-frequent-token guess.

`match_labels` is BiSR's backward attack, BiSR(b) (Chen et al. 2024, arXiv 2409.00960; paper 002 ref. [23]):
recover the labels, which in LLM fine-tuning are the next tokens, from the gradient sent up at the cut.

The attacker (split FT's server, the audit's cloud) holds s'_B (it computed it), the top part C as of the step
(the strong threat model) and the intercepted g = ∂L/∂s'_B (`grad_up`). It optimises soft labels Y = softmax(Z), one distribution over the
vocabulary per position, so that the gradient the same loss would give with Y in place of the true
labels, ∂ℓ(f_C(s'_B), Y)/∂s'_B, matches g; each position's guess is argmax Z. This is gradient matching
(DLG/TAG) on the top part, as the authors' SplitLLM code runs it after its learned SIP guess
(`DLGAttacker.fit`, read 2026-12-01). What we take, and what we chose:

- The distance: β·‖Δ‖² + (1 − β)·‖Δ‖₁ between the two gradients (theirs, β = 0.85), with both divided by
  the RMS of g first. The true gradient is the mean over every token of the batch, so its entries are
  tiny (≈1e-6 on SmolLM2) and AdamW's ε would otherwise swamp the step; the division changes no minimum.
- The loss normalisation: ℓ is the mean next-token cross-entropy over all rows × (T − 1) positions of
  the recorded batch (harness/splitft/step.py), so each row's predicted gradient is divided by that
  count, which the attacker knows from the shapes it received. Rows are independent through C, so the
  rows attacked (`max_examples`) are matched on their own.
- The start: Z = f_C(s'_B) / temperature, the attacker's own decoding (attacks/splitft/label.py), in place
  of the SIP inverter's logits, which we do not train. Y then starts at the model's prediction, where
  the predicted gradient is (nearly) zero; what moves it is the part of g the prediction does not explain.
- Against the guard on `grad_up` (harness/splitft/defences.GradientGuard: a per-token clip at c, then
  Gaussian noise), which the protocol publishes, each row that arrives at norm c is first scaled back up to
  the norm of the gradient the model's own next-token guesses would give. A clipped row keeps only the
  direction of J_Cᵀ(p − Y); with V ≫ d many dense small changes of Y share it, and matching at norm c finds
  one of them, not the label (tests/splitft/test_splitft.py checks this on the tiny model), while the one-hot label
  is the only distribution that also has the unclipped norm. The noise it cannot undo.
- Under the guard's noise (`prior`, the default), it is a MAP estimate, not a plain match: the guard
  publishes σ = z·c, so the loss is the Gaussian negative log-likelihood Σ‖ĝ − g‖²/(2σ_r²) (σ_r the noise
  of row r, scaled with the row as above) plus the labels' expected negative log prior under the server's
  own decoding, −Σ_t Σ_v Y_tv log p_C(v | s'_B)_t, both in nats. Matching the noise alone pulls the guesses
  off that prior: on SmolLM2 at z = 1 the plain match read 10 % token F1 where its own start read 34 %
  (docs/results/splitft_grad_guard). With the prior, the gradient moves a guess only as far as its
  likelihood outweighs the decoding, so heavy noise leaves the guesses at the decoding, not below it.
  `prior=False` is the authors' plain distance under noise too (the alternative).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F


def unclipped(grad: torch.Tensor, guard: dict[str, float], s_b: torch.Tensor, log_p: torch.Tensor,
              n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`grad` with every row the guard clipped scaled by m/c, m the norm that row has when the labels are
    the model's own argmax guesses (module docstring); `log_p` was computed from `s_b`. Without noise a
    clipped row is one at norm c; with noise, one whose m exceeds c. The noise is scaled with the row: the
    second tensor is each row's factor (1 where it was not clipped)."""
    clip = float(guard["clip"])
    guess = -log_p.gather(-1, log_p.argmax(-1, keepdim=True)).sum() / n_tokens
    (own,) = torch.autograd.grad(guess, s_b, retain_graph=True)
    own = own.norm(dim=-1, keepdim=True).detach()
    if guard["noise_multiplier"] > 0:
        clipped = own > clip
    else:
        clipped = grad.norm(dim=-1, keepdim=True) >= clip * (1 - 1e-4)
    factor = torch.where(clipped, own / clip, torch.ones_like(own))
    return grad * factor, factor


def match_labels(part: Any, s_b: torch.Tensor, grad: torch.Tensor, n_tokens: int, *, steps: int, lr: float,
                 beta: float, temperature: float, guard: dict[str, float] | None = None,
                 prior: bool = True) -> list[list[int]]:
    """Label guesses (rows, T − 1) for the rows of s'_B `s_b` whose intercepted gradient is `grad`; the
    loss they came from was a mean over `n_tokens` label positions; `guard`: the view's `grad_up` meta;
    `prior`: under the guard's noise, the MAP loss (module docstring) in place of the plain distance."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s = s_b.detach().clone().requires_grad_(True)
    # The match differentiates a gradient (double backward); the fused CPU attention kernels have no
    # derivative of their backward, the math one is plain differentiable ops.
    with sdpa_kernel(SDPBackend.MATH):
        logits = part.tail(s, part.context(s))[:, :-1]
    z = (logits.detach() / temperature).clone().requires_grad_(True)
    log_p = F.log_softmax(logits, dim=-1)
    sigma = None
    if guard:
        grad, factor = unclipped(grad, guard, s, log_p, n_tokens)
        if prior and guard["noise_multiplier"] > 0:
            sigma = float(guard["noise_multiplier"]) * float(guard["clip"]) * factor   # per row, (rows, T, 1)
    if sigma is None:
        scale = grad.pow(2).mean().sqrt().clamp_min(torch.finfo(grad.dtype).tiny)
        target = grad / scale
    optimiser = torch.optim.AdamW([z], lr=lr, eps=1e-6, weight_decay=0.01)
    for _ in range(steps):
        optimiser.zero_grad()
        y = F.softmax(z, dim=-1)
        loss = -(y * log_p).sum() / n_tokens
        (predicted,) = torch.autograd.grad(loss, s, create_graph=True)
        if sigma is None:
            diff = predicted / scale - target
            distance = beta * diff.pow(2).sum() + (1 - beta) * diff.abs().sum()
        else:   # MAP: the Gaussian likelihood of what arrived, plus the decoding's prior on the labels
            distance = ((predicted - grad) / sigma).pow(2).sum() / 2 - (y * log_p.detach()).sum()
        distance.backward(inputs=[z], retain_graph=True)
        optimiser.step()
    return z.detach().argmax(-1).tolist()


def constant_guesses(labels: list[list[int]]) -> list[list[int]]:
    """The label floor: every position guessed as the most frequent token over all `labels` (ties: the
    smallest id, so the floor does not depend on the order of the examples)."""
    counts = Counter(t for row in labels for t in row)
    if not counts:
        return [[] for _ in labels]
    top = max(counts.values())
    mode = min(t for t, c in counts.items() if c == top)
    return [[mode] * len(row) for row in labels]


def top1(ref: Sequence[int], hyp: Sequence[int]) -> float:
    """Position-wise top-1 (%) of one guess against its labels."""
    n = max(len(ref), 1)
    return 100.0 * sum(int(a == b) for a, b in zip(ref, hyp)) / n


def top1_floor(labels: list[list[int]]) -> float:
    """The constant guess's top-1 (%), averaged over examples (split FT's `label_top1_floor`)."""
    return sum(top1(r, g) for r, g in zip(labels, constant_guesses(labels))) / len(labels) if labels else 0.0
