"""The runner contract and the registry of runners (`cfg.runner` → module).

A runner is a module with three functions:

    semantic_config(cfg) -> dict        what its config hash covers (runners.identity.semantic_config: the keys
                                        it reads, READS below, with ε normalised)
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

# The config keys each runner reads: a run's identity (runners/identity.py). Its config hash covers these
# keys only and its run directory is named by overrides of these keys only, so a parameter the runner never
# reads (another system's section, a section added later) moves neither. A system's own section (sanitize,
# splitft, collab, grad_audit) counts only for a configuration of that system: fidelity reads `sanitize`
# for the sanitisers, not for SpliTEE's configurations. Labels (logger, paths, tags, experiment_name, rerun)
# are never part of a run's identity.
READS: dict[str, tuple[str, ...]] = {r.name: r.reads for _, r in systems.runners()}
# What a runner's READS names that it does not read: always (IGNORES), or for the configurations a part is
# not read for (READS_ONLY_FOR: path → the configurations that read it). Neither enters its hash or directory.
IGNORES: dict[str, tuple[str, ...]] = {r.name: r.ignores for _, r in systems.runners()}
READS_ONLY_FOR: dict[str, dict[str, tuple[str, ...]]] = {r.name: dict(r.reads_only_for) for _, r in systems.runners()}
# (path, value) pairs left out of a runner's config hash at that value (harness/systems.py Runner.unhashed).
UNHASHED: dict[str, tuple[tuple[str, object], ...]] = {r.name: r.unhashed for _, r in systems.runners()}
# Runners that read several systems' sections whatever the configuration: their READS count whole.
CROSS_SYSTEM: tuple[str, ...] = tuple(r.name for s in systems.CROSS_SYSTEM for r in s.runners)


def systems_of(runner: str) -> tuple[str, ...]:
    return SYSTEMS.get(runner, (configurations.SPLITEE,))


def runner_systems() -> dict[str, tuple[str, ...]]:
    """Every runner with the systems it runs: what harness.schema.validate checks a config against."""
    return {runner: systems_of(runner) for runner in RUNNERS}


def load_runner(name: str) -> Runner:
    return importlib.import_module(RUNNERS[name])  # type: ignore[return-value]
