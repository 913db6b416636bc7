"""The runner contract and the registry of runners (`cfg.runner` → module).

A runner is a module with three functions:

    semantic_config(cfg) -> dict        what its config hash covers (harness.schema.semantic_config over the keys
                                        it reads, READS below, with ε normalised)
    run(cfg, ctx: RunContext) -> dict   a short recipe over library code that ends in runners.common.finish()
    describe_skip(cfg) -> str | None    why a skipped job duplicates another (e.g. its configuration ignores ε)

Runners never import each other: what two of them share lives in runners/common.py or in a library module.
Modules are imported when a job runs, so composing or rejecting a config never imports torch. Adding an
experiment: a runner module, one line in RUNNERS, one in READS and one in SYSTEMS here, a
conf/experiment/NAME.yaml, and a report section (runners/report/sections.py).
"""
from __future__ import annotations

import importlib
from typing import Any, Protocol

from omegaconf import DictConfig

from harness import configurations


class Runner(Protocol):
    def semantic_config(self, cfg: DictConfig) -> dict[str, Any]: ...

    def run(self, cfg: DictConfig, ctx: Any) -> dict[str, Any]: ...

    def describe_skip(self, cfg: DictConfig) -> str | None: ...


RUNNERS: dict[str, str] = {
    # SpliTEE (paper 000)
    "fidelity": "runners.fidelity",
    "timing": "runners.timing",
    "fp_error": "runners.fp_error",
    "controlled_error": "runners.controlled_error",
    "attack": "runners.attack",
    "sequential_attack": "runners.sequential_attack",
    "restore": "runners.restore",
    # sanitize (paper 001)
    "sanitize": "runners.sanitize",
    # splitft (paper 002)
    "splitft": "runners.splitft",
    # collab (paper 003)
    "collab": "runners.collab",
    # grad_audit (paper 004)
    "grad_audit": "runners.grad_audit",
    # every system's verdict calibrated against nulls (issue 31)
    "calibration": "runners.calibration",
}

# Which systems' configurations (harness/configurations.py `system`) each runner can run; a runner left
# out runs SpliTEE's only. schema.validate refuses any other pairing in one line.
SYSTEMS: dict[str, tuple[str, ...]] = {
    # sanitize (paper 001); fidelity also runs the sanitisers (sanitised prompt, then the plain engine)
    "sanitize": (configurations.SANITIZE,),
    "fidelity": (configurations.SPLITEE, configurations.SANITIZE),
    # splitft (paper 002)
    "splitft": (configurations.SPLITFT,),
    # collab (paper 003)
    "collab": (configurations.COLLAB,),
    # grad_audit (paper 004)
    "grad_audit": (configurations.GRAD_AUDIT,),
    # calibration runs no configuration of its own: it calibrates every system's verdict whatever is selected
    "calibration": (configurations.SPLITEE, configurations.SANITIZE, configurations.SPLITFT, configurations.COLLAB,
                    configurations.GRAD_AUDIT),
}


# The config keys each runner reads: a run's identity (runners/identity.py). Its config hash covers these
# keys only and its run directory is named by overrides of these keys only, so a parameter the runner never
# reads (another system's section, a section added later) moves neither. A system's own section (sanitize,
# splitft, collab, grad_audit) counts only for a configuration of that system: fidelity reads `sanitize`
# for the sanitisers, not for SpliTEE's configurations. Labels (logger, paths, tags, experiment_name, rerun)
# are never part of a run's identity.
_SPLITEE_READS = ("runner", "seed", "model", "configuration", "epsilon", "workload", "generation", "engine",
                  "epn_n", "mask_seeds", "semantic_model")
READS: dict[str, tuple[str, ...]] = {
    # SpliTEE (paper 000); timing times the configurations of its own section, not the `configuration` group
    "fidelity": (*_SPLITEE_READS, "baseline", "sanitize"),
    "timing": ("runner", "seed", "model", "epsilon", "workload", "generation", "engine", "epn_n", "mask_seeds",
               "timing"),
    "fp_error": ("runner", "seed", "model", "configuration", "epsilon", "workload", "engine", "epn_n", "mask_seeds",
                 "fp_error"),
    "controlled_error": (*_SPLITEE_READS, "controlled_error"),
    "attack": (*_SPLITEE_READS, "attack"),
    "sequential_attack": (*_SPLITEE_READS, "attack"),
    # restore: the source attack run fixed the configuration, workload and generation
    "restore": ("runner", "seed", "model", "semantic_model", "restore"),
    # sanitize (paper 001)
    "sanitize": ("runner", "seed", "model", "configuration", "epsilon", "workload", "sanitize"),
    # splitft (paper 002)
    "splitft": ("runner", "seed", "model", "configuration", "epsilon", "splitft"),
    # collab (paper 003)
    "collab": ("runner", "seed", "model", "configuration", "epsilon", "semantic_model", "collab"),
    # grad_audit (paper 004): its seeds are grad_audit.seeds
    "grad_audit": ("runner", "model", "configuration", "epsilon", "grad_audit"),
    # every system's verdict against nulls (issue 31): its own section and each system's margins
    "calibration": ("runner", "model", "calibration", "collab", "sanitize", "splitft", "grad_audit", "attack",
                    "engine"),
}
# Runners that read several systems' sections whatever the configuration: their READS count whole.
CROSS_SYSTEM = ("calibration",)


def systems_of(runner: str) -> tuple[str, ...]:
    return SYSTEMS.get(runner, (configurations.SPLITEE,))


def runner_systems() -> dict[str, tuple[str, ...]]:
    """Every runner with the systems it runs: what harness.schema.validate checks a config against."""
    return {runner: systems_of(runner) for runner in RUNNERS}


def load_runner(name: str) -> Runner:
    return importlib.import_module(RUNNERS[name])  # type: ignore[return-value]
