"""The real inputs of every op instance, captured while the model answers a workload (for the FP study,
paper §7.3.2).

`capture_op_inputs` runs the T3 configuration with the adversary view recorded: every offloaded op's input
(QKV, O, Gate/Up per layer, the LM head's positions) is exactly what crossed the boundary, unmasked. The
Down projection's input never crosses (it stays in the TEE), so a forward pre-hook on each layer's
`mlp.down_proj` records it. Per prompt, `vectors_per_prompt` token positions (prompt and generated, never
padding) are drawn once and kept for every layer op; the LM head keeps up to that many of its positions
(one per generated token). Each kept vector remembers the length of its prompt, which EPN's σ needs.
`cached_capture` keeps a capture under the cache root, keyed by everything that changes it, so that an ε
sweep captures once.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness import provenance
from harness.architectures import decoder_layers
from harness.progress import progress as progress_bar
from harness.results import atomic_torch_save, cache_key
from harness.splitee.engine import EngineSettings, SplitEngine
from harness.splitee.noise_bank import stream_seed

CAPTURED_OPS = ("qkv", "o", "gate_up", "down", "lm_head")


@dataclass
class CapturedInputs:
    """Per op instance (op, layer): inputs [K, d] (fp32) and, for each row [K], the n of its prompt that
    the configuration's ε rule counts (EPN's 1/√n: the caller's `epsilon_lengths`, default every token)."""

    inputs: dict[tuple[str, int | None], torch.Tensor] = field(default_factory=dict)
    prompt_lengths: dict[tuple[str, int | None], torch.Tensor] = field(default_factory=dict)
    output_ids: list[list[int]] = field(default_factory=list)

    def to_payload(self) -> dict:
        return {"inputs": {f"{op}:{'' if layer is None else layer}": t for (op, layer), t in self.inputs.items()},
                "prompt_lengths": {f"{op}:{'' if layer is None else layer}": t
                                   for (op, layer), t in self.prompt_lengths.items()},
                "output_ids": self.output_ids}

    def vectors_per_op(self) -> dict[str, int]:
        """Captured vectors of each op (its first layer's instance; every layer keeps as many)."""
        return {op: int(t.shape[0]) for (op, layer), t in self.inputs.items() if layer in (0, None)}

    @classmethod
    def from_payload(cls, payload: dict) -> "CapturedInputs":
        def key(text: str) -> tuple[str, int | None]:
            op, _, layer = text.partition(":")
            return op, (int(layer) if layer else None)

        return cls({key(k): v for k, v in payload["inputs"].items()},
                   {key(k): v for k, v in payload["prompt_lengths"].items()}, payload["output_ids"])


def _down_hooks(model: nn.Module, store: dict[int, list[torch.Tensor]]) -> list:
    handles = []
    for index, layer in enumerate(decoder_layers(model)):
        def hook(_module, args, index=index):
            store[index].append(args[0].detach().to("cpu", copy=True))
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(hook))
    return handles


