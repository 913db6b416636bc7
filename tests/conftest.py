"""Shared test helpers: composing configs with Hydra's compose API, running the CLI in a subprocess
(run_cli) or, without paying an interpreter's start-up, in the test process (run_cli_in_process; any other
entry point's main(): run_main_in_process).

Every CLI run gets WANDB_MODE=disabled, its own output dir and cache dir under tmp_path, and the
repository root as working directory, so tests never touch ~/.cache or ./outputs and never reach W&B.

A test that runs a Flower simulation asks for `flower_ray`: Ray started once per session (per xdist worker),
and the test rerun once, reported as a rerun, when a Ray worker died under it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import harness.run_identity  # noqa: F401  (registers the sb.* resolvers, which name run directories)
import harness.schema  # noqa: F401  (registers the schema)

# No test reaches the Hugging Face hub: library calls in the test process work from the local cache, as every CLI
# run does (run_cli). Without it, the first hub load would probe the network (harness/hub.py) and switch this
# process offline for every later test.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
MAX_WORKERS = 4     # pytest-xdist workers under `-n auto` (pyproject addopts): each holds models of its own


def _cores() -> int:
    """The cores this process may run on (its affinity on Linux; the machine's count elsewhere)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else (os.cpu_count() or 1)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core, at most MAX_WORKERS (more only multiplies the models in memory)."""
    return max(1, min(_cores(), MAX_WORKERS))


def _share_cores_among_workers() -> None:
    """Under xdist, each worker's torch (and every subprocess a test starts) gets its share of the cores,
    so that n workers do not run n × cores threads on the machine."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 1:
        return
    import torch

    threads = max(1, _cores() // workers)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


_share_cores_among_workers()


def _keep_freed_memory() -> None:
    """glibc hands every allocation over 32 MB back to the kernel when it is freed (mmap, munmap), so a test
    that allocates a (rows x vocabulary) tensor at every step pays the page faults again at every step: in
    the grad-audit smoke (BiSR's label matching on a 151k vocabulary) the kernel's time was 38 of its 66
    CPU-seconds. Served from the heap, with up to 1 GiB freed kept for reuse, it is 1 s (25.7 in all; the
    sanitize smoke's 9 s of kernel time are 1.3, the attack smoke's 5.7 are 0.9). The
    CLI's subprocesses and Ray's workers get the same through glibc's environment variables. Elsewhere
    (no glibc) nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    keep = 1 << 30
    os.environ.setdefault("MALLOC_MMAP_MAX_", "0")
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(keep))
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):      # another C library
        return
    m_trim_threshold, m_mmap_max = -1, -4    # malloc.h
    mallopt(m_trim_threshold, keep)
    mallopt(m_mmap_max, 0)


_keep_freed_memory()


def _parse_config_files_once() -> None:
    """Hydra parses every YAML file of a composition again at each compose (its cache lasts one compose), in
    pure Python: a sixth of a compose's time, and the suite composes thousands of times (test_configs alone
    spends minutes). Here a file under conf/ is parsed once per process, keyed by its path, size and mtime
    (an edited file is parsed again), and every load still builds a fresh OmegaConf object from the parsed
    data, as OmegaConf.load does; any other file is loaded as before."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    load = OmegaConf.load
    parsed: dict[tuple, object] = {}
    root = os.path.realpath(CONF) + os.sep

    def load_once(file_):
        name = getattr(file_, "name", file_)
        path = os.path.realpath(name) if isinstance(name, (str, Path)) else ""
        if not path.startswith(root):
            return load(file_)
        stat = os.stat(path)
        key = (path, stat.st_size, stat.st_mtime_ns)
        if key not in parsed:
            if hasattr(file_, "read"):
                obj = yaml.load(file_, Loader=get_yaml_loader())
            else:
                with open(path, encoding="utf-8") as f:
                    obj = yaml.load(f, Loader=get_yaml_loader())
            if obj is not None and not isinstance(obj, (list, dict, str)):
                return load(path)     # OmegaConf's own error
            parsed[key] = obj
        obj = parsed[key]
        return OmegaConf.create() if obj is None else OmegaConf.create(obj)

    OmegaConf.load = staticmethod(load_once)


_parse_config_files_once()


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def builtin_prompt_ids(tokenizer, n_prompts: int, use_chat_template: bool) -> list[list[int]]:
    """The first `n_prompts` built-in prompts as token ids (seed 0): the attack tests' evaluation prompts."""
    from harness.workloads import load_workload

    wl = load_workload({"name": "builtin", "source": "builtin", "n_prompts": n_prompts,
                        "use_chat_template": use_chat_template}, tokenizer, seed=0)
    return [list(p.input_ids) for p in wl.prompts]


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): on a
    shared 2-core machine more threads only contend (10x slower for the split fine-tuning tests)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- Flower's simulations: Ray once per session, a test rerun when a Ray worker dies ---------------------------------

