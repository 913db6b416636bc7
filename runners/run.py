"""splitbench's command line: `python -m runners.run [overrides]` (console script `splitbench`), `-m` to sweep.

    splitbench experiment=smoke
    splitbench -m experiment=fidelity workload=dolly configuration=ep1,epn,slalom epsilon=0.5,1,5,10,15
    splitbench experiment=timing 'timing.max_new_tokens=[50,100]'
    splitbench -m hydra/launcher=joblib ...          # local parallel sweep

Every job goes through `run_job`: validate, note the overrides its runner does not read (they change
neither its directory nor its config hash: harness/run_identity.py), lock its run directory, skip it if it is
already complete, else hand it to the runner named by `cfg.runner` (runners/registry.py: the contract and
the registry). Runners compose library code (harness/, metrics/) and write results through
harness/results.py.

Errors. A mistake the user can make (bad override, unknown option, value out of range, missing model,
no network) ends in exactly one line `splitbench: error: ...` on stderr and exit code 2; anything else
is a bug and keeps its traceback (exit code 1). How that is done with Hydra 1.3: Hydra's `hydra.main`
catches every exception itself, prints a multi-line report and calls sys.exit(1) — unless the documented
variable HYDRA_FULL_ERROR=1 is set, in which case it re-raises. `main()` sets it for its own process
(remembering whether the user had set it) and renders what comes out:
- composition errors (ConfigCompositionException, MissingConfigException, OverrideParseException, an
  OmegaConf ValidationError under them) and UserError → one line, exit 2;
- UserError inside a single run: the job itself prints the line and raises SystemExit(2), because Hydra
  would otherwise print "Error executing job with overrides: [...]" first; in a sweep it re-raises so
  the other jobs still run, and the sweep ends with exit 2 once they have;
- in a sweep, an exception from Hydra's launcher before any job ran (its own settings: joblib's
  n_jobs=0) → one line, exit 2;
- anything else → the traceback, exit 1. If the user set HYDRA_FULL_ERROR=1 themselves, user errors also
  show their traceback before the one line.
A sweep that ends in one of these before any job wrote a file leaves its folder as it was, multirun.yaml
included (SweepGuard). An empty paths.output_dir and a key given twice on the command line are refused
while Hydra resolves the sweep folder, before it writes anything (harness/run_identity.py sweep_dirname).
"""
from __future__ import annotations

import errno
import os
import shutil
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness import configurations, schema
from harness.errors import UserError
from harness.progress import quiet_bars_in_environment, quiet_library_bars
from harness.results import DONE, RunContext, RunDir, atomic_write_bytes, config_hash, remove_if_empty
from harness.run_identity import unread_overrides  # also registers the sb.* resolvers, which name run dirs
from runners import plan
from runners.common import results_header
from runners.registry import Runner, load_runner, runner_systems

PROG = "splitbench"
# An absolute config dir, computed from this file: works from a source checkout (`python -m runners.run`),
# an editable install and a wheel (conf/ is installed beside runners/). A relative "../conf" makes Hydra
# look the configs up as the package `conf` when the entry point is imported (the console script), and
# importlib.resources rejects that namespace package under setuptools' editable finder.
CODE_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = str(CODE_ROOT / "conf")


class JobFailed(Exception):
    """A job failed on a bug or an environment problem; its results.json says status "failed"."""


def _say(message: str, *, err: bool = False) -> None:
    print(f"{PROG}: {message}", file=sys.stderr if err else sys.stdout, flush=True)


