"""The collaboration engine (paper 003 §2): two causal LMs sharing a tokenizer decode one answer together.

Per step t both parties compute their next-token distribution over the shared vocabulary, the cloud's from
(x_pub, y_<t) and the edge's from (x_priv, x_pub, y_<t) (eqs. 1-2), each with its own KV cache:

- cloud-side fusion: the edge uploads `defence.upload(p_S, p_L)`; the cloud fuses α·p_L + (1−α)·upload
  (eq. 3) and appends the greedy token (temperature 0, paper A.1.2);
- edge-side fusion: the cloud sends p_L; the edge appends `defence.select(p_S, p_L)` and syncs it.

Decoding stops at EOS or after max_new_tokens. Everything the cloud receives goes into the adversary view
(harness/adversary_view.py), one exposure per message, op = the example's id:

- `public_query` (step 0): the cloud's prompt ids, x_pub as the cloud receives it;
- `uploaded_probs` (cloud-side, step t ≥ 1): a (n, 2) float64 tensor of (token id, uploaded probability),
  the `view_top` largest non-zero uploaded entries in descending order (every exposure metric reads at
  most the top 100; the rest of a dense upload is not kept);
- `synced_tokens` (edge-side, step t ≥ 1): the synchronised token id.

The distributions are computed in float64 from the models' float32 logits, truncated to the tokenizer's
size (Qwen's checkpoints pad the output layer past it, differently per size) and renormalised.

Examples are decoded together (`collaborate_batch`, `greedy_batch`), each party's rows in its model's own
batched cache; every example's numbers are those it gets alone, to the last bit (harness/collab/batching.py).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.adversary_view import Exposure
from harness.collab import batching
from harness.collab.defences import Defence, fuse

PUBLIC_QUERY, UPLOADED_PROBS, SYNCED_TOKENS = "public_query", "uploaded_probs", "synced_tokens"


@dataclass
class Decoded:
    """One example's collaborative decoding: the generated ids, the view's exposures, and timings.

    `step_seconds` has one entry per generated token: the wall time of the step that produced it, divided
    evenly among the examples that step decoded together (at batch 1, the step's own time); step 1 is the
    example's own prompt forwards (each prompt is forwarded alone) and its defence. `defence_seconds` is the
    example's own defence calls."""

    output_ids: list[int]
    exposures: list[Exposure] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    defence_seconds: float = 0.0


def shared_vocab(edge_tokenizer: Any, cloud_tokenizer: Any) -> int:
    """The shared vocabulary's size; raises ValueError when the two tokenizers differ (paper §2.1 assumes
    one vocabulary V; the paper's Limitations leave cross-vocabulary alignment open)."""
    if edge_tokenizer.get_vocab() != cloud_tokenizer.get_vocab():
        raise ValueError("the edge and cloud models have different tokenizers")
    return len(edge_tokenizer)


def _probs(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.softmax(logits[:vocab].double(), -1)


def collaborate_batch(edge: Any, cloud: Any, edge_ids: Sequence[list[int]], cloud_ids: Sequence[list[int]],
                      defence: Defence, *, mode: str, max_new_tokens: int, vocab: int, eos: int | None,
                      rngs: Sequence[torch.Generator], example_ids: Sequence[str], view_top: int,
                      min_rows: int = batching.MIN_ROWS, prompt_cache: Any = None) -> list[Decoded]:
    """Collaborative greedy decoding of several examples together under `defence` in fusion `mode` (cloud |
    edge), example i drawing from `rngs[i]` (one generator may serve several examples in sequence only at
    batch 1). Each example's numbers are those it gets decoded alone (harness/collab/batching.py).

    Where the edge is the cloud's model and every edge prompt is the cloud's (a null decode: the edge without
    x_priv), both parties would compute the same forward: it is computed once and p_S = p_L. `prompt_cache`
    (batching.PromptCache) serves prompts forwarded before."""
    n = len(example_ids)
    shared = edge is cloud and all(list(e) == list(c) for e, c in zip(edge_ids, cloud_ids))
    start = time.perf_counter()
    c = batching.Rows(cloud, cloud_ids, min_rows, prompt_cache)
    e = c if shared else batching.Rows(edge, edge_ids, min_rows, prompt_cache)
    outs = [Decoded([], [Exposure(example_ids[i], None, 0, (len(cloud_ids[i]),), torch.tensor(list(cloud_ids[i])),
                                  PUBLIC_QUERY)]) for i in range(n)]
    prefill = [c.prefill_seconds[i] + (0.0 if shared else e.prefill_seconds[i]) for i in range(n)]
    logits_L, logits_S = dict(enumerate(c.first)), None if shared else dict(enumerate(e.first))
    for t in range(1, max_new_tokens + 1):
        forward = time.perf_counter() - start
        tokens = {}
        for i in logits_L:
            row = time.perf_counter()
            p_L = _probs(logits_L[i], vocab)
            p_S = p_L if shared else _probs(logits_S[i], vocab)
            out = outs[i]
            d0 = time.perf_counter()
            if mode == "cloud":
                up = defence.upload(p_S, p_L, rngs[i])
                d1 = time.perf_counter()
                token = int(torch.argmax(fuse(p_L, up.probs, defence.alpha)))
                out.exposures.append(_upload_exposure(example_ids[i], t, up.probs, view_top))
            else:
                token = defence.select(p_S, p_L, rngs[i])
                d1 = time.perf_counter()
                out.exposures.append(Exposure(example_ids[i], None, t, (1,), torch.tensor([token]), SYNCED_TOKENS))
            out.defence_seconds += d1 - d0
            out.output_ids.append(token)
            own = time.perf_counter() - row      # this row's softmaxes, defence, fusion and exposure
            out.step_seconds.append((prefill[i] if t == 1 else forward / len(logits_L)) + own)
            if not (eos is not None and token == eos) and t < max_new_tokens:
                tokens[i] = token
        if not tokens:
            break
        start = time.perf_counter()
        logits_L = c.step(tokens)
        logits_S = None if shared else e.step(tokens)
    return outs


def collaborate(edge: Any, cloud: Any, edge_ids: list[int], cloud_ids: list[int], defence: Defence, *, mode: str,
                max_new_tokens: int, vocab: int, eos: int | None, rng: torch.Generator, example_id: str,
                view_top: int, min_rows: int = 1) -> Decoded:
    """Collaborative greedy decoding of one example (collaborate_batch at batch 1, by default one row per
    forward: the engine as it was before batching)."""
    return collaborate_batch(edge, cloud, [edge_ids], [cloud_ids], defence, mode=mode, max_new_tokens=max_new_tokens,
                             vocab=vocab, eos=eos, rngs=[rng], example_ids=[example_id], view_top=view_top,
                             min_rows=min_rows)[0]


def _upload_exposure(example_id: str, step: int, probs: torch.Tensor, view_top: int) -> Exposure:
    nonzero = int((probs > 0).sum())
    top = torch.topk(probs, min(view_top, nonzero)) if nonzero else None
    rows = (torch.stack([top.indices.double(), top.values], 1) if top is not None
            else torch.zeros((0, 2), dtype=torch.float64))
    return Exposure(example_id, None, step, tuple(rows.shape), rows, UPLOADED_PROBS)


def greedy_batch(model: Any, prompts: Sequence[list[int]], *, max_new_tokens: int, vocab: int | None, stop: Any,
                 top: int = 0, min_rows: int = batching.MIN_ROWS,
                 prompt_cache: Any = None) -> list[tuple[list[int], list[list[int]]]]:
    """One model decoding greedily alone from each prompt, together: per prompt its ids (up to and with the
    first id in `stop`, a set) and, with `top` > 0, its own top-`top` ids at every step. `vocab=None` takes
    the argmax of the raw logits over the whole output layer, as transformers' generate does (the inversion)."""
    rows = batching.Rows(model, prompts, min_rows, prompt_cache)
    out: list[tuple[list[int], list[list[int]]]] = [([], []) for _ in prompts]
    logits = dict(enumerate(rows.first))
    for t in range(1, max_new_tokens + 1):
        tokens = {}
        for i, row in logits.items():
            if vocab is None:
                token = int(torch.argmax(row))
            else:
                p = _probs(row, vocab)
                if top:
                    out[i][1].append(torch.topk(p, min(top, vocab)).indices.tolist())
                token = int(torch.argmax(p))
            out[i][0].append(token)
            if token not in stop and t < max_new_tokens:
                tokens[i] = token
        if not tokens:
            break
        logits = rows.step(tokens)
    return out


def cloud_only(cloud: Any, cloud_ids: list[int], *, max_new_tokens: int, vocab: int, eos: int | None,
               top: int, min_rows: int = 1) -> tuple[list[int], list[list[int]]]:
    """The no-signal floor's generation: the cloud decodes greedily alone from x_pub; returns its ids and
    its own top-`top` ids at every step (what it can guess with no upload at all). greedy_batch does several."""
    return greedy_batch(cloud, [cloud_ids], max_new_tokens=max_new_tokens, vocab=vocab,
                        stop=set() if eos is None else {eos}, top=top, min_rows=min_rows)[0]


@torch.no_grad()
def cloud_topk_along(cloud: Any, cloud_ids: list[int], synced: list[int], *, vocab: int, top: int) -> list[list[int]]:
    """TopK(p_L(· | y_<t, x_pub)) for every step t of a synced prefix, by one teacher-forced forward: what
    the cloud computes from the synchronised tokens in edge-side fusion (eq. 5, token-level)."""
    if not synced:
        return []
    ids = torch.tensor([cloud_ids + synced[:-1]], dtype=torch.long)
    logits = cloud(input_ids=ids, logits_to_keep=len(synced)).logits[0, :, :vocab]
    return torch.topk(logits.double(), min(top, vocab), dim=-1).indices.tolist()
