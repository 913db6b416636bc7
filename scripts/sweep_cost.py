"""What a sweep's finished runs cost: the sum of their results.json provenance `cpu_s` (the job's CPU seconds,
every thread) and `wall_s`, over every finished run (.done) under a folder. CPU time sums across sessions and
loads, so a grid run in several sittings on a shared machine still has one honest total.

    python scripts/sweep_cost.py outputs/collab_paper [--expect 52]

Prints one line per configuration and the total; runs without `cpu_s` (finished before it was recorded) are
counted and named, never guessed.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--expect", type=int, default=None, help="the sweep's number of runs (says how many are left)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"sweep_cost: error: {args.folder} is not a folder", file=sys.stderr)
        return 2
    cpu, wall, missing = defaultdict(float), defaultdict(float), []
    runs = 0
    for done in sorted(args.folder.rglob(".done")):
        prov = json.loads((done.parent / "results.json").read_text()).get("provenance") or {}
        key = done.parent.relative_to(args.folder).parts[2] if len(done.parent.relative_to(args.folder).parts) > 2 \
            else str(done.parent.relative_to(args.folder))
        runs += 1
        if prov.get("cpu_s") is None:
            missing.append(str(done.parent.relative_to(args.folder)))
            continue
        cpu[key] += float(prov["cpu_s"])
        wall[key] += float(prov.get("wall_s") or 0.0)
    print("| configuration | CPU-minutes | wall-minutes |\n| --- | ---: | ---: |")
    for key in sorted(cpu):
        print(f"| {key} | {cpu[key] / 60:.1f} | {wall[key] / 60:.1f} |")
    total = sum(cpu.values())
    left = "" if args.expect is None else f" of {args.expect} ({args.expect - runs} to run)"
    print(f"\n{runs} finished runs{left}; {runs - len(missing)} recorded their CPU time: "
          f"{total / 3600:.2f} CPU-hours ({total / 60:.0f} CPU-minutes), {sum(wall.values()) / 3600:.2f} wall-hours summed.")
    for m in missing:
        print(f"no cpu_s (finished before it was recorded): {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
