"""The trust boundary: every tensor that leaves the TEE for the untrusted device passes through here.

Because there is exactly one way out, one switch records the complete adversary view (op, layer, decode
step, shape, the tensor itself, on SpliTEE's `masked_input` channel: harness/adversary_view.py), and the
same place counts bytes each way and times the crossing. Attacks read only that AdversaryView, so
whatever they recover really was exposed.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from harness.adversary_view import MASKED_INPUT, AdversaryView, Exposure


class Stopwatch:
    """Accumulates wall-clock seconds per category; synchronises CUDA so device work is attributed."""

    def __init__(self, devices: tuple[torch.device, ...] = ()) -> None:
        self.cuda = any(d.type == "cuda" for d in devices)
        self.totals: dict[str, float] = defaultdict(float)

    def time(self, category: str) -> "_Timing":
        return _Timing(self, category)

    def reset(self) -> None:
        self.totals.clear()


class _Timing:
    """One timed span. A slotted object, not a @contextmanager generator, whose setup costs several times
    more: masked ops time three to five spans a call, and a SmolLM2 decode of 64 tokens makes 5,733 calls."""

    __slots__ = ("watch", "category", "start")

    def __init__(self, watch: Stopwatch, category: str) -> None:
        self.watch, self.category = watch, category

    def __enter__(self) -> None:
        if self.watch.cuda:
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self.watch.cuda:
            torch.cuda.synchronize()
        self.watch.totals[self.category] += time.perf_counter() - self.start


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
                Exposure(op, layer, self.step, tuple(tensor.shape), tensor.detach().to("cpu", copy=True),
                         MASKED_INPUT)
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
