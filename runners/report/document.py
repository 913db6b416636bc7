"""report.md from a run or sweep directory: the header, every registered section (sections.py), the
generic tables of other experiments, the runs covered and the failed and unfinished ones."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.results import atomic_write_bytes
from runners.report import other
from runners.report.format import relative_paths
from runners.report.plotting import Figures
from runners.report.provenance import problems_md, provenance_md, runs_md
from runners.report.runs import Selection, scan, select
from runners.report.sections import EXPERIMENTS, SECTIONS
from runners.report.splitee import verdicts

REPORT = "report.md"


class ReportError(Exception):
    """A mistake the user can make (missing directory, nothing finished to report)."""


def _selection(root: Path, include_tags: Sequence[str]) -> Selection:
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory")
    selection = select(scan(root), include_tags)
    if not selection.finished:
        found = len(selection.finished) + len(selection.problems) + len(selection.skipped_tagged)
        hint = ""
        if selection.skipped_tagged:
            tags = selection.skipped_tags
            hint = (f"; {len(selection.skipped_tagged)} run(s) tagged {', '.join(tags)} left out "
                    f"(pass --include-tagged {','.join(tags)})")
        raise ReportError(f"no finished runs under {root} ({found} run director{'y' if found == 1 else 'ies'} "
                          f"found, {len(selection.problems)} failed or unfinished{hint})")
    return selection


def build(root: Path, out: Path, include_tags: Sequence[str] = (), command: str | None = None,
          relative_to: Path | None = None) -> dict[str, Any]:
    """Write out/report.md and its PNGs from the runs under `root`. Returns a summary for the terminal:
    the report's path, the PNGs, the selection, and every section's tables under its experiment name."""
    root, out = Path(root), Path(out)
    selection = _selection(root, include_tags)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create the output directory {out}: {exc.strerror or exc}") from None
    runs = selection.finished
    items = {s.EXPERIMENT: s.groups(runs) for s in SECTIONS}
    figure = Figures(out)

    md: list[str] = ["# splitbench report", ""]
    tagged_in = sorted({t for r in runs for t in r.tags} & set(selection.included_tags))
    if tagged_in:
        md += [f"> **Includes runs tagged {', '.join(tagged_in)}** (`--include-tagged {','.join(tagged_in)}`). "
               "Smoke runs use a tiny random model and a few prompts: they test the pipeline and say nothing "
               "about the scheme. Tagged runs are kept in tables of their own, never mixed with untagged ones.", ""]
    md += [relative_paths(f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from `{root}`"
                          + (f" by `{command}`" if command else "") + ".", relative_to),
           "", "## Provenance", "", provenance_md(runs, relative_to), ""]
    for section in SECTIONS:
        if items[section.EXPERIMENT]:
            md += section.markdown(items[section.EXPERIMENT], figure)
    for exp, table_md in other.tables_md(runs, EXPERIMENTS):
        md += [f"## Other experiment: {exp}", "", table_md, ""]
    md += ["## Runs in this report", "", runs_md(runs), ""]
    md += ["## Failed and unfinished runs", ""]
    md += [problems_md(selection.problems) if selection.problems else "None.", ""]
    if selection.skipped_tagged:
        tags = selection.skipped_tags
        md += [f"{len(selection.skipped_tagged)} run(s) tagged {', '.join(tags)} left out "
               f"(`--include-tagged {','.join(tags)}` to report them, in tables of their own).", ""]

    report = out / REPORT
    atomic_write_bytes(report, ("\n".join(md) + "\n").encode("utf-8"))
    figure.remove_stale()
    verdict_file = verdicts.write(runs, out)   # issue 31: the per-configuration verdict as a file
    return {"report": report, "pngs": figure.written, "selection": selection, "verdicts": verdict_file, **items}
