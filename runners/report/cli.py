"""The `splitbench-report` command line: arguments, one-line errors with exit code 2, the terminal summary.

A corrupt run (results.json unreadable) and a metric that should be a number and is not
(runs.data_problems) each get one `error:` line on stderr and make the exit code 2, after the report of
everything else is written: the report lists the corrupt run among the failed ones and shows such a metric
as "—", and a script must not take that for a clean report."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from runners.report import wandb_report
from runners.report.document import ReportError, build
from runners.report.runs import Selection, data_problems, scan
from runners.report.sections import SECTIONS

PROG = "splitbench-report"


def summary_text(result: dict[str, Any]) -> str:
    sel: Selection = result["selection"]
    lines = [f"{PROG}: wrote {result['report']} and {len(result['pngs'])} PNG(s) from {len(sel.finished)} "
             f"finished run(s); {len(sel.problems)} failed/unfinished, {len(sel.skipped_tagged)} tagged run(s) left out"]
    if result.get("verdicts") is not None:
        lines.append(f"{PROG}: wrote the per-configuration verdicts {result['verdicts']}")
    for section in SECTIONS:
        lines += section.summary(result[section.EXPERIMENT])
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's default adds a usage block)
        print(f"{PROG}: error: {message} (see {PROG} --help)", file=sys.stderr, flush=True)
        sys.exit(2)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog=PROG, description="Aggregate splitbench runs into report.md + PNGs.")
    parser.add_argument("dir", type=Path, nargs="?", help="a run or sweep directory (searched recursively for results.json)")
    parser.add_argument("--out", type=Path, default=None, help="where report.md and the PNGs go (default: DIR)")
    parser.add_argument("--include-tagged", action="append", default=[], metavar="TAG[,TAG]",
                        help="also report runs with these tags (default: runs tagged smoke are left out)")
    parser.add_argument("--relative-to", type=Path, default=None, metavar="DIR",
                        help="write the absolute paths of the runs' commands (and of this command) relative to DIR, "
                             "the repository root they ran from: for a committed report")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", default=None,
                        help="also build a W&B comparison report of the sweep (runs mirrored with logger=wandb): "
                             "saved when W&B is reachable, else its definition is written to OUT/"
                             f"{wandb_report.DEFINITION_FILE}")
    parser.add_argument("--mirror", action="store_true",
                        help="with --wandb: first mirror the finished runs that never were (logger=none) into "
                             "offline W&B runs under their directories, replayed from results.json")
    parser.add_argument("--wandb-push", metavar="FILE", type=Path, default=None,
                        help="save a report definition written offline by --wandb (needs W&B online)")
    args = parser.parse_args(argv)
    if args.mirror and args.wandb is None:
        parser.error("--mirror needs --wandb ENTITY/PROJECT (the project the runs are mirrored to)")
    if (args.dir is None) == (args.wandb_push is None):
        parser.error("give a run or sweep directory, or --wandb-push FILE (not both)")
    if args.wandb is not None:
        try:  # before any report is written
            wandb_report.parse_target(args.wandb)
        except wandb_report.WandbReportError as exc:
            parser.error(str(exc))
    return args


def _wandb(args: argparse.Namespace, result: dict[str, Any], out: Path) -> str:
    """The W&B step of `--wandb`: save the report, or write its definition and say how to push it."""
    entity, project = wandb_report.parse_target(args.wandb)
    finished = result["selection"].finished
    replayed = wandb_report.replay(finished, entity, project) if args.mirror else []
    definition = wandb_report.plan(finished, entity, project, str(args.dir))
    note = f"{PROG}: mirrored {len(replayed)} never-mirrored run(s) offline\n" if args.mirror else ""
    # The report's run sets select mirrored runs: offline ones must reach the project to show in it.
    offline = wandb_report.offline_runs(args.dir)
    sync = (f"wandb sync --entity {entity} --project {project} {' '.join(str(p) for p in offline)}"
            if offline else "")
    online, why = wandb_report.can_go_online()
    if online:
        return (f"{note}{PROG}: saved the W&B report {wandb_report.save(definition)}"
                + (f"; runs mirrored offline show in it once synced: {sync}" if sync else ""))
    path = wandb_report.write_definition(definition, out)
    return (f"{note}{PROG}: W&B offline ({why}): wrote the report definition {path}; push it from a machine "
            f"with W&B access: {sync + ' && ' if sync else ''}{PROG} --wandb-push {path}")


def _push(path: Path) -> int:
    definition = wandb_report.load_definition(path)
    online, why = wandb_report.can_go_online()
    if not online:
        raise wandb_report.WandbReportError(f"cannot push {path}: {why}")
    print(f"{PROG}: saved the W&B report {wandb_report.save(definition)}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.wandb_push is not None:
        try:
            return _push(args.wandb_push)
        except wandb_report.WandbReportError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
    tags = [t.strip() for item in args.include_tagged for t in item.split(",") if t.strip()]
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    try:
        if args.wandb:  # before report.md is written: a report on the wrong project would select no run
            wandb_report.check_target([r for r in scan(args.dir) if r.state == "ok"],
                                      *wandb_report.parse_target(args.wandb))
        result = build(args.dir, args.out or args.dir, tags, command=command, relative_to=args.relative_to)
    except (wandb_report.WandbReportError, ReportError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(summary_text(result), flush=True)
    lost = data_problems([*result["selection"].finished, *result["selection"].problems])
    for line in lost:
        print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    if args.wandb:
        try:
            print(_wandb(args, result, args.out or args.dir), flush=True)
        except wandb_report.WandbReportError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
    return 2 if lost else 0
