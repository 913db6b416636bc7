"""`splitbench --dry-run` (also `--plan`): a sweep's jobs, which of them are already finished, and what the rest
should cost, without running or writing anything.

    splitbench --dry-run -m experiment=fidelity configuration=ep1,epn epsilon=1,5
    splitbench --dry-run experiment=sanitize_smoke          # an experiment that sweeps by itself (hydra.mode)

The jobs are Hydra's own: the experiment's `hydra.sweeper.params` and the command line's sweeps expanded by
Hydra's basic sweeper (its `split_arguments`, the command line winning over the experiment for one key), each
composed with the compose API into its run directory (conf/hydra/default.yaml's sweep dir and subdir) and its
config hash (the runner's semantic_config, as runners/run.py `run_job` computes them). A job is *finished*
when its directory holds `.done` and a results.json of the same hash (harness/results.RunDir.state), *stale*
when `.done` is there with another hash (the real run refuses it without rerun=true), else *to run*; jobs that
land in one directory (an ε sweep over a configuration that ignores ε) are one run.

The estimate is the mean wall time (results.json provenance `wall_s`, recorded since this command exists) of
the finished runs of the same experiment and model under the sweep's output folder (of the same
configuration where there are some), with its 95% t interval, times the runs left to do.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError

FLAGS = ("--dry-run", "--plan")
MULTIRUN = ("-m", "--multirun")


@dataclass
class Job:
    overrides: list[str]
    path: Path                 # its run directory
    folder: Path               # the experiment's output folder (hydra.sweep.dir), where finished runs are timed
    name: str                  # relative to the output folder, as `splitbench: done NAME` prints it
    experiment: str
    model: str
    configuration: str
    state: str                 # "finished" | "stale" | "to run" | "same run" (a directory an earlier job has)


def plan(argv: Sequence[str], conf_dir: str) -> list[Job]:
    """The jobs `splitbench ARGV` would run (the config in `conf_dir`), each with its state. A user's mistake
    raises what the real run raises (UserError, a Hydra composition error): runners/run.py `main` says it in
    one line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    args = [a for a in argv if a not in FLAGS]
    multirun = any(a in MULTIRUN for a in args)
    overrides = [a for a in args if a not in MULTIRUN]
    flags = [a for a in overrides if a.startswith("-")]
    if flags:
        raise UserError(f"--dry-run takes overrides and -m only, not {' '.join(flags)}")
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    with initialize_config_dir(version_base="1.3", config_dir=conf_dir):
        # Hydra composes the sweep's own config without the swept values, and reads the experiment's sweep there
        plain = [o.input_line for o in parsed if not o.is_sweep_override()]
        primary = compose(config_name="config", overrides=plain, return_hydra_config=True)
        multirun = multirun or primary.hydra.mode == RunMode.MULTIRUN
        swept = [o.input_line for o in parsed if o.is_sweep_override()]
        if swept and not multirun:
            raise UserError(f"{' '.join(swept)} is a sweep: add -m to run (or plan) one")
        params = (primary.hydra.sweeper.get("params") or {}) if multirun else {}
        return _states([_job(compose(config_name="config", overrides=job, return_hydra_config=True), job)
                        for job in _expand([f"{k}={v}" for k, v in params.items()] + overrides)])


def _expand(overrides: list[str]) -> list[list[str]]:
    """Every job's overrides, as Hydra's basic sweeper expands them (its own code: the product of the sweeps,
    the later of two overrides of one key winning)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (batch,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)
    return batch


def _job(cfg: Any, overrides: list[str]) -> Job:
    """One job's run directory (Hydra's sweep dir / subdir, relative paths from the working directory as the
    real run takes them) and state, from its config composed with the hydra node."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from harness import schema
    from harness.results import RunDir, config_hash
    from runners.registry import load_runner, runner_systems

    HydraConfig.instance().set_config(cfg)   # what a running job sees (its overrides: harness/run_identity.py)
    folder = Path(cfg.hydra.sweep.dir).expanduser().resolve()
    path = folder / str(cfg.hydra.sweep.subdir)
    job = cfg.copy()
    with open_dict(job):
        del job["hydra"]                      # a job's config, as the task function gets it
    schema.validate(job, runner_systems())
    digest = config_hash(load_runner(job.runner).semantic_config(job))
    state = {"complete": "finished", "stale": "stale", "todo": "to run"}[RunDir(path).state(digest)]
    root = Path(job.paths.output_dir).expanduser().resolve()
    name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    return Job(overrides, path, folder, name, str(job.experiment_name), str(job.model.name), str(job.configuration.name),
               state)


