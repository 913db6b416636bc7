"""Put committed run copies (scripts/collect_runs.sh, with or without --short) back under an output root at
their original run folders (results.json `run_dir`), so that a rerun of the sweep skips them as finished and
runs only the rest: how a grid too long for one sitting resumes on a fresh machine.

    python scripts/restore_runs.py docs/results/collab/n30_runs outputs/collab_paper
    DATA=... bash scripts/collab_paper_runs.sh outputs/collab_paper      # runs what is left

A folder whose run_dir already holds a finished run is left as it is.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[0]).is_dir():
        print("restore_runs: error: usage: restore_runs.py COMMITTED_DIR OUTPUT_ROOT (COMMITTED_DIR a folder)",
              file=sys.stderr)
        return 2
    src, out = Path(argv[0]), Path(argv[1])
    restored = kept = 0
    for results in sorted(src.rglob("results.json")):
        if not (results.parent / ".done").is_file():
            continue
        target = out / json.loads(results.read_text())["run_dir"]
        if (target / ".done").is_file():
            kept += 1
            continue
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(results, target / "results.json")       # results first, .done last: a finished run
        shutil.copy2(results.parent / ".done", target / ".done")
        restored += 1
    print(f"restore_runs: {restored} runs restored under {out}, {kept} already there")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
