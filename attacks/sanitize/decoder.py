"""The attack suite's learned decoder (attacks/inversion.py) on sanitised tokens: the victim model itself,
frozen, reads the table embeddings of the sanitised tokens through a trained projection (`projection`
mode), the `evidence` head (a learned nearest-embedding reader times the language model) and the
`aligned` layout, and decodes the original text position by position.

What it reads is what leaves the client: the sanitised token ids of the view (prompts.read_view). The
feature row of position i is the table embeddings of t'_{i-1}, t'_i, t'_{i+1} side by side (zeros past a
sequence end; the ridge inverter's window, attacks/sanitize/learned.py): the decoder's attention is
causal, so without the right neighbour it could not undo Stencil's blur of t_{i+1} into t'_i. The
target of position i is t_i (one row per token, as the SpliTEE attack's layer-0 exposures).

Training data are public: the built-in corpus in pieces of 64 tokens, sanitised by the attacker itself
with the same (public) mechanism and parameters and a seed the evaluation never uses
(learned.public_pairs; the ridge and the decoder share one sanitised copy when their token budgets agree),
7/8 of the pieces for training and 1/8 for validation; at most `steps` Adam steps or `minutes` of training
(attacks/inversion.train keeps the parameters with the best validation loss).
Decoding is greedy; the k best tokens of each step's logits (LM + evidence) are its ranked guesses, the
greedy token first. Where the mechanism never returns the original (Stencil; dχ-Stencil with
may_return_original=false) t'_i is struck from position i's guesses after decoding (the decoding itself
continued from the greedy token); a token outside the candidate vocabulary is its own original, as for
every attacker of the suite.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attacks.inversion import (
    Inverter,
    TrainLog,
    TrainSettings,
    build,
    make_examples,
    shuffle_pairs,
    train,
)
from attacks.sanitize import learned
from harness.sanitize import mechanisms
from harness.token_embeddings import Table

HALF_WINDOW = learned.HALF_WINDOW
# The decoder's optimiser: fixed parts of the method, like the rest of train_settings (not options).
BATCH_SIZE = 8
LR = 1e-3


@dataclass(frozen=True)
class DecoderSettings:
    steps: int                 # Adam steps at most
    minutes: float             # wall-clock budget of the training
    corpus_tokens: int         # public training tokens (the built-in corpus, first tokens)
    window: int                # positions per decoded window (prompts are tiled left to right)
    evidence_scale: float      # the evidence head's starting scale s (attacks/inversion.py)

    def train_settings(self, seed: int) -> TrainSettings:
        return TrainSettings(mode="projection", layout="aligned", head="evidence", evidence_scale=self.evidence_scale,
                             window=self.window, batch_size=BATCH_SIZE, lr=LR, max_steps=self.steps,
                             max_minutes=self.minutes,
                             eval_every=max(1, self.steps // 4), val_windows=32, warmup_steps=min(20, self.steps),
                             max_target_tokens=self.window, seed=seed,
                             # projection mode trains no decoder weights; a projection 2 × the decoder's width
                             decoder_lr=1e-4, projection_hidden=None, gen_batch_size=32)


def features(sequence: Sequence[int], table: Table, half: int = HALF_WINDOW) -> torch.Tensor:
    """(n, (2·half + 1)·d): the table embeddings of each position's window of sanitised tokens."""
    return learned.features([sequence], table, half)[:, :-1]   # without the ridge's bias column


def excludes_original(settings: mechanisms.Settings) -> bool:
    return settings.mechanism == mechanisms.STENCIL or (
        settings.mechanism == mechanisms.DX_STENCIL and not settings.may_return_original)


class DecoderInverter:
    """Trained at construction on the sanitised built-in corpus; `rank` reads sanitised sequences. With
    `shuffled`, every training window gets the tokens of another (attacks.inversion.shuffle_pairs): the
    features then say nothing of the targets (a control for tests)."""

    def __init__(self, sanitizer, model, tokenizer, settings: DecoderSettings, seed: int,
                 shuffled: bool = False, pairs: tuple[list[list[int]], list[list[int]]] | None = None) -> None:
        self.table, self.mechanism = sanitizer.table, sanitizer.settings
        self.settings = settings
        self.train_settings = settings.train_settings(seed)
        clean, noisy = pairs if pairs is not None else learned.public_pairs(sanitizer, tokenizer,
                                                                             settings.corpus_tokens, seed)
        if len(clean) < 2:
            raise ValueError("the learned decoder needs at least 2 corpus pieces (decoder_corpus_tokens)")
        cut = len(clean) - max(1, len(clean) // 8)
        feats = [features(s, self.table).half() for s in noisy]   # float16: the projection standardises in fp32
        w = settings.window
        train_ex = make_examples(feats[:cut], clean[:cut], True, w, w, phases=(0, max(1, w // 2)))
        val_ex = make_examples(feats[cut:], clean[cut:], True, w, w)
        if shuffled:
            train_ex, val_ex = shuffle_pairs(train_ex, seed), shuffle_pairs(val_ex, seed + 1)
        self.inverter: Inverter = build(model, int(feats[0].shape[1]), self.train_settings)
        self.log: TrainLog = train(self.inverter, train_ex, val_ex, self.train_settings)
        self.n_train_tokens = sum(len(s) for s in clean[:cut])

    def rank(self, observed: Sequence[Sequence[int]], k: int) -> list[torch.Tensor]:
        """Per prompt (n_i, k) guesses for the original tokens, the greedy decoding first."""
        exclude = excludes_original(self.mechanism)
        extra = 1 if exclude else 0
        seqs = [list(map(int, seq)) for seq in observed]
        w = self.settings.window
        examples = make_examples([features(seq, self.table) for seq in seqs], seqs, True, w, w)
        ranked = self.inverter.generate_ranked(examples, self.train_settings.gen_batch_size, k + extra)
        parts: list[list[tuple[int, torch.Tensor]]] = [[] for _ in observed]
        for ex, g in zip(examples, ranked):
            parts[ex.prompt].append((ex.start, g))
        out = []
        for seq, pieces in zip(observed, parts):
            ids = torch.tensor(list(seq), dtype=torch.long)
            if not pieces:
                out.append(torch.empty(0, k, dtype=torch.long))
                continue
            g = torch.cat([p for _, p in sorted(pieces, key=lambda p: p[0])])
            if exclude:
                # Move t'_i to the end of its row (k + 1 entries), keeping the order of the rest.
                order = torch.sort((g == ids.unsqueeze(1)).int(), dim=1, stable=True).indices
                g = g.gather(1, order)
            g = g[:, :k].clone()
            fixed = ~self.table.is_candidate[ids]
            g[fixed, 0] = ids[fixed]
            out.append(g)
        return out

    def record(self) -> dict:
        s = self.train_settings
        return {"mode": s.mode, "layout": s.layout, "head": s.head, "window": s.window, "half_window": HALF_WINDOW,
                "n_train_tokens": self.n_train_tokens, **self.log.record()}
