"""A Hugging Face causal LM cut into head A | body B | tail C at cut points k < m (paper 002 §III).

    head(A)  = input embeddings + decoder blocks 1..k        (client)
    body(B)  = decoder blocks k+1..m                          (server, frozen)
    tail(C)  = decoder blocks m+1..L + final norm + LM head   (client)

The stages call the model's own modules in the order its own forward does (the decoder layers, the
rotary embedding and transformers' mask builders), so a partitioned forward equals the model's forward
(tests/splitft/test_splitft.py checks it to the bit) and every supported architecture (harness/splitee/
architectures.py) works without re-implementing attention. What crosses between the stages is an
ordinary tensor that the caller may transform (obfuscate, add noise, add decoy rows) before passing it
on; `Context` is rebuilt for any batch shape with `context()`, so the body may run on a different number
of rows than the head produced.

What crosses is float32 whatever the model's dtype (splitft.placement.dtype, grad_audit.placement.dtype): the
blocks compute in the model's dtype and the stages cast at their ends (differentiably), so the protocol's
noise, clipping, views and messages never see bfloat16 or float16. For a float32 model the casts are no-ops
and the partitioned forward stays bit-equal to the model's.

The cut is a simulation of the topology on one machine: the server's blocks run in the same process, and
the one record of what the server saw is the adversary view the caller fills at the cut points.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.architectures import architecture_of, decoder_layers, final_norm
from harness.errors import UserError


@dataclass
class Context:
    """What every decoder layer of one forward needs besides the hidden states: position ids, and the
    attention mask and rotary embedding per layer type (one type, "full_attention", for most models;
    Gemma 3 interleaves sliding-window layers)."""

    position_ids: torch.Tensor
    masks: dict[str, Any]
    rotary: dict[str, tuple[torch.Tensor, torch.Tensor]]


class Partition:
    """Stage functions over one model; the model's parameters are shared, not copied."""

    def __init__(self, model: nn.Module, k: int, m: int) -> None:
        architecture_of(model)   # a one-line error for an architecture splitbench does not support
        n_layers = len(decoder_layers(model))
        if not 0 < k < m <= n_layers:
            raise UserError(f"cut points must satisfy 0 < k < m <= {n_layers} (the model's layers), got k={k}, m={m}")
        self.model, self.k, self.m, self.n_layers = model, int(k), int(m), n_layers
        self.layers = decoder_layers(model)
        self.layer_types = list(getattr(model.config, "layer_types", None) or ["full_attention"] * n_layers)
        self.dtype = model.get_input_embeddings().weight.dtype   # the blocks' arithmetic (module docstring)

    # -- parameters per party ------------------------------------------------------------------------
    def head_modules(self) -> list[nn.Module]:
        return [self.model.get_input_embeddings(), *self.layers[:self.k]]

    def body_modules(self) -> list[nn.Module]:
        return list(self.layers[self.k:self.m])

    def tail_modules(self) -> list[nn.Module]:
        head = self.model.get_output_embeddings()
        return [*self.layers[self.m:], final_norm(self.model), head]

    def freeze_body(self) -> None:
        """B is frozen (paper 002: the server's middle is not trained). A tied LM head shares the input
        embedding's weight, so it stays trainable through A."""
        for module in self.body_modules():
            for p in module.parameters():
                p.requires_grad_(False)

    # -- stages --------------------------------------------------------------------------------------
    def context(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Context:
        """The per-forward context for hidden states of shape (batch, seq, d); `attention_mask` (batch,
        seq) of 1 for real tokens, or None for all real."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        seq = hidden.shape[1]
        hidden = hidden.to(self.dtype)   # the masks' fill value and the rotary tables follow the blocks' dtype
        position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0)
        kwargs = dict(config=self.model.config, inputs_embeds=hidden, attention_mask=attention_mask,
                      cache=None, position_ids=position_ids)
        masks: dict[str, Any] = {}
        rotary: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        rotary_emb = self.model.model.rotary_emb
        for layer_type in dict.fromkeys(self.layer_types):
            masks[layer_type] = (create_sliding_window_causal_mask(**kwargs) if layer_type == "sliding_attention"
                                 else create_causal_mask(**kwargs))
            # Gemma 3's rotary embedding takes the layer type (local and global bases); the others do not.
            rotary[layer_type] = (rotary_emb(hidden, position_ids, layer_type) if len(set(self.layer_types)) > 1
                                  else rotary_emb(hidden, position_ids=position_ids))
        return Context(position_ids, masks, rotary)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(input_ids)

    def run_layers(self, hidden: torch.Tensor, ctx: Context, start: int, stop: int) -> torch.Tensor:
        """Blocks start..stop-1 in the model's dtype; the result in float32 (what crosses)."""
        hidden = hidden.to(self.dtype)
        for i in range(start, stop):
            kind = self.layer_types[i]
            hidden = self.layers[i](hidden, attention_mask=ctx.masks[kind], position_embeddings=ctx.rotary[kind],
                                    position_ids=ctx.position_ids)
        return hidden.float()

    def head(self, input_ids: torch.Tensor, ctx: Context | None = None,
             attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Context]:
        """A: s_A, the smashed data after block k, and the context it was computed under."""
        hidden = self.embed(input_ids)
        ctx = ctx or self.context(hidden, attention_mask)
        return self.run_layers(hidden, ctx, 0, self.k), ctx

    def body(self, hidden: torch.Tensor, ctx: Context) -> torch.Tensor:
        """B: s_B, blocks k+1..m on whatever the server received."""
        return self.run_layers(hidden, ctx, self.k, self.m)

    def tail(self, hidden: torch.Tensor, ctx: Context) -> torch.Tensor:
        """C: the logits from s_B (or the client's recovery of it)."""
        hidden = self.run_layers(hidden, ctx, self.m, self.n_layers).to(self.dtype)
        return self.model.get_output_embeddings()(final_norm(self.model)(hidden)).float()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """A, B and C with nothing in between: the model's own logits."""
        s_a, ctx = self.head(input_ids, attention_mask=attention_mask)
        return self.tail(self.body(s_a, ctx), ctx)


# Row clipping: split fine-tuning's defences and the gradient audit's mitigation both bound each row's norm.
def clip_rows(x: torch.Tensor, bound: float, p: int) -> torch.Tensor:
    """Each last-axis vector scaled down to ℓp norm at most `bound`."""
    norms = x.norm(p=p, dim=-1, keepdim=True)
    return x * torch.clamp(bound / norms.clamp_min(1e-12), max=1.0)


def clip_and_noise(x: torch.Tensor, clip: float, noise_multiplier: float,
                   generator: torch.Generator) -> torch.Tensor:
    """Every last-axis vector clipped to ℓ2 norm `clip`, plus N(0, (noise_multiplier·clip)²) on every entry."""
    out = clip_rows(x, clip, 2)
    if noise_multiplier > 0:
        out = out + noise_multiplier * clip * torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return out
