"""What a collaborative decoding step fuses and what every defence implements (paper 003 §2.2, eq. 3).

`fuse` is the fusion rule, `Upload` what the edge uploads in cloud-side fusion, and `Defence` the interface
(the undefended edge: upload p_S, select argmax p_fuse). The cloud-side defences (harness/collab/defences.py)
and the edge-side baselines (harness/collab/edge_baselines.py) both build on it; defences.make_defence picks
among all of them.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Upload:
    probs: torch.Tensor          # (V,) float64; 0 where nothing is uploaded
    ids: torch.Tensor | None     # the uploaded ids (sparse uploads), None for a dense upload


def fuse(p_L: torch.Tensor, p_S: torch.Tensor, alpha: float) -> torch.Tensor:
    """Eq. 3: p_fuse = α·p_L + (1−α)·p_S."""
    return alpha * p_L + (1.0 - alpha) * p_S


def plain(value: Any) -> Any:
    """A parameter as JSON can hold it, for a defence's `identity`: a tensor by the sha256 of its bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return f"tensor {tuple(t.shape)} {t.dtype} sha256:{hashlib.sha256(t.numpy().tobytes()).hexdigest()}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


class Defence:
    name = "collab_none"
    # The fusion modes in which the defence draws from its generator; in the others it is deterministic, so its
    # decode does not depend on the seed (the de-duplication of experiment.decode keys it without one).
    random_modes: tuple[str, ...] = ()

    def __init__(self, alpha: float):
        self.alpha = alpha

    def identity(self) -> dict[str, Any]:
        """What determines this defence's computation: its name and every parameter it holds."""
        return {"name": self.name, **{k: plain(v) for k, v in sorted(vars(self).items())}}

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
