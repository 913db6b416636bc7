"""The attack suite's learned inverter (attacks/inversion.py: `build`, `train`, `make_examples`) on the
smashed data s'_A: EIA's learned form (paper 002 §II, ref. [19], "trains an inverse mapper").

The server trains it on public data it can compute itself: the blocks of D_align (public by the
protocol) through its white-box A, at the weights of every recorded step (`client_weights`, the strong
threat model), so the (s_A, tokens) pairs are exactly what an undefended client would have sent for
that text. Then it reads each recorded s'_A. It is not adapted to a defence (it never sees W1's output
or the DP noise in training); an adaptive server could train on the `align_up` pairs PrivPair sends
(not done).

The inverter: the pretrained model as its decoder (a frozen copy; `mode=projection` trains only the
projection), the aligned layout and the `evidence` head by default (position-wise exposures: a learned
nearest-embedding reader times the language model, attacks/inversion.py), one window per block.

Unlike the optimisation attacks it is trained on (exposure, text) pairs, so its negative control is
real: the same inverter trained on shuffled pairs (`attacks/inversion.shuffle_pairs`), scored against its
own exposure-free reference (attacks/splitft/cell.py).
"""
from __future__ import annotations

import copy as copy_module
from collections.abc import Sequence
from typing import Any

import torch

from attacks.inversion import (
    Example,
    TrainLog,
    TrainSettings,
    build,
    make_examples,
    shuffle_pairs,
    train,
)
from attacks.splitft.white_box import PRETRAINED, ServerCopy
from harness.splitft.step import SMASHED_UP


def settings_from(section: Any, seq_len: int) -> TrainSettings:
    """TrainSettings of attacks/inversion.py from `splitft.attack.inverter`; one window per block."""
    steps = int(section.max_steps)
    return TrainSettings(mode=str(section.mode), layout=str(section.layout), head=str(section.head),
                         window=seq_len, batch_size=int(section.batch_size), lr=float(section.lr),
                         max_steps=steps, max_minutes=float(section.max_minutes),
                         eval_every=max(1, steps // 4), warmup_steps=min(20, steps),
                         max_target_tokens=seq_len, seed=0,
                         # the SpliTEE attack's values (conf/splitee/default.yaml attack.train) for what the section leaves out
                         evidence_scale=10.0, decoder_lr=1e-4, val_windows=64, projection_hidden=None,
                         gen_batch_size=32)


def public_examples(copy: ServerCopy, public: torch.Tensor, steps: Sequence[int], window: int) -> list[Example]:
    """(s_A, tokens) of the public blocks through A at each of `steps`' weights."""
    out: list[Example] = []
    for step in steps:
        part = copy.at(step)
        with torch.no_grad():
            s_a, _ = part.head(public)
        out += make_examples(list(s_a), public.tolist(), True, window, window)
    return out


def trained(copy: ServerCopy, public: Sequence[Sequence[int]], settings: TrainSettings,
            shuffled: bool = False) -> tuple[Any, TrainLog]:
    """An inverter trained on the public blocks (3/4 train, 1/4 validation, split by block), and its training
    log (whose loss curves the runner logs as W&B step history)."""
    blocks = torch.as_tensor(public, dtype=torch.long)
    if blocks.shape[0] < 2:
        raise ValueError("the learned inverter needs at least 2 public blocks (splitft.data.n_align)")
    steps = sorted({e.step for e in copy.view.select(channel=SMASHED_UP)})
    cut = max(1, (3 * blocks.shape[0]) // 4)
    train_ex = public_examples(copy, blocks[:cut], steps, settings.window)
    val_ex = public_examples(copy, blocks[cut:], steps, settings.window)
    if shuffled:
        train_ex, val_ex = shuffle_pairs(train_ex, settings.seed), shuffle_pairs(val_ex, settings.seed + 1)
    copy.at(PRETRAINED)
    decoder = copy_module.deepcopy(copy.model)       # the decoder keeps the pretrained weights
    inv = build(decoder, int(train_ex[0].features.shape[-1]), settings)
    return inv, train(inv, train_ex, val_ex, settings)


def read(inv: Any, copy: ServerCopy, max_examples: int, batch_size: int = 32) -> list[tuple[int, int, list[int]]]:
    """(step, row, recovered input ids) for up to `max_examples` rows of the recorded s'_A."""
    keys, examples = [], []
    for exposure in copy.view.select(channel=SMASHED_UP):
        for row, features in enumerate(exposure.tensor):
            if len(keys) >= max_examples:
                break
            length = features.shape[0]
            examples.append(Example(features, [0] * length, len(keys), 0))
            keys.append((exposure.step, row))
    guesses = inv.reconstruct(examples, len(keys), batch_size) if examples else []
    return [(s, r, g) for (s, r), g in zip(keys, guesses)]
