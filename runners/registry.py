"""The runner contract and the registry of runners (`cfg.runner` → module).

A runner is a module with three functions:

    semantic_config(cfg) -> dict        what its config hash covers (harness.run_identity.semantic_config: the
                                        keys it reads, with ε normalised)
    run(cfg, ctx: RunContext) -> dict   a short recipe over library code that ends in runners.common.finish()
    describe_skip(cfg) -> str | None    why a skipped job duplicates another (e.g. its configuration ignores ε)

Runners never import each other: what two of them share lives in runners/common.py or in a library module.
Modules are imported when a job runs, so composing or rejecting a config never imports torch. Adding an
experiment: a runner module, one `Runner(...)` in its system's entry of harness/systems.py (its module, the
keys it reads), a conf/experiment/NAME.yaml, and a report section (the entry's report_sections).
"""
from __future__ import annotations

import importlib
from typing import Any, Protocol

from omegaconf import DictConfig

from harness import configurations, systems


class Runner(Protocol):
    def semantic_config(self, cfg: DictConfig) -> dict[str, Any]: ...

    def run(self, cfg: DictConfig, ctx: Any) -> dict[str, Any]: ...

    def describe_skip(self, cfg: DictConfig) -> str | None: ...


# Built from the systems registry (harness/systems.py), where each runner is declared once with its system.
RUNNERS: dict[str, str] = {r.name: r.module for _, r in systems.runners()}

# Which systems' configurations (harness/configurations.py `system`) each runner can run: its own system's,
# those it also runs, every system's for a cross-system runner. schema.validate refuses any other pairing in
# one line.
SYSTEMS: dict[str, tuple[str, ...]] = {r.name: systems.runs(s, r) for s, r in systems.runners()}

# The config keys each runner reads (its run's identity: config hash and directory name) are
# harness/run_identity.py's, built from the same entries.


def systems_of(runner: str) -> tuple[str, ...]:
    return SYSTEMS.get(runner, (configurations.SPLITEE,))


def runner_systems() -> dict[str, tuple[str, ...]]:
    """Every runner with the systems it runs: what harness.schema.validate checks a config against."""
    return {runner: systems_of(runner) for runner in RUNNERS}


def load_runner(name: str) -> Runner:
    return importlib.import_module(RUNNERS[name])  # type: ignore[return-value]
