"""BiSR's forward attack (attacks/splitft/bisr.py) against the EIA optimisation (attacks/splitft/eia.py) on
the undefended s_A of one text passage, with the pretrained weights (docs/splitft.md "BiSR: our reading");
and BiSR's backward attack (attacks/splitft/bisr_backward.py) on the gradient at cut m of the same passage.

For each cut k (with its number of steps) it prints the token F1 / top-1 (%) of: the EIA; BiSR(f)'s
starting guess alone (the model's argmax next tokens shifted by one: what the label attack on s_B gives
an undefended server); BiSR(f) from that guess and from random tokens, at two learning rates. For each
`--backward` cut m, the labels BiSR(b) reads from ∂L/∂s_B (L the mean next-token cross-entropy of the
passage) after 0 (the label attack's guesses), and more, steps. With `--guard f:z,...` it also runs
BiSR(b) on that gradient after the guard on `grad_up` (harness/splitft/defences.GradientGuard: every row
clipped at c = f × the median row norm, then noise of std z·c), 30 steps at lr 1, with its MAP loss (the
default) and with the plain distance (`prior=False`), against the label attack's guesses.

    python -m benchmarks.splitft_bisr --model smollm2-135m --text ../shared/data/wikitext2/wiki.test.raw
    python -m benchmarks.splitft_bisr --model smollm2-135m --text ../shared/data/wikitext2/wiki.test.raw \
        --cuts= --backward= --guard 0.15:0,0.15:0.1,0.15:0.3,0.15:1,0.15:3 --seeds 3
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from attacks.labels import match_labels
from attacks.splitft.bisr import initial_embeddings, reconstruct
from attacks.splitft.eia import invert
from benchmarks.models import load_named_model
from harness.partition import Partition
from harness.splitft.defences import GradientGuard
from harness.splitft.privpair import token_ce
from metrics.privacy import token_prf

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama-4l")
    ap.add_argument("--text", default=str(ROOT / "attacks" / "data" / "builtin_corpus.txt"))
    ap.add_argument("--offset", type=int, default=2000, help="first character of the passage")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--cuts", default="1:100,2:300", help="k:steps, comma-separated")
    ap.add_argument("--backward", default="-2:10:30:100", help="BiSR(b): m:steps:steps..., m < 0 counts from the top (then write --backward=-2:30)")
    ap.add_argument("--backward-lr", default="0.09,1.0", help="BiSR(b)'s learning rates, comma-separated")
    ap.add_argument("--guard", default="", help="f:z,...: BiSR(b) after a guard with clip f × median row norm, noise z")
    ap.add_argument("--guard-m", type=int, default=-2, help="the cut m of the --guard runs (< 0 counts from the top)")
    ap.add_argument("--seeds", type=int, default=1, help="noise draws per --guard setting (passages stay the same)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    loaded = load_named_model(args.model)
    model = loaded.model
    for p in model.parameters():
        p.requires_grad_(False)
    text = Path(args.text).read_text()[args.offset: args.offset + 40 * args.tokens]
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"][: args.tokens]])
    truth = ids[0].tolist()
    with torch.no_grad():
        labels = model(input_ids=ids).logits[0, :-1].argmax(-1).tolist()
    vocab = model.get_input_embeddings().weight.detach()

    def score(guess: list[int], ref: list[int] = truth) -> str:
        top1 = 100.0 * sum(int(a == b) for a, b in zip(ref, guess)) / len(ref)
        return f"F1 {token_prf(ref, guess)[2]:5.1f}  top-1 {top1:5.1f}"

    print(f"{args.model}: {len(truth)} tokens; next-token top-1 of the label guesses "
          f"{100.0 * sum(int(a == b) for a, b in zip(truth[1:], labels)) / len(labels):.1f}%")
    backward(model, ids, truth[1:], args.backward, [float(x) for x in args.backward_lr.split(",")], score)
    guarded(model, ids, truth[1:], args.guard, args.guard_m, args.seeds)
    for cut in filter(None, args.cuts.split(",")):
        k, steps = map(int, cut.split(":"))
        part = Partition(model, k, k + 1)
        with torch.no_grad():
            target, _ = part.head(ids)
        started = time.perf_counter()
        print(f"k={k} EIA {steps} steps: {score(invert(part, target, vocab, steps, 0.5)[0])} "
              f"({time.perf_counter() - started:.0f}s)")
        for init in ("label", "random"):
            start = initial_embeddings(vocab, (1, len(truth)), init, [labels], torch.Generator().manual_seed(0))
            print(f"k={k} BiSR(f) init={init} start: {score(reconstruct(part, target, start, vocab, 0, 0.5)[0])}")
            for lr in (0.5, 0.1):
                started = time.perf_counter()
                print(f"k={k} BiSR(f) init={init} lr={lr} {steps} steps: "
                      f"{score(reconstruct(part, target, start, vocab, steps, lr)[0])} "
                      f"({time.perf_counter() - started:.0f}s)", flush=True)


def _gradient_at(model, ids: torch.Tensor, m: int):
    """The partition cut at 1 and m, s_B of the passage, and the gradient the client would send up."""
    part = Partition(model, 1, m % model.config.num_hidden_layers)
    with torch.no_grad():
        s_a, ctx = part.head(ids)
        s_b = part.body(s_a, ctx)
    s = s_b.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(token_ce(part.tail(s, part.context(s)), ids).mean(), s)
    return part, s_b, grad


def guarded(model, ids: torch.Tensor, labels: list[int], spec: str, m: int, seeds: int) -> None:
    """BiSR(b) against the guard: for each f:z, token F1 (%) of the label attack's guesses (0 steps), of
    the MAP match and of the plain match, mean and range over `seeds` noise draws."""
    if not spec:
        return
    part, s_b, grad = _gradient_at(model, ids, m)
    norms = grad[0, :-1].norm(dim=-1)   # the last position's row is 0: no label reads it
    median = float(norms.median())
    n = ids.shape[1] - 1
    # 0 steps: the decoding's argmax, whatever arrived (the label attack's guesses)
    start = token_prf(labels, match_labels(part, s_b, grad, n, steps=0, lr=1.0, beta=0.85, temperature=1.2)[0])[2]
    print(f"m={part.m} guard: row norms of dL/ds'_B median {median:.3g} (min {float(norms.min()):.3g}, "
          f"max {float(norms.max()):.3g}); BiSR(b) 30 steps lr 1.0, {seeds} noise draw(s)")
    print("| clip c / median | z | label attack F1 % | BiSR(b) MAP F1 % | BiSR(b) plain F1 % |")
    print("|--:|--:|--:|--:|--:|")
    for item in spec.split(","):
        fraction, z = map(float, item.split(":"))
        guard = {"clip": fraction * median, "noise_multiplier": z}
        scores: dict[str, list[float]] = {"start": [start], "map": [], "plain": []}
        for seed in range(seeds):
            sent = GradientGuard(guard["clip"], z, torch.Generator().manual_seed(seed))(grad)
            for name, prior in (("map", True), ("plain", False)):
                guess = match_labels(part, s_b, sent, n, steps=30, lr=1.0, beta=0.85, temperature=1.2,
                                     guard=guard, prior=prior)[0]
                scores[name].append(token_prf(labels, guess)[2])
        cells = [f"{sum(v) / len(v):.1f} ({min(v):.1f}–{max(v):.1f})" for v in scores.values()]
        print(f"| {fraction:g} | {z:g} | " + " | ".join(cells) + " |", flush=True)


def backward(model, ids: torch.Tensor, labels: list[int], spec: str, lrs: list[float], score) -> None:
    """BiSR(b) at cut m: the gradient the client would send up for this passage, matched for each number of
    steps at each learning rate."""
    if not spec:
        return
    m, *steps = map(int, spec.split(":"))
    part, s_b, grad = _gradient_at(model, ids, m)
    m = part.m
    for lr in lrs:
        for n in [0, *steps]:
            started = time.perf_counter()
            guess = match_labels(part, s_b, grad, ids.shape[1] - 1, steps=n, lr=lr, beta=0.85, temperature=1.2)[0]
            print(f"m={m} BiSR(b) lr={lr} {n} steps: labels {score(guess, labels)} "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
