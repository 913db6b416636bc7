"""The server's white-box copy of the model (strong threat model, paper 002 §III): the pretrained model
it has anyway, the public protocol (cuts, LoRA layout) from the view's meta, and the clients' weights
after each step from the view's `client_weights` channel. Nothing else of the run is read."""
from __future__ import annotations

from typing import Any

import torch

from harness.adversary_view import AdversaryView
from harness.splitft import trainable
from harness.splitft.step import CLIENT_WEIGHTS

PRETRAINED = -1     # the key of the pretrained weights in ServerCopy.weights (step ids are >= 0)


class ServerCopy:
    def __init__(self, view: AdversaryView, model_cfg: dict[str, Any], cache_dir: str | None = None) -> None:
        from harness.models import load_model

        meta = view.meta["splitft"]
        self.view = view
        self.model = load_model(model_cfg, cache_dir=cache_dir).model
        self.part, self.names = trainable.make_trainable(self.model, int(meta["k"]), int(meta["m"]), meta["lora"],
                                                         bool(meta.get("train_head", True)))
        if self.names != list(meta["weight_layout"]):
            raise ValueError("the attacker's copy lays the client weights out differently from the view's meta")
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.weights = {e.step: e.tensor for e in view.select(channel=CLIENT_WEIGHTS)}
        self.weights[PRETRAINED] = trainable.flat(self.model, self.names)   # BiSR's semi-white-box prior
        self._at: int | None = None

    def at(self, step: int) -> Any:
        """The partition with the clients' A and C as the server learned them after `step` (PRETRAINED:
        the pretrained A and C, which the server has without the strong threat model)."""
        if self._at != step:
            trainable.load_flat(self.model, self.names, self.weights[step])
            self._at = step
        return self.part

    def round_start(self, step: int) -> int | None:
        """The recorded step whose weights are the global A and C its round started from (FedAvg's output,
        which every client loads before its local step 0; harness/splitft/client.step_id numbers a client's
        steps of one round consecutively from a multiple of local_steps), or None where that step is not
        in the view (`splitft.record.steps_per_round` < `local_steps`, or a view saved before its meta
        held `local_steps`)."""
        local_steps = self.view.meta["splitft"].get("local_steps")
        if local_steps is None:
            return None
        first = step - step % int(local_steps)
        return first if first in self.weights else None

    @property
    def vocab_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight
