"""EIA-style inversion of the smashed data (paper 002 §II, ref. [19]), the optimisation form: the server
looks for input embeddings whose head output matches what it received, then reads each position's
nearest vocabulary embedding (cosine).

    x* = argmin_x Σ_t [1 − cos(A(x)_t, s'_A,t)] + ‖A(x)_t − s'_A,t‖² / ‖s'_A,t‖²
    token_t = argmax_v cos(x*_t, E_v)

Adam from the mean vocabulary embedding for `steps` steps, learning rate `lr` × the standard deviation of
the embedding matrix (the scale x lives at). Per-token terms, not one MSE over the whole tensor: a few
positions of an LLM's residual stream carry norms many times the rest (the first token's), and a global
MSE spends its steps on those. On SmolLM2-135M (a 64-token WikiText passage, plain s_A) this recovered 66%
of tokens at k = 1 in 100 steps and 17% at k = 2 in 300 steps, where the global MSE at lr 0.1 recovered none
(probe run 2026-12-01).

A is the client's head as of that step (`client_weights`), its input the embedding output (so dχ noise
on the embeddings is what x* finds, and the nearest token is dχ's own decoder). Reads `smashed_up` only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attacks.splitft.white_box import ServerCopy
from harness.splitft.step import SMASHED_UP


def invert(part, target: torch.Tensor, vocab: torch.Tensor, steps: int, lr: float) -> list[list[int]]:
    """Token ids per row of one s'_A (batch, seq, d)."""
    x = vocab.mean(0).expand_as(target).clone().requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=lr * float(vocab.std()))
    scale = target.pow(2).mean(-1).clamp_min(1e-12)
    for _ in range(steps):
        optimiser.zero_grad()
        out = part.run_layers(x, part.context(x), 0, part.k)
        loss = (1 - F.cosine_similarity(out, target, dim=-1)).mean() + ((out - target).pow(2).mean(-1) / scale).mean()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        sims = F.normalize(x.detach(), dim=-1) @ F.normalize(vocab, dim=-1).T
    return sims.argmax(-1).tolist()


def eia(copy: ServerCopy, steps: int, lr: float, max_examples: int) -> list[tuple[int, int, list[int]]]:
    """(step, row, recovered input ids) for up to `max_examples` rows of the recorded s'_A."""
    out: list[tuple[int, int, list[int]]] = []
    for exposure in copy.view.select(channel=SMASHED_UP):
        if len(out) >= max_examples:
            break
        target = exposure.tensor[: max_examples - len(out)]
        part = copy.at(exposure.step)
        for row, ids in enumerate(invert(part, target, copy.vocab_embeddings.detach(), steps, lr)):
            out.append((exposure.step, row, ids))
    return out
