"""The audited two-node split-LLM trainer (paper 004) as a topology of Partition (harness/partition.py).

The local (trusted) node holds the data, blocks 1..a, blocks b+1..L, the LM head and the loss; the cloud
(untrusted) holds blocks a+1..b and an up-projection D → d that reads the latent it receives. One training
step is one frame:

1. local: s_A = blocks 1..a on the real rows and on the decoy rows; each row through LocalObfuscation
   (bottleneck, rotation, clip, noise); a fresh permutation mixes real and decoy rows into the frame;
2. cloud: s_B = blocks a+1..b (up-projection first) on all rows; s_B goes back to the local node;
3. local: the real rows' s_B through blocks b+1..L and the head, next-token cross-entropy over the real
   rows only (the loss ignores the decoys); the gradient ∂loss/∂s_B goes back to the cloud, in the cloud's
   row order: exactly zero on every decoy row, since no decoy reaches the loss (the audited bug). Under the
   mitigation it is clipped and noised first (transforms.mitigate);
4. cloud: backward through its blocks with that gradient: its up-projection's gradient and ∂/∂payload,
   which goes back to the local node for its bottleneck.

Everything the cloud receives (the payload of step 1, the gradient of step 3) is recorded in the
AdversaryView under the channels `forward_payload` and `returned_gradient`; on the frames a caller asks
for, also the cloud's own output s_B of step 2 (`cloud_output`: the cloud computed it, and the BiSR
backward attacker, attacks/grad_audit/bisr_backward.py, differentiates the public tail at it). The LM's own weights are
frozen; only the bottleneck (local) and the up-projection (cloud) train, with Adam. What the cloud does
not receive (which rows are real, their tokens) is the audit's ground truth (`FrameTruth`), kept apart from
the view and used only to score the attacks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.adversary_view import AdversaryView, Exposure
from harness.grad_audit.transforms import LocalObfuscation, assemble_frame, carrying_norms, frame_clip, mitigate
from harness.partition import Context, Partition

FORWARD_PAYLOAD, RETURNED_GRADIENT, CLOUD_OUTPUT = "forward_payload", "returned_gradient", "cloud_output"


@dataclass(frozen=True)
class TopologySettings:
    """The trainer's settings (`topology_settings` reads them from the grad_audit section; no defaults here:
    they live in conf/grad_audit/default.yaml)."""
    cut_after: int
    resume_at: int
    latent_dim: int
    clip: float
    noise_ratio: float
    lr: float
    # (grad_clip, noise_multiplier) of the returned-gradient mitigation; None: the gradient goes back as it is.
    # grad_clip None: the clip is set per frame at `clip_quantile` of the real rows' per-position norms.
    mitigation: tuple[float | None, float] | None
    init: str                   # random | least_squares (DecoyTrainer.warm_start)
    clip_quantile: float | None


def topology_settings(g: Any, configuration: str) -> TopologySettings:
    """The trainer's settings from the grad_audit section `g`: the mitigation only for decoy_mitigated (a
    fixed clip, or null: the per-frame clip at mitigation.clip_quantile)."""
    mitigated = configuration == "decoy_mitigated"
    fixed = g.mitigation.grad_clip
    mitigation = ((None if fixed is None else float(fixed), float(g.mitigation.noise_multiplier))
                  if mitigated else None)
    quantile = g.mitigation.clip_quantile
    return TopologySettings(g.cut_after, g.resume_at, g.latent_dim, float(g.clip), float(g.noise_ratio),
                            float(g.train.lr), mitigation, str(g.train.init),
                            None if not mitigated or quantile is None else float(quantile))


@dataclass
class FrameTruth:
    """What the cloud does not see: per frame, which cloud rows are real, and every row's tokens."""

    is_real: list[torch.Tensor] = field(default_factory=list)   # (rows,) bool, cloud order
    tokens: list[torch.Tensor] = field(default_factory=list)    # (rows, T) long, cloud order
    parity: list[int] = field(default_factory=list)             # which half of the training blocks


