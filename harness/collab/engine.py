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
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.adversary_view import Exposure
from harness.collab.defences import Defence, fuse

PUBLIC_QUERY, UPLOADED_PROBS, SYNCED_TOKENS = "public_query", "uploaded_probs", "synced_tokens"


class Stepper:
    """One party's incremental forward: feed its prompt once, then one token per step, through a KV cache."""

    def __init__(self, model: Any, prompt_ids: list[int], vocab: int):
        self.model, self.vocab = model, vocab
        self.cache = None
        self.pending = torch.tensor([prompt_ids], dtype=torch.long)

    @torch.no_grad()
    def probs(self) -> torch.Tensor:
        out = self.model(input_ids=self.pending, cache=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.cache
        return torch.softmax(out.logits[0, -1, :self.vocab].double(), -1)

    def append(self, token: int) -> None:
        self.pending = torch.tensor([[token]], dtype=torch.long)


@dataclass
class Decoded:
    """One example's collaborative decoding: the generated ids, the view's exposures, and timings."""

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


def collaborate(edge: Any, cloud: Any, edge_ids: list[int], cloud_ids: list[int], defence: Defence, *, mode: str,
                max_new_tokens: int, vocab: int, eos: int | None, rng: torch.Generator, example_id: str,
                view_top: int) -> Decoded:
    """Collaborative greedy decoding of one example under `defence` in fusion `mode` (cloud | edge)."""
    e, c = Stepper(edge, edge_ids, vocab), Stepper(cloud, cloud_ids, vocab)
    out = Decoded([], [Exposure(example_id, None, 0, (len(cloud_ids),), torch.tensor(cloud_ids), PUBLIC_QUERY)])
    for t in range(1, max_new_tokens + 1):
        start = time.perf_counter()
        p_L, p_S = c.probs(), e.probs()
        d0 = time.perf_counter()
        if mode == "cloud":
            up = defence.upload(p_S, p_L, rng)
            d1 = time.perf_counter()
            token = int(torch.argmax(fuse(p_L, up.probs, defence.alpha)))
            out.exposures.append(_upload_exposure(example_id, t, up.probs, view_top))
        else:
            token = defence.select(p_S, p_L, rng)
            d1 = time.perf_counter()
            out.exposures.append(Exposure(example_id, None, t, (1,), torch.tensor([token]), SYNCED_TOKENS))
        out.defence_seconds += d1 - d0
        out.output_ids.append(token)
        out.step_seconds.append(time.perf_counter() - start)
        if eos is not None and token == eos:
            break
        e.append(token)
        c.append(token)
    return out


def _upload_exposure(example_id: str, step: int, probs: torch.Tensor, view_top: int) -> Exposure:
    nonzero = int((probs > 0).sum())
    top = torch.topk(probs, min(view_top, nonzero)) if nonzero else None
    rows = (torch.stack([top.indices.double(), top.values], 1) if top is not None
            else torch.zeros((0, 2), dtype=torch.float64))
    return Exposure(example_id, None, step, tuple(rows.shape), rows, UPLOADED_PROBS)


@torch.no_grad()
def cloud_only(cloud: Any, cloud_ids: list[int], *, max_new_tokens: int, vocab: int, eos: int | None,
               top: int) -> tuple[list[int], list[list[int]]]:
    """The no-signal floor's generation: the cloud decodes greedily alone from x_pub; returns its ids and
    its own top-`top` ids at every step (what it can guess with no upload at all)."""
    c = Stepper(cloud, cloud_ids, vocab)
    ids, sets = [], []
    for _ in range(max_new_tokens):
        p = c.probs()
        sets.append(torch.topk(p, min(top, vocab)).indices.tolist())
        token = int(torch.argmax(p))
        ids.append(token)
        if eos is not None and token == eos:
            break
        c.append(token)
    return ids, sets


@torch.no_grad()
def cloud_topk_along(cloud: Any, cloud_ids: list[int], synced: list[int], *, vocab: int, top: int) -> list[list[int]]:
    """TopK(p_L(· | y_<t, x_pub)) for every step t of a synced prefix, by one teacher-forced forward: what
    the cloud computes from the synchronised tokens in edge-side fusion (eq. 5, token-level)."""
    if not synced:
        return []
    ids = torch.tensor([cloud_ids + synced[:-1]], dtype=torch.long)
    logits = cloud(input_ids=ids, logits_to_keep=len(synced)).logits[0, :, :vocab]
    return torch.topk(logits.double(), min(top, vocab), dim=-1).indices.tolist()
