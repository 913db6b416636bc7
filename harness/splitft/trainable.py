"""Which of the model's parameters the clients train (A and C, fully or through LoRA), and their one flat
layout: what FedAvg averages, what the server is told after every step (the strong threat model), and
what the attacker loads into its own copy of the model.

Full fine-tuning trains every parameter of A and C (a tied LM head is A's input embedding, so it is one
parameter). With `lora.enabled`, peft's `inject_adapter_in_model` adds LoRA adapters in place (the
module tree, and so `Partition`, is unchanged) to the `target_modules` of A's and C's decoder blocks only,
and only the adapters train. Either way B is frozen. With `train_head` false A is frozen too (and a tied
LM head with it: its weight is A's embedding), so only C's own parameters or adapters train.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from harness.partition import Partition


def make_trainable(model: nn.Module, k: int, m: int, lora: Any,
                   train_head: bool = True) -> tuple[Partition, list[str]]:
    """The partition of `model` with B (and, unless `train_head`, A) frozen and the names of the
    parameters the clients train, sorted."""
    part = Partition(model, k, m)
    if lora is not None and lora.get("enabled"):
        from peft import LoraConfig, inject_adapter_in_model

        layers = [*(range(0, k) if train_head else ()), *range(m, part.n_layers)]
        config = LoraConfig(r=int(lora["r"]), lora_alpha=float(lora["alpha"]),
                            target_modules=list(lora["target_modules"]), layers_to_transform=layers or None,
                            lora_dropout=0.0, bias="none")
        for p in model.parameters():
            p.requires_grad_(False)
        if layers:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)   # the same adapters on every client and in the attacker's copy
                inject_adapter_in_model(config, model)
        part = Partition(model, k, m)
        names = sorted(n for n, p in model.named_parameters() if "lora_" in n)
        for n, p in model.named_parameters():
            p.requires_grad_(n in names)
        return part, names
    part.freeze_body()
    owned = {id(p) for module in part.head_modules() + part.tail_modules() for p in module.parameters()}
    if not train_head:
        owned -= {id(p) for module in part.head_modules() for p in module.parameters()}
    names = sorted(n for n, p in model.named_parameters() if id(p) in owned)
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)
    return part, names


def state(model: nn.Module, names: list[str]) -> "OrderedDict[str, torch.Tensor]":
    """The trained parameters, detached float32 copies on the CPU in `names` order: what a message carries and
    FedAvg averages, whatever device and dtype the model has (splitft.placement); `load` casts them back."""
    params = dict(model.named_parameters())
    return OrderedDict((n, params[n].detach().to(device="cpu", dtype=torch.float32, copy=True)) for n in names)


def load(model: nn.Module, names: list[str], tensors: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n in names:
            params[n].copy_(torch.as_tensor(tensors[n], dtype=params[n].dtype))


def flat(model: nn.Module, names: list[str]) -> torch.Tensor:
    """One vector of the trained parameters (the view's `client_weights` exposure), float32 on the CPU like every
    crossing (`state`)."""
    params = dict(model.named_parameters())
    return torch.cat([params[n].detach().reshape(-1).to(device="cpu", dtype=torch.float32) for n in names])


def load_flat(model: nn.Module, names: list[str], vector: torch.Tensor) -> None:
    params = dict(model.named_parameters())
    offset = 0
    with torch.no_grad():
        for n in names:
            p = params[n]
            p.copy_(vector[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    if offset != vector.numel():
        raise ValueError(f"client weight vector has {vector.numel()} values, the layout {offset}")
