"""Peak RSS of the main job's generation (15 built-in prompts of 100–250 tokens, batch 15, 64 new tokens,
SmolLM2-135M) per configuration and noise-bank bound, each in a fresh process (VmHWM).

    python -m benchmarks.bank_memory                      # t3, ep1 (default bound), ep1 unbounded
    python -m benchmarks.bank_memory --new-tokens 256     # the bound holds for any generation length

Only the engine's generation is measured (no baseline, no similarity model: both add the same to every
configuration, so leaving them out makes the ep1/t3 ratio stricter, not looser). docs/noise_bank.md has
the figures and the command that made them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.rounds import commit_label, emit

ROOT = Path(__file__).resolve().parents[1]
CASES = (("t3", None), ("ep1", "default"), ("ep1", "null"))


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(configuration: str, bank: str | None, new_tokens: int) -> None:
    from hydra import compose, initialize_config_dir

    import harness.schema  # noqa: F401  (the sb.* resolvers)
    from harness.splitee.engine import EngineSettings, SplitEngine
    from runners.common import load_inputs

    overrides = [f"configuration={configuration}"] + ([f"engine.bank_bytes={bank}"] if bank not in (None, "default") else [])
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    inputs = load_inputs(cfg)
    kw = {"bank_bytes": None} if bank == "null" else {}
    engine = SplitEngine(inputs.loaded.model, EngineSettings(configuration, epsilon=1.0 if configuration == "ep1" else None,
                                                           **kw))
    before = peak_rss_mib()
    start = time.perf_counter()
    res = engine.generate(inputs.prompts[: cfg.generation.batch_size], new_tokens, pad_token_id=inputs.pad)
    print(json.dumps({"configuration": configuration, "bank": bank, "n_prompts": len(inputs.prompts),
                      "prompt_tokens": [min(map(len, inputs.prompts)), max(map(len, inputs.prompts))],
                      "new_tokens": new_tokens, "rss_before_generate_mib": before, "peak_rss_mib": peak_rss_mib(),
                      "bank_peak_mib": res.bank.get("peak_bytes", 0) / 2**20 if res.bank else 0.0,
                      "bank_capacity_rows": (res.bank or {}).get("capacity_rows"),
                      "generate_s": time.perf_counter() - start, "total_s": res.timings["total"],
                      "bank_refill_s": res.timings["bank_refill"], "bank_precompute_s": res.timings["bank_precompute"],
                      "output_digest": hashlib.sha256(str(res.output_ids).encode()).hexdigest()[:16]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--cases", default=",".join(f"{c}:{b}" for c, b in CASES))
    parser.add_argument("--out", type=Path, default=None, help="also write the table there (markdown)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        configuration, _, bank = args.child.partition(":")
        return child(configuration, None if bank in ("", "None") else bank, args.new_tokens)
    commit = commit_label()   # at the start: the code the children run
    rows = []
    for case in args.cases.split(","):
        done = subprocess.run([sys.executable, "-m", "benchmarks.bank_memory", "--child", case,
                               "--new-tokens", str(args.new_tokens)], cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    t3 = next(r for r in rows if r["configuration"] == "t3")["peak_rss_mib"]
    lines = [f"Command: `python -m benchmarks.bank_memory --new-tokens {args.new_tokens} --cases {args.cases}`, "
             f"commit {commit}, {time.strftime('%Y-%m-%d %H:%M')}. Batch of "
             f"{rows[0]['n_prompts']} prompts ({rows[0]['prompt_tokens'][0]}–{rows[0]['prompt_tokens'][1]} tokens with "
             f"the chat template), {args.new_tokens} new tokens, one generation per fresh process.", "",
             "| configuration | bank bound | peak RSS (MiB) | × t3 | bank peak (MiB) | generate (s) | bank refill in generation (s) | output digest |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = {None: "—", "default": "512 MiB (default)", "null": "unbounded"}.get(r["bank"], f"{r['bank']} B")
        lines.append(f"| {r['configuration']} | {bound} | {r['peak_rss_mib']:.0f} | {r['peak_rss_mib'] / t3:.2f} | "
                     f"{r['bank_peak_mib']:.0f} | {r['generate_s']:.1f} | {r['bank_refill_s']:.1f} | {r['output_digest']} |")
    emit("\n" + "\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
