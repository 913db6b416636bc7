"""The paper's inversion attacker (§4.3): rank the vocabulary by the distance of each token's embedding to
the embedding of the substituted token t'; Pr@k counts the original among the first k. t' itself (at
distance 0) ranks first, so a token the mechanism kept is always recovered."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.token_embeddings import Table


def rank(observed: Sequence[Sequence[int]], table: Table, k: int, chunk: int = 256) -> list[torch.Tensor]:
    """Per prompt (n_i, k) ranked guesses: t' first, then its k − 1 nearest candidates."""
    lengths = [len(s) for s in observed]
    ids = torch.tensor([t for s in observed for t in s], dtype=torch.long)
    if ids.numel() == 0:
        return [torch.empty(0, k, dtype=torch.long) for _ in observed]
    near = table.nearest(table.vectors[ids], max(k - 1, 1), exclude=ids, chunk=chunk)[:, :k - 1]
    guesses = torch.cat([ids.unsqueeze(1), near], dim=1)
    return list(torch.split(guesses, lengths))