def run_job(cfg: DictConfig) -> dict:
    """One job (a single run or one job of a sweep) in Hydra's output dir for it. Returns a small status
    dict ({"status": ..., "run_dir": ...})."""
    hydra_cfg = HydraConfig.get()
    quiet_library_bars()
    run_dir = RunDir(Path(hydra_cfg.runtime.output_dir))
    output_root = Path(cfg.paths.output_dir).expanduser().resolve()
    sweeping = hydra_cfg.mode == RunMode.MULTIRUN
    name = _relative(run_dir.path, output_root)
    try:
        schema.validate(cfg, runner_systems())
        unread = unread_overrides(hydra_cfg.overrides.task, hydra_cfg.job.config.override_dirname.exclude_keys,
                                  cfg.runner, cfg.configuration.name)
        if unread:
            _say(f"note: runner {cfg.runner} does not read {', '.join(unread)}: left out of {name} and its "
                 f"config hash", err=True)
        runner = load_runner(cfg.runner)
        semantic = runner.semantic_config(cfg)
        digest = config_hash(semantic)
        with run_dir.lock() as held:
            if not held:
                _say(f"skip {name}: another job is computing this run right now{_dup_note(runner, cfg)}")
                return {"status": "skipped_running", "run_dir": str(run_dir.path)}
            state = run_dir.state(digest)
            if state == "complete" and not cfg.rerun:
                _say(f"skip {name}: already complete{_dup_note(runner, cfg)}")
                return {"status": "skipped_complete", "run_dir": str(run_dir.path)}
            if state == "corrupt" and not cfg.rerun:
                raise UserError(
                    f"{run_dir.results_path} {run_dir.unreadable()}, yet {run_dir.path / DONE} marks the run "
                    "finished: a corrupt or unfinished run; pass rerun=true to recompute it in place")
            if state == "stale" and not cfg.rerun:
                raise UserError(
                    f"{run_dir.path} holds a finished run of a different config (hash {run_dir.stored_hash()} != "
                    f"{digest}); move it away, or pass rerun=true to recompute it in place")
            before = set(os.listdir(run_dir.path))
            try:
                runner.run(cfg, RunContext(run_dir, name, digest, semantic))
            except UserError:
                raise
            except BaseException as exc:
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    # A full disk: the atomic writes left no torn file; what this job did write goes too (a
                    # failure record would need the space it lacks), so the run stays as it was: to do.
                    _remove_new(run_dir.path, before)
                    raise UserError(f"no space left on the device writing {exc.filename or run_dir.path} "
                                    f"({exc.strerror}); free some space, or move paths.output_dir / "
                                    "paths.cache_dir") from None
                _record_failure(run_dir, cfg, name, digest, exc)
                if isinstance(exc, Exception):
                    _say(f"FAILED {name}: {type(exc).__name__}: {_first_line(exc)}", err=True)
                    raise JobFailed(f"{name}: {type(exc).__name__}: {_first_line(exc)}") from exc
                raise
        _say(f"done {name}")
        return {"status": "ok", "run_dir": str(run_dir.path)}
    except UserError as exc:
        # Hydra made the directory before we ran; a user error leaves nothing behind.
        remove_if_empty(run_dir.path, output_root)
        if sweeping:
            # main() says it once, naming the first failed job, after the other jobs have run.
            exc.job = name
            raise
        _say(f"error: {exc}", err=True)
        raise SystemExit(2) from None


class _WithoutHydraJobError:
    """stderr without the line Hydra's sweeper writes before re-raising a failed job ("Error executing job
    with overrides: [...]"): main() ends a sweep with one line that names the job itself."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        if text.startswith("Error executing job with overrides:"):
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@dataclass
class _SweepStart:
    """A sweep's folder as it stood before Hydra wrote into it (SweepGuard)."""
    folder: Path
    created: list[Path]            # the folders Hydra will make for it, innermost first
    listing: set[str]              # what the folder held
    multirun_yaml: bytes | None    # the previous sweep's multirun.yaml, which Hydra overwrites
    launcher: str                  # hydra.launcher's class, for the message of a launcher that fails


class SweepGuard(Callback):
    """Hydra callback (conf/hydra/default.yaml hydra.callbacks): on a sweep's start, before Hydra's sweeper
    writes multirun.yaml and before its launcher starts, remember the sweep's folder as it was, so that a sweep
    that fails before any job left a file (a composition error in one job's overrides, a launcher refusing
    its settings, a user error in every job) is put back as it was: a mistake writes nothing. Hydra calls
    callbacks in this process and hands main() no state, hence the class attribute, reset by main()."""

    last: _SweepStart | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:   # Hydra turns a callback's exception into a warning; the sweeper meets a bad sweep dir itself
            folder = Path(str(config.hydra.sweep.dir)).expanduser().resolve()
            launcher = str(OmegaConf.select(config, "hydra.launcher._target_") or "?").rsplit(".", 1)[-1]
        except Exception:
            return
        created = [p for p in (folder, *folder.parents) if not p.exists()]
        listing = set(os.listdir(folder)) if folder.is_dir() else set()
        previous = folder / _MULTIRUN_YAML
        SweepGuard.last = _SweepStart(folder, created, listing,
                                      previous.read_bytes() if previous.is_file() else None, launcher)


_MULTIRUN_YAML = "multirun.yaml"


def _undo_empty_sweep() -> None:
    """After a failed sweep: if no job left anything in its folder (only Hydra's multirun.yaml is new), put
    the previous multirun.yaml back (or remove it) and remove the folders Hydra made for the sweep. A sweep
    with any run in it keeps its record."""
    start = SweepGuard.last
    if start is None or not start.folder.is_dir():
        return
    if not set(os.listdir(start.folder)) - start.listing <= {_MULTIRUN_YAML}:
        return
    target = start.folder / _MULTIRUN_YAML
    if start.multirun_yaml is not None:
        atomic_write_bytes(target, start.multirun_yaml)
    else:
        target.unlink(missing_ok=True)
    for folder in start.created:
        try:
            folder.rmdir()
        except OSError:
            return


