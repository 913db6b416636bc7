"""Every run's identity as the configs compose it: for each experiment (and the default config) and each
configuration its runner runs, the config hash and the run directory, one line each, sorted.

Run it at two commits and diff the output: an empty diff means every finished run keeps its hash and its
directory (a move of code that a config names, as the engine's move to harness/splitee/ in issue 30).

    python scripts/run_identities.py > after.txt
    git worktree add --detach /tmp/base BASE && (cd /tmp/base && python scripts/run_identities.py) > before.txt
    diff before.txt after.txt

Composition only (Hydra's compose API, as tests/conftest.py compose_config): no model is loaded.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402

import harness.run_identity  # noqa: E402,F401  (registers the sb.* resolvers, which name run directories)
import harness.schema  # noqa: E402,F401  (registers the schema)
from harness import configurations  # noqa: E402
from harness.results import config_hash  # noqa: E402
from runners.registry import load_runner, runner_systems  # noqa: E402

CONF = ROOT / "conf"


def identities() -> list[str]:
    experiments = [None, *sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))]
    systems = runner_systems()
    lines = []
    for experiment in experiments:
        base = ["paths.output_dir=out", *([f"experiment={experiment}"] if experiment else [])]
        runner = compose(config_name="config", overrides=base).runner
        for name in configurations.NAMES:
            if configurations.get(name).system not in systems[runner]:
                continue   # a pairing validate refuses (another system's runner): no run
            overrides = [*base, f"configuration={name}"]
            digest = config_hash(load_runner(runner).semantic_config(compose(config_name="config", overrides=overrides)))
            # the directory as runners/run.py gets it: Hydra's node set, the run dir resolved (test_configs _run_dir)
            named = compose(config_name="config", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(named)
            lines.append(f"{experiment or '(default)'}\t{name}\t{runner}\t{digest}\t{named.hydra.run.dir}")
    return sorted(lines)


def main() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        print("\n".join(identities()))


if __name__ == "__main__":
    main()