# A Ray worker's death as a Flower test sees it: ray.exceptions' names (the failed client replies carry them into
# harness/splitft's "did not complete" error) and Flower's own wrapper. A test that uses `flower_ray` and fails so
# is rerun once (pytest-rerunfailures, which also reruns a test that crashed its xdist worker); the rerun shows as
# R in the progress and in the summary (addopts -r fER). Any other failure fails at once.
RAY_DIED = [r"RayActorError", r"ActorDiedError", r"ActorUnavailableError", r"WorkerCrashedError", r"RaySystemError",
            r"NodeDiedError", r"RayletDiedError", r"OwnerDiedError", r"ObjectLostError", r"The actor died",
            r"Simulation Runtime crashed"]
RAY_CPUS = 2    # the Flower smoke's ray_cpus (conf/experiment/splitft_smoke.yaml): its two clients at once


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if "flower_ray" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=RAY_DIED))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.call_failed = report.failed     # read by flower_ray's teardown
    return report


@pytest.fixture(scope="session")
def _ray_kept_up() -> Iterator[None]:
    """Flower's Ray backend (flwr 1.42 ships no other) starts Ray for each simulation unless one is up, and
    shuts it down when the simulation ends (RayBackend.terminate): seconds of start-up a simulation, and under
    load a Ray crash took neighbouring tests down with it. For the session its end only ends the simulation's
    client actors; Ray itself is shut down after the last test."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    def end_actors_only(backend) -> None:
        if backend.pool:
            backend.pool.terminate_all_actors()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RayBackend, "terminate", end_actors_only)
        yield
    import ray

    ray.shutdown()


@pytest.fixture
def flower_ray(_ray_kept_up, request) -> Iterator[None]:
    """Ray for a test's Flower simulations, started once per session (per xdist worker, at its first Flower
    test) with the arguments harness/splitft's simulate gives it, and the environment run_cli gives a run. After
    a failed test Ray is shut down, so that the next (its rerun) starts a fresh one."""
    import ray

    from harness.splitft.federation import quiet_flower

    if not ray.is_initialized():
        quiet_flower()
        env = {"PYTHONPATH": os.pathsep.join(sys.path), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 runtime_env={"env_vars": env})
    yield
    if getattr(request.node, "call_failed", True):
        ray.shutdown()


def model_cfg(name: str = "tiny-llama-4l") -> dict:
    """conf/model/<name>.yaml as a plain dict without Hydra's defaults list, as recipes and clients take it."""
    from omegaconf import OmegaConf

    from harness.models import model_entry

    cfg = OmegaConf.to_container(model_entry(name))
    cfg.pop("defaults", None)
    return cfg


