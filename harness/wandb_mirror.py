"""Optional mirror of a finished run to Weights & Biases (logger=wandb).

The local run directory is the record; W&B is a mirror of it, written after the local files. Every W&B
call is wrapped: any exception becomes one warning line on stderr and the local result stands. Each job
starts its own W&B run (reinit="finish_previous") and always finishes it, so the jobs of a multirun sweep
never merge into one W&B run (lightning-hydra-template #289).

Mode: the WANDB_MODE environment variable when set (tests and CI set `disabled`), else `logger.mode`
(default `offline`: nothing leaves the machine until `wandb sync`).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def _warn(message: str) -> None:
    print(f"splitbench: warning: W&B mirror failed, local results are kept: {message}", file=sys.stderr)


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float, bool))


def _table_value(value: Any) -> Any:
    # wandb.Table columns must be one type; lists (token ids) are stored as text.
    if isinstance(value, (list, tuple, dict)):
        return str(value)
    return value


def mirror(cfg: DictConfig, run_dir: Path, results: Mapping[str, Any], samples: Sequence[Mapping[str, Any]],
           *, name: str, table_columns: Sequence[str] | None = None) -> bool:
    """Mirror one run; True if W&B accepted it, False (after one warning line) if anything failed.

    `name` is the run's directory relative to the output root (model/configuration/eps/overrides), so the
    W&B run and the local directory are found from each other. Summary: every numeric entry of
    results["metrics"]. Per-prompt rows: a wandb.Table `samples` with `table_columns` (all keys of the
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
        for key in ("status", "configuration", "epsilon", "n_prompts"):
            if results.get(key) is not None:
                metrics[key] = results[key]
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
