"""What a collaborative decoding step fuses and what every defence implements (paper 003 §2.2, eq. 3).

`fuse` is the fusion rule, `Upload` what the edge uploads in cloud-side fusion, and `Defence` the interface
(the undefended edge: upload p_S, select argmax p_fuse). The cloud-side defences (harness/collab/defences.py)
and the edge-side baselines (harness/collab/edge_baselines.py) both build on it; defences.make_defence picks
among all of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Upload:
    probs: torch.Tensor          # (V,) float64; 0 where nothing is uploaded
    ids: torch.Tensor | None     # the uploaded ids (sparse uploads), None for a dense upload


def fuse(p_L: torch.Tensor, p_S: torch.Tensor, alpha: float) -> torch.Tensor:
    """Eq. 3: p_fuse = α·p_L + (1−α)·p_S."""
    return alpha * p_L + (1.0 - alpha) * p_S


class Defence:
    name = "collab_none"

    def __init__(self, alpha: float):
        self.alpha = alpha

    def upload(self, p_S: torch.Tensor, p_L: torch.Tensor, rng: torch.Generator) -> Upload:
        return Upload(p_S, None)

    def select(self, p_S: torch.Tensor, p_L: torch.Tensor, rng: torch.Generator) -> int:
        return int(torch.argmax(self.distribution(p_S, p_L, "edge", rng)))

    def distribution(self, p_S: torch.Tensor, p_L: torch.Tensor, mode: str, rng: torch.Generator) -> torch.Tensor:
        """The distribution the step's token is decoded from (likelihood option scoring reads it): cloud-side,
        the cloud's fused α·p_L + (1−α)·upload, renormalised (it decodes the argmax); edge-side, what the
        edge decodes from: p_fuse undefended, the sampling distribution of a randomised defence, and for a
        deterministic selection rule (CoVeil) the point mass on the token it selects."""
        if mode == "cloud":
            p = fuse(p_L, self.upload(p_S, p_L, rng).probs, self.alpha)
            return p / p.sum()
        if type(self).select is Defence.select:
            return fuse(p_L, p_S, self.alpha)
        out = torch.zeros_like(p_S)
        out[self.select(p_S, p_L, rng)] = 1.0
        return out
