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
of a run (warmup_align_steps, once per client) is timed apart: it is paid once, not per step. `--lora` and
`--hidden` give the run's settings (experiment=splitft: LoRA on A and C, W1/W2 width 128, batch 4).
`--schedule P:S` sets PrivPair's arm (align_every P, align_steps S; default conf/'s) and
`--alt-schedule P:S[,P:S...]` adds an arm per other burst schedule (align_every P, align_steps S: a change
of the method, not conf/'s), and the report breaks one burst step down into its passes over B and C,
each timed alone on the D_align batch, to show what a burst step cannot do without.

    python -m benchmarks.splitft_step --model smollm2-135m --k 2 --m 28 --out docs/benchmarks/splitft_step.md
    python -m benchmarks.splitft_step --cycle --model smollm2-135m --k 2 --m 28 --batch 2 --seq 32 --rounds 4 \
        --out docs/benchmarks/splitft_step_smollm2_cycle.md
    python -m benchmarks.splitft_step --cycle --model smollm2-135m --k 2 --m 28 --batch 4 --seq 32 --rounds 6 \
        --lora --hidden 128 --alt-schedule 8:1 --out docs/benchmarks/splitft_step_smollm2_cycle_run.md
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
    ap.add_argument("--lora", action="store_true", help="LoRA on A and C (conf/splitft/default.yaml's lora), as experiment=splitft")
    ap.add_argument("--hidden", type=int, default=None, help="W1/W2 width (default: conf/splitft/default.yaml's)")
    ap.add_argument("--schedule", default=None, metavar="P:S",
                    help="--cycle: PrivPair's schedule, align_every P and align_steps S (default: conf/splitft/default.yaml's)")
    ap.add_argument("--alt-schedule", default=None, metavar="P:S[,P:S...]",
                    help="--cycle: one more PrivPair arm per schedule, with align_every P and align_steps S")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from benchmarks.models import load_named_model
    from harness.splitft import trainable
    from harness.splitft.defences import Defence
    from harness.splitft.privpair import PrivPair, token_ce
    from harness.splitft.step import split_step

    model = load_named_model(args.model).model
    model.train()
    defaults = OmegaConf.load(ROOT / "conf" / "splitft" / "default.yaml")
    part, names = trainable.make_trainable(model, args.k, args.m, defaults.lora if args.lora else None)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([params[n] for n in names], lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    settings = defaults.privpair
    if args.hidden is not None:
        settings.hidden = args.hidden
    if args.schedule is not None:
        settings.align_every, settings.align_steps = (int(x) for x in args.schedule.split(":"))
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
    """--cycle: P local steps per arm, PrivPair's burst inside its arm, paired CPU-time ratios per step with
    verdicts, and one burst step broken down into its passes."""
    from harness.splitft.privpair import PrivPair, token_ce

    every, gen = int(settings.align_every), torch.Generator().manual_seed(1)
    align = torch.randint(0, model.config.vocab_size, (16, args.seq), generator=torch.Generator().manual_seed(2))

    def privpair_arm(pp: PrivPair, period: int):
        counter = {"step": period}   # past the first burst: the steady state, one burst per P steps

        def arm() -> None:
            for _ in range(period):
                pp.burst(counter["step"], part, align, gen)
                split_step(part, pp, ids, opt)
                counter["step"] += 1
        return arm, period

    def repeat(fn):
        return lambda: [fn() for _ in range(every)]

    arms = {"plain": (repeat(plain_step), every), "split": (repeat(lambda: split_step(part, Defence(), ids, opt)), every),
            "privpair": privpair_arm(privpair, every)}
    n = int(settings.align_steps)
    labels = {"privpair": f"privpair (P={every}, {n} burst step{'s' if n > 1 else ''})"}
    for schedule in (args.alt_schedule.split(",") if args.alt_schedule else []):
        alt_every, alt_steps = (int(x) for x in schedule.split(":"))
        alt = PrivPair(1.0, OmegaConf.merge(settings, {"align_every": alt_every, "align_steps": alt_steps}))
        alt.setup(part, ids, torch.Generator().manual_seed(0))
        arms[f"privpair_alt_{alt_every}_{alt_steps}"] = privpair_arm(alt, alt_every)
        labels[f"privpair_alt_{alt_every}_{alt_steps}"] = (f"privpair (P={alt_every}, {alt_steps} burst "
                                                          f"step{'s' if alt_steps > 1 else ''})")

    def cpu_seconds_per_step(fn, steps):
        def arm() -> float:
            start = time.process_time()
            fn()
            return (time.process_time() - start) / steps
        return arm

    for fn, _ in arms.values():   # warm-up: allocator, lazy imports
        fn()
    start = time.process_time()
    privpair.burst(0, part, align, gen)
    warmup_s = time.process_time() - start
    times = run_rounds({name: cpu_seconds_per_step(fn, n) for name, (fn, n) in arms.items()}, args.rounds)
    plain_s = statistics.median(times["plain"])
    command = (f"python -m benchmarks.splitft_step --cycle --model {args.model} --k {args.k} --m {args.m} "
               f"--batch {args.batch} --seq {args.seq} --rounds {args.rounds} --threads {args.threads}"
               + (" --lora" if args.lora else "") + (f" --hidden {args.hidden}" if args.hidden is not None else "")
               + (f" --schedule {args.schedule}" if args.schedule else "")
               + (f" --alt-schedule {args.alt_schedule}" if args.alt_schedule else ""))
    lines = [f"# A run's split steps vs plain training steps: {args.model}, k={args.k}, m={args.m}", "",
             f"Command: `{command}`", "",
             f"batch {args.batch} × {args.seq} tokens, {'LoRA on A and C' if args.lora else 'A and C fully trained'}, "
             f"W1/W2 width {int(settings.hidden)}; one arm = P local steps (PrivPair: with its burst of align_steps "
             f"adapter steps on {int(settings.align_batch_size)} D_align blocks, as harness/splitft/client.py "
             f"schedules them); {args.rounds} rounds in rotated order, each arm timed by this process's CPU time and "
             f"divided by its steps; {args.threads} torch thread(s), {platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}.", "",
             f"| arm | median CPU seconds per step | ratio to plain [95% CI] (paired log-ratio) | ≤ {args.target:g}× |",
             "| --- | --- | --- | --- |",
             f"| plain | {plain_s:.4f} | 1 | |"]
    for k in [a for a in arms if a != "plain"]:
        label = labels.get(k, k)
        if args.rounds < 2:
            lines.append(f"| {label} | {statistics.median(times[k]):.4f} | — (one round) | cannot tell |")
            continue
        r = paired_log_ratio(times[k], times["plain"])
        lines.append(f"| {label} | {statistics.median(times[k]):.4f} | **{r.ratio:.3f}** [{r.lo:.3f}, {r.hi:.3f}] "
                     f"| {verdict(r.lo, r.hi, args.target)} |")
    lines += ["", f"The run's first burst ({int(settings.warmup_align_steps)} adapter steps, once per client) took "
                  f"{warmup_s:.3f} CPU seconds, {warmup_s / plain_s:.1f} plain steps' worth, paid once per client "
                  "rather than per step.", ""]
    lines += breakdown(part, privpair, align[: int(settings.align_batch_size)], plain_s, settings, token_ce)
    emit("\n".join(lines) + "\n", args.out)


def breakdown(part, privpair, batch, plain_s: float, settings, token_ce) -> list[str]:
    """One burst step (PrivPair.losses and its two gradients) beside the passes it is made of, each timed alone
    on the same D_align batch (CPU seconds, the least of 3 after a warm-up), in plain steps."""
    def least(fn) -> float:
        fn()
        out = []
        for _ in range(3):
            start = time.process_time()
            fn()
            out.append(time.process_time() - start)
        return min(out)

    def target() -> None:
        with torch.no_grad():
            s_a, ctx = part.head(batch)
            part.body(s_a, ctx)

    with torch.no_grad():
        s_a, ctx = part.head(batch)
        s_b = part.body(s_a, ctx)

    def through_b() -> None:
        x = s_a.clone().requires_grad_(True)
        y = part.body(x, ctx)
        torch.autograd.grad(y, [x], grad_outputs=torch.ones_like(y))

    def through_c() -> None:
        x = s_b.clone().requires_grad_(True)
        torch.autograd.grad(token_ce(part.tail(x, ctx), batch).mean(), [x])

    def step() -> None:
        out = privpair.losses(part, batch)
        torch.autograd.grad(out["l_w1"], list(privpair.w1.parameters()), retain_graph=True)
        torch.autograd.grad(out["l_w2"], list(privpair.w2.parameters()))

    parts = {"the whole burst step (PrivPair.losses, ∂L_W1/∂W1, ∂L_W2/∂W2)": least(step),
             "s_A, s_B of the batch without a graph (L_W2's target)": least(target),
             "B forward with a graph and backward to its input (W1's gradient crosses B)": least(through_b),
             "C forward and backward to its input, once (L_W1 reads it twice: ẑ and z')": least(through_c)}
    burst_steps = int(settings.align_steps) / int(settings.align_every)
    b_units = parts["B forward with a graph and backward to its input (W1's gradient crosses B)"] / plain_s
    lines = [f"One burst step on {batch.shape[0]} D_align blocks, by its passes (CPU seconds, least of 3; in plain "
             "steps):", "", "| pass | CPU seconds | plain steps |", "| --- | --- | --- |"]
    lines += [f"| {k} | {v:.4f} | {v / plain_s:.2f} |" for k, v in parts.items()]
    lines += ["", f"A run does {int(settings.align_steps)} burst steps every {int(settings.align_every)} private steps, "
                  f"{burst_steps:.2f} per step. The pass over B alone, which W1's gradient cannot skip (L_W1 reads "
                  f"C's output of B(W1(s_A))), adds {burst_steps:.2f} × {b_units:.2f} = {burst_steps * b_units:.2f} "
                  "plain steps per step before any C pass or target."]
    return lines


if __name__ == "__main__":
    main()