def _states(jobs: list[Job]) -> list[Job]:
    seen: set[Path] = set()
    for job in jobs:
        if job.path in seen:
            job.state = "same run"
        seen.add(job.path)
    return jobs


def wall_times(jobs: Sequence[Job]) -> dict[tuple[str, str, str], list[float]]:
    """(experiment, model, configuration) → the wall times of the finished runs under the jobs' experiment
    folders."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for folder in sorted({job.folder for job in jobs}):
        for done in folder.rglob(".done"):
            try:
                d = json.loads((done.parent / "results.json").read_text())
            except (OSError, ValueError):
                continue
            wall = (d.get("provenance") or {}).get("wall_s") if isinstance(d, dict) else None
            if isinstance(wall, (int, float)) and not isinstance(wall, bool):
                key = (str(d.get("experiment_name") or d.get("experiment")), str(d.get("model")),
                       str(d.get("configuration")))
                out.setdefault(key, []).append(float(wall))
    return out


def estimate(jobs: Sequence[Job]) -> list[str]:
    """Lines of the cost estimate for the jobs to run: per experiment and model, the mean wall time of the
    finished runs seen (those of the same configuration where there are some) times the runs to do."""
    from metrics.intervals import mean_t_ci

    seen = wall_times(jobs)
    todo = [j for j in jobs if j.state in ("to run", "stale")]
    if not todo:
        return ["estimate: nothing to run"]
    lines, total, unknown = [], 0.0, 0
    for job in todo:
        same = seen.get((job.experiment, job.model, job.configuration))
        like = same or [w for (e, m, _), ws in seen.items() if (e, m) == (job.experiment, job.model) for w in ws]
        if not like:
            unknown += 1
            continue
        total += sum(like) / len(like)
    groups = sorted({(j.experiment, j.model) for j in todo})
    for experiment, model in groups:
        walls = [w for (e, m, _), ws in seen.items() if (e, m) == (experiment, model) for w in ws]
        n = sum(1 for j in todo if (j.experiment, j.model) == (experiment, model))
        if not walls:
            lines.append(f"estimate: {experiment} · {model}: {n} run(s) to do, no finished run records its wall time")
            continue
        est = mean_t_ci(walls)
        # one run gives a mean and no spread: an interval would read as a certainty
        spread = (f"[95% interval {max(est.lo, 0.0):.1f}, {est.hi:.1f}] from {len(walls)} finished runs"
                  if len(walls) > 1 else "from one finished run, no interval")
        lines.append(f"estimate: {experiment} · {model}: {n} run(s) to do × mean {est.mean:.1f} s per run {spread}")
    known = len(todo) - unknown
    if known:
        lines.append(f"estimate: about {_duration(total)} for the {known} run(s) with a measured kind"
                     + (f"; {unknown} without one" if unknown else ""))
    return lines


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def report(jobs: Sequence[Job]) -> list[str]:
    finished = sum(j.state == "finished" for j in jobs)
    runs = sum(j.state != "same run" for j in jobs)
    lines = [f"plan: {len(jobs)} job(s), {runs} run(s): {finished} finished, {runs - finished} to run "
             "(dry run: nothing was run or written)"]
    for job in jobs:
        note = {"stale": " (holds a finished run of a different config: rerun=true recomputes it)",
                "same run": " (the run of an earlier job: it ignores what differs)"}.get(job.state, "")
        lines.append(f"  {job.state:<9} {job.name}{note}")
    return lines + estimate(jobs)
