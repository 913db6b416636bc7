"""The sequential all-exposure attacker on SpliTEE's adversary view (issues 32 and 36; docs/sequential_attack.md).

One prefill of a prompt of n tokens sends, at every layer ℓ, the inputs of QKV, O and Gate/Up of every
position to the accelerator, each masked afresh: y_e = x_e + σ_e·η_e, e = (op, ℓ). The input x_e at
position p is a function of the tokens 0..p alone (causal attention), and the model is public. So, position
by position, the attacker computes with its own clear copy of the model what every exposure of position p
would be for each candidate token v given the prefix, μ_e(v), and scores

    likelihood:  L(v) = Σ_e log N(y_e; μ_e(v), σ_e²I) = −Σ_e ‖y_e − μ_e(v)‖² / (2σ_e²) + const
    MAP:         L(v) + log P_model(v | prefix)          (the victim model's own next-token distribution)

over every used exposure e of that position. With a known prefix, the likelihood's argmax is the
maximum-likelihood token and the MAP's the Bayes-optimal guess under the model's prior (0-1 loss). σ_e =
Δ_e·sigma_scale/ε is computed from the public weights and the configuration exactly as the engine does
(`op_sigmas`; tests/splitee/test_sequential_attack.py checks equality with the engine's own σ). T3 sends inputs
in the clear: σ_e = 1 there, so the score is −½ Σ‖y − μ‖²: exact matching, the nearest candidate.

Prefix (`mode`): `teacher_forced` gives the true prefix (an upper bound for every attacker of this family);
`free_running` uses the attacker's own recovery so far. The true prefix of every position comes from one
prefill of the prompt (`Prefill`: its per-layer keys and values, sliced per position, and the prior after
each); a free-running recovery extends its own KV cache a token a step. Every candidate attends to the
prefix's keys and values, shared and never copied, and to its own alone (`_candidate_attention`), so the cost
of a position does not grow with the number of positions already attacked, beyond attention over the prefix.

Staged pruning (`prune`: (layers_upto, keep) pairs). Stage `0` scores the whole vocabulary with the
layer-0 QKV exposure alone, which needs no forward pass: its input is RMSNorm(E[v]), a codebook (as in
attacks/splitee/bayes.py), plus the prior for MAP. A stage `k` > 0 runs the survivors through layers 0..k−1 and
scores them with every used exposure of those layers. Each stage keeps its `keep` best by the score so
far; after the last stage the survivors are scored with every used exposure and the best is the guess. A
stage whose layers hold no used exposure (layers=[8] and a stage 0) is dropped: it would prune by nothing.
No stages (null) scores the whole vocabulary with every used exposure. `prune_prior` K adds a first stage
that keeps the K tokens the model's next-token prior ranks highest, before any exposure is scored (both
scorers prune by it): the only pruning a single deep layer alone allows without a forward of the whole
vocabulary through every layer above it. `prune_union_prior` K makes the first exposure stage keep its own
`keep` best ∪ the prior's K best, for each scorer: the exposure score and the prior each rescue the truth the
other ranks low, where a stage by either alone loses it. A stage's optional third element, `[layers_upto, keep,
prior_keep]`, does the same at that stage (issue 52: at small ε MAP ranks the truth where the prior does, so
each stage must hold about the prior's 95th-percentile rank of the truth; the default schedule's). The pruning recall of a stage is the
fraction of positions whose true token survived it: with the truth's rank per stage and `pruning_decisive`
(diagnostics of the same kind) the only use of the truth besides scoring, so that a verdict can tell a
pruning failure from a mask that held. `pruning_rule` picks which the verdict reads: every stage's recall
(`recall`, issue 32's rule) or no decisive miss (`no_decisive_miss`, teacher-forced only: `decisive_check`).

Scorers. One attack runs several scorers at once: the likelihood and MAP attackers on the prompt's own view
and, with `null_view`, the same two on the view of another prompt (the next one in the workload that covers
the same positions), scored against this prompt's tokens: the attacker's own reference with no information
about the prompt (controls.sequential_verdict). Each scorer prunes by its own score among its own survivors;
with a shared prefix (teacher-forced) their candidates are forwarded together (the union), otherwise each
scorer follows its own prefix.

The prior-only floor (`prior_top1`, and `prior_token_f1` on the token-F1 scale): the model's top-1 next-token
guess given the true prefix, no view, on the same positions.

Positions: `positions=text` attacks the positions after the public chat-template header (the longest
common prefix of the prompt and the template rendered around an empty message, `public_prefix_length`);
`all` attacks every position from 1 (position 0 has no prefix: it is the template's or tokenizer's first
marker in every chat workload, and is given). `max_positions` caps the count per prompt.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from harness import configurations
from harness.adversary_view import MASKED_INPUT, AdversaryView
from harness.architectures import OP_MEMBERS, decoder_layers
from harness.errors import UserError
from harness.splitee.sensitivity import OpSensitivity, sensitivity_table

OPS = ("qkv", "o", "gate_up")
MODES = ("teacher_forced", "free_running")
PRIORS = ("none", "model")
POSITIONS = ("text", "all")
MAP_REFERENCES = ("prior", "null_view")   # what MAP's verdict reads MAP against (summarise)
PRUNING_RULES = ("recall", "no_decisive_miss")   # what at_chance asks of the pruning (summarise)
LIKELIHOOD, MAP = "likelihood", "map"
Key = tuple[str, int]   # (op, layer) of one exposure


@dataclass(frozen=True)
class Settings:
    """attack.sequential (conf/splitee/default.yaml), typed by harness/schema.py SequentialAttackConfig."""

    mode: str
    prior: str                                   # none: the likelihood attacker; model: also MAP
    layers: tuple[int, ...] | None               # None: every layer
    ops: tuple[str, ...]
    # (layers_upto, keep) or (layers_upto, keep, prior_keep) per stage; None: no pruning
    prune: tuple[tuple[int, ...], ...] | None
    prune_prior: int | None                      # keep the prior's K best first; None: no such stage
    prune_union_prior: int | None                # the first exposure stage also keeps the prior's K best
    positions: str
    max_positions: int | None
    null_view: bool
    map_reference: str                           # prior: MAP − prior; null_view: MAP − MAP on the null view
    chunk: int                                   # candidates per forward pass
    min_pruning_recall: float
    pruning_rule: str                            # recall | no_decisive_miss (pruning_decisive, teacher-forced)

    @classmethod
    def from_config(cls, node) -> Settings:
        layers = node["layers"]
        prune = node["prune"]
        return cls(mode=str(node["mode"]), prior=str(node["prior"]),
                   layers=None if layers is None else tuple(int(x) for x in layers),
                   ops=tuple(str(o) for o in node["ops"]),
                   prune=None if prune is None else tuple(tuple(int(x) for x in stage) for stage in prune),
                   prune_prior=None if node.get("prune_prior") is None else int(node["prune_prior"]),
                   prune_union_prior=(None if node.get("prune_union_prior") is None
                                      else int(node["prune_union_prior"])),
                   positions=str(node["positions"]),
                   max_positions=None if node["max_positions"] is None else int(node["max_positions"]),
                   null_view=bool(node["null_view"]), map_reference=str(node["map_reference"]),
                   chunk=int(node["chunk"]),
                   min_pruning_recall=float(node["min_pruning_recall"]),
                   pruning_rule=str(node["pruning_rule"]))


def check(settings: Settings, n_layers: int, offload: Sequence[str]) -> tuple[int, ...]:
    """The layers whose exposures are used; UserError (one line) for a layer outside the model, an op the
    view cannot hold (not offloaded), a pruning width < 1, or a stage deeper than the model."""
    for key, value, allowed in (("mode", settings.mode, MODES), ("prior", settings.prior, PRIORS),
                                ("positions", settings.positions, POSITIONS),
                                ("map_reference", settings.map_reference, MAP_REFERENCES),
                                ("pruning_rule", settings.pruning_rule, PRUNING_RULES)):
        if value not in allowed:
            raise UserError(f"attack.sequential.{key}={value!r} is not one of {', '.join(allowed)}")
    if settings.prior == "model" and settings.map_reference == "null_view" and not settings.null_view:
        raise UserError("attack.sequential.map_reference=null_view judges MAP against MAP on a null view, which "
                        "needs attack.sequential.null_view=true (or map_reference=prior)")
    if settings.pruning_rule == "no_decisive_miss" and settings.mode != "teacher_forced":
        raise UserError("attack.sequential.pruning_rule=no_decisive_miss scores the truth after the true prefix, "
                        "which needs attack.sequential.mode=teacher_forced")
    if not settings.ops or any(op not in OPS for op in settings.ops) or len(set(settings.ops)) != len(settings.ops):
        raise UserError(f"attack.sequential.ops must be distinct ops from {', '.join(OPS)}, got {list(settings.ops)}")
    missing = [op for op in settings.ops if op not in offload]
    if missing:
        raise UserError(f"attack.sequential.ops needs {missing} offloaded, but engine.offload is {list(offload)}: "
                        "an op kept in the TEE is not in the adversary view")
    layers = tuple(range(n_layers)) if settings.layers is None else settings.layers
    bad = [x for x in layers if not 0 <= x < n_layers]
    if not layers or bad or len(set(layers)) != len(layers):
        raise UserError(f"attack.sequential.layers={list(layers)} must be distinct layers in 0..{n_layers - 1} "
                        "(null: all)")
    for stage in settings.prune or ():
        if len(stage) not in (2, 3):
            raise UserError(f"attack.sequential.prune: each stage is [layers_upto, keep] or [layers_upto, keep, "
                            f"prior_keep], got {list(stage)}")
        upto, keep = stage[:2]
        if keep < 1 or min(stage[2:], default=1) < 1:
            raise UserError(f"attack.sequential.prune: a stage keeps {list(stage[1:])} candidates; a pruning width "
                            "must be >= 1")
        if not 0 <= upto <= n_layers:
            raise UserError(f"attack.sequential.prune: stage depth {upto} is outside 0..{n_layers} (the model has "
                            f"{n_layers} layers)")
    if settings.prune_prior is not None and settings.prune_prior < 1:
        raise UserError(f"attack.sequential.prune_prior keeps {settings.prune_prior} candidates; a pruning width "
                        "must be >= 1")
    if settings.prune_union_prior is not None and settings.prune_union_prior < 1:
        raise UserError(f"attack.sequential.prune_union_prior keeps {settings.prune_union_prior} candidates; a "
                        "pruning width must be >= 1")
    if settings.max_positions is not None and settings.max_positions < 1:
        raise UserError(f"attack.sequential.max_positions must be >= 1 or null, got {settings.max_positions}")
    if not 0 < settings.min_pruning_recall <= 1:
        raise UserError(f"attack.sequential.min_pruning_recall must lie in (0, 1], got {settings.min_pruning_recall}")
    if settings.chunk < 1:
        raise UserError(f"attack.sequential.chunk must be >= 1, got {settings.chunk}")
    return tuple(sorted(layers))


PRIOR_STAGE = -1   # the depth that marks prune_prior's stage: the prior alone, no exposure


def stages(settings: Settings, keys: Sequence[Key], vocab: int) -> list[tuple[int, int]]:
    """The effective pruning stages (depth, keep), each depth clamped to the deepest used layer + 1; a stage
    that adds no used exposure to the one before (or has none) is dropped; the final full scoring is not a
    stage. prune_prior's stage comes first, with depth PRIOR_STAGE."""
    return [(upto, keep) for upto, keep, _ in _plan(settings, keys, vocab)]


