"""CPU cost of the per-token Bayes attacker (attacks/sanitize/bayes.py) on SmolLM2's 49,152-token table, and
its top-5 beside Pr@5 on the same positions.

The first `--prompts` built-in prompts' text tokens are sanitised by each case (mechanism, η) with the
default window, then ranked by the attacker with the `sanitize.attack` defaults of conf/sanitize/default.yaml
(candidates C, draws per candidate M, prefilter size); printed: seconds per position (wall, and process CPU
seconds / threads), the share of draws the prefilter sent to the full-vocabulary search, Pr@5 and Bayes top-5
(% of positions) with the paired difference and its 95% interval over positions.

    python -m benchmarks.sanitize_bayes_cost --threads 2 --prompts 2
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CASES = (("dx_noise", 25.0), ("dx_noise", 50.0), ("dx_stencil", 150.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--samples", type=int, default=None, help="draws per candidate (default: the YAML's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from attacks.sanitize import bayes, neighbours
    from benchmarks.models import load_named_model
    from harness.sanitize import sanitizer
    from harness.workloads import load_workload

    loaded = load_named_model(args.model)
    wl = OmegaConf.load(ROOT / "conf" / "workload" / "builtin.yaml")
    wl.n_prompts = args.prompts
    prompts = load_workload(wl, loaded.tokenizer, seed=0).prompts
    texts = [list(loaded.tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in prompts]
    section = OmegaConf.load(ROOT / "conf" / "sanitize" / "default.yaml")
    a = section.attack
    settings = bayes.BayesSettings(int(a.bayes_candidates), int(args.samples or a.bayes_samples), int(a.bayes_local_vocab))
    truth = torch.tensor([t for s in texts for t in s]).unsqueeze(1)
    print(f"{args.model}, {truth.numel()} positions, C={settings.candidates} M={settings.samples} "
          f"prefilter={settings.local_vocab}, {args.threads} threads")
    print("| mechanism | η | s/position (wall) | s/position (CPU/threads) | Pr@5 % | Bayes top-5 % | difference [95%] |")
    print("| --- | --: | --: | --: | --: | --: | --: |")
    for name, eta in CASES:
        built = sanitizer.build(section, name, eta, loaded.model, loaded.tokenizer)
        observed = built(texts, seed=0)
        wall, cpu = time.perf_counter(), time.process_time()
        guesses = torch.cat(bayes.rank(observed, built.table, built.settings, 5, settings, seed=0, keep=built.keep))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        nb = torch.cat(neighbours.rank(observed, built.table, 5))
        diff = 100.0 * ((guesses == truth).any(1).float() - (nb == truth).any(1).float())
        half = 1.96 * float(diff.std()) / math.sqrt(diff.numel())
        n = truth.numel()
        print(f"| {name} | {eta:g} | {wall / n:.3f} | {cpu / args.threads / n:.3f} | "
              f"{100 * float((nb == truth).any(1).float().mean()):.1f} | "
              f"{100 * float((guesses == truth).any(1).float().mean()):.1f} | "
              f"{float(diff.mean()):+.1f} [{float(diff.mean()) - half:+.1f}, {float(diff.mean()) + half:+.1f}] |", flush=True)


if __name__ == "__main__":
    main()
