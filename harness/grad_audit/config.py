"""The schema of the `grad_audit` config section (The returned-gradient audit (paper 004)): types only, every value in conf/grad_audit/default.yaml.

Torch-free: harness/schema.py imports it to type the section and calls `check` from its `validate`.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig


@dataclass
class GradAuditConfig:
    """Fields with MISSING defaults; their values and comments live in conf/grad_audit/default.yaml."""


def check(section: DictConfig, cfg: DictConfig) -> None:
    """Raise harness.errors.UserError (one line) for a value of the section out of range."""
