"""Run directories: atomic writes, the done-marker, skip-if-complete, the run lock, the generation cache.

A run directory is finished when it holds `.done`, written last, after results.json, samples.jsonl and
any side files. Every file is written atomically (a temp file in the same directory, then os.replace),
so a killed run leaves either the old file or the new one, never half of one. A failed run writes
results.json with status "failed" and the error, and no `.done`, so a rerun retries it.

results.json stores `config_hash`: the sha256 of the run's semantic config (what changes the answer;
see `config_hash`). On a rerun, `RunDir.state(hash)` says:
- "complete": `.done` and the same hash: skip.
- "stale": `.done` with a different hash: the directory holds a finished run of a *different* config
  (a default changed, or a key outside the directory name changed). The runner refuses (UserError)
  unless rerun=true, in which case it recomputes in place. Silently keeping or overwriting it would
  report one config's answers under another's name.
- "corrupt": `.done` beside a results.json that cannot be read as a finished run's (missing, torn, not a
  JSON object, no config_hash; `RunDir.unreadable()` says which): written by something other than this
  module, or damaged since. Refused like "stale" (rerun=true recomputes it), but named for what it is.
- "todo": no `.done` (never ran, failed, interrupted): run.

Two jobs that map to one directory (an ε sweep over a configuration that ignores ε, run in parallel)
are serialised by `RunDir.lock()`, an flock on `.lock` that the kernel releases if the holder dies, so
a killed run never leaves a stale lock behind.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DONE = ".done"
LOCK = ".lock"
RESULTS = "results.json"
SAMPLES = "samples.jsonl"


# ---------------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    # numpy scalars/arrays, tuples, paths: whatever the metric modules hand back.
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """NaN/inf become null: results.json stays strict JSON that any reader accepts."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def dumps(obj: Any, indent: int | None = None) -> str:
    return json.dumps(_clean(obj), indent=indent, default=_json_default, allow_nan=False, ensure_ascii=False)


@contextmanager
def atomic_path(path: Path) -> Iterator[str]:
    """A temp file beside `path` for the block to write; it replaces `path` only if the block succeeds.

    mkstemp makes the file 0600; results are meant to be read by colleagues, so the umask decides instead.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        os.close(fd)
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file in the same directory, fsync, os.replace)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save atomically; it streams to the temp file, so large adversary views fit."""
    import torch  # here, not at import time: composing a config must not import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (dumps(obj, indent=2) + "\n").encode())


def atomic_write_jsonl(path: Path, rows: Iterable[Any]) -> None:
    atomic_write_bytes(path, "".join(dumps(row) + "\n" for row in rows).encode())


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def read_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# Config hash
# ---------------------------------------------------------------------------------------------------


def config_hash(semantic: Mapping[str, Any]) -> str:
    """sha256 of a canonical JSON rendering (sorted keys) of the semantic config."""
    return hashlib.sha256(dumps(_sorted(semantic)).encode()).hexdigest()


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------
# Run directories
# ---------------------------------------------------------------------------------------------------


def is_complete(run_dir: Path) -> bool:
    return (Path(run_dir) / DONE).exists()