def stage_priors(settings: Settings, keys: Sequence[Key], vocab: int) -> list[int | None]:
    """Per stage of `stages`, how many of the prior's best it keeps besides its own `keep` best (a stage's
    third element, and prune_union_prior on the first exposure stage: the larger of the two), or None."""
    plan = _plan(settings, keys, vocab)
    out = [prior for _, _, prior in plan]
    widened = union_stage([(upto, keep) for upto, keep, _ in plan], settings)
    if widened is not None:
        assert settings.prune_union_prior is not None
        out[widened] = max(out[widened] or 0, min(settings.prune_union_prior, vocab))
    return out


def _plan(settings: Settings, keys: Sequence[Key], vocab: int) -> list[tuple[int, int, int | None]]:
    """stages() with each stage's own prior width (its third element, or None). Two stages that read the same
    exposures merge into one keeping the narrower of each width (None: none of the prior's)."""
    depth = max(layer for _, layer in keys) + 1
    out: list[tuple[int, int, int | None]] = []
    if settings.prune_prior is not None:
        out.append((PRIOR_STAGE, min(settings.prune_prior, vocab), None))
    for stage in settings.prune or ():
        upto, keep = min(stage[0], depth), min(stage[1], vocab)
        prior = min(stage[2], vocab) if len(stage) > 2 else None
        if not _covered(keys, upto):
            continue
        if out and out[-1][0] != PRIOR_STAGE and _covered(keys, out[-1][0]) == _covered(keys, upto):
            before = out[-1][2]
            out[-1] = (out[-1][0], min(out[-1][1], keep), None if before is None or prior is None
                       else min(before, prior))
            continue
        out.append((upto, keep, prior))
    return out