def _launcher_failed(exc: BaseException) -> bool:
    """Whether a sweep's exception came from Hydra's launcher itself (its settings: joblib's n_jobs=0, a
    submitit option), not from a job: no frame of splitbench's code below main() (an in-process job runs
    run_job), no re-raised job result (Hydra's JobReturn.return_value: a job in another process), and no
    remote traceback of one (joblib chains the worker's as the cause)."""
    if SweepGuard.last is None:
        return False
    ours = tuple(f"{CODE_ROOT / package}{os.sep}" for package in ("runners", "harness", "attacks", "metrics"))
    for frame in traceback.extract_tb(exc.__traceback__)[1:]:
        if frame.filename.startswith(ours) or frame.name == "return_value":
            return False
    cause = exc.__cause__ or exc.__context__
    return cause is None or not any(root in str(cause) for root in ours)


def _remove_new(path: Path, before: set[str]) -> None:
    """Remove what appeared in `path` since `before` was listed (the lock file, held, stays)."""
    for entry in sorted(set(os.listdir(path)) - before):
        target = path / entry
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


def _dup_note(runner: Runner, cfg: DictConfig) -> str:
    note = runner.describe_skip(cfg)
    return f" ({note})" if note else ""


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _record_failure(run_dir: RunDir, cfg: DictConfig, name: str, digest: str, exc: BaseException) -> None:
    """results.json of a job that failed: the header every runner writes (runners.common.results_header, of
    the model and workload the config names; nothing was scored), status failed, the error and its trace."""
    header = results_header(cfg, str(cfg.runner), generation=False, model=cfg.model.get("name"),
                            workload=cfg.workload.get("name"))
    run_dir.write_failure({
        **header,
        "configuration": cfg.configuration.name,
        "epsilon": configurations.effective_epsilon(cfg.configuration.name, cfg.epsilon),
        "status": "failed",
        "error": f"{type(exc).__name__}: {_first_line(exc)}",
        "traceback": traceback.format_exception(exc)[-12:],
        "metrics": {},
        "tags": list(cfg.tags),
        "config_hash": digest,
        "run_dir": name,
    })


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def render_error(exc: BaseException) -> str:
    """One line for a composition / override / user error (Hydra's own messages span several lines)."""
    cause: BaseException | None = exc
    while cause is not None:   # a UserError raised by a resolver (harness/schema.py: sb.plain), however wrapped
        if isinstance(cause, UserError):
            return _first_line(cause)
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, MissingConfigException) and exc.options:
        missing = exc.missing_cfg_file or _first_line(exc)
        return f"no config option '{missing}' (available: {', '.join(sorted(exc.options))})"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override '{exc.override}': {lines[0] if lines else 'syntax error'}"
    message = lines[0].rstrip(".") if lines else type(exc).__name__
    cause = exc.__cause__
    if isinstance(cause, OmegaConfBaseException):
        cause_lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
        if cause_lines:
            message = f"{message}: {cause_lines[0]}"
    return message.replace("\t", " ")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> dict:
    return run_job(cfg)


def main() -> None:
    """Console entry point (`splitbench`)."""
    user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    quiet_bars_in_environment()
    SweepGuard.last = None
    real_stderr = sys.stderr
    sys.stderr = _WithoutHydraJobError(real_stderr)

    def refuse(message: str) -> NoReturn:
        if user_full_error:
            traceback.print_exc()
        _undo_empty_sweep()
        _say(f"error: {message}", err=True)
        sys.exit(2)

    try:
        try:
            if any(flag in sys.argv[1:] for flag in plan.FLAGS):   # --dry-run / --plan: the jobs; nothing run or written
                print("\n".join(plan.report(plan.plan(sys.argv[1:], CONF_DIR))))
                return
            app()
        except UserError as exc:
            job = getattr(exc, "job", None)
            refuse(f"{f'the sweep finished with failed jobs, first {job}: ' if job else ''}{exc}")
        except JobFailed:
            raise
        except (HydraException, OmegaConfBaseException) as exc:
            refuse(render_error(exc))
        except OSError as exc:
            # Hydra makes a job's run directory before calling us: a paths.output_dir that names a file (or a folder
            # the user may not write) fails there. The same error from inside our run_job is a job's failure.
            if any(frame.filename == __file__ for frame in traceback.extract_tb(exc.__traceback__)[1:]):
                raise
            refuse(f"cannot create the run directory {exc.filename}: {exc.strerror}")
        except Exception as exc:
            if not _launcher_failed(exc):
                raise
            assert SweepGuard.last is not None
            refuse(f"hydra/launcher ({SweepGuard.last.launcher}) failed before running any job: "
                   f"{type(exc).__name__}: {_first_line(exc)}; check its hydra.launcher.* settings")
    finally:
        sys.stderr = real_stderr


if __name__ == "__main__":
    # The importable module's main(): Hydra instantiates runners.run.SweepGuard by that name, and under
    # `python -m runners.run` this file is also loaded as __main__, a second copy with a class of its own.
    from runners.run import main as importable_main

    importable_main()