@dataclass
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS

    @property
    def samples_path(self) -> Path:
        return self.path / SAMPLES

    def stored_hash(self) -> str | None:
        try:
            return read_json(self.results_path).get("config_hash")
        except (OSError, ValueError, AttributeError):
            return None

    def unreadable(self) -> str | None:
        """Why results.json is not a finished run's record (one phrase), or None when it is one."""
        try:
            data = read_json(self.results_path)
        except FileNotFoundError:
            return "is missing"
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"
        except ValueError as exc:
            return f"is not valid JSON ({exc}: truncated or damaged)"
        if not isinstance(data, dict):
            return "is not a JSON object"
        if not isinstance(data.get("config_hash"), str):
            return "has no config_hash"
        return None

    def state(self, semantic_hash: str) -> str:
        """"complete", "stale", "corrupt" or "todo" (see the module docstring)."""
        if not is_complete(self.path):
            return "todo"
        if self.unreadable() is not None:
            return "corrupt"
        return "complete" if self.stored_hash() == semantic_hash else "stale"

    def write_results(self, results: Mapping[str, Any], samples: Iterable[Mapping[str, Any]],
                      side_files: Mapping[str, Any] | None = None,
                      before_done: Callable[[], None] | None = None) -> None:
        """Write side files (name → JSON object), then call `before_done` (other artefacts, e.g. the
        adversary view, written atomically by their owner), then samples.jsonl, results.json and last
        `.done`, each atomically.

        Any `.done` from an earlier run is removed first, so a crash half-way never pairs new files with
        an old marker.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        self.clear_done()
        for name, obj in (side_files or {}).items():
            atomic_write_json(self.path / name, obj)
        if before_done is not None:
            before_done()
        atomic_write_jsonl(self.samples_path, samples)
        atomic_write_json(self.results_path, results)
        atomic_write_bytes(self.path / DONE, b"")

    def write_failure(self, results: Mapping[str, Any]) -> None:
        """results.json with status "failed" and no `.done`: the next run retries."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.clear_done()
        atomic_write_json(self.results_path, results)

    def clear_done(self) -> None:
        try:
            (self.path / DONE).unlink()
        except FileNotFoundError:
            pass

    @contextmanager
    def lock(self) -> Iterator[bool]:
        """Yield True while holding the run's exclusive lock, False if another live process holds it.

        flock is released by the kernel when its holder exits, however it exits. The lock file is
        removed on release; the inode check after acquiring guards against a file that was removed
        (and maybe recreated) between our open and our flock.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        lock_path = self.path / LOCK
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    yield False
                    return
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # our inode was unlinked by the previous holder: try again on the new file
        try:
            yield True
        finally:
            try:
                os.unlink(lock_path)
            except FileNotFoundError:
                pass
            os.close(fd)


def remove_if_empty(run_dir: Path, stop_at: Path) -> None:
    """Remove `run_dir` and then its parents while they are empty, never going above `stop_at`.

    For user errors: Hydra creates the run directory before our code runs, and a run that fails on a
    bad config must not leave an empty tree behind that looks like a result.
    """
    run_dir, stop_at = Path(run_dir).resolve(), Path(stop_at).resolve()
    current = run_dir
    while current != stop_at and stop_at in current.parents:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent


# ---------------------------------------------------------------------------------------------------
# Generation cache (baseline generations shared by every configuration compared against them)
# ---------------------------------------------------------------------------------------------------


def cache_key(parts: Mapping[str, Any]) -> str:
    """sha256 over everything that changes a generation. Callers pass model, workload and its filter,
    the prompts' token ids, seed, generation settings, the configuration and the code version: a key
    of the prompt alone reports one model's answers as another's (lm-eval #2715)."""
    return config_hash(parts)


@dataclass
class GenerationCache:
    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root).expanduser()

    def _path(self, key: str) -> Path:
        return self.root / "generations" / f"{key}.json"

    def get(self, key: str) -> dict | None:
        path = self._path(key)
        try:
            entry = read_json(path)
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn or foreign file: regenerate (writes are atomic, so this is rare)
        return entry if entry.get("key") == key else None

    def put(self, key: str, entry: Mapping[str, Any]) -> Path:
        path = self._path(key)
        atomic_write_json(path, {**entry, "key": key})
        return path


# ---------------------------------------------------------------------------------------------------
# What a runner is handed
# ---------------------------------------------------------------------------------------------------


@dataclass
class RunContext:
    """One job: its directory, its name relative to the experiment's output dir, its config hash, and when it
    started (time.time(), for the wall time results.json records: `splitbench --dry-run` estimates a sweep's
    cost from it) and the process's CPU seconds then (time.process_time(), every thread: a sweep's CPU cost
    is the sum of its jobs' `cpu_s`, which a loaded machine does not inflate as it does wall time)."""

    run_dir: RunDir
    name: str
    config_hash: str
    semantic: dict
    started: float = field(default_factory=time.time)
    started_cpu: float = field(default_factory=time.process_time)
