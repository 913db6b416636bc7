"""The adversary view: one record of everything that crosses to an untrusted party (paper §3, threat model).

Attacks read nothing else (paper §7.4), so whatever they recover really was exposed. Each exposure names
its channel: SpliTEE's is `masked_input`, the input of an offloaded linear op as the accelerator receives
it (masked by the configuration's mechanism; t3's `plain` mechanism sends it as it is). A system that
exposes something else (probability vectors, sampled tokens, gradients) records it under its own channel
name, and the attacks that read activations, which select their channel, are unchanged.

`meta` says what produced the view, so a saved view.pt stands on its own: the system, the configuration,
its privacy parameter, the seed, the model, the workload and a digest of the code (`view_meta`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness import configurations

if TYPE_CHECKING:
    import torch

SPLITEE = configurations.SPLITEE
MASKED_INPUT = "masked_input"


@dataclass
class Exposure:
    op: str
    layer: int | None
    step: int            # 0 = prefill, k = k-th decode step
    shape: tuple[int, ...]
    tensor: torch.Tensor
    channel: str = MASKED_INPUT


@dataclass
class AdversaryView:
    """Everything the untrusted party received, in order, and what produced it."""

    exposures: list[Exposure] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def select(self, op: str | None = None, layer: int | None = None, step: int | None = None,
               channel: str | None = None) -> list[Exposure]:
        """The exposures matching every criterion given (None matches anything)."""
        return [
            e for e in self.exposures
            if (op is None or e.op == op) and (layer is None or e.layer == layer) and (step is None or e.step == step)
            and (channel is None or e.channel == channel)
        ]

    def channels(self) -> tuple[str, ...]:
        """The channels this view holds, in order of first exposure."""
        return tuple(dict.fromkeys(e.channel for e in self.exposures))

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file in the same directory, then rename)."""
        from harness.results import atomic_torch_save

        atomic_torch_save({"meta": self.meta, "exposures": [e.__dict__ for e in self.exposures]}, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> AdversaryView:
        """Read a saved view; one written before channels existed reads as SpliTEE's masked inputs."""
        import torch

        payload = torch.load(path, weights_only=False)
        return cls([Exposure(**e) for e in payload["exposures"]], payload.get("meta", {}))


def describe(*, configuration: str, epsilon: float | None, seed: int, model: str | None, workload: str | None,
             code_digest: str, system: str = SPLITEE) -> dict[str, Any]:
    """The meta of a view: what produced it. The privacy parameter is the configuration's own
    (harness.configurations: its name in the mechanism's paper and the value it really ran at; both None
    for configurations without a knob, e.g. epn's ε = 1/√n per prompt)."""
    return {
        "system": system,
        "configuration": configuration,
        "privacy_parameter": {"name": configurations.get(configuration).parameter_name,
                              "value": configurations.effective_epsilon(configuration, epsilon)},
        "seed": int(seed),
        "model": model,
        "workload": workload,
        "code_digest": code_digest,
    }


def view_meta(cfg: Any, *, system: str = SPLITEE, configuration: str | None = None, epsilon: float | None = None,
              model: str | None = None, workload: str | None = None) -> dict[str, Any]:
    """`describe` for a run's config: its configuration, ε, seed, model and workload unless given, and
    the digest of the code (harness.provenance.source_digest)."""
    from harness.provenance import source_digest

    return describe(configuration=configuration or cfg.configuration.name,
                    epsilon=cfg.epsilon if epsilon is None else epsilon, seed=cfg.seed,
                    model=model or cfg.model.name, workload=workload or cfg.workload.name,
                    code_digest=source_digest(), system=system)
