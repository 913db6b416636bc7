"""Where the offloadable projections and their input norms live in each supported architecture.

The engine never re-implements a model's forward pass: it swaps the Hugging Face linear modules for
boundary-crossing ones. This table names those modules, the RMSNorm whose output feeds each offloaded op
(its gain enters the sensitivity bound, paper §5.3.2), and how that norm stores its gain.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.errors import UserError


@dataclass(frozen=True)
class Architecture:
    model_type: str
    qkv_norm: str            # attribute of a decoder layer: the RMSNorm whose output feeds Q, K and V
    mlp_norm: str            # the RMSNorm whose output feeds Gate and Up
    gain_offset: float       # effective gain α = weight + gain_offset (Gemma stores α as 1 + w)


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", "input_layernorm", "post_attention_layernorm", 0.0),
    "mistral": Architecture("mistral", "input_layernorm", "post_attention_layernorm", 0.0),
    "qwen2": Architecture("qwen2", "input_layernorm", "post_attention_layernorm", 0.0),
    "qwen3": Architecture("qwen3", "input_layernorm", "post_attention_layernorm", 0.0),
    # Gemma 3 normalises the attention output again (post_attention_layernorm) before the residual;
    # the MLP reads pre_feedforward_layernorm.
    "gemma3_text": Architecture("gemma3_text", "input_layernorm", "pre_feedforward_layernorm", 1.0),
}

# Offloadable op -> the linear modules that share its one masked input.
OP_MEMBERS: dict[str, tuple[str, ...]] = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
OFFLOADABLE = ("qkv", "o", "gate_up", "down", "lm_head")


def architecture_of(model: nn.Module) -> Architecture:
    model_type = getattr(model.config, "model_type", None)
    if model_type == "gemma3":  # multimodal wrapper config: the text model is what we run
        model_type = "gemma3_text"
    if model_type not in ARCHITECTURES:
        raise UserError(
            f"unsupported architecture {model_type!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    return ARCHITECTURES[model_type]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


def final_norm(model: nn.Module) -> nn.Module:
    return model.model.norm


def effective_gain(norm: nn.Module, arch: Architecture) -> torch.Tensor:
    """The RMSNorm gain α as it multiplies the normalised input (float64, detached)."""
    return norm.weight.detach().double() + arch.gain_offset


def get_submodule(root: nn.Module, dotted: str) -> nn.Module:
    return root.get_submodule(dotted)


def set_submodule(root: nn.Module, dotted: str, module: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)
