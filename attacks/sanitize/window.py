"""Stencil's window inverter: the attacker knows L, σ and E, so it knows φ̃ = F·E[t] for the banded
weight matrix F (mechanisms.window_matrix). It takes E[t'] for φ̃ (t' is the token nearest φ̃), solves
for the originals' embeddings with a ridge pull towards E[t'],

    X = argmin ‖F X − E[t']‖² + λ‖X − E[t']‖²   ⇒   (FᵀF + λI) X = (Fᵀ + λI) E[t'],

and ranks the candidates by distance to each row of X, without t'_i itself where the mechanism never returns
the original (Stencil; dχ-Stencil with may_return_original=false)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.sanitize import mechanisms
from harness.sanitize.mechanisms import Settings
from harness.token_embeddings import Table

RIDGE = 0.1


def rank(observed: Sequence[Sequence[int]], table: Table, settings: Settings, k: int,
         ridge: float = RIDGE) -> list[torch.Tensor]:
    """Per prompt (n_i, k) guesses for the original tokens, nearest to the inverted embedding first."""
    out = []
    exclude_original = settings.mechanism == mechanisms.STENCIL or (
        settings.mechanism == mechanisms.DX_STENCIL and not settings.may_return_original)
    for seq in observed:
        ids = torch.tensor(list(seq), dtype=torch.long)
        if ids.numel() == 0:
            out.append(torch.empty(0, k, dtype=torch.long))
            continue
        f = mechanisms.window_matrix(len(ids), settings.window, settings.sigma).double()
        y = table.vectors[ids].double()
        eye = torch.eye(len(ids), dtype=torch.float64)
        x = torch.linalg.solve(f.T @ f + ridge * eye, (f.T + ridge * eye) @ y).float()
        guesses = table.nearest(x, k, exclude=ids if exclude_original else None)
        fixed = ~table.is_candidate[ids]
        guesses[fixed, 0] = ids[fixed]
        out.append(guesses)
    return out
