"""One split training step (harness/splitft/step.py) against a plain training step of the same model, side
by side in one run (issue 12: split ≤ 1.3× plain).

Each round times, on the same batch and in a rotated order: `plain` (model(ids) → cross-entropy →
backward → AdamW step over A's and C's parameters), `split` (the split step with no defence: the cut
crossings, the server's detached copies and its backward through frozen B) and `privpair` (the same with
W1/W2 in their STE forms). The result is the median over rounds of each round's ratio to plain, with the
min–max range. Recording a step for the adversary view and measuring H are off, as on unrecorded steps.

`--cycle` times what a run does instead (issue 33): one arm is P = splitft.privpair.align_every consecutive
local steps, and PrivPair's arm includes its alignment burst (align_steps adapter steps on D_align, every P
private steps: harness/splitft/client.py's schedule after the first burst), so its ratio is PrivPair's
amortised cost per step. Each arm is timed by this process's CPU time (time.process_time, one torch
thread), so a shared machine's other processes do not count; each round's log-ratio to plain is one pair,
and the geometric mean with its 95% Student-t interval gets a verdict against the 1.3× target ("met" when
the upper bound is ≤ 1.3, "not met" when the lower bound is above it, else "cannot tell"). The first burst
of a run (warmup_align_steps, once per client) is timed apart: it is paid once, not per step.

    python -m benchmarks.splitft_step --model smollm2-135m --k 2 --m 28 --out docs/benchmarks/splitft_step.md
    python -m benchmarks.splitft_step --cycle --model smollm2-135m --k 2 --m 28 --batch 2 --seq 32 --rounds 4 \
        --out docs/benchmarks/splitft_step_smollm2_cycle.md
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.rounds import emit, median_range, paired_log_ratio, round_ratios, run_rounds, verdict, wall_seconds

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama-4l")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--m", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cycle", action="store_true", help="P local steps per arm, PrivPair's burst included, CPU time")
    ap.add_argument("--target", type=float, default=1.3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from benchmarks.models import load_named_model
    from harness.splitft import trainable
    from harness.splitft.defences import Defence
    from harness.splitft.privpair import PrivPair, token_ce
    from harness.splitft.step import split_step

    model = load_named_model(args.model).model
    model.train()
    part, names = trainable.make_trainable(model, args.k, args.m, None)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([params[n] for n in names], lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    settings = OmegaConf.load(ROOT / "conf" / "splitft" / "default.yaml").privpair
    privpair = PrivPair(1.0, settings)
    privpair.setup(part, ids, torch.Generator().manual_seed(0))

    def plain() -> None:
        opt.zero_grad(set_to_none=True)
        token_ce(model(input_ids=ids).logits, ids).mean().backward()
        opt.step()

    if args.cycle:
        return cycle(args, model, part, opt, ids, privpair, settings, plain_step=plain, split_step=split_step,
                     Defence=Defence)
    steps = {"plain": plain, "split": lambda: split_step(part, Defence(), ids, opt),
             "privpair": lambda: split_step(part, privpair, ids, opt)}
    for fn in steps.values():      # warm-up: allocator, lazy imports
        fn()
    times = run_rounds({name: wall_seconds(fn) for name, fn in steps.items()}, args.rounds)
    ratios = {k: round_ratios(times, k, "plain") for k in ("split", "privpair")}
    lines = [f"# Split step vs plain training step: {args.model}, k={args.k}, m={args.m}", "",
             f"batch {args.batch} × {args.seq} tokens, {args.rounds} rounds, {args.threads} torch thread(s), "
             f"{platform.processor() or platform.machine()}, torch {torch.__version__}", "",
             "| step | median seconds | ratio to plain (median [min, max]) |", "| --- | --- | --- |",
             f"| plain | {statistics.median(times['plain']):.4f} | 1 |"]
    for k, rs in ratios.items():
        med, lo, hi = median_range(rs)
        lines.append(f"| {k} | {statistics.median(times[k]):.4f} | {med:.3f} [{lo:.3f}, {hi:.3f}] |")
    text = "\n".join(lines) + "\n"
    emit(text, args.out)


def cycle(args, model, part, opt, ids, privpair, settings, *, plain_step, split_step, Defence) -> None:
    """--cycle: P local steps per arm, PrivPair's burst inside its arm, paired CPU-time ratios with verdicts."""
    every, gen = int(settings.align_every), torch.Generator().manual_seed(1)
    align = torch.randint(0, model.config.vocab_size, (16, args.seq), generator=torch.Generator().manual_seed(2))
    counter = {"step": every}   # past the first burst: the steady state, one burst of align_steps per P steps

    def privpair_cycle() -> None:
        for _ in range(every):
            privpair.burst(counter["step"], part, align, gen)
            split_step(part, privpair, ids, opt)
            counter["step"] += 1

    def repeat(fn):
        return lambda: [fn() for _ in range(every)]

    arms = {"plain": repeat(plain_step), "split": repeat(lambda: split_step(part, Defence(), ids, opt)),
            "privpair": privpair_cycle}

    def cpu_seconds(fn):
        def arm() -> float:
            start = time.process_time()
            fn()
            return time.process_time() - start
        return arm

    for fn in arms.values():   # warm-up: allocator, lazy imports
        fn()
    start = time.process_time()
    privpair.burst(0, part, align, gen)
    warmup_s = time.process_time() - start
    times = run_rounds({name: cpu_seconds(fn) for name, fn in arms.items()}, args.rounds)
    command = (f"python -m benchmarks.splitft_step --cycle --model {args.model} --k {args.k} --m {args.m} "
               f"--batch {args.batch} --seq {args.seq} --rounds {args.rounds} --threads {args.threads}")
    lines = [f"# A run's split steps vs plain training steps: {args.model}, k={args.k}, m={args.m}", "",
             f"Command: `{command}`", "",
             f"batch {args.batch} × {args.seq} tokens; one arm = P = {every} local steps (PrivPair: with its burst "
             f"of {int(settings.align_steps)} adapter steps on {int(settings.align_batch_size)} D_align blocks); "
             f"{args.rounds} rounds in rotated order, each arm timed by this process's CPU time; {args.threads} "
             f"torch thread(s), {platform.processor() or platform.machine()}, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M')}.", "",
             f"| arm | median CPU seconds per step | ratio to plain [95% CI] (paired log-ratio) | ≤ {args.target:g}× |",
             "| --- | --- | --- | --- |",
             f"| plain | {statistics.median(times['plain']) / every:.4f} | 1 | |"]
    for k in ("split", "privpair"):
        if args.rounds < 2:
            lines.append(f"| {k} | {statistics.median(times[k]) / every:.4f} | — (one round) | cannot tell |")
            continue
        r = paired_log_ratio(times[k], times["plain"])
        lines.append(f"| {k} | {statistics.median(times[k]) / every:.4f} | **{r.ratio:.3f}** [{r.lo:.3f}, {r.hi:.3f}] "
                     f"| {verdict(r.lo, r.hi, args.target)} |")
    lines += ["", f"The run's first burst ({int(settings.warmup_align_steps)} adapter steps, once per client) took "
                  f"{warmup_s:.3f} CPU seconds, {warmup_s / (statistics.median(times['plain']) / every):.1f} plain "
                  "steps' worth, paid once per client rather than per step."]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
