"""Optional mirror of a finished run to Weights & Biases (logger=wandb).

The local run directory is the record; W&B is a mirror of it, written after the local files. Every W&B
call is wrapped: any exception becomes one warning line on stderr and the local result stands. Each job
starts its own W&B run (reinit="finish_previous") and always finishes it, so the jobs of a multirun sweep
never merge into one W&B run (lightning-hydra-template #289).

Mode: the WANDB_MODE environment variable when set (tests and CI set `disabled`), else `logger.mode`
(default `offline`: nothing leaves the machine until `wandb sync`). An `online` mirror first opens one TCP
connection to the W&B host (WANDB_BASE_URL, else api.wandb.ai) within `logger.connect_timeout_s`: with no
route, wandb.init would otherwise retry for about 95 s per job before giving up, so the mirror goes
offline at once with one line saying so (the offline run is pushed later with `wandb sync`).
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omegaconf import DictConfig, OmegaConf


def _warn(message: str) -> None:
    print(f"splitbench: warning: W&B mirror failed, local results are kept: {message}", file=sys.stderr)


DEFAULT_BASE_URL = "https://api.wandb.ai"  # wandb's own default when WANDB_BASE_URL is unset


def unreachable(timeout_s: float) -> str | None:
    """None when a TCP connection to the W&B host opens within `timeout_s`, else "host:port (reason)"."""
    url = urlsplit(os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as exc:  # refused, no route, DNS failure, timeout: all mean W&B cannot be reached now
        return f"{host}:{port} ({type(exc).__name__}: {exc})"


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float, bool))


def _table_value(value: Any) -> Any:
    # wandb.Table columns must be one type; lists (token ids) are stored as text.
    if isinstance(value, (list, tuple, dict)):
        return str(value)
    return value


def mirror(cfg: DictConfig, run_dir: Path, results: Mapping[str, Any], samples: Sequence[Mapping[str, Any]],
           *, name: str, table_columns: Sequence[str] | None = None,
           history: Sequence[Mapping[str, Any]] = ()) -> bool:
    """Mirror one run; True if W&B accepted it, False (after one warning line) if anything failed.

    `name` is the run's directory relative to the output root (model/configuration/eps/overrides), so the
    W&B run and the local directory are found from each other. Summary: every numeric entry of
    results["metrics"]. Step history: each record of `history` (dicts with an int "step" key, steps
    increasing, as wandb.log requires), logged at its step. Per-prompt rows: a wandb.Table `samples` with `table_columns` (all keys of the
    first sample when None).
    """
    logger = cfg.logger
    if logger.name != "wandb":
        return False
    try:
        import wandb
    except ImportError:
        _warn("the wandb package is not installed (pip install wandb)")
        return False
    mode = os.environ.get("WANDB_MODE") or logger.mode
    run = None
    try:
        if mode == "online":  # inside the try: a config without connect_timeout_s (an old run's) only warns
            why = unreachable(float(logger.connect_timeout_s))
            if why is not None:
                print(f"splitbench: warning: W&B host {why} is unreachable; mirroring offline instead "
                      f"(push later with `wandb sync {run_dir}/wandb/offline-run-*`)", file=sys.stderr)
                mode = "offline"
        run = wandb.init(
            project=logger.project,
            entity=logger.entity,
            group=logger.group or cfg.experiment_name,
            job_type=cfg.runner,
            name=name,
            tags=list(cfg.tags),
            config=OmegaConf.to_container(cfg, resolve=True),
            dir=str(run_dir),
            mode=mode,
            reinit="finish_previous",
        )
        metrics = {k: v for k, v in (results.get("metrics") or {}).items() if _scalar(v)}
        # tokens_per_second: generation runners record one aggregate rate, no per-step series.
        for key in ("status", "configuration", "epsilon", "n_prompts", "tokens_per_second"):
            if results.get(key) is not None:
                metrics[key] = results[key]
        # Step history (a runner's per-step records, each with a "step" key) becomes W&B line charts.
        for record in history:
            row = {k: v for k, v in record.items() if k != "step" and _scalar(v)}
            run.log(row, step=int(record["step"]))
        # After the history: wandb.log leaves each logged key's last value in the summary, and a key both
        # logged per step and in results.json (split FT's train_loss, H, ...) must show the run's value.
        run.summary.update(metrics)
        if samples:
            columns = list(table_columns or samples[0].keys())
            table = wandb.Table(columns=columns, data=[[_table_value(s.get(c)) for c in columns] for s in samples])
            run.log({"samples": table})
        return True
    except Exception as exc:  # a mirror must never lose the local result
        _warn(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return False
    finally:
        if run is not None:
            try:
                run.finish()
            except Exception as exc:
                _warn(f"finish(): {type(exc).__name__}: {exc}")
