"""The schema of the `collab` config section (Cloud-edge collaborative decoding (paper 003)): types only, every value in conf/collab/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig


@dataclass
class CollabConfig:
    """Fields with MISSING defaults; their values and comments live in conf/collab/default.yaml."""


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range."""