def union_stage(plan: Sequence[tuple[int, int]], settings: Settings) -> int | None:
    """The index in `plan` of the stage that prune_union_prior widens (the first that reads an exposure), or
    None."""
    if settings.prune_union_prior is None:
        return None
    return next((i for i, (upto, _) in enumerate(plan) if upto != PRIOR_STAGE), None)


def _covered(keys: Sequence[Key], upto: int) -> tuple[Key, ...]:
    return tuple(k for k in keys if k[1] < upto or (upto == 0 and k == ("qkv", 0)))


def public_prefix_length(tokenizer, input_ids: Sequence[int], chat_template: bool) -> int:
    """Tokens of the public chat-template header before the prompt's text: the longest common prefix of the
    prompt and the template rendered around an empty message (at least 1; 1 without a template)."""
    if not chat_template:
        return 1
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True,
                                             tokenize=False)
    empty = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    n = 0
    while n < min(len(empty), len(input_ids)) and empty[n] == input_ids[n]:
        n += 1
    return max(1, n)


# ---------------------------------------------------------------------------------------------------
# The victim's side: one recorded view, and what the attacker reads of it
# ---------------------------------------------------------------------------------------------------

@torch.no_grad()
def record_view(model: nn.Module, prompts: Sequence[Sequence[int]], *, configuration: str, epsilon: float | None,
                seed: int, offload: Sequence[str], sigma_scale: float, sensitivity_rule: str, pad_token_id: int,
                batch_size: int, epsilon_lengths: Sequence[int] | None = None, meta: dict | None = None,
                ) -> tuple[list[AdversaryView], list[OpSensitivity]]:
    """The prompts submitted once through the split engine under `configuration` (prefill only, no LM head),
    one AdversaryView per batch: what the accelerator received; and the engine's Δ table (harness.splitee.
    sensitivity), which `op_sigmas` takes rather than computing it again."""
    from harness.splitee.engine import EngineSettings, SplitEngine

    settings = EngineSettings(configuration=configuration, epsilon=epsilon, seed=seed, record_view=True,
                              offload=tuple(op for op in offload if op != "lm_head"), sigma_scale=sigma_scale,
                              sensitivity_rule=sensitivity_rule)
    engine = SplitEngine(model, settings)
    views = []
    for start in range(0, len(prompts), batch_size):
        batch = [list(map(int, p)) for p in prompts[start:start + batch_size]]
        engine.generate(batch, 1, pad_token_id=pad_token_id,
                        epsilon_lengths=None if epsilon_lengths is None else list(epsilon_lengths[start:start + batch_size]))
        views.append(AdversaryView(list(engine.view.exposures), dict(meta or {})))
        engine.view.exposures.clear()
    return views, engine.table


def prompt_rows(views: Sequence[AdversaryView], lengths: Sequence[int], batch_size: int,
                keys: Sequence[Key]) -> list[dict[Key, torch.Tensor]]:
    """Per prompt, the prefill exposure rows [len_r, d] of every used (op, layer), read from the views'
    `masked_input` channel alone (left padding: row r holds prompt r in its last len_r positions). A view
    without one of them is a UserError: the attacker was asked for a channel the run did not expose."""
    out: list[dict[Key, torch.Tensor]] = []
    for b, view in enumerate(views):
        batch_lengths = lengths[b * batch_size:(b + 1) * batch_size]
        rows: list[dict[Key, torch.Tensor]] = [{} for _ in batch_lengths]
        for op, layer in keys:
            found = view.select(op=op, layer=layer, step=0, channel=MASKED_INPUT)
            if len(found) != 1:
                raise UserError(f"the adversary view holds {len(found)} prefill exposures of {op}[{layer}] on the "
                                f"{MASKED_INPUT} channel; the sequential attacker needs exactly one")
            t = found[0].tensor
            if t.dim() != 3 or t.shape[0] != len(batch_lengths) or t.shape[1] < max(batch_lengths):
                raise ValueError(f"{op}[{layer}] exposure has shape {tuple(t.shape)} for lengths {list(batch_lengths)}")
            width = t.shape[1]
            for r, n in enumerate(batch_lengths):
                rows[r][(op, layer)] = t[r, width - n:].float()
        out.extend(rows)
    return out


def op_sigmas(model: nn.Module, configuration: str, epsilon: float | None, epsilon_lengths: Sequence[int],
              keys: Sequence[Key], *, sigma_scale: float, sensitivity_rule: str,
              table: Sequence[OpSensitivity] | None = None) -> list[dict[Key, float]]:
    """σ of every used exposure for every prompt, as the attacker computes it from public knowledge: Δ of
    the op from the weights (harness.splitee.sensitivity; `table` where it is already computed, record_view's
    under `sensitivity_rule`) times the configuration's noise factor sigma_scale/ε
    (harness.configurations.noise_factors), the engine's own product in float32. 1.0 where nothing is masked
    with noise (t3, sigma_scale = 0): the score becomes exact matching."""
    if table is None:
        table = sensitivity_table(model, tuple(dict.fromkeys(op for op, _ in keys)), sensitivity_rule)
    delta = {(r.op, r.layer): r.delta for r in table}
    factors = configurations.noise_factors(configuration, epsilon, list(epsilon_lengths), sigma_scale)
    out = []
    for f in factors:
        # The engine's σ: (Δ · factor) in float32 (harness/splitee/mechanisms.py Gaussian._sigma).
        row = {k: float(torch.tensor(delta[k]) * torch.tensor(f, dtype=torch.float32)) for k in keys}
        out.append({k: (s if s > 0 else 1.0) for k, s in row.items()})
    return out


# ---------------------------------------------------------------------------------------------------
# The attacker's clear computation
# ---------------------------------------------------------------------------------------------------

@torch.no_grad()
def layer0_codebook(model: nn.Module, chunk: int = 8192) -> torch.Tensor:
    """μ_qkv0(v) = RMSNorm₀(E[v]) for every token, [V, d] (attacks/splitee/bayes.py codebook)."""
    from attacks.splitee.bayes import codebook

    return codebook(model, chunk)


