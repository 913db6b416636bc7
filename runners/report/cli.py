"""The `splitbench-report` command line: arguments, one-line errors with exit code 2, the terminal summary."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from runners.report.document import ReportError, build
from runners.report.runs import Selection
from runners.report.sections import SECTIONS

PROG = "splitbench-report"


def summary_text(result: dict[str, Any]) -> str:
    sel: Selection = result["selection"]
    lines = [f"{PROG}: wrote {result['report']} and {len(result['pngs'])} PNG(s) from {len(sel.finished)} "
             f"finished run(s); {len(sel.problems)} failed/unfinished, {len(sel.skipped_tagged)} tagged run(s) left out"]
    for section in SECTIONS:
        lines += section.summary(result[section.EXPERIMENT])
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's default adds a usage block)
        print(f"{PROG}: error: {message} (see {PROG} --help)", file=sys.stderr, flush=True)
        sys.exit(2)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog=PROG, description="Aggregate splitbench runs into report.md + PNGs.")
    parser.add_argument("dir", type=Path, help="a run or sweep directory (searched recursively for results.json)")
    parser.add_argument("--out", type=Path, default=None, help="where report.md and the PNGs go (default: DIR)")
    parser.add_argument("--include-tagged", action="append", default=[], metavar="TAG[,TAG]",
                        help="also report runs with these tags (default: runs tagged smoke are left out)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tags = [t.strip() for item in args.include_tagged for t in item.split(",") if t.strip()]
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    try:
        result = build(args.dir, args.out or args.dir, tags, command=command)
    except ReportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(summary_text(result), flush=True)
    return 0
