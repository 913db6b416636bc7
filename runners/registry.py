"""The runner contract and the registry of runners (`cfg.runner` → module).

A runner is a module with three functions:

    semantic_config(cfg) -> dict        what its config hash covers (harness.schema.semantic_config, with what
                                        the runner ignores dropped and ε normalised)
    run(cfg, ctx: RunContext) -> dict   a short recipe over library code that ends in runners.common.finish()
    describe_skip(cfg) -> str | None    why a skipped job duplicates another (e.g. its configuration ignores ε)

Runners never import each other: what two of them share lives in runners/common.py or in a library module.
Modules are imported when a job runs, so composing or rejecting a config never imports torch. Adding an
experiment: a runner module, one line here, a conf/experiment/NAME.yaml, and a report section
(runners/report/sections.py).
"""
from __future__ import annotations

import importlib
from typing import Any, Protocol

from omegaconf import DictConfig


class Runner(Protocol):
    def semantic_config(self, cfg: DictConfig) -> dict[str, Any]: ...

    def run(self, cfg: DictConfig, ctx: Any) -> dict[str, Any]: ...

    def describe_skip(self, cfg: DictConfig) -> str | None: ...


RUNNERS: dict[str, str] = {
    "fidelity": "runners.fidelity",
    "timing": "runners.timing",
    "fp_error": "runners.fp_error",
    "controlled_error": "runners.controlled_error",
    "attack": "runners.attack",
}


def load_runner(name: str) -> Runner:
    return importlib.import_module(RUNNERS[name])  # type: ignore[return-value]
