"""This machine's ceiling for a model at a thread count: what no experiment on it can beat (issue 50).

- `matmul_gflops`: a square float32 matmul's GFLOP/s (2·n³ per product, n = 2048), the best of a few repeats;
- `decode_tokens_per_second(model, batch)`: greedy decoding of `batch` equal-length random prompts together with
  the model's own batched cache (transformers' DynamicCache), no padding, no per-row work: tokens generated per
  second over the decode steps only (the prompts' forward is not timed);
- `prefill_gflops(model)`: one forward of a `tokens`-long prompt at batch 1, in GFLOP/s of its matmuls: 2 FLOPs
  per weight of every linear layer but the output layer per token, the output layer for the last token only
  (logits_to_keep=1), and the causal attention's two products, 2·T²·(heads·head_dim) per layer.

Every experiment's benchmark reports its own speed as a fraction of these (benchmarks/collab_throughput.py).

    python benchmarks/ceiling.py --model smollm2-135m --threads 1
    python benchmarks/ceiling.py --model smollm2-135m --threads 1 --out docs/benchmarks/ceiling_smollm2-135m.md
"""
from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):      # run as a file (python benchmarks/ceiling.py): the repository on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.rounds import commit_label, emit  # noqa: E402

BATCHES = (1, 8, 16, 32)


@contextlib.contextmanager
def _threads(threads: int | None) -> Iterator[None]:
    """torch's thread count set to `threads` for the block (None: left as it is)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def matmul_gflops(size: int = 2048, repeats: int = 5, threads: int | None = None) -> float:
    """GFLOP/s of a (size × size) @ (size × size) float32 matmul at `threads` threads (None: torch's current
    count), best of `repeats` (after one warm-up)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    with _threads(threads):
        torch.mm(a, b)
        best = min(_seconds(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2.0 * size ** 3 / best / 1e9


def _seconds(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _prompts(model: Any, batch: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(3, int(model.config.vocab_size), (batch, length), generator=g)


@torch.no_grad()
def decode_tokens_per_second(model: Any, batch: int, *, prompt_tokens: int = 64, new_tokens: int = 32,
                             repeats: int = 2) -> float:
    """Greedy decode speed of `model` at `batch` rows (module docstring), best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        out = model(input_ids=_prompts(model, batch, prompt_tokens), use_cache=True, logits_to_keep=1)
        cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(new_tokens):
            out = model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
            cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        best = min(best, time.perf_counter() - start)
    return batch * new_tokens / best


def prefill_flops(model: Any, tokens: int) -> float:
    """The matmul FLOPs of one `tokens`-long prompt's forward with logits_to_keep=1 (module docstring)."""
    head = model.get_output_embeddings()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    c = model.config
    attention = 2.0 * tokens * tokens * c.num_attention_heads * getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
    return 2.0 * linear * tokens + 2.0 * head.weight.numel() + attention * c.num_hidden_layers


@torch.no_grad()
def prefill_gflops(model: Any, tokens: int = 512, repeats: int = 3) -> float:
    """GFLOP/s of a `tokens`-long prompt's forward at batch 1, best of `repeats`."""
    ids = _prompts(model, 1, tokens)
    model(input_ids=ids, logits_to_keep=1)
    best = min(_seconds(lambda: model(input_ids=ids, logits_to_keep=1)) for _ in range(repeats))
    return prefill_flops(model, tokens) / best / 1e9


def measure(model: Any, batches: Sequence[int] = BATCHES, *, prompt_tokens: int = 64, new_tokens: int = 32,
            prefill_tokens: int = 512) -> dict[str, Any]:
    """Every ceiling at torch's current thread count: {matmul_gflops, decode_tokens_per_second: {batch: t/s},
    prefill_gflops}."""
    return {"matmul_gflops": matmul_gflops(), "prompt_tokens": prompt_tokens,
            "decode_tokens_per_second": {b: decode_tokens_per_second(model, b, prompt_tokens=prompt_tokens,
                                                                     new_tokens=new_tokens) for b in batches},
            "prefill_gflops": prefill_gflops(model, prefill_tokens)}


def report(name: str, threads: int, ceiling: dict[str, Any], command: str) -> str:
    lines = [f"# Ceiling of this machine: {name}, {threads} thread(s)", "", f"`{command}`", "",
             f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, commit {commit_label()}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "| measure | value |", "|:--|--:|",
             f"| matmul (2048², float32) | {ceiling['matmul_gflops']:.1f} GFLOP/s |"]
    for b, tps in ceiling["decode_tokens_per_second"].items():
        lines.append(f"| greedy decode, batch {b}, {ceiling['prompt_tokens']}-token prompts | {tps:.1f} tokens/s |")
    lines += [f"| prefill, 512 tokens | {ceiling['prefill_gflops']:.1f} GFLOP/s |", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="each decoded prompt's length (attention and the "
                    "cache grow with it)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from benchmarks.models import load_named_model

    model = load_named_model(args.model).model
    ceiling = measure(model, args.batches, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens)
    command = (f"python benchmarks/ceiling.py --model {args.model} --threads {args.threads} --batches "
               f"{' '.join(map(str, args.batches))} --prompt-tokens {args.prompt_tokens} --new-tokens {args.new_tokens}")
    emit(report(args.model, args.threads, ceiling, command), args.out)


if __name__ == "__main__":
    main()
