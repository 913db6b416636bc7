"""Several examples decoded by one model together, each row's numbers those of the row decoded alone.

`Rows` is one party's incremental forward over a batch of prompts. Batching pays on a CPU because a decode
step at batch 1 is bound by reading the weights (SmolLM2-135M: 538 MB a step, issue 50; benchmarks/ceiling.py
measures the gain); B rows read them once. What batching must not change is any row's result,
to the last bit, so that a run's tokens and exposures are the same at every `collab.batch_size`. Three
things would change it, and each is done so that it does not:

- The prompt: each is forwarded alone (the same call as at batch 1, so its first distribution and its cache
  are exactly batch 1's); the caches are then left-padded to one length and stacked into the model's own
  cache (transformers' DynamicCache, one row per example). A prompt's forward is compute-bound (M = its
  length), so batching it would gain little.
- Attention: a padded row attends over a longer, masked key sequence, and the kernel's summation order then
  depends on the padding. So decode steps run with the attention implementation `collab_rows` (registered
  below), which calls transformers' own SDPA attention once per row on that row's unpadded keys: exactly the
  batch-1 call. Its cost is one small call per row and layer; the weights are still read once per step.
- The linear layers: MKL's sgemm picks its kernel by the number of rows M, and a row's result differs in the
  last bits between M = 1 (gemv), M = 2-3 and M >= 4, while every M >= 4 gives the same bits (measured
  with torch 2.13's MKL 2024.2 on AVX-512, 1 and 2 threads, M up to 64, SmolLM2's and the tiny models'
  shapes). So every decode step runs at least MIN_ROWS = 4 rows: a batch with fewer live examples keeps
  finished rows (or copies of a live one) as fillers whose outputs are dropped. The other layers (norms,
  RoPE, activations, the float64 softmax) are row-wise and do not depend on the batch.

`tests/collab/test_collab.py::test_every_defence_decodes_the_same_at_batch_1_and_4` holds this to exact
equality. The cost at batch 1 is the filler rows (a decode step at M = 4 takes about 1.8× the gemv one on
SmolLM2's output layer); `collab.rng=shared` keeps the one-row engine of before (harness/collab/protocol.py).
Rows that finish stay in the batch as fillers until at most half of its rows are live; then the cache is
cut down to the live rows (each cut copies the cache, as every step's concatenation does anyway).
"""
from __future__ import annotations

import contextlib
import copy
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import torch

MIN_ROWS = 4
IMPLEMENTATION = "collab_rows"


def _rows_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, dropout: float = 0.0, scaling: float | None = None, *,
                    collab_rows: Sequence[tuple[int, int]] = (), **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention of each live row (index, tokens in its cache) over its own keys, the last `tokens` columns of
    the left-padded cache, by transformers' SDPA attention with no mask, as a lone row at batch 1 is computed;
    filler rows get zeros (their outputs are dropped)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q_len, dim = query.shape
    out = query.new_zeros((b, q_len, heads, value.shape[-1]))
    kv = key.shape[2]
    for row, tokens in collab_rows:
        start = kv - min(tokens, kv)      # a sliding-window layer's cache holds only the last columns
        o, _ = sdpa_attention_forward(module, query[row:row + 1], key[row:row + 1, :, start:],
                                      value[row:row + 1, :, start:], None, dropout=dropout, scaling=scaling, **kwargs)
        out[row] = o[0]
    return out, None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None      # _rows_attention reads each row's keys from its length, not from a mask


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _rows_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)


_register()


@contextlib.contextmanager
def _implementation(model: Any, name: str) -> Iterator[None]:
    """The model's attention implementation set to `name` for one forward (the edge and the cloud may be one
    model object, and every other caller keeps the model's own)."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def _stack(caches: Sequence[Any], width: int) -> Any:
    """The prompts' caches left-padded with zeros to `width` columns and stacked, one row each, into the first
    one's cache object (a transformers Cache)."""
    batched = caches[0]
    for i, layer in enumerate(batched.layers):
        for attr in ("keys", "values"):
            parts = [getattr(c.layers[i], attr) for c in caches]
            cols = max(p.shape[2] for p in parts)
            padded = [torch.nn.functional.pad(p, (0, 0, cols - p.shape[2], 0)) for p in parts]
            setattr(layer, attr, torch.cat(padded, 0))
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = width
    return batched


# The prompt cache's size: SmolLM2-135M's cache of a 400-token prompt is 18 MB, so 1 GiB holds both prompts of
# 30 PubMedQA examples (a point of the n30 grid), on a machine whose 23 GB several runs share.
PROMPT_CACHE_BYTES = 1 << 30


