"""Shared test helpers: composing configs with Hydra's compose API, running the CLI in a subprocess.

Every CLI run gets WANDB_MODE=disabled, its own output dir and cache dir under tmp_path, and the
repository root as working directory, so tests never touch ~/.cache or ./outputs and never reach W&B.
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

import harness.schema  # noqa: F401  (registers the schema and the sb.* resolvers)

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


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


def run_cli(args: list[str], out: Path, cache: Path, *, script: Path | None = None, env: dict | None = None,
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
