"""Do common random numbers explain identical departures? (issue 34, the Table 3 disclosure)

In docs/results/table2/report.md ep1 at ε = 0.5, ep1 at ε = 1 and EPN all leave the baseline at token 75 of
dolly-9556 with word-identical text, and every configuration there ran mask seed 0. Two readings:
(a) common random numbers: the same seed gives the same mask draws, scaled by σ(ε), so the configurations
    share one rounding-error pattern and flip the same token the same way;
(b) a near-tie: the baseline's top two logits at that token lie within rounding error, any small
    perturbation picks the runner-up, and greedy decoding from the same prefix then writes the same text.
This script tells them apart on a small model: each configuration runs once with the shared seed 0 (as the
report's runs) and once with a seed of its own. Under (a) the shared departures need the shared seed; under
(b) they survive independent seeds. It also reads the baseline's top-1 minus top-2 logit margin at every
departure against all generated positions.

    python scripts/crn_departures.py --model tiny-llama --prompts 30 --tokens 64 --sigma-scale 30
    python scripts/crn_departures.py --model smollm2-135m --workload-path ../shared/data/dolly/dolly_prompts.jsonl \
        --prompts 30 --ids dolly-9556 --tokens 90
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = (("ep1", 0.5), ("ep1", 1.0), ("epn", None))
WINDOW = 16   # tokens after a shared departure compared (the report shows about this much of it)


def first_departure(row: list[int], base: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(row, base)) if a != b), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--prompts", type=int, default=12, help="workload.n_prompts (seed 0's sample, as a run draws it)")
    ap.add_argument("--workload-path", default=None, help="a Dolly JSONL (workload=dolly); default: the built-in set")
    ap.add_argument("--ids", default=None, help="comma-separated prompt ids to keep of the sample (one batch)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--sigma-scale", type=float, default=1.0,
                    help="engine.sigma_scale: larger masks, larger rounding errors, more departures on a small model")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from benchmarks.models import load_named_model
    from harness.splitee.engine import EngineSettings, SplitEngine
    from harness.workloads import load_workload

    loaded = load_named_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    workload = {"name": "dolly", "source": "dolly", "path": args.workload_path} if args.workload_path else \
        {"name": "builtin", "source": "builtin"}
    chosen = load_workload({**workload, "n_prompts": args.prompts}, tok, seed=0).prompts
    if args.ids:
        keep = args.ids.split(",")
        chosen = [q for q in chosen if q.id in keep]
    prompts = [list(q.input_ids) for q in chosen]
    lengths = [q.n_text_tokens for q in chosen]         # EPN's n, epn_n=text (the runs' reading)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def generate(configuration: str, epsilon: float | None, seed: int) -> list[list[int]]:
        engine = SplitEngine(model, EngineSettings(configuration=configuration, epsilon=epsilon, seed=seed,
                                                   sigma_scale=args.sigma_scale if configuration != "cpu" else 1.0))
        return engine.generate(prompts, args.tokens, pad_token_id=pad, epsilon_lengths=lengths).output_ids

    base = generate("cpu", None, 0)
    # the baseline's margin (top-1 minus top-2 logit) at each generated position, on its own sequence
    margins, runner_up = [], []
    with torch.no_grad():
        for p, out in zip(prompts, base):
            logits = model(input_ids=torch.tensor([p + out])).logits[0, len(p) - 1: len(p) - 1 + len(out)]
            top = logits.topk(2, dim=-1)
            margins.append((top.values[:, 0] - top.values[:, 1]).tolist())
            runner_up.append(top.indices[:, 1].tolist())
    own_seeds = {arm: 101 + i for i, arm in enumerate(ARMS)}
    outputs = {("shared", arm): generate(arm[0], arm[1], 0) for arm in ARMS}
    outputs |= {("own", arm): generate(arm[0], arm[1], own_seeds[arm]) for arm in ARMS}

    all_margins = [m for row in margins for m in row]
    print(f"# {args.model}: {len(prompts)} {workload['name']} prompts × {args.tokens} greedy tokens, baseline cpu, "
          f"sigma_scale {args.sigma_scale:g}")
    print(f"arms: {', '.join(f'{c} ε={e}' if e else c for c, e in ARMS)}; shared seed 0, own seeds "
          f"{', '.join(str(s) for s in own_seeds.values())}")
    print(f"baseline margin (top-1 − top-2 logit) over all {len(all_margins)} generated positions: median "
          f"{statistics.median(all_margins):.4g}")
    for seeds in ("shared", "own"):
        departures, same_at, same_text, pairs, dep_margins, to_runner_up = 0, 0, 0, 0, [], 0
        for i in range(len(prompts)):
            at = {arm: first_departure(outputs[(seeds, arm)][i], base[i]) for arm in ARMS}
            departures += sum(d is not None for d in at.values())
            dep_margins += [margins[i][d] for d in at.values() if d is not None]
            to_runner_up += sum(outputs[(seeds, arm)][i][d] == runner_up[i][d] for arm, d in at.items() if d is not None)
            if args.ids:
                print(f"  {seeds} seeds, {chosen[i].id}: departures {[at[a] for a in ARMS]}, baseline margin there "
                      f"{[round(margins[i][d], 6) if d is not None else None for d in at.values()]}")
            for a, b in itertools.combinations(ARMS, 2):
                if at[a] is not None and at[b] is not None:
                    pairs += 1
                    if at[a] == at[b]:
                        same_at += 1
                        d = at[a]
                        same_text += outputs[(seeds, a)][i][d:d + WINDOW] == outputs[(seeds, b)][i][d:d + WINDOW]
        med = f"{statistics.median(dep_margins):.4g}" if dep_margins else "—"
        print(f"{seeds} seeds: {departures} departures over {len(ARMS) * len(prompts)} arm-prompts; of {pairs} pairs of "
              f"arms that both depart on a prompt, {same_at} depart at the same token, {same_text} of them with the "
              f"same next {WINDOW} tokens; baseline margin at the departures: median {med}; {to_runner_up} of the "
              "departures take the baseline's runner-up token")


if __name__ == "__main__":
    main()
