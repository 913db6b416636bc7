"""The registry of report sections, in the order report.md shows them.

A section is a module for one experiment (`cfg.runner`, runners/registry.py) with:

    EXPERIMENT: str                         the results.json `experiment` it reports
    groups(runs) -> list                    its tables: finished runs grouped so that numbers in one are comparable
    markdown(items, figure) -> list[str]    its `## ...` section (called only when items is non-empty),
                                            drawing plots through `figure` (plotting.Figures)
    summary(items) -> list[str]             its lines of the terminal summary

Adding an experiment's section: one module beside this one, named in its system's `report_sections`
(harness/systems.py). Experiments without
a section still appear, in generic tables (other.py).
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from harness import systems
from runners.report import tradeoff
from runners.report.plotting import Figures
from runners.report.runs import Run


class Section(Protocol):
    EXPERIMENT: str

    def groups(self, runs: Sequence[Run]) -> list[Any]: ...

    def markdown(self, items: Sequence[Any], figure: Figures) -> list[str]: ...

    def summary(self, items: Sequence[Any]) -> list[str]: ...


# Built from the systems registry (harness/systems.py): each entry's report sections in the entries' order;
# the cross-system chart reads every experiment's `tradeoff` blocks: last.
SECTIONS: tuple[Section, ...] = (*(importlib.import_module(m) for s in systems.ENTRIES for m in s.report_sections),
                                 tradeoff)  # type: ignore[assignment]
EXPERIMENTS: tuple[str, ...] = tuple(s.EXPERIMENT for s in SECTIONS)
