"""One seed of the audit: train the decoy trainer for `frames` steps, recording every frame, then measure
its held-out cross-entropy. The seed fixes the trainer's secrets and which blocks fill each frame."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.adversary_view import AdversaryView
from harness.grad_audit.data import Blocks
from harness.grad_audit.trainer import DecoyTrainer, FrameTruth, TopologySettings
from harness.progress import progress


@dataclass
class SeedRun:
    seed: int
    view: AdversaryView          # what the cloud received
    truth: FrameTruth            # what it did not
    losses: list[float]
    heldout_ce: torch.Tensor     # (heldout_blocks,) of the split pipeline after training
    clip_record: list[tuple[float, int, int]]   # mitigated frames: (clip, positions clipped, real positions carrying a gradient)
    ce_curve: list[tuple[int, float]]           # (frames trained, mean held-out CE) at the curve's points


def _pick(pool: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """n blocks of `pool`, without replacement where the pool is large enough."""
    if pool.shape[0] >= n:
        return pool[torch.randperm(pool.shape[0], generator=generator)[:n]]
    return pool[torch.randint(pool.shape[0], (n,), generator=generator)]


def train_seed(model: nn.Module, blocks: Blocks, settings: TopologySettings, *, seed: int, frames: int,
               real_rows: int, decoy_rows: int, meta: dict, desc: str, init_blocks: int,
               curve_points: int, cloud_output_frames: int = 0) -> SeedRun:
    """`cloud_output_frames`: the view also holds the cloud's s_B of the last that many frames (the BiSR
    backward attacker's input; kept to those frames for memory)."""
    trainer = DecoyTrainer(model, settings, seed)
    data_gen = torch.Generator().manual_seed(10_000 + int(seed))
    if settings.init == "least_squares":
        trainer.warm_start(_pick(blocks.train, init_blocks, torch.Generator().manual_seed(20_000 + int(seed))))
    view, truth, losses = AdversaryView(meta={**meta, "seed": int(seed)}), FrameTruth(), []
    # The held-out CE curve: at `curve_points` evenly spaced frame counts, the last one the final model.
    marks = {max(1, round(frames * (j + 1) / curve_points)) for j in range(curve_points)}
    curve: list[tuple[int, float]] = []
    final = None
    for i in progress(range(frames), desc=desc, unit="frame"):
        parity = i % 2
        real = _pick(blocks.half(parity), real_rows, data_gen)
        decoys = _pick(blocks.train, decoy_rows, data_gen)
        losses.append(trainer.step(real, decoys, view, truth, i, parity,
                                   record_cloud_output=i >= frames - cloud_output_frames))
        if i + 1 == frames:
            final = trainer.heldout_ce(blocks.heldout)
            curve.append((i + 1, float(final.mean())))
        elif i + 1 in marks:
            point = trainer.heldout_ce(blocks.heldout, generator=torch.Generator().manual_seed(30_000 + int(seed) + i))
            curve.append((i + 1, float(point.mean())))
    return SeedRun(int(seed), view, truth, losses, final, trainer.clip_record, curve)
