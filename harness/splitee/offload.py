"""Swapping a model's linear modules for boundary-crossing ones, without touching its forward code.

An OffloadedOp is one exposure: the QKV projections (and Gate/Up) share one input, so the first member
called sends one masked input to the device, which applies every member's weights; the remaining members
are served from that answer. Ops left in the TEE are wrapped in TimedLinear only, for the time breakdown.
"""
from __future__ import annotations

import torch
from torch import nn

from harness.architectures import OP_MEMBERS, decoder_layers, get_submodule, set_submodule

CATEGORY = {"qkv": "attention_proj", "o": "attention_proj", "gate_up": "ffn_proj", "down": "down_proj", "lm_head": "lm_head"}


class OffloadedOp:
    def __init__(self, name: str, layer: int | None, linears: list[nn.Linear], delta: float | None, ctx, mechanism,
                 device: torch.device) -> None:
        self.name, self.layer, self.delta, self.ctx, self.mechanism = name, layer, delta, ctx, mechanism
        self.category = CATEGORY[name]
        self.tee_weights = [lin.weight.detach() for lin in linears]
        self.tee_params = [(lin.weight.detach(), None if lin.bias is None else lin.bias.detach()) for lin in linears]
        self.bank = None
        self._pending: tuple[torch.Tensor, list[torch.Tensor], set[int]] | None = None
        if mechanism.name == "slalom":
            from harness.splitee.mechanisms import ExactProduct

            self.tee_quantised = mechanism.quantised_weights(self.tee_weights)
            # W_q·v mod q: the device's product of the masked input, and the TEE's of each bank mask (the
            # same kernels where both sides are the CPU).
            self.device_product = ExactProduct(self.tee_quantised, mechanism.modulus, device)
            self.tee_product = (self.device_product if device.type == "cpu"
                                else ExactProduct(self.tee_quantised, mechanism.modulus, torch.device("cpu")))
        elif device.type == "cpu":
            # The model's own parameters, not detached views: F.linear rounds differently on a non-contiguous
            # input (the LM head's last position) depending on whether the weight requires grad, and T3 must
            # compute exactly what the model would.
            self.device_params = [(lin.weight, lin.bias) for lin in linears]
        else:
            self.device_params = [(w.to(device), None if b is None else b.to(device)) for w, b in self.tee_params]

    @property
    def label(self) -> str:
        return self.name if self.layer is None else f"{self.name}[{self.layer}]"

    def take(self, n: int):
        before = self.bank.stats.refill_s
        served = self.bank.take(n, self.ctx.refill_size)
        self.ctx.clock.totals["bank_refill"] += self.bank.stats.refill_s - before
        return served

    def output_for(self, member: int, x: torch.Tensor) -> torch.Tensor:
        pending = self._pending
        if pending is None or pending[0] is not x or member in pending[2]:
            outputs = self.mechanism.run(self, x)
            if self.ctx.inject is not None:
                outputs = self.ctx.inject(self, x, outputs)
            pending = self._pending = (x, outputs, set())
        pending[2].add(member)
        if len(pending[2]) == len(pending[1]):
            self._pending = None  # every member served: drop the reference to the input
        return pending[1][member]


class MemberLinear(nn.Module):
    """Stands where one of an op's nn.Linear modules stood."""

    def __init__(self, op: OffloadedOp, member: int, original: nn.Linear) -> None:
        super().__init__()
        self.op, self.member = op, member
        self.in_features, self.out_features = original.in_features, original.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op.output_for(self.member, x)


class TimedLinear(nn.Module):
    def __init__(self, inner: nn.Module, category: str, clock) -> None:
        super().__init__()
        self.inner, self.category, self.clock = inner, category, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.clock.time(self.category):
            return self.inner(x)


def op_linears(model: nn.Module, op: str, layer: int | None) -> list[tuple[str, nn.Linear]]:
    """(dotted path from the model root, module) for each member of one op instance."""
    if op == "lm_head":
        return [("lm_head", model.lm_head)]
    prefix = f"model.layers.{layer}."
    return [(prefix + m, get_submodule(model, prefix + m)) for m in OP_MEMBERS[op]]


def all_op_instances(model: nn.Module, ops: tuple[str, ...]) -> list[tuple[str, int | None]]:
    instances = [(op, i) for i in range(len(decoder_layers(model))) for op in ("qkv", "o", "gate_up", "down") if op in ops]
    if "lm_head" in ops:
        instances.append(("lm_head", None))
    return instances


class Installed:
    """Modules swapped into a model for the duration of a generation; `restore()` puts the originals back."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.originals: list[tuple[str, nn.Module]] = []

    def swap(self, path: str, module: nn.Module) -> None:
        self.originals.append((path, get_submodule(self.model, path)))
        set_submodule(self.model, path, module)

    def restore(self) -> None:
        for path, module in reversed(self.originals):
            set_submodule(self.model, path, module)
        self.originals.clear()