class Prefix:
    """A prefix the attacker extends token by token (free-running: its own recovery): its keys and values (batch
    1) and the model's next-token log-probabilities after it."""

    def __init__(self, model: nn.Module, tokens: Sequence[int]) -> None:
        from transformers import DynamicCache

        self.model = model
        self.tokens: list[int] = []
        self.cache = DynamicCache(config=model.config)
        self.log_prior: torch.Tensor | None = None
        self.extend(tokens)

    @property
    def length(self) -> int:
        return len(self.tokens)

    @torch.no_grad()
    def extend(self, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        ids = torch.as_tensor([list(tokens)], dtype=torch.long)
        pos = torch.arange(len(self.tokens), len(self.tokens) + len(tokens))[None]
        logits = self.model(input_ids=ids, position_ids=pos, cache=self.cache, use_cache=True,
                            logits_to_keep=1).logits
        self.log_prior = torch.log_softmax(logits[0, -1].double(), -1)
        self.tokens.extend(int(t) for t in tokens)

    def kv(self, n_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.cache.layers[:n_layers]]


@dataclass(frozen=True)
class TruePrefix:
    """The true prefix of one position: its `length` tokens' keys and values per layer ([1, H_kv, length, d],
    views into a Prefill's) and the model's next-token log-probabilities after it."""

    length: int
    keys_values: list[tuple[torch.Tensor, torch.Tensor]]
    log_prior: torch.Tensor

    def kv(self, n_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.keys_values[:n_layers]


class Prefill:
    """One forward pass over a prompt's true tokens up to its last attacked position: every layer's keys and
    values, and the model's next-token logits after each prefix a position asks for. `at(p)` is position p's
    true prefix, read from it and never computed again (causal attention: the keys and values of tokens 0..p−1
    do not depend on what follows them)."""

    @torch.no_grad()
    def __init__(self, model: nn.Module, tokens: Sequence[int], positions: Sequence[int]) -> None:
        from transformers import DynamicCache

        # No config: every layer keeps every key (a sliding-window layer's cache would keep only its last
        # window − 1, and at(p) slices the first p); the model's own mask still applies its window here.
        cache = DynamicCache()
        ids = torch.as_tensor([[int(t) for t in tokens[:max(positions)]]], dtype=torch.long)
        self.rows = {p: i for i, p in enumerate(positions)}
        keep = torch.as_tensor([p - 1 for p in positions], dtype=torch.long)   # position p's prior: logits at p − 1
        self.logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep).logits[0]
        self.keys_values = [(layer.keys, layer.values) for layer in cache.layers]

    def at(self, p: int) -> TruePrefix:
        return TruePrefix(p, [(k[:, :, :p], v[:, :, :p]) for k, v in self.keys_values],
                          torch.log_softmax(self.logits[self.rows[p]].double(), -1))


class _Enough(Exception):
    """Raised by the hook of the last op input a stage needs, to end the forward there."""


CANDIDATE_ATTENTION = "splitbench_candidates"   # the attention implementation candidate_inputs runs the model with


def _candidate_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask, scaling: float, dropout: float = 0.0, *, prefix_kv, **kwargs):
    """Attention of n candidates for one position, each as if it alone followed the prefix: query [1, H, n, d],
    key and value the candidates' own [1, H_kv, n, d]; candidate i attends to the prefix's keys and values
    (`prefix_kv`, per layer, [1, H_kv, p, d]) and to its own key and value alone, never to another candidate's.
    Eager attention's arithmetic (scores · scaling, float32 softmax), with a query head g·j+i reading KV head j
    (transformers' repeat_kv). The mask is not read: which keys a candidate sees is the whole point. A
    sliding-window layer (Gemma 3's local ones) sees the prefix's last window − 1 keys besides its own."""
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("candidate attention has no attention logit soft-capping")
    prefix_k, prefix_v = prefix_kv[module.layer_idx]
    window = kwargs.get("sliding_window")
    if window is not None:   # the last ones of whatever the cache holds (a sliding layer's holds no more)
        first = max(0, prefix_k.shape[2] - (window - 1))
        prefix_k, prefix_v = prefix_k[:, :, first:], prefix_v[:, :, first:]
    _, heads, n, d = query.shape
    kv_heads, p = key.shape[1], prefix_k.shape[2]
    q = query.reshape(kv_heads, heads // kv_heads, n, d)
    own = (q * key.reshape(kv_heads, 1, n, d)).sum(-1, keepdim=True)                       # [H_kv, g, n, 1]
    on_prefix = torch.matmul(q.reshape(kv_heads, -1, d), prefix_k[0].transpose(1, 2))     # [H_kv, g·n, p]
    scores = torch.cat([on_prefix.view(kv_heads, -1, n, p), own], -1) * scaling
    weights = torch.softmax(scores, -1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights[..., :p].reshape(kv_heads, -1, p), prefix_v[0]).view(kv_heads, -1, n, d)
    out = out + weights[..., p:] * value.reshape(kv_heads, 1, n, d)
    return out.reshape(1, heads, n, d).transpose(1, 2).contiguous(), None


@torch.no_grad()
def candidate_inputs(model: nn.Module, prefix: Prefix | TruePrefix, candidates: torch.Tensor, upto: int,
                     keys: Sequence[Key], chunk: int) -> dict[Key, torch.Tensor]:
    """The input of every op in `keys` (layer < upto) at the next position for each candidate token, [K, d],
    through layers 0..upto−1 of the model (forward pre-hooks on the first linear of each op: q_proj, o_proj,
    gate_proj). The candidates of a chunk go in as one sequence, all at the prefix's next position, through
    the model's own layers with `_candidate_attention`: each attends to the prefix's keys and values, read
    where they are (neither copied nor recomputed per chunk), and to itself, and nothing is spent on pairs of
    candidates."""
    from transformers import AttentionInterface

    from attacks.splitee.capture import truncated

    wanted = [k for k in keys if k[1] < upto]
    if not wanted:
        return {}
    # The forward stops once the last wanted input is read: the rest of that layer (its MLP, when the last
    # op is Gate/Up: three quarters of a layer-0 stage's work) reaches no exposure the stage scores.
    last = max(wanted, key=lambda k: (k[1], OPS.index(k[0])))
    inner = truncated(model, last[1] + 1).model
    layers = decoder_layers(model)
    store: dict[Key, list[torch.Tensor]] = {k: [] for k in wanted}

    def hook(key: Key):
        def read(_module, args):
            store[key].append(args[0][0].float())
            if key == last:
                raise _Enough
        return read

    AttentionInterface.register(CANDIDATE_ATTENTION, _candidate_attention)
    handles = [layers[key[1]].get_submodule(OP_MEMBERS[key[0]][0]).register_forward_pre_hook(hook(key))
               for key in wanted]
    kv = prefix.kv(last[1] + 1)
    p = prefix.length
    # The model's layers read their attention implementation from the (shared) config at every call; with an
    # implementation the mask functions do not know, the model builds no mask either.
    config, before = model.config, model.config._attn_implementation
    config._attn_implementation = CANDIDATE_ATTENTION
    try:
        for start in range(0, candidates.numel(), chunk):
            ids = candidates[start:start + chunk]
            try:
                inner(input_ids=ids[None], position_ids=torch.full((1, ids.numel()), p, dtype=torch.long),
                      use_cache=False, prefix_kv=kv)
            except _Enough:
                pass
    finally:
        config._attn_implementation = before
        for h in handles:
            h.remove()
    return {k: torch.cat(v) for k, v in store.items()}


def gaussian_scores(mu: torch.Tensor, y: torch.Tensor, sigma: float, squares: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """log N(y; μ_v, σ²I) for each row μ_v of mu, up to the constant −‖y‖²/(2σ²) − d·log(σ√2π) shared by
    every candidate: (2·yᵀμ_v − ‖μ_v‖²)/(2σ²), float64 out (`squares`: ‖μ_v‖², if already computed). The
    shared term is left out rather than subtracted, so a huge σ loses no precision to cancellation."""
    if squares is None:
        squares = (mu * mu).sum(-1)
    return (2.0 * (mu @ y.float()) - squares).double() / (2.0 * sigma * sigma)


# ---------------------------------------------------------------------------------------------------
# The attack
# ---------------------------------------------------------------------------------------------------

@dataclass
class Scorer:
    """One attacker: the prior's weight (0: likelihood, 1: MAP) and whose view rows it reads."""

    name: str
    prior_weight: float
    view: str                 # own | null


@dataclass
class ScorerResult:
    guesses: list[list[int]] = field(default_factory=list)      # per prompt, per attacked position
    hits: list[list[bool]] = field(default_factory=list)
    survived: list[list[int]] = field(default_factory=list)     # per stage: positions whose truth survived it
    # per stage, per position: the truth's rank (0 = best) among the stage's candidates by the score it prunes
    # by, None where an earlier stage dropped it: how wide the stage had to be (docs/sequential_attack.md)
    ranks: list[list[int | None]] = field(default_factory=list)
    # per prompt, per attacked position: the truth's rank in the final scoring (0: the guess), the vocabulary's
    # size where pruning dropped it (it ranks after every survivor): the per-position score of `roc_tests`
    final_ranks: list[list[int]] = field(default_factory=list)


@dataclass
class Outcome:
    """What one sequential attack measured (the runner turns it into results.json)."""

    scorers: dict[str, ScorerResult]
    prior_guesses: list[list[int]]
    prior_hits: list[list[bool]]
    truth: list[list[int]]
    positions: list[list[int]]         # absolute positions attacked, per prompt
    stages: list[tuple[int, int]]
    keys: list[Key]
    null_of: list[int | None]          # the prompt whose view each prompt's null scorers read
    seconds: float
    n_positions: int
    forward_candidates: int            # candidates run through the model, summed over positions and stages
    vocab: int

    def recall(self, name: str) -> list[float]:
        s = self.scorers[name]
        return [n / self.n_positions for n in s.survived] if self.n_positions else []


def scorers_for(settings: Settings) -> list[Scorer]:
    out = [Scorer(LIKELIHOOD, 0.0, "own")]
    if settings.prior == "model":
        out.append(Scorer(MAP, 1.0, "own"))
    if settings.null_view:
        out += [Scorer(f"{s.name}_null", s.prior_weight, "null") for s in list(out)]
    return out


def attack_positions(settings: Settings, lengths: Sequence[int], starts: Sequence[int]) -> list[list[int]]:
    out = []
    for n, start in zip(lengths, starts):
        start = max(1, start if settings.positions == "text" else 1)
        stop = n if settings.max_positions is None else min(n, start + settings.max_positions)
        out.append(list(range(start, stop)))
    return out


def null_partners(positions: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[int | None]:
    """For each prompt, the next other prompt (cyclically) long enough to hold its attacked positions."""
    out: list[int | None] = []
    n = len(lengths)
    for r, pos in enumerate(positions):
        need = (max(pos) + 1) if pos else 0
        out.append(next(((r + j) % n for j in range(1, n) if lengths[(r + j) % n] >= need), None))
    return out


@torch.no_grad()
def run(model: nn.Module, prompts: Sequence[Sequence[int]], rows: Sequence[dict[Key, torch.Tensor]],
        sigmas: Sequence[dict[Key, float]], settings: Settings, keys: Sequence[Key], starts: Sequence[int],
        *, book: torch.Tensor | None = None, log=None) -> Outcome:
    """The attack on every prompt (module docstring). `rows[r]`/`sigmas[r]`: prompt r's exposure rows and
    their σ (prompt_rows, op_sigmas); `starts[r]`: its first text position (public_prefix_length)."""
    keys = list(keys)
    vocab = model.get_input_embeddings().weight.shape[0]
    plan = stages(settings, keys, vocab)
    if book is None and any(upto == 0 for upto, _ in plan):
        book = layer0_codebook(model)
    book_sq = None if book is None else (book * book).sum(-1)
    scorers = scorers_for(settings)
    lengths = [len(p) for p in prompts]
    positions = attack_positions(settings, lengths, starts)
    partners = null_partners(positions, lengths)
    if settings.null_view and any(p is None for p in partners):
        raise UserError("attack.sequential.null_view needs, for every prompt, another prompt at least as long as "
                        "its attacked positions; lower attack.sequential.max_positions or add prompts")
    results = {s.name: ScorerResult(survived=[0] * len(plan), ranks=[[] for _ in plan]) for s in scorers}
    prior_guesses, prior_hits, truth = [], [], []
    counter = {"forward": 0}
    start_time = time.perf_counter()
    for r, prompt in enumerate(prompts):
        tokens = [int(t) for t in prompt]
        pos = positions[r]
        truth.append([tokens[p] for p in pos])
        for s in scorers:
            results[s.name].guesses.append([])
            results[s.name].hits.append([])
            results[s.name].final_ranks.append([])
        if not pos:
            prior_guesses.append([])
            prior_hits.append([])
            continue
        views = {"own": (rows[r], sigmas[r])}
        if settings.null_view:
            views["null"] = (rows[partners[r]], sigmas[partners[r]])
        # The prior-only floor always reads the true prefix, from one forward pass over the prompt (Prefill);
        # teacher-forced scorers share it, free-running ones each extend their own recovery a token at a time.
        prefill = Prefill(model, tokens, pos)
        if settings.mode == "teacher_forced":
            groups, chains = [scorers], [None]
        else:
            groups = [[s] for s in scorers]
            chains = [Prefix(model, tokens[:pos[0]]) for _ in groups]
        guesses_p, hits_p = [], []
        for p in pos:
            true_prefix = prefill.at(p)
            g = int(true_prefix.log_prior.argmax())
            guesses_p.append(g)
            hits_p.append(g == tokens[p])
            for group, chain in zip(groups, chains):
                best = _position(model, true_prefix if chain is None else chain, group, views, p, keys, plan, book,
                                 book_sq, settings, tokens[p], results, counter)
                if chain is not None:
                    chain.extend([best[group[0].name]])
        prior_guesses.append(guesses_p)
        prior_hits.append(hits_p)
        if log is not None:
            done = {s.name: sum(results[s.name].hits[-1]) for s in scorers}
            log(f"sequential attack: prompt {r + 1}/{len(prompts)}: {len(pos)} positions, hits {done}, "
                f"prior {sum(hits_p)}")
    seconds = time.perf_counter() - start_time
    n_positions = sum(len(p) for p in positions)
    return Outcome(results, prior_guesses, prior_hits, truth, positions, plan, keys,
                   partners if settings.null_view else [None] * len(prompts), seconds, n_positions,
                   counter["forward"], vocab)


def _position(model, prefix: Prefix, group: Sequence[Scorer], views, p: int, keys: Sequence[Key],
              plan: Sequence[tuple[int, int]], book, book_sq, settings: Settings, true_token: int,
              results: dict[str, ScorerResult], counter: dict[str, int]) -> dict[str, int]:
    """One position for the scorers sharing `prefix`: staged pruning, then the full score; records each
    scorer's guess, its hit and the stages its true token survived, and returns the guesses."""
    assert prefix.log_prior is not None
    log_prior = prefix.log_prior
    vocab = log_prior.numel()
    everything = torch.arange(vocab)   # one per position, shared: alive's tensors are replaced, never written
    alive: dict[str, torch.Tensor] = {s.name: everything for s in group}
    depth = max(layer for _, layer in keys) + 1
    priors = stage_priors(settings, keys, vocab)
    for i, (upto, keep) in enumerate([*plan, (depth, 1)]):
        final = i == len(plan)
        if final and plan and _covered(keys, plan[-1][0]) == _covered(keys, depth):
            # The last stage already scored its survivors with every used exposure, best first: its rank of the
            # truth is the final one.
            for s in group:
                _record(results[s.name], int(alive[s.name][0]), true_token, results[s.name].ranks[i - 1][-1], vocab)
            break
        if upto == PRIOR_STAGE:   # prune_prior: every scorer keeps the prior's best, no exposure read
            top = log_prior.topk(keep).indices
            for s in group:
                _rank(results[s.name], i, log_prior, everything, true_token)
                alive[s.name] = top
                if bool((top == true_token).any()):
                    results[s.name].survived[i] += 1
            continue
        used = _covered(keys, upto)
        partial: dict[str, torch.Tensor] = {}     # per view: the exposures' log-likelihood of every candidate
        if upto == 0:   # the codebook stage: the whole vocabulary, layer-0 QKV alone, no forward pass
            for view in {s.view for s in group}:
                y_rows, sig = views[view]
                y, sigma = y_rows[("qkv", 0)][p], sig[("qkv", 0)]
                partial[view] = (2.0 * (book @ y) - book_sq).double() / (2.0 * sigma * sigma)
            where = None
        else:
            union = torch.unique(torch.cat([alive[s.name] for s in group]))
            mus = candidate_inputs(model, prefix, union, upto, keys, settings.chunk)
            counter["forward"] += union.numel()
            where = torch.full((vocab,), -1, dtype=torch.long)
            where[union] = torch.arange(union.numel())
            squares = {key: (mus[key] * mus[key]).sum(-1) for key in used}
            for view in {s.view for s in group}:
                y_rows, sig = views[view]
                partial[view] = sum(gaussian_scores(mus[key], y_rows[key][p], sig[key], squares[key]) for key in used)
        for s in group:
            cand = alive[s.name]
            sc = partial[s.view][cand if where is None else where[cand]]
            if s.prior_weight:
                sc = sc + s.prior_weight * log_prior[cand]
            if final:
                at = (cand == true_token).nonzero()
                rank = int((sc > sc[int(at[0])]).sum()) if at.numel() else None
                _record(results[s.name], int(cand[int(sc.argmax())]), true_token, rank, vocab)
            else:
                _rank(results[s.name], i, sc, cand, true_token)
                alive[s.name] = cand[sc.topk(min(keep, cand.numel())).indices]
                if priors[i] is not None:   # the prior's best join, after the stage's own (alive stays best first)
                    extra = log_prior.topk(priors[i]).indices
                    # among this stage's candidates only: a token an earlier stage (prune_prior) dropped
                    # has no score here
                    extra = extra[torch.isin(extra, cand) & ~torch.isin(extra, alive[s.name])]
                    alive[s.name] = torch.cat([alive[s.name], extra])
                if bool((alive[s.name] == true_token).any()):
                    results[s.name].survived[i] += 1
    return {s.name: results[s.name].guesses[-1][-1] for s in group}


def _rank(result: ScorerResult, stage: int, scores: torch.Tensor, cand: torch.Tensor, true_token: int) -> None:
    at = (cand == true_token).nonzero()
    result.ranks[stage].append(int((scores > scores[int(at[0])]).sum()) if at.numel() else None)


def _record(result: ScorerResult, guess: int, true_token: int, rank: int | None, vocab: int) -> None:
    result.guesses[-1].append(guess)
    result.hits[-1].append(guess == true_token)
    result.final_ranks[-1].append(vocab if rank is None else rank)


def candidates_per_position(outcome: Outcome) -> float:
    """Mean number of candidates run through the model per position (the codebook stage scores the whole
    vocabulary without a forward pass and is not counted)."""
    return outcome.forward_candidates / outcome.n_positions if outcome.n_positions else math.nan


@torch.no_grad()
def pruning_decisive(model: nn.Module, prompts: Sequence[Sequence[int]], outcome: Outcome,
                     rows: Sequence[dict[Key, torch.Tensor]], sigmas: Sequence[dict[Key, float]],
                     settings: Settings) -> dict[str, int]:
    """Per scorer, the missed positions where the truth, scored with every used exposure (and the prior, for
    MAP), scores at least as high as the scorer's guess. Only there can the pruning have cost a hit: at any
    other miss the unpruned argmax is not the truth either (it scores at least the guess's score, which
    beats the truth's). A truth that survived every stage and lost scores below the guess here too (up to
    rounding between the two computations). One forward of the prompt (Prefill) and of the truth and the
    guesses per missed position; teacher-forced only (the prefix is the truth's)."""
    if settings.mode != "teacher_forced":
        raise ValueError("pruning_decisive reads the true prefix: teacher_forced outcomes only")
    keys = outcome.keys
    depth = max(layer for _, layer in keys) + 1
    count = {name: 0 for name in outcome.scorers}
    weight = {s.name: s.prior_weight for s in scorers_for(settings)}
    for r, prompt in enumerate(prompts):
        checked = [p for j, p in enumerate(outcome.positions[r])
                   if not all(res.hits[r][j] for res in outcome.scorers.values())]
        prefill = Prefill(model, prompt, checked) if checked else None
        for j, p in enumerate(outcome.positions[r]):
            truth = outcome.truth[r][j]
            missed = {name: res.guesses[r][j] for name, res in outcome.scorers.items() if not res.hits[r][j]}
            if not missed:
                continue
            assert prefill is not None
            prefix = prefill.at(p)
            cand = torch.tensor(sorted({truth, *missed.values()}), dtype=torch.long)
            mus = candidate_inputs(model, prefix, cand, depth, keys, settings.chunk)
            at = {int(t): i for i, t in enumerate(cand)}
            for name, guess in missed.items():
                view = r if not name.endswith("_null") else outcome.null_of[r]
                assert view is not None
                full = sum(gaussian_scores(mus[k], rows[view][k][p], sigmas[view][k]) for k in keys)
                full = full + weight[name] * prefix.log_prior[cand]
                count[name] += bool(full[at[truth]] >= full[at[guess]])
    return count


def decisive_check(model: nn.Module, prompts: Sequence[Sequence[int]], outcome: Outcome,
                   rows: Sequence[dict[Key, torch.Tensor]], sigmas: Sequence[dict[Key, float]],
                   settings: Settings) -> dict | None:
    """What attack.sequential.pruning_rule=no_decisive_miss reads (results.json `sequential.pruning_decisive`):
    per scorer its decisive misses (pruning_decisive) and its misses, the positions forwarded for the check
    (those some scorer missed) and its seconds. None with no pruning stage: the attacker is then the unpruned
    one, which issue 32's "or with no pruning" certifies as it is."""
    if not outcome.stages:
        return None
    start = time.perf_counter()
    counts = pruning_decisive(model, prompts, outcome, rows, sigmas, settings)
    missed = [[not all(res.hits[r][j] for res in outcome.scorers.values()) for j in range(len(pos))]
              for r, pos in enumerate(outcome.positions)]
    return {"by_scorer": {name: {"decisive": counts[name], "misses": sum(1 for h in _flat(res.hits) if not h)}
                          for name, res in outcome.scorers.items()},
            "positions_checked": sum(_flat(missed)), "seconds": time.perf_counter() - start}


# results.json names of each scorer's metrics
PREFIX = {LIKELIHOOD: "sequential", MAP: "sequential_map", f"{LIKELIHOOD}_null": "sequential_null",
          f"{MAP}_null": "sequential_map_null"}


# map_reference → the paired difference MAP's verdict reads, and the reference its reason names
MAP_VERDICT = {"prior": ("map_minus_prior", "the prior alone"), "null_view": ("map_minus_null", "MAP on a null view")}


def _flat(hits: Sequence[Sequence[bool]]) -> list[bool]:
    return [h for row in hits for h in row]


def summarise(outcome: Outcome, settings: Settings, margin_pp: float, decisive: dict | None = None) -> dict:
    """results.json `metrics` of one sequential attack: each scorer's top-1 (Wilson interval over
    positions) and token F1 (multiset, macro over prompts, t interval), the prior-only floor (its top-1 and
    its token F1, `prior_token_f1`: the prior's guesses scored as the attackers' are), the paired
    differences (MAP − prior; with a null view MAP there − prior and MAP − MAP there; likelihood − the same
    attacker on a null view), each attacker's verdict and reason (attacks/controls.py sequential_verdict; MAP's
    reads `map_minus_prior` or, with map_reference=null_view, `map_minus_null`, named in `verdict_map_reads`),
    the worst of them, and the cost. With pruning_rule=no_decisive_miss each verdict's pruning condition is
    its own scorer's decisive misses in `decisive` (decisive_check; None only where nothing was pruned)."""
    from attacks import controls
    from metrics.privacy import corpus_token_prf
    from metrics.proportions import paired_difference_record, rate_record

    m: dict = {"n_positions": outcome.n_positions, "n_prompts_attacked": sum(1 for p in outcome.positions if p)}
    prior = _flat(outcome.prior_hits)
    m.update(rate_record(prior, "prior_top1"))
    keep = [i for i, t in enumerate(outcome.truth) if t]
    truth = [outcome.truth[i] for i in keep]
    # The prior alone's guesses scored as the attackers' are: MAP's no-signal floor on the token-F1 scale
    # (the cross-system chart's x axis, runners/splitee/sequential_attack.py tradeoff)
    m.update(corpus_token_prf(truth, [outcome.prior_guesses[i] for i in keep]).f1.flat("prior_token_f1"))
    for name, result in outcome.scorers.items():
        prefix = PREFIX[name]
        m.update(rate_record(_flat(result.hits), f"{prefix}_top1"))
        f1 = corpus_token_prf(truth, [result.guesses[i] for i in keep]).f1
        m.update(f1.flat(f"{prefix}_token_f1"))
        recall = outcome.recall(name)
        m[f"{prefix}_pruning_recall_min"] = min(recall) if recall else 1.0
    teacher = settings.mode == "teacher_forced"
    if settings.pruning_rule == "no_decisive_miss" and outcome.stages and decisive is None:
        raise ValueError("pruning_rule=no_decisive_miss needs decisive_check's counts of a pruned attack")

    def decisive_misses(name: str) -> int | None:   # None: the recall rule (or no pruning, where both agree)
        if settings.pruning_rule != "no_decisive_miss" or decisive is None:
            return None
        return int(decisive["by_scorer"][name]["decisive"])

    judged = []
    if MAP in outcome.scorers:
        map_hits = _flat(outcome.scorers[MAP].hits)
        m.update(paired_difference_record(map_hits, prior, "map_minus_prior"))
        if f"{MAP}_null" in outcome.scorers:
            null_hits = _flat(outcome.scorers[f"{MAP}_null"].hits)
            # MAP on another prompt's view against the prior: MAP's bias on a view with no information about
            # the prompt (on SmolLM2 below the prior, docs/sequential_attack.md), and MAP against it
            m.update(paired_difference_record(null_hits, prior, "map_null_minus_prior"))
            m.update(paired_difference_record(map_hits, null_hits, "map_minus_null"))
        key, reference = MAP_VERDICT[settings.map_reference]
        if key not in m:
            raise ValueError(f"map_reference={settings.map_reference} needs the null view's MAP scorer (null_view)")
        v, why = controls.sequential_verdict(m[f"{key}_ci_lo"], m[f"{key}_ci_hi"], margin_pp,
                                             teacher_forced=teacher, pruning_recall=outcome.recall(MAP),
                                             min_recall=settings.min_pruning_recall, reference=reference,
                                             decisive_misses=decisive_misses(MAP),
                                             certify=(m[f"{key}_earned_ci_lo"], m[f"{key}_earned_ci_hi"]))
        m["map_reference"], m["verdict_map_reads"] = settings.map_reference, key
        m["verdict_map"], m["verdict_map_reason"] = v, why
        judged.append((v, f"MAP: {why}"))
    if f"{LIKELIHOOD}_null" in outcome.scorers:
        m.update(paired_difference_record(_flat(outcome.scorers[LIKELIHOOD].hits),
                             _flat(outcome.scorers[f"{LIKELIHOOD}_null"].hits), "likelihood_minus_null"))
        v, why = controls.sequential_verdict(m["likelihood_minus_null_ci_lo"], m["likelihood_minus_null_ci_hi"],
                                             margin_pp, teacher_forced=teacher,
                                             pruning_recall=outcome.recall(LIKELIHOOD),
                                             min_recall=settings.min_pruning_recall,
                                             reference="the same attacker on a null view",
                                             decisive_misses=decisive_misses(LIKELIHOOD),
                                             certify=(m["likelihood_minus_null_earned_ci_lo"],
                                                      m["likelihood_minus_null_earned_ci_hi"]))
        m["verdict_likelihood"], m["verdict_likelihood_reason"] = v, why
        judged.append((v, f"likelihood: {why}"))
    if judged:
        m["verdict"] = controls.worst([v for v, _ in judged])
        m["verdict_reason"] = "; ".join(why for v, why in judged if v == m["verdict"])
    else:
        m["verdict"] = controls.INCONCLUSIVE
        m["verdict_reason"] = ("no reference to judge against: set attack.sequential.prior=model (MAP against the "
                               "prior alone) or attack.sequential.null_view=true")
    m["attack_gate"] = m["verdict"] == controls.AT_CHANCE
    m["gate_margin_pp"] = margin_pp
    m["seconds"] = outcome.seconds
    m["seconds_per_position"] = outcome.seconds / outcome.n_positions if outcome.n_positions else None
    m["candidates_per_position"] = candidates_per_position(outcome)
    m["vocab_fraction_forward"] = m["candidates_per_position"] / outcome.vocab
    return m


def roc_tests(outcome: Outcome) -> dict[str, dict]:
    """Each scorer as a membership-style test (metrics/roc.py), where the null view ran: per attacked position, the
    score −(the truth's rank in its final scoring) from the prompt's own view (positives) and from the null view,
    another prompt's, scored against the same tokens (negatives). A truth that pruning dropped ranks last (the
    vocabulary's size), so ties among the dropped are ties. MAP's null reads the prior, so its AUC is what the
    view adds to the prior."""
    from metrics import roc

    def scores(name: str) -> list[float]:
        return [-float(r) for ranks in outcome.scorers[name].final_ranks for r in ranks]

    return {name: roc.roc(scores(name), scores(f"{name}_null"),
                          positive=f"−rank of the true token in the {name} scorer's final scoring, own view",
                          negative="the same from the null view (another prompt's), against the same tokens")
            for name in (LIKELIHOOD, MAP) if name in outcome.scorers and f"{name}_null" in outcome.scorers
            and outcome.n_positions}


def record(outcome: Outcome, settings: Settings, layers_used: Sequence[int]) -> dict:
    """The attack's own section of results.json: what it was, per stage its pruning recall, and the pairing."""
    return {
        "mode": settings.mode,
        "prior": settings.prior,
        "map_reference": settings.map_reference,
        "layers_used": list(layers_used),
        "ops": list(settings.ops),
        "positions": settings.positions,
        "max_positions": settings.max_positions,
        "stages": [{"by": "prior", "keep": keep} if upto == PRIOR_STAGE else
                   {"layers_upto": upto, "keep": keep, **({"union_prior": prior} if prior is not None else {})}
                   for (upto, keep), prior in zip(outcome.stages,
                                                  stage_priors(settings, outcome.keys, outcome.vocab))],
        "pruning_recall": {name: outcome.recall(name) for name in outcome.scorers},
        "pruning_rule": settings.pruning_rule,
        "null_view_of": outcome.null_of,
        "n_exposures_per_position": len(outcome.keys),
        "vocab": outcome.vocab,
    }


def samples(outcome: Outcome, ids: Sequence) -> list[dict]:
    """samples.jsonl rows: per prompt the attacked positions, the true tokens, the prior's and each scorer's
    guesses, and `output_ids`, the recovery of the strongest attacker run (MAP where it ran)."""
    main = MAP if MAP in outcome.scorers else LIKELIHOOD
    return [{"id": pid, "positions": outcome.positions[i], "truth": outcome.truth[i],
             "prior_guess": outcome.prior_guesses[i],
             **{f"{PREFIX[name]}_guess": r.guesses[i] for name, r in outcome.scorers.items()},
             "output_ids": outcome.scorers[main].guesses[i]} for i, pid in enumerate(ids)]