class PromptCache:
    """Prompt forwards memoised by (model object, prompt ids): the same prompt forwarded by the same model is
    the same computation (a prompt is always forwarded alone, at batch 1), so a run's decodes forward each
    party's prompt once (the cloud's x_pub serves the cloud alone, every decode's cloud and every null decode's
    edge). A hit returns a copy of the cache; the least recently used entries go past `max_bytes`."""

    def __init__(self, max_bytes: int = PROMPT_CACHE_BYTES):
        self.max_bytes, self.bytes = int(max_bytes), 0
        self.entries: OrderedDict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, Any, int]] = OrderedDict()
        self.computed = self.reused = 0

    @torch.no_grad()
    def forward(self, model: Any, ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        """(the last position's logits, the cache) of `ids` through `model`."""
        key = (id(model), tuple(int(i) for i in ids))
        if key in self.entries:
            self.entries.move_to_end(key)
            logits, cache, _ = self.entries[key]
            self.reused += 1
            return logits, copy.deepcopy(cache)
        logits, cache = prompt_forward(model, ids)
        self.computed += 1
        size = sum(t.numel() * t.element_size() for layer in getattr(cache, "layers", ())
                   for t in (layer.keys, layer.values))
        if 0 < size <= self.max_bytes:
            self.entries[key] = (logits, copy.deepcopy(cache), size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                self.bytes -= self.entries.popitem(last=False)[1][2]
        return logits, cache


@torch.no_grad()
def prompt_forward(model: Any, ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
    """One prompt alone through `model`: the last position's logits and the model's cache."""
    out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=True, logits_to_keep=1)
    return out.logits[0, -1], out.cache


class Rows:
    """One model's incremental forward over several prompts: `first[i]` is prompt i's next-token logits (the
    last position's float32 row, the whole output layer), then `step({i: token})` feeds each still-decoding
    prompt its token and returns its next logits; a prompt left out of `tokens` is finished."""

    @torch.no_grad()
    def __init__(self, model: Any, prompts: Sequence[Sequence[int]], min_rows: int = MIN_ROWS,
                 prompt_cache: PromptCache | None = None):
        self.model, self.min_rows = model, int(min_rows)
        self.first, self.prefill_seconds, caches = [], [], []
        for ids in prompts:
            start = time.perf_counter()
            logits, cache = prompt_cache.forward(model, ids) if prompt_cache is not None else prompt_forward(model, ids)
            self.first.append(logits)
            self.prefill_seconds.append(time.perf_counter() - start)
            caches.append(cache)
        self.tokens = [len(p) for p in prompts]          # tokens in each prompt's cache
        # One prompt at min_rows 1 is the engine before batching: the model's own call, cache and attention.
        self.alone = len(prompts) == 1 and self.min_rows <= 1
        self.cache = caches[0] if self.alone else _stack(caches, max(self.tokens))
        fillers = max(0, self.min_rows - len(caches))
        if fillers:      # copies of the first prompt's row: computed, then dropped
            self._pad_rows(fillers)
        self.row_of = {i: i for i in range(len(prompts))}   # prompt -> its row in the cache
        self.rows = len(prompts) + fillers

    def _pad_rows(self, n: int) -> None:
        for layer in self.cache.layers:
            layer.keys = torch.cat([layer.keys, layer.keys[:1].expand(n, *layer.keys.shape[1:])], 0)
            layer.values = torch.cat([layer.values, layer.values[:1].expand(n, *layer.values.shape[1:])], 0)

    def _cut(self, live: Sequence[int]) -> None:
        """Keep the rows of the `live` examples, with fillers up to min_rows, once at most half the rows are live."""
        if len(live) > self.rows // 2 or self.rows <= self.min_rows:
            return
        keep = [self.row_of[e] for e in live]
        spare = [r for r in range(self.rows) if r not in set(keep)]
        keep += spare[:max(0, self.min_rows - len(keep))]
        self.cache.batch_select_indices(torch.tensor(keep, device=self.cache.layers[0].keys.device))
        self.row_of = {e: keep.index(self.row_of[e]) for e in live}
        self.rows = len(keep)

    @torch.no_grad()
    def step(self, tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """Feed each prompt of `tokens` its token; the others are finished. Returns each one's next logits."""
        live = sorted(tokens)
        if self.alone:
            out = self.model(input_ids=torch.tensor([[tokens[0]]], dtype=torch.long), cache=self.cache, use_cache=True, logits_to_keep=1)
            self.cache = out.cache
            return {0: out.logits[0, -1]}
        self._cut(live)
        ids = torch.zeros((self.rows, 1), dtype=torch.long)
        for e in live:
            ids[self.row_of[e], 0] = tokens[e]
            self.tokens[e] += 1
        # Each row's position is its own token count (left padding shifts no position); fillers' do not matter.
        pos = torch.zeros((self.rows, 1), dtype=torch.long)
        for e in live:
            pos[self.row_of[e], 0] = self.tokens[e] - 1
        rows = [(self.row_of[e], self.tokens[e]) for e in live]
        with _implementation(self.model, IMPLEMENTATION):
            out = self.model(input_ids=ids, position_ids=pos, cache=self.cache,
                             use_cache=True, logits_to_keep=1, collab_rows=rows)
        self.cache = out.cache
        return {e: out.logits[self.row_of[e], -1] for e in live}
