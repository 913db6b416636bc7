"""Where each side of the split runs: the trusted CPU (a TDX guest or an emulation of one) and the
untrusted accelerator."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.errors import UserError


def detect_tee_kind() -> str:
    """'tdx' only when this process really runs in an Intel TDX guest, else 'emulated'.

    Two independent signs are accepted: the guest driver's device node and the CPU flag the guest
    kernel exposes. Never claim TDX without one of them.
    """
    if Path("/dev/tdx_guest").exists() or Path("/dev/tdx-guest").exists():
        return "tdx"
    return "tdx" if "tdx_guest" in cpu_flags() else "emulated"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux's /proc/cpuinfo lists them (empty where it cannot be read); read
    once per process (ExactProduct asks for every op of every engine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_any(*flags: str) -> bool:
    """Whether the CPU lists any of these feature flags (e.g. the instructions a fast kernel needs)."""
    return bool(set(flags) & cpu_flags())


@dataclass(frozen=True)
class Accelerator:
    device: torch.device
    description: str     # e.g. "cuda:0 NVIDIA H200" or "cpu (no CUDA: the accelerator side ran on the CPU)"
    is_fallback: bool


def resolve_accelerator(allow_cpu_fallback: bool, *, strict: bool) -> Accelerator:
    """The untrusted device. `strict` configurations (the all-on-GPU baseline) refuse to pretend.

    Split configurations without CUDA still run, with the device side on the CPU, and say so: the masking
    logic is exercised faithfully, only its timing is not an accelerator's.
    """
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        return Accelerator(torch.device("cuda", index), f"cuda:{index} {torch.cuda.get_device_name(index)}", False)
    if strict and not allow_cpu_fallback:
        raise UserError(
            "configuration 'gpu' needs CUDA, which this machine does not have; "
            "pass engine.allow_cpu_fallback=true to run it on the CPU (results will say so)"
        )
    return Accelerator(torch.device("cpu"), "cpu (no CUDA: the accelerator side ran on the CPU)", True)


def set_tee_threads(threads: int | None) -> int:
    if threads is not None:
        if threads < 1:
            raise UserError(f"engine.tee_threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def cpu_description() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"cpu x{os.cpu_count()}"
