"""The trust boundary: every tensor that leaves the TEE for the untrusted device passes through here.

Because there is exactly one way out, one switch records the complete adversary view (op, layer, decode
step, shape, the tensor itself), and the same place counts bytes each way and times the crossing. Attacks
read only a saved AdversaryView, so whatever they recover really was exposed.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


class Stopwatch:
    """Accumulates wall-clock seconds per category; synchronises CUDA so device work is attributed."""

    def __init__(self, devices: tuple[torch.device, ...] = ()) -> None:
        self.cuda = any(d.type == "cuda" for d in devices)
        self.totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def time(self, category: str):
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.totals[category] += time.perf_counter() - start

    def reset(self) -> None:
        self.totals.clear()


@dataclass
class Exposure:
    op: str
    layer: int | None
    step: int            # 0 = prefill, k = k-th decode step
    shape: tuple[int, ...]
    tensor: torch.Tensor


@dataclass
class AdversaryView:
    """Everything the untrusted device received, in order."""

    exposures: list[Exposure] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def select(self, op: str | None = None, layer: int | None = None, step: int | None = None) -> list[Exposure]:
        return [
            e for e in self.exposures
            if (op is None or e.op == op) and (layer is None or e.layer == layer) and (step is None or e.step == step)
        ]

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file in the same directory, then rename)."""
        from harness.results import atomic_torch_save

        atomic_torch_save({"meta": self.meta, "exposures": [e.__dict__ for e in self.exposures]}, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "AdversaryView":
        payload = torch.load(path, weights_only=False)
        return cls([Exposure(**e) for e in payload["exposures"]], payload.get("meta", {}))


class Boundary:
    def __init__(self, device: torch.device, clock: Stopwatch, record: bool = False) -> None:
        self.device = device
        self.clock = clock
        self.record = record
        self.view = AdversaryView()
        self.step = 0
        self.bytes_to_device = 0
        self.bytes_from_device = 0
        self.crossings = 0

    def send(self, op: str, layer: int | None, tensor: torch.Tensor) -> torch.Tensor:
        self.bytes_to_device += tensor.nbytes
        self.crossings += 1
        if self.record:
            self.view.exposures.append(
                Exposure(op, layer, self.step, tuple(tensor.shape), tensor.detach().to("cpu", copy=True))
            )
        with self.clock.time("crossing"):
            return tensor.to(self.device)

    def receive(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self.bytes_from_device += sum(t.nbytes for t in tensors)
        with self.clock.time("crossing"):
            return [t.to("cpu") for t in tensors]

    def counters(self) -> dict:
        return {
            "bytes_to_device": self.bytes_to_device,
            "bytes_from_device": self.bytes_from_device,
            "crossings": self.crossings,
        }
