"""Capture what the accelerator sees: run prompts through the split engine with `record_view` and turn the
adversary view into per-prompt exposure sequences (paper §7.4.1).

The victim side (`capture`) drives a SplitEngine under a configuration (t3, ep1 at ε, epn, slalom) exactly as a
deployment would; the attacker side (`features_from_view`) reads nothing but the `masked_input` channel
of the recorded AdversaryView (harness/adversary_view.py) and the prompt lengths.

Components (`COMPONENTS`): `qkv` (the shared input of Q, K and V of one layer), `o`, `gate_up`,
`composite` (QKV, O and Gate/Up of one layer, concatenated per position, paper §7.4.2) and `lm_head`
(the final-norm output at the positions whose logits are computed: the last prompt position at prefill,
then one per decode step). Layer ops are taken from the prefill only: decode steps expose the generated
tokens, not the prompt.

Alignment. The engine left-pads a batch to its longest prompt, so row r of a prefill exposure of shape
[B, T, d] holds prompt r in its last len_r positions; `features_from_view` keeps exactly those. The
prompt lengths are side knowledge the harness hands to the attacker: with one prompt per submission, as a
deployment would send it, the exposure's shape [1, n, d] reveals n, so batching (a speed-up of the
harness) must neither hide nor add anything. Padded rows are dropped, never attacked.

Speed. Exposures of layer ℓ depend only on layers 0..ℓ, so components other than the LM head are
captured on a view of the victim cut after layer ℓ (`truncated`): the same modules, the same noise-bank
streams (they are keyed by seed and op label), the same exposures (tests/splitee/test_attacks.py checks they are
identical), a fraction of the cost.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from harness import configurations
from harness.adversary_view import MASKED_INPUT, AdversaryView, describe
from harness.errors import UserError
from harness.progress import progress
from harness.splitee.engine import EngineSettings, SplitEngine

COMPONENTS: dict[str, tuple[str, ...]] = {
    "qkv": ("qkv",),
    "o": ("o",),
    "gate_up": ("gate_up",),
    "composite": ("qkv", "o", "gate_up"),
    "lm_head": ("lm_head",),
}
# What the learned attacks read: the op input itself (`plain`), Gaussian-masked inputs, and Slalom's blinded
# residues mod q (attacked as numbers, float32: a measurement of what its one-time pad leaves, not a model of
# it). The Bayes attacker models the first two only (attacks/suite.attack_cell).
ATTACKABLE = tuple(n for n in configurations.names(split=True)
                   if configurations.get(n).mechanism in ("plain", "gaussian", "slalom"))   # t3, ep1, epn, slalom
BAYES_MODELLED = tuple(n for n in ATTACKABLE if configurations.get(n).mechanism in ("plain", "gaussian"))
UNMASKED = next(n for n in ATTACKABLE if configurations.get(n).mechanism == "plain")  # t3: the noise-free attacks


@dataclass(frozen=True)
class CaptureSpec:
    """How the victim ran when the exposures were recorded; everything here changes the captured tensors."""

    configuration: str
    epsilon: float | None
    seed: int
    component: str
    layer: int
    offload: tuple[str, ...]
    sigma_scale: float
    sensitivity_rule: str
    slalom_frac_bits: int
    slalom_scaling: str
    max_new_tokens: int
    batch_size: int

    def ops(self) -> tuple[str, ...]:
        return COMPONENTS[self.component]

    def record(self) -> dict:
        return asdict(self)

    def meta(self, model: str | None = None, workload: str | None = None, code_digest: str = "") -> dict:
        """The meta of the adversary views this capture records (harness.adversary_view.describe)."""
        return describe(configuration=self.configuration, epsilon=self.epsilon, seed=self.seed, model=model,
                        workload=workload, code_digest=code_digest)


@dataclass
class Capture:
    """Per-prompt exposure sequences: `features[r]` is [len_r, D] (layer ops) or [steps, d] (LM head)."""

    spec: CaptureSpec
    features: list[torch.Tensor]
    epsilons: list[float | None] = field(default_factory=list)   # per-token ε each prompt ran under
    dims: dict[str, int] = field(default_factory=dict)          # input dimension of each op, in concat order
    meta: dict = field(default_factory=dict)                    # the views' meta (CaptureSpec.meta)


def check_component(component: str, layer: int, offload: Sequence[str], n_layers: int) -> None:
    if component not in COMPONENTS:
        raise UserError(f"attack.component={component!r} is not one of {', '.join(COMPONENTS)}")
    missing = [op for op in COMPONENTS[component] if op not in offload]
    if missing:
        raise UserError(f"attack.component={component} needs op(s) {missing} offloaded, but engine.offload is "
                        f"{list(offload)}: an op kept in the TEE exposes nothing to attack")
    if component != "lm_head" and not 0 <= layer < n_layers:
        raise UserError(f"attack.layer={layer} is out of range: the model has {n_layers} layers")


def truncated(model: nn.Module, n_layers: int) -> nn.Module:
    """A view of `model` that runs only its first n_layers decoder layers (modules shared, nothing copied).

    Hugging Face decoders iterate `self.layers[:config.num_hidden_layers]`, so a shorter ModuleList is all
    it takes; the original model is left untouched.
    """
    layers = model.model.layers
    if n_layers >= len(layers):
        return model
    outer = copy.copy(model)
    outer._modules = dict(model._modules)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner._modules["layers"] = nn.ModuleList(list(layers)[:n_layers])
    outer._modules["model"] = inner
    return outer


def features_from_view(view: AdversaryView, ops: Sequence[str], layer: int, lengths: Sequence[int]) -> list[torch.Tensor]:
    """Per-prompt exposure sequences of one batch's view (the attacker's side: reads only the view's
    `masked_input` channel, so exposures other systems add on their own channels change nothing here).

    Layer ops: the prefill exposure [B, T, d] of each op in `ops` at `layer`, the last len_r positions of
    row r, ops concatenated along the feature axis. LM head: every LM-head exposure of the batch in step
    order, one row per step. Integer exposures (Slalom residues) are returned as float32.
    """
    if tuple(ops) == ("lm_head",):
        steps = sorted(view.select(op="lm_head", channel=MASKED_INPUT), key=lambda e: e.step)
        if not steps:
            raise ValueError("the view holds no lm_head exposure")
        stacked = torch.cat([e.tensor.float().reshape(len(lengths), -1, e.tensor.shape[-1]) for e in steps], dim=1)
        return [stacked[r].clone() for r in range(len(lengths))]
    parts = []
    for op in ops:
        found = view.select(op=op, layer=layer, step=0, channel=MASKED_INPUT)
        if len(found) != 1:
            raise ValueError(f"expected one prefill exposure of {op}[{layer}] in the view, found {len(found)}")
        t = found[0].tensor.float()
        if t.dim() != 3 or t.shape[0] != len(lengths):
            raise ValueError(f"{op}[{layer}] exposure has shape {tuple(t.shape)}, expected [{len(lengths)}, T, d]")
        parts.append(t)
    width = parts[0].shape[1]
    if any(n > width or n < 1 for n in lengths):
        raise ValueError(f"prompt lengths {list(lengths)} do not fit the exposure width {width}")
    joined = torch.cat(parts, dim=-1)
    return [joined[r, width - n:].clone() for r, n in enumerate(lengths)]


def make_engine(model: nn.Module, spec: CaptureSpec) -> tuple[SplitEngine, tuple[str, ...]]:
    """The engine a capture runs, on the truncated model where the component allows it."""
    ops = spec.ops()
    if "lm_head" in ops:
        victim, offload = model, spec.offload
    else:
        victim = truncated(model, spec.layer + 1)
        offload = tuple(op for op in spec.offload if op != "lm_head")
    settings = EngineSettings(configuration=spec.configuration, epsilon=spec.epsilon, offload=tuple(offload),
                              seed=spec.seed, record_view=True, sigma_scale=spec.sigma_scale,
                              sensitivity_rule=spec.sensitivity_rule, slalom_frac_bits=spec.slalom_frac_bits,
                              slalom_scaling=spec.slalom_scaling)
    return SplitEngine(victim, settings), ops


@torch.no_grad()
def capture(model: nn.Module, prompts: Sequence[Sequence[int]], spec: CaptureSpec, *, pad_token_id: int,
            repeats: int = 1, on_repeat=None, meta: dict | None = None,
            epsilon_lengths: Sequence[int] | None = None) -> list[Capture]:
    """Run `prompts` through the engine `repeats` times (fresh masks each time: the noise bank never serves
    an entry twice) and return one Capture per repeat.

    `on_repeat(index, capture)` is called after each repeat; when given, the captures are not kept (for
    the repeated-submission attack, which only needs running sums) and [] is returned. The features are
    ordinary tensors (cloned outside the engine's inference mode), usable as training inputs. `meta` is
    every batch's view's and each Capture's meta (default `spec.meta()`, which names no model or workload).
    `epsilon_lengths`: each prompt's n for EPN's ε = 1/√n (default its length; SplitEngine.generate).
    """
    if spec.configuration not in ATTACKABLE:
        raise UserError(f"the attack suite handles configurations {', '.join(ATTACKABLE)}, got {spec.configuration!r}")
    check_component(spec.component, spec.layer, spec.offload, len(model.model.layers))
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    meta = spec.meta() if meta is None else meta
    engine, ops = make_engine(model, spec)
    dims = {}
    out: list[Capture] = []
    n_batches = -(-len(prompts) // spec.batch_size)
    bar = progress(desc=f"capture {spec.configuration} {spec.component}", total=repeats * n_batches, unit="batch")
    for rep in range(repeats):
        features: list[torch.Tensor] = []
        epsilons: list[float | None] = []
        for start in range(0, len(prompts), spec.batch_size):
            batch = [list(map(int, p)) for p in prompts[start:start + spec.batch_size]]
            lengths = [len(p) for p in batch]
            first = len(engine.view.exposures)
            result = engine.generate(batch, spec.max_new_tokens, pad_token_id=pad_token_id,
                                     epsilon_lengths=None if epsilon_lengths is None
                                     else list(epsilon_lengths[start:start + spec.batch_size]))
            view = AdversaryView(engine.view.exposures[first:], meta)
            del engine.view.exposures[first:]  # the batch's record is consumed here: memory stays bounded
            features.extend(features_from_view(view, ops, spec.layer, lengths))
            epsilons.extend(result.epsilons)
            if not dims:
                dims = {op: _dim(view, op, spec.layer) for op in ops}
            bar.update(1)
        cap = Capture(spec, features, epsilons, dims, meta)
        if on_repeat is not None:
            on_repeat(rep, cap)
        else:
            out.append(cap)
    bar.close()
    return out


def _dim(view: AdversaryView, op: str, layer: int) -> int:
    found = (view.select(op=op, channel=MASKED_INPUT) if op == "lm_head"
             else view.select(op=op, layer=layer, step=0, channel=MASKED_INPUT))
    return int(found[0].shape[-1])


def feature_dim(model: nn.Module, component: str) -> int:
    """Width of one exposure row of `component` (concatenated input dimensions of its ops)."""
    cfg = model.config
    d = cfg.hidden_size
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or d // heads
    width = {"qkv": d, "o": heads * head_dim, "gate_up": d, "lm_head": d}
    return sum(width[op] for op in COMPONENTS[component])


def sigma_qkv0(model: nn.Module, configuration: str, epsilon: float | None, n_tokens: int,
               sigma_scale: float = 1.0) -> float:
    """σ of the layer-0 QKV mask of a prompt of n tokens, as the attacker computes it: Δ from the public
    weights (harness.splitee.sensitivity) over the ε the exposure really gets (harness.configurations); 0
    without Gaussian masks (t3)."""
    from harness.splitee.sensitivity import sensitivity_table

    (eps,) = configurations.exposure_epsilons(configuration, epsilon, [n_tokens], sigma_scale)
    if eps is None:
        return 0.0
    delta = next(r.delta for r in sensitivity_table(model, ("qkv",)) if r.op == "qkv" and r.layer == 0)
    # Δ/ε rather than Δ·noise_factor: the σ the attacker has always used, to the bit (Δ·sigma_scale/ε).
    return float(delta) / eps
