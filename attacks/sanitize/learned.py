"""A learned inverter for sanitised tokens: ridge regression from the embeddings of a window of sanitised
tokens (t'_{i-w} … t'_{i+w}) to the embedding of the original t_i, trained on public text that the attacker
sanitises itself with the same (public) mechanism and parameters, then the nearest tokens to its prediction.

It learns what a mechanism does systematically (Stencil's blur of the neighbours into each token, CusText+'s
pull towards similar tokens) from data instead of from the mechanism's formula. The attack suite's learned
decoder on the same features and training text is attacks/sanitize/decoder.py. Training text: attacks/data/builtin_corpus.txt (the suite's built-in corpus), seeded
with a seed the evaluation never uses.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from attacks.corpus import BUILTIN_CORPUS, paragraphs
from harness.sanitize import mechanisms
from harness.token_embeddings import Table

# λ relative to the mean diagonal of XᵀX, so the shrinkage does not depend on the table's scale.
HALF_WINDOW, RIDGE = 1, 1e-2
TRAIN_SEED_OFFSET = 7919     # the attacker's own sanitiser draws never repeat the evaluation's


def features(observed: Sequence[Sequence[int]], table: Table, half: int = HALF_WINDOW) -> torch.Tensor:
    """(n, (2·half + 1)·d + 1): the embeddings of each position's window (zeros past a sequence end) and a bias."""
    rows = []
    for seq in observed:
        e = table.vectors[torch.tensor(list(seq), dtype=torch.long)]
        pad = torch.zeros(half, table.dim)
        padded = torch.cat([pad, e, pad])
        cols = [padded[o:o + len(seq)] for o in range(2 * half + 1)]
        rows.append(torch.cat([*cols, torch.ones(len(seq), 1)], dim=1))
    return torch.cat(rows) if rows else torch.empty(0, (2 * half + 1) * table.dim + 1)


def corpus_sequences(tokenizer, max_tokens: int, length: int = 64, path: str | None = None) -> list[list[int]]:
    """The public text at `path` (None: the built-in corpus) as consecutive pieces of `length` tokens, at
    most `max_tokens` in all."""
    text = (Path(path).expanduser() if path else BUILTIN_CORPUS).read_text(encoding="utf-8")
    stream: list[int] = []
    for para in paragraphs(text):
        stream += tokenizer(para, add_special_tokens=False)["input_ids"]
        if len(stream) >= max_tokens:
            break
    stream = stream[:max_tokens]
    return [stream[i:i + length] for i in range(0, len(stream), length) if stream[i:i + length]]


def public_pairs(sanitizer, tokenizer, max_tokens: int, seed: int,
                 path: str | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """(clean, sanitised) pieces of public text (`path`; None: the built-in corpus): the attacker's own
    training text, sanitised with the public mechanism under a seed the evaluation never uses."""
    clean = corpus_sequences(tokenizer, max_tokens, path=path)
    return clean, sanitizer(clean, seed + TRAIN_SEED_OFFSET)


class LearnedInverter:
    """`pairs`: public_pairs(sanitizer, tokenizer, max_tokens, seed) when the caller has them already."""

    def __init__(self, sanitizer, tokenizer, max_tokens: int, seed: int,
                 pairs: tuple[list[list[int]], list[list[int]]] | None = None) -> None:
        self.table, self.settings = sanitizer.table, sanitizer.settings
        clean, noisy = pairs if pairs is not None else public_pairs(sanitizer, tokenizer, max_tokens, seed)
        x = features(noisy, self.table).double()
        y = self.table.vectors[torch.tensor([t for s in clean for t in s], dtype=torch.long)].double()
        gram = x.T @ x
        gram += RIDGE * gram.diagonal().mean() * torch.eye(x.shape[1], dtype=torch.float64)
        self.weights = torch.linalg.solve(gram, x.T @ y).float()
        self.n_train_tokens = int(y.shape[0])

    def rank(self, observed: Sequence[Sequence[int]], k: int) -> list[torch.Tensor]:
        """Per prompt (n_i, k) guesses, nearest to the predicted original embedding first."""
        lengths = [len(s) for s in observed]
        ids = torch.tensor([t for s in observed for t in s], dtype=torch.long)
        if ids.numel() == 0:
            return [torch.empty(0, k, dtype=torch.long) for _ in observed]
        pred = features(observed, self.table) @ self.weights
        exclude = ids if self.settings.mechanism == mechanisms.STENCIL or (
            self.settings.mechanism == mechanisms.DX_STENCIL and not self.settings.may_return_original) else None
        guesses = self.table.nearest(pred, k, exclude=exclude)
        fixed = ~self.table.is_candidate[ids]
        guesses[fixed, 0] = ids[fixed]
        return list(torch.split(guesses, lengths))