def capture_op_inputs(model: nn.Module, prompts: list[list[int]], *, new_tokens: int, batch_size: int,
                      vectors_per_prompt: int, seed: int, pad_token_id: int, include_down: bool = True,
                      threads: int | None = None, progress: Callable[[int], None] | None = None,
                      epsilon_lengths: list[int] | None = None) -> CapturedInputs:
    """Greedy T3 generation of `new_tokens` per prompt, keeping sampled real inputs of every op instance,
    each labelled with its prompt's n for the ε rule (`epsilon_lengths`, default len(prompt))."""
    engine = SplitEngine(model, EngineSettings("t3", record_view=True, seed=seed, tee_threads=threads))
    kept: dict[tuple[str, int | None], list[torch.Tensor]] = defaultdict(list)
    lengths: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    out = CapturedInputs()
    for start in progress_bar(range(0, len(prompts), batch_size), desc="capture op inputs (t3)", unit="batch"):
        batch = prompts[start:start + batch_size]
        down: dict[int, list[torch.Tensor]] = defaultdict(list)
        handles = _down_hooks(model, down) if include_down else []
        try:
            engine.view.exposures.clear()
            res = engine.generate(batch, new_tokens, pad_token_id=pad_token_id)
        finally:
            for h in handles:
                h.remove()
        out.output_ids.extend(res.output_ids)
        # Per (op, layer): the tensors of prefill (step 0, [B, T, d]) then one [B, 1, d] per decode step.
        calls: dict[tuple[str, int | None], list[torch.Tensor]] = defaultdict(list)
        for e in engine.view.exposures:
            calls[(e.op, e.layer)].append(e.tensor)
        for layer, tensors in down.items():
            calls[("down", layer)] = tensors
        longest = max(len(p) for p in batch)
        for row, prompt in enumerate(batch):
            n = len(prompt)
            g = torch.Generator().manual_seed(stream_seed(seed, "capture", start + row))
            # Slots: prompt positions 0..n-1 (prefill), then decode steps 1..new_tokens-1.
            slots = n + new_tokens - 1
            picked = torch.randperm(slots, generator=g)[:vectors_per_prompt].sort().values.tolist()
            head = torch.randperm(new_tokens, generator=g)[:vectors_per_prompt].sort().values.tolist()
            for key, tensors in calls.items():
                rows = []
                if key[0] == "lm_head":   # one position per step: the last prompt token, then each new one
                    rows = [tensors[s][row, -1] for s in head]
                else:
                    for s in picked:
                        rows.append(tensors[0][row, longest - n + s] if s < n else tensors[s - n + 1][row, -1])
                kept[key].extend(rows)
                lengths[key].extend([n if epsilon_lengths is None else int(epsilon_lengths[start + row])] * len(rows))
        engine.view.exposures.clear()
        if progress is not None:
            progress(min(start + batch_size, len(prompts)))
    for key, rows in kept.items():
        out.inputs[key] = torch.stack(rows).float()
        out.prompt_lengths[key] = torch.tensor(lengths[key], dtype=torch.long)
    return out


def cached_capture(model: nn.Module, prompts: list[list[int]], *, cache_dir: str | Path,
                   identity: Mapping[str, Any], new_tokens: int, batch_size: int, vectors_per_prompt: int, seed: int,
                   pad_token_id: int, include_down: bool = True, threads: int | None = None,
                   epsilon_lengths: list[int] | None = None) -> tuple[CapturedInputs, dict[str, Any]]:
    """`capture_op_inputs` through a cache under `cache_dir`/fp_capture/: the capture from the cache, or
    captured now and saved atomically. The key covers `identity` (what the caller knows about the model
    and workload: names, sources, configs), the prompts' token ids, the seed, the capture settings and the
    code version. Returns the capture and its record for results.json (cache key, hit, settings)."""
    settings = {"vectors_per_prompt": vectors_per_prompt, "capture_new_tokens": new_tokens,
                "capture_batch_size": batch_size, "include_down": include_down}
    key = cache_key({"kind": "fp_capture", **identity, "input_ids": prompts, "seed": seed, "capture": settings,
                     "epsilon_lengths": epsilon_lengths, "code": provenance.source_digest()})
    path = Path(cache_dir).expanduser() / "fp_capture" / f"{key}.pt"
    if path.exists():
        try:
            payload = torch.load(path, weights_only=False)
            if payload.get("key") == key:
                return CapturedInputs.from_payload(payload), {"cache": {"key": key, "hit": True}, **settings}
        except Exception as exc:  # a torn or foreign file: capture again, and say so
            print(f"splitbench: warning: ignoring unreadable capture cache {path}: {type(exc).__name__}", file=sys.stderr)
    captured = capture_op_inputs(model, prompts, new_tokens=new_tokens, batch_size=batch_size,
                                 vectors_per_prompt=vectors_per_prompt, seed=seed, pad_token_id=pad_token_id,
                                 include_down=include_down, threads=threads, epsilon_lengths=epsilon_lengths)
    atomic_torch_save({**captured.to_payload(), "key": key}, path)
    return captured, {"cache": {"key": key, "hit": False}, **settings}
