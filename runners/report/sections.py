"""The registry of report sections, in the order report.md shows them.

A section is a module for one experiment (`cfg.runner`, runners/registry.py) with:

    EXPERIMENT: str                         the results.json `experiment` it reports
    groups(runs) -> list                    its tables: finished runs grouped so that numbers in one are comparable
    markdown(items, figure) -> list[str]    its `## ...` section (called only when items is non-empty),
                                            drawing plots through `figure` (plotting.Figures)
    summary(items) -> list[str]             its lines of the terminal summary

Adding an experiment's section: one module beside this one and one line in SECTIONS. Experiments without
a section still appear, in generic tables (other.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from runners.report import (
    attack,
    calibration,
    collab,
    controlled_error,
    fidelity,
    fp_error,
    grad_audit,
    restore,
    sanitize,
    sequential_attack,
    splitft,
    timing,
    tradeoff,
)
from runners.report.plotting import Figures
from runners.report.runs import Run


class Section(Protocol):
    EXPERIMENT: str

    def groups(self, runs: Sequence[Run]) -> list[Any]: ...

    def markdown(self, items: Sequence[Any], figure: Figures) -> list[str]: ...

    def summary(self, items: Sequence[Any]) -> list[str]: ...


SECTIONS: tuple[Section, ...] = (fidelity, timing, fp_error, controlled_error, attack, sequential_attack, restore,
                                 sanitize,   # paper 001
                                 splitft,    # paper 002
                                 collab,     # paper 003
                                 grad_audit,  # paper 004
                                 calibration,  # every system's verdict against nulls (issue 31)
                                 # the cross-system chart reads every experiment's `tradeoff` blocks: last
                                 tradeoff)
EXPERIMENTS: tuple[str, ...] = tuple(s.EXPERIMENT for s in SECTIONS)