def block_ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-row mean next-token cross-entropy (nats) of logits (rows, T, V) on ids (rows, T)."""
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1),
                             reduction="none")
    return losses.view(ids.shape[0], -1).mean(dim=1)


class DecoyTrainer:
    """One seed's trainer: its secrets (bottleneck init, rotation, up-projection init, permutations, noise)
    all come from `seed`."""

    def __init__(self, model: nn.Module, settings: TopologySettings, seed: int) -> None:
        self.settings = settings
        self.part = Partition(model, settings.cut_after, settings.resume_at)
        # per mitigated frame: (its clip, real position vectors longer than it, real position vectors that carry a
        # gradient: a row's last never does)
        self.clip_record: list[tuple[float, int, int]] = []
        for p in model.parameters():
            p.requires_grad_(False)
        hidden = int(model.config.hidden_size)
        self.gen = torch.Generator().manual_seed(int(seed))
        self.local = LocalObfuscation(hidden, settings.latent_dim, settings.clip, settings.noise_ratio, self.gen)
        self.up = nn.Linear(settings.latent_dim, hidden)
        with torch.no_grad():
            self.up.weight.copy_(torch.randn(hidden, settings.latent_dim, generator=self.gen)
                                 / math.sqrt(settings.latent_dim))
            self.up.bias.zero_()
        self.local_opt = torch.optim.Adam(self.local.parameters(), lr=settings.lr)
        self.cloud_opt = torch.optim.Adam(self.up.parameters(), lr=settings.lr)
        self._contexts: dict[tuple[int, ...], Context] = {}

    @torch.no_grad()
    def warm_start(self, ids: torch.Tensor) -> None:
        """Start both maps from a least-squares fit on the blocks `ids` (grad_audit.train.init=least_squares).

        From random maps, tens of Adam steps leave the split pipeline worse than a uniform guess (held-out
        CE above log V on SmolLM2), so a reduced run's utility gate would measure the start, not the trainer.
        The paper trains for 4,096 steps; this start stands in for them. The bottleneck keeps the top-D right
        singular directions of s_A, scaled so that the median position vector has norm C (the clip then
        bounds only the large ones); the cloud's up-projection (with its bias) is the least-squares map from
        the payload, noise included, back to s_A: the linear decoder training would move it towards. It is the
        cloud's own parameter either way; the audit's probes read the payload and the gradient, not it."""
        st = self.settings
        s_a = self.part.head(ids)[0].float()
        flat = s_a.reshape(-1, s_a.shape[-1])
        _, _, vh = torch.linalg.svd(flat, full_matrices=False)
        down = vh[:st.latent_dim]
        self.local.down.weight.copy_(down)
        self.local.input_scale.fill_(st.clip / float((flat @ down.T).norm(dim=-1).median().clamp_min(1e-12)))
        z = self.local(s_a, self.gen).reshape(-1, st.latent_dim).double()
        # relative error per position: SmolLM2's first position of a row has ~100x the norm of the others and
        # would otherwise be the only one fitted (float64: the design spans that range too)
        weight = 1.0 / flat.norm(dim=-1, keepdim=True).double().clamp_min(1e-12)
        design = torch.cat([z, torch.ones(z.shape[0], 1, dtype=z.dtype)], dim=1)
        solution = torch.linalg.lstsq(design * weight, flat.double() * weight).solution   # (D + 1, d)
        self.up.weight.copy_(solution[:-1].T)
        self.up.bias.copy_(solution[-1])

    def _context(self, hidden: torch.Tensor) -> Context:
        key = tuple(hidden.shape[:2])
        if key not in self._contexts:
            self._contexts[key] = self.part.context(hidden)
        return self._contexts[key]

    def step(self, real_ids: torch.Tensor, decoy_ids: torch.Tensor, view: AdversaryView, truth: FrameTruth,
             index: int, parity: int, record_cloud_output: bool = False) -> float:
        """One training step on one frame (module docstring); records what crosses, and with
        `record_cloud_output` the cloud's s_B of the frame. Returns the loss."""
        st = self.settings
        # 1. local node
        with torch.no_grad():
            s_real, _ = self.part.head(real_ids)
            if decoy_ids.shape[0]:
                z_decoy = self.local(self.part.head(decoy_ids)[0], self.gen)   # decoys are not trained on
            else:
                z_decoy = torch.zeros(0, *real_ids.shape[1:], st.latent_dim)
        z_real = self.local(s_real, self.gen)
        frame = assemble_frame(z_real, z_decoy, self.gen)
        # 2. cloud
        payload = frame.payload.detach().requires_grad_(True)
        h = self.up(payload)
        s_b = self.part.body(h, self._context(h))
        # 3. local node: the loss over the real rows only
        received = s_b.detach().requires_grad_(True)
        real_rows = received[frame.real_index]
        logits = self.part.tail(real_rows, self._context(real_rows))
        loss = block_ce(logits, real_ids).mean()
        loss.backward()
        returned = received.grad
        if st.mitigation is not None:
            norms = carrying_norms(returned[frame.real_index])
            clip = frame_clip(norms, st.mitigation[0], st.clip_quantile)
            self.clip_record.append((clip, int((norms > clip).sum()), int(norms.numel())))
            returned = mitigate(returned, clip, st.mitigation[1], self.gen)
        # 4. cloud backward, then the local node's bottleneck
        self.cloud_opt.zero_grad()
        s_b.backward(returned)
        self.local_opt.zero_grad()
        frame.payload.backward(payload.grad)
        self.cloud_opt.step()
        self.local_opt.step()

        view.exposures.append(Exposure(op="frame", layer=st.cut_after, step=index, shape=tuple(payload.shape),
                                       tensor=payload.detach().clone(), channel=FORWARD_PAYLOAD))
        view.exposures.append(Exposure(op="output_gradient", layer=st.resume_at, step=index,
                                       shape=tuple(returned.shape), tensor=returned.detach().clone(),
                                       channel=RETURNED_GRADIENT))
        if record_cloud_output:
            view.exposures.append(Exposure(op="cloud_output", layer=st.resume_at, step=index,
                                           shape=tuple(s_b.shape), tensor=s_b.detach().clone(),
                                           channel=CLOUD_OUTPUT))
        tokens = torch.cat([real_ids, decoy_ids])[frame.perm]
        truth.is_real.append(frame.is_real.clone())
        truth.tokens.append(tokens)
        truth.parity.append(parity)
        return float(loss.detach())

    @torch.no_grad()
    def heldout_ce(self, blocks: torch.Tensor, batch: int = 32,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """Per-block held-out cross-entropy of the deployed split pipeline (forward noise included, drawn from
        `generator`, else from the trainer's own stream: a mid-training curve point passes its own so that the
        training that follows does not change)."""
        gen = self.gen if generator is None else generator
        out = []
        for start in range(0, blocks.shape[0], batch):
            ids = blocks[start:start + batch]
            s_a, ctx = self.part.head(ids)
            s_b = self.part.body(self.up(self.local(s_a, gen)), ctx)
            out.append(block_ce(self.part.tail(s_b, ctx), ids))
        return torch.cat(out)


@torch.no_grad()
def base_ce(model: nn.Module, blocks: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """Per-block held-out cross-entropy of the model itself, unsplit (the utility gate's reference)."""
    return torch.cat([block_ce(model(input_ids=blocks[s:s + batch]).logits, blocks[s:s + batch])
                      for s in range(0, blocks.shape[0], batch)])
