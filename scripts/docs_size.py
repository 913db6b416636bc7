"""How big the docs are (issue 53, "docs a reader can hold"): words in docs/*.md, file by file and in total,
words in docs/results, how many files docs/results commits and its longest committed paths.

Words are whitespace-separated tokens, as `wc -w` counts them; only Markdown is counted. Files are what git
tracks (`git ls-files`, so the index: stage a rename before measuring it), so the numbers are the commit's,
not whatever a run left in the working tree.

    python scripts/docs_size.py            # the table, in Markdown
    python scripts/docs_size.py --longest 5
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tracked(under: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--", under], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return sorted(p for p in out.split("\0") if p)


def words(path: str) -> int:
    return len((ROOT / path).read_text(encoding="utf-8").split())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--longest", type=int, default=3, help="how many of the longest paths to list")
    args = parser.parse_args(argv)

    top = [p for p in tracked("docs") if p.count("/") == 1 and p.endswith(".md")]
    results = tracked("docs/results")
    result_md = [p for p in results if p.endswith(".md")]
    print("| docs/*.md | words |\n|---|--:|")
    for p in top:
        print(f"| {p} | {words(p):,} |")
    print(f"| **total, {len(top)} files** | **{sum(words(p) for p in top):,}** |\n")
    print("| docs/results | |\n|---|--:|")
    print(f"| words in its {len(result_md)} Markdown files | {sum(words(p) for p in result_md):,} |")
    print(f"| words in its index (docs/results/README.md) | {words('docs/results/README.md'):,} |")
    print(f"| committed files | {len(results)} |")
    name = max((part for p in results for part in p.split("/")), key=len)
    print(f"| longest file or folder name | {len(name)} characters |")
    for p in sorted(results, key=lambda p: (-len(p), p))[:args.longest]:
        print(f"| path of {len(p)} characters | `{p}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
