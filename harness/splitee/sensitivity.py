"""Global ℓ2 sensitivity of the input of every offloaded op, from the model's own weights (paper §5.3).

- After an RMSNorm with effective gain α over d dimensions (Theorem, §5.3.2): ‖LN(x)‖₂ ≤ √d·‖α‖₄, so
  Δ_LN ≤ 2·√d·‖α‖₄. This covers QKV (input norm), Gate/Up (MLP norm) and the LM head (final norm).
- After attention (§5.3.3): each output row is a convex combination of value vectors W_V·LN(x_j), so
  Δ_att ≤ 2·√d·‖W_V‖₂·‖α‖₄ with W_V the layer's V projection and α its input-norm gain ("paper" rule).
  With several heads the O input concatenates per-head combinations that may pick different positions;
  the bound that provably covers that case is 2·√d·‖α‖₄·√(n_rep·Σ_g ‖W_V^g‖₂²) over the KV-head blocks
  W_V^g, each repeated n_rep times by grouped-query attention ("per_head" rule). Both are reported; the
  mechanism uses the one configured.
- Down (after SiLU/GELU) is never offloaded (the paper keeps it in the TEE, §6.3), so the engine has no
  Δ for it; `down_sensitivity` gives a sound one for the floating-point study, which shows why
  (docs/fp_bound.md §6).
Here d is the dimension of the normalised vector (the hidden size), as in the derivation.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from harness.architectures import (
    architecture_of,
    decoder_layers,
    effective_gain,
    final_norm,
)
from harness.errors import UserError

ATTENTION_RULES = ("paper", "per_head")


@dataclass(frozen=True)
class OpSensitivity:
    op: str
    layer: int | None     # None for the LM head
    input_dim: int
    norm_dim: int
    gain_l4: float        # ‖α‖₄ of the norm feeding the op (for O: the layer's input norm)
    wv_spectral: float | None
    wv_per_head: float | None   # √(n_rep·Σ_g ‖W_V^g‖₂²)
    delta: float          # the Δ the mechanism uses
    delta_paper: float
    delta_per_head: float | None
    delta_sup: float | None = None   # the exact supremum after an RMSNorm, 2·√d·‖α‖∞


def layernorm_bound(gain: torch.Tensor) -> float:
    """2·√d·‖α‖₄ (paper §5.3.2)."""
    d = gain.numel()
    return 2.0 * math.sqrt(d) * torch.linalg.vector_norm(gain.double(), ord=4).item()


def layernorm_supremum(gain: torch.Tensor) -> float:
    """2·√d·‖α‖∞: the largest change an RMSNorm output can make (ignoring its ε)."""
    return 2.0 * math.sqrt(gain.numel()) * gain.double().abs().max().item()


def _v_norms(layer: nn.Module, config) -> tuple[float, float]:
    w_v = layer.self_attn.v_proj.weight.detach().double()
    spectral = torch.linalg.matrix_norm(w_v, ord=2).item()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    n_kv = w_v.shape[0] // head_dim
    n_rep = config.num_attention_heads // n_kv
    blocks = w_v.view(n_kv, head_dim, -1)
    per_block = torch.linalg.matrix_norm(blocks, ord=2)
    return spectral, math.sqrt(n_rep * float((per_block**2).sum()))


def sensitivity_table(model: nn.Module, ops: tuple[str, ...], attention_rule: str = "paper") -> list[OpSensitivity]:
    if attention_rule not in ATTENTION_RULES:
        raise UserError(f"sensitivity rule must be one of {ATTENTION_RULES}, got {attention_rule!r}")
    arch = architecture_of(model)
    config = model.config
    table: list[OpSensitivity] = []
    for index, layer in enumerate(decoder_layers(model)):
        in_gain = effective_gain(getattr(layer, arch.qkv_norm), arch)
        d = in_gain.numel()
        ln = layernorm_bound(in_gain)
        l4 = ln / (2.0 * math.sqrt(d))
        if "qkv" in ops:
            table.append(OpSensitivity("qkv", index, d, d, l4, None, None, ln, ln, None, layernorm_supremum(in_gain)))
        if "o" in ops:
            spectral, per_head = _v_norms(layer, config)
            paper, strict = ln * spectral, ln * per_head
            o_in = layer.self_attn.o_proj.in_features
            chosen = paper if attention_rule == "paper" else strict
            table.append(OpSensitivity("o", index, o_in, d, l4, spectral, per_head, chosen, paper, strict))
        if "gate_up" in ops:
            gain = effective_gain(getattr(layer, arch.mlp_norm), arch)
            b = layernorm_bound(gain)
            table.append(OpSensitivity("gate_up", index, gain.numel(), gain.numel(), b / (2 * math.sqrt(gain.numel())), None, None, b, b,
                                       None, layernorm_supremum(gain)))
        if "down" in ops:
            raise UserError(
                "no sensitivity bound for 'down' (its input follows SiLU/GELU); the paper keeps it in the TEE "
                "(§6.3): drop it from engine.offload or use a configuration without noise (t3, slalom)"
            )
    if "lm_head" in ops:
        gain = effective_gain(final_norm(model), arch)
        b = layernorm_bound(gain)
        table.append(OpSensitivity("lm_head", None, gain.numel(), gain.numel(), b / (2 * math.sqrt(gain.numel())), None, None, b, b,
                                   None, layernorm_supremum(gain)))
    return table


def as_dicts(table: list[OpSensitivity]) -> list[dict]:
    return [asdict(row) for row in table]


# ---------------------------------------------------------------------------------------------------
# Down (after the gated activation): for the floating-point study only, never for the engine
# ---------------------------------------------------------------------------------------------------

# Activations with |act(t)| ≤ |t| for every t: SiLU t·σ(t), GELU t·Φ(t) and its tanh form t·(1+tanh(·))/2.
BOUNDED_BY_IDENTITY = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new")


@dataclass(frozen=True)
class DownSensitivity:
    layer: int
    input_dim: int          # the intermediate size d_ff
    norm_dim: int           # d of the MLP norm
    gain_l4: float
    gate_spectral: float    # ‖W_gate‖₂
    up_spectral: float
    gate_max_row: float     # max_i ‖W_gate[i]‖₂
    up_max_row: float
    delta: float            # 2·R²·min(ρ_gate·‖W_up‖₂, ‖W_gate‖₂·ρ_up), R = √d·‖α‖₄ (the one used)
    delta_spectral: float   # 2·R²·‖W_gate‖₂·‖W_up‖₂ (looser, the shape of a bound in the matrices' norms)


def down_sensitivity(model: nn.Module) -> list[DownSensitivity]:
    """Global ℓ2 sensitivity of the Down projection's input z = act(W_g·h) ⊙ (W_u·h), h = RMSNorm output.

    docs/fp_bound.md §6: ‖h‖₂ ≤ R = √d·‖α‖₄ (the paper's Prop. for §5.3.2); |act(t)| ≤ |t|, so
    |zᵢ| ≤ |gᵢ|·|uᵢ| and ‖z‖₂ ≤ ‖g‖_∞·‖u‖₂ ≤ (ρ_g·R)·(‖W_u‖₂·R), or symmetrically; Δ ≤ 2·sup‖z‖₂.
    """
    arch = architecture_of(model)
    act = str(getattr(model.config, "hidden_act", None) or getattr(model.config, "hidden_activation", None))
    if act not in BOUNDED_BY_IDENTITY:
        raise UserError(f"no Down sensitivity bound for the activation {act!r}; known: {', '.join(BOUNDED_BY_IDENTITY)}")
    out = []
    for index, layer in enumerate(decoder_layers(model)):
        gain = effective_gain(getattr(layer, arch.mlp_norm), arch)
        d = gain.numel()
        l4 = torch.linalg.vector_norm(gain, ord=4).item()
        r2 = d * l4 * l4
        wg = layer.mlp.gate_proj.weight.detach().double()
        wu = layer.mlp.up_proj.weight.detach().double()
        sg, su = (torch.linalg.matrix_norm(w, ord=2).item() for w in (wg, wu))
        rg, ru = (torch.linalg.vector_norm(w, dim=1).max().item() for w in (wg, wu))
        out.append(DownSensitivity(index, wg.shape[0], d, l4, sg, su, rg, ru,
                                   2.0 * r2 * min(rg * su, sg * ru), 2.0 * r2 * sg * su))
    return out
