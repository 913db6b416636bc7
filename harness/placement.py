"""Where a system's model runs and in what precision: the `placement` node of a system's config section.

    sanitize.placement, splitft.placement, grad_audit.placement      one model each
    collab.placement.edge, collab.placement.cloud                     the two parties, each on its own device

Each node holds `device` (cpu | cuda | cuda:N), `dtype` (float32 | bfloat16 | float16) and `device_map`
(null | auto: Hugging Face/accelerate sharding over every visible GPU, for a model larger than one). What each
dtype does to the numbers is in docs/design.md ("Devices and precision"). SpliTEE has no placement node: its
engine puts the TEE part on the CPU and the offloaded ops on the accelerator itself (harness/devices.py
resolve_accelerator), in float32/float64 as its masking and floating-point bound need.

Torch-free (the schemas import it); whether CUDA is there is asked by harness.devices.resolve_device, which
schema.validate calls only for a placement that names a GPU, before any model loads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from harness.checks import check_choice
from harness.errors import UserError

DTYPES = ("float32", "bfloat16", "float16")
DEVICE_MAPS = ("auto",)
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
# What every run computed before placement existed: its config hash is kept (run_identity.semantic_config drops
# a placement equal to this), so finished runs stay valid.
CPU_FLOAT32 = {"device": "cpu", "dtype": "float32", "device_map": None}


@dataclass
class Placement:
    """Fields with MISSING defaults; their values live in conf/<system>/default.yaml."""

    device: str = MISSING                 # cpu | cuda | cuda:N
    dtype: str = MISSING                  # DTYPES
    device_map: Optional[str] = MISSING   # null | auto (shards over every GPU; device then names the first)


def check(key: str, node: Any, *, shardable: bool = True) -> None:
    """Raise UserError (one line) for a placement that cannot mean anything; `shardable`: whether the system
    may shard the model with device_map=auto (inference only: it calls the whole model, never its blocks)."""
    if not _DEVICE.fullmatch(str(node.device)):
        raise UserError(f"{key}.device={node.device!r} is not cpu, cuda or cuda:N")
    check_choice(f"{key}.dtype", node.dtype, DTYPES)
    if node.device_map is not None:
        check_choice(f"{key}.device_map", node.device_map, DEVICE_MAPS)
        if not shardable:
            raise UserError(f"{key}.device_map=auto shards a model for inference; this system runs the model's "
                            f"blocks one by one (training): set {key}.device_map=null and {key}.device=cuda")
        if not str(node.device).startswith("cuda"):
            raise UserError(f"{key}.device_map=auto shards the model over the GPUs: set {key}.device=cuda")


def record(node: Any) -> dict[str, Any]:
    """The placement as a plain dict (for results.json)."""
    return {k: node[k] for k in CPU_FLOAT32}
