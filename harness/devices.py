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


# --- where a system's model runs (harness/placement.py) ---------------------------------------------------

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(key: str, spec: str) -> torch.device:
    """The torch device `spec` (cpu | cuda | cuda:N) names; a GPU that is not there is a UserError naming `key`,
    raised before any model loads (schema.validate) so no run starts on a device it cannot use."""
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{key}={spec} needs CUDA, which this machine does not have "
                            f"(torch {torch.__version__}); set {key}=cpu")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise UserError(f"{key}={spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        device = torch.device("cuda", index)
    return device


def describe_device(device: torch.device) -> str:
    """e.g. 'cuda:0 NVIDIA H200' or 'cpu Intel(R) Xeon(R) ... x2' (results.json provenance)."""
    if device.type == "cuda":
        return f"{device} {torch.cuda.get_device_name(device)}"
    return f"cpu {cpu_description()}"


def keep_io_on_caller(model: torch.nn.Module, device: torch.device, *, blocks: bool = True) -> None:
    """Let callers hand `model` (and, with `blocks`, the modules a split calls on their own: embeddings, each
    decoder block, the rotary embedding, the final norm, the LM head) CPU float32 tensors, whatever device and
    dtype the model has, as accelerate's io_same_device hook does for a device_map="auto" model, with the dtype
    too: inputs move to `device` and floating ones take the model's dtype; outputs come back to the caller's
    device, the model's floating outputs in float32 (a module's in the caller's floating dtype). The systems'
    protocol tensors (noise, adversary views, crossings, distributions) then stay on the CPU in float32 as they
    would when crossing a network, and only the model's arithmetic runs on `device` in its dtype. Inside one
    forward the tensors already sit on `device` in that dtype and nothing moves. Moves and casts are `.to()`,
    so gradients flow through them (split fine-tuning, the gradient audit). The KV cache never moves."""
    dtype = next(model.parameters()).dtype
    modules: list[tuple[torch.nn.Module, bool]] = [(model, True)]
    inner = getattr(model, "model", None)
    if blocks and inner is not None:
        for name in ("embed_tokens", "rotary_emb", "norm"):
            if getattr(inner, name, None) is not None:
                modules.append((getattr(inner, name), False))
        modules += [(layer, False) for layer in getattr(inner, "layers", [])]
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is not None:
            modules.append((head, False))
    for module, top in modules:
        _IoHook(device, dtype, top).attach(module)


_CACHE_KEYS = ("cache", "past_key_values")


class _IoHook:
    """keep_io_on_caller's pre- and post-forward hooks on one module (a stack: a module may run re-entrantly)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, top: bool) -> None:
        self.device, self.dtype, self.top = device, dtype, top
        self.callers: list[tuple[torch.device | None, torch.dtype | None]] = []

    def attach(self, module: torch.nn.Module) -> None:
        module.register_forward_pre_hook(self.before, with_kwargs=True)
        module.register_forward_hook(self.after)

    def before(self, module, args, kwargs):
        found = [t for t in _tensors((args, kwargs))]
        floats = [t for t in found if t.is_floating_point()]
        self.callers.append((found[0].device if found else None, floats[0].dtype if floats else None))
        inward = lambda t: t.to(self.device, self.dtype) if t.is_floating_point() else t.to(self.device)  # noqa: E731
        return _map(args, inward), {k: v if k in _CACHE_KEYS else _map(v, inward) for k, v in kwargs.items()}

    def after(self, module, args, output):
        device, floating = self.callers.pop()
        floating = torch.float32 if self.top else floating

        def outward(t: torch.Tensor) -> torch.Tensor:
            t = t.to(device) if device is not None else t
            return t.to(floating) if floating is not None and t.is_floating_point() else t
        if isinstance(output, dict):   # a ModelOutput: its item assignment keeps its attributes in step
            for key in list(output.keys()):
                if key not in _CACHE_KEYS:
                    output[key] = _map(output[key], outward)
            return output
        return _map(output, outward)


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in _CACHE_KEYS:
                yield from _tensors(v)


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: v if k in _CACHE_KEYS else _map(v, fn) for k, v in value.items()}
    return value