@pytest.fixture
def hydra_conf() -> Iterator[None]:
    """An initialised Hydra (compose API) on conf/, cleared afterwards so tests never share state."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def compose_config(overrides: list[str], hydra_node: bool = False):
    return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_node)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_cli(args: list[str], out: Path | str, cache: Path, *, script: Path | None = None, env: dict | None = None,
            timeout: float = 300) -> CliResult:
    """`python -m runners.run ARGS paths.output_dir=OUT paths.cache_dir=CACHE` (or `python SCRIPT ...`)."""
    full_env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    _share_tokenizer_cache(Path(cache))
    head = [sys.executable, str(script)] if script else [sys.executable, "-m", "runners.run"]
    done = subprocess.run([*head, *args, f"paths.output_dir={out}", f"paths.cache_dir={cache}"], cwd=REPO,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    return CliResult(done.returncode, done.stdout, done.stderr)


def run_cli_in_process(args: list[str], out: Path | str, cache: Path, *, env: dict | None = None) -> CliResult:
    """run_cli without the subprocess: the console script's own entry point (pyproject [project.scripts]
    `splitbench = runners.run:main`) called in this process by run_main_in_process, with the same argv,
    environment and working directory. SPLITBENCH_TEST_SUBPROCESS=1 runs each call through run_cli instead
    (a process of its own), to check that a test passes the same both ways or to time the two (a test that
    patches this process's modules, such as test_runs' count_jobs, needs the in-process way)."""
    if os.environ.get("SPLITBENCH_TEST_SUBPROCESS") == "1":
        return run_cli(args, out, cache, env=env)
    _share_tokenizer_cache(Path(cache))
    return run_main_in_process("runners.run", ["splitbench", *args, f"paths.output_dir={out}",
                                               f"paths.cache_dir={cache}"], env=env)


def run_main_in_process(module: str, argv: list[str], *, env: dict | None = None, cwd: Path = REPO) -> CliResult:
    """`python -m MODULE ARGV[1:]` in CWD (run_cli's environment plus `env`) without the subprocess: MODULE's
    main() called in this process with sys.argv = ARGV, stdout and stderr captured and SystemExit turned into
    the exit code, as the interpreter would (an uncaught exception: its traceback on stderr, exit 1). It
    saves the Python + torch start-up (seconds on a busy CI core) of every call. Everything a
    run changes in the process is put back: the environment (main() sets HYDRA_FULL_ERROR), sys.argv, the
    working directory, Hydra's GlobalHydra and HydraConfig, the root logging handlers Hydra's job logging
    installs, torch's thread count (runners may set it), the global random generators (model loading
    seeds torch's) and the SIGINT/SIGTERM handlers (ray.init, under splitft's Flower simulation, installs
    one that calls sys.exit). The logging handlers that exist before the run are hidden from it: Hydra's job
    logging calls logging.config.dictConfig, which first closes every handler of the process, and absl's
    handler (absl.logging, imported with dp-accounting) closes its stream unless that is the current
    sys.stderr: inside the run that is the capture below, so it would close pytest's own capture stream.
    SPLITBENCH_TEST_SUBPROCESS=1 runs it as `python -m MODULE` in a process of its own instead."""
    full_env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    if os.environ.get("SPLITBENCH_TEST_SUBPROCESS") == "1":
        done = subprocess.run([sys.executable, "-m", module, *argv[1:]], cwd=cwd, env=full_env, capture_output=True,
                              text=True, timeout=300)
        return CliResult(done.returncode, done.stdout, done.stderr)
    import contextlib
    import importlib
    import io
    import logging
    import random
    import signal
    import traceback

    import numpy as np
    import torch
    from hydra.core.hydra_config import HydraConfig

    main = importlib.import_module(module).main
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_threads = torch.get_num_threads()
    saved_rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    saved_handler_refs, saved_named_handlers = logging._handlerList[:], dict(logging._handlers)
    try:
        del logging._handlerList[:]    # what dictConfig's clean-up closes (weak references to every handler)
        logging._handlers.clear()
        os.environ.clear()
        os.environ.update(full_env)
        sys.argv = list(argv)
        os.chdir(cwd)
        GlobalHydra.instance().clear()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                raise SystemExit(main())           # what a console script does with main()'s return value
            except SystemExit as exc:
                if isinstance(exc.code, str):      # sys.exit("message"): printed, status 1
                    print(exc.code, file=sys.stderr)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:                      # what the interpreter would print before exiting 1
                traceback.print_exc()
                code = 1
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None   # HydraConfig.initialized() is False again, as outside any run
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        logging._handlerList[:0] = saved_handler_refs
        logging._handlers.update(saved_named_handlers)
        torch.set_num_threads(saved_threads)
        torch.set_rng_state(saved_rng[0])
        random.setstate(saved_rng[1])
        np.random.set_state(saved_rng[2])
        for s, handler in saved_signals.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)
    return CliResult(code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture
def splitbench_lm_eval(monkeypatch):
    """`splitbench-lm-eval ARGV[1:]` (runners/lm_eval_model.py main()) in this process: a function of (argv, env)
    that returns run_main_in_process's CliResult. Each call is set up as a fresh process would be: lm-eval's log
    handler is made again, on the captured stderr, so its lines are checked too. lm-eval's command line indexes
    its ~14k task files (pure-Python YAML, seconds) at every call, the same files every time here: they are
    indexed once for the test and each call gets its own copy. What main() changes in the process
    (lm_eval.simple_evaluate, the lm_eval logger) is put back after the test."""
    import copy
    import logging

    import lm_eval
    import lm_eval.utils
    from lm_eval.tasks._index import TaskIndex

    monkeypatch.setattr(lm_eval, "simple_evaluate", lm_eval.simple_evaluate)
    logger = logging.getLogger("lm_eval")
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(logger, "handlers", logger.handlers)
    built: dict = {}
    build = TaskIndex.build

    def build_once(paths, **kwargs):
        paths = list(paths)
        key = (tuple(str(p) for p in paths), tuple(sorted(kwargs.items())))
        if key not in built:
            built[key] = build(paths, **kwargs)
        return copy.deepcopy(built[key])

    monkeypatch.setattr(TaskIndex, "build", staticmethod(build_once))

    def run(argv: list[str], env: dict | None = None, cwd: Path = REPO) -> CliResult:
        monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)
        logger.handlers = []
        return run_main_in_process("runners.lm_eval_model", argv, env=env, cwd=cwd)

    return run


def _share_tokenizer_cache(cache: Path) -> None:
    """Point a fresh test cache's tokenizers/ at the user's cache root, so that the tiny models' SmolLM2
    tokenizer is parsed from its GGUF once per machine rather than once per CLI test (a few seconds each).
    Only the tokenizer is shared: generations, captures and attackers stay in the test's own cache."""
    from harness.models import cache_root

    shared = cache_root() / "tokenizers"
    link = cache / "tokenizers"
    if (cache.exists() and not cache.is_dir()) or link.exists() or link.is_symlink() \
            or Path(cache).resolve() == cache_root().resolve():
        return
    shared.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(shared, target_is_directory=True)
