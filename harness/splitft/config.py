"""The schema of the `splitft` config section (Split federated fine-tuning (paper 002)): types only, every value in conf/splitft/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig


@dataclass
class SplitFtConfig:
    """Fields with MISSING defaults; their values and comments live in conf/splitft/default.yaml."""


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range."""
