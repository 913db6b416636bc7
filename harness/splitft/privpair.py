"""PrivPair (paper 002 §V–VI): the client obfuscates s_A with W1, the server runs B on s'_A, the client
recovers with W2; gradients pass straight through; the adapter pair is re-aligned in bursts on D_align.

Our copy of the paper lost its equations (13)–(16); what follows is derived from its text (the choices and
their alternatives: docs/splitft.md "PrivPair: the derivation").

- W1, a residual obfuscation: s'_A = s_A + δ_A, δ_A = ρ(s_A)·g1(s_A/ρ(s_A)), g1 an MLP d → h → d (tanh),
  ρ the per-token RMS, so the obfuscation scales with the activations it hides.
- W2, a recovery from (s'_B, δ_A): ŝ_B = s'_B + ρ(s'_B)·g2([s'_B/ρ(s'_B), δ_A/ρ(s'_A)]), its last layer
  zero at start (W2 = identity on s'_B).
- STE (§VI-A): in the backward pass J_W1 = I, J_W2^(1) = I, J_W2^(2) = 0: the forward values are s'_A and
  ŝ_B, the gradients reach s'_B and s_A as if both adapters were the identity (`send`, `recover`).
- The losses, on a D_align batch (public: the server may return the plain s_B = f_B(s_A) for it):
    L_W1 = ℓ(ẑ, y) − β·T(z', y) + λ·K(δ_A)      ẑ = f_C(ŝ_B), z' = f_C(s'_B) (the server's decoder)
    L_W2 = ‖ŝ_B − s_B‖² / ‖s_B‖²  [+ ℓ(ẑ, y) with w2_loss=mse_task]          (16): H, measured directly
  T, the privacy term: `capped_ce` the server decoder's per-token cross-entropy, capped at log V (a
  uniform guess) so it cannot grow without bound; `entropy` its predictive entropy. K, the coupling term
  (13) that keeps H_A finite: `relative` ‖δ_A‖²/‖s_A‖², `absolute` ‖δ_A‖². λ is the run's `epsilon` knob:
  larger λ, smaller H_A, weaker obfuscation. W1's parameters move on ∂L_W1 only, W2's on ∂L_W2 only; A, B
  and C are not updated in a burst ("re-trained ... against the current model weights").
- Burst alignment: `warmup_align_steps` adapter steps before the first private step, then `align_steps`
  every P = `align_every` private steps.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.splitft.defences import Defence


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


class ObfuscationW1(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(d, hidden), nn.Linear(hidden, d)
        nn.init.normal_(self.outer.weight, std=0.02)
        nn.init.zeros_(self.outer.bias)

    def delta(self, s_a: torch.Tensor) -> torch.Tensor:
        scale = _rms(s_a)
        return scale * self.outer(torch.tanh(self.inner(s_a / scale)))

    def forward(self, s_a: torch.Tensor) -> torch.Tensor:
        return s_a + self.delta(s_a)


class RecoveryW2(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(2 * d, hidden), nn.Linear(hidden, d)
        nn.init.zeros_(self.outer.weight)
        nn.init.zeros_(self.outer.bias)

    def forward(self, s_b_obf: torch.Tensor, delta_a: torch.Tensor, s_a_obf: torch.Tensor) -> torch.Tensor:
        scale = _rms(s_b_obf)
        features = torch.cat([s_b_obf / scale, delta_a / _rms(s_a_obf)], dim=-1)
        return s_b_obf + scale * self.outer(torch.tanh(self.inner(features)))


def token_ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-token next-token cross-entropy (batch, seq-1)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                           reduction="none").view(ids.shape[0], -1)


def sq_norm(x: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of the squared ℓ2 norm of each token vector."""
    return x.pow(2).sum(-1).mean()


def burst_length(s: Any, step: int) -> int:
    """Adapter steps of the burst before private step `step` (0-based over the run): `warmup_align_steps`
    before the first, `align_steps` every `align_every`, else none. `s` is splitft.privpair. The one rule:
    PrivPair.burst runs it, and the split deployment's server drives the clients' bursts by it."""
    if step == 0:
        return int(s["warmup_align_steps"])
    return int(s["align_steps"]) if step % int(s["align_every"]) == 0 else 0


class PrivPair(Defence):
    name, obfuscates = "privpair", True

    def __init__(self, coupling_weight: float, settings: Any) -> None:
        self.lam, self.s = float(coupling_weight), settings

    def setup(self, part: Any, align: torch.Tensor, generator: torch.Generator) -> None:
        d = part.model.config.hidden_size
        self.vocab = part.model.config.vocab_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            self.w1, self.w2 = ObfuscationW1(d, int(self.s.hidden)), RecoveryW2(d, int(self.s.hidden))

    # -- the private step: STE forms ---------------------------------------------------------------
    def send(self, s_a: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            delta = self.w1.delta(s_a)
        return s_a + delta                      # value s'_A; gradient to s_A: identity (J_W1 = I)

    @property
    def identity_w2(self) -> bool:
        """`splitft.privpair.w2=identity`: no recovery, ŝ_B = s'_B (the ablation of W2)."""
        return self.s.w2 == "identity"

    def recover(self, s_b_recv: torch.Tensor, s_a: torch.Tensor, s_a_sent: torch.Tensor) -> torch.Tensor:
        if self.identity_w2:
            return s_b_recv
        with torch.no_grad():
            correction = self.w2(s_b_recv, (s_a_sent - s_a), s_a_sent) - s_b_recv
        return s_b_recv + correction            # value ŝ_B; J_W2^(1) = I, J_W2^(2) = 0

    # -- the burst ---------------------------------------------------------------------------------
    def privacy_term(self, z_obf: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.s.privacy_term == "entropy":
            logp = F.log_softmax(z_obf[:, :-1], dim=-1)
            return -(logp.exp() * logp).sum(-1).mean()
        return token_ce(z_obf, ids).clamp(max=math.log(self.vocab)).mean()

    def coupling(self, delta: torch.Tensor, s_a: torch.Tensor) -> torch.Tensor:
        k = sq_norm(delta)
        return k / sq_norm(s_a).clamp_min(1e-12) if self.s.coupling == "relative" else k

    def losses(self, part: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """L_W1, L_W2 and their parts on one D_align batch (module docstring)."""
        with torch.no_grad():
            s_a, ctx = part.head(ids)
            s_b = part.body(s_a, ctx)           # public data: the server returns the plain s_B too
        s_a_obf = self.w1(s_a)
        delta = s_a_obf - s_a
        s_b_obf = part.body(s_a_obf, ctx)
        s_b_hat = s_b_obf if self.identity_w2 else self.w2(s_b_obf, delta, s_a_obf)
        ce_hat = token_ce(part.tail(s_b_hat, ctx), ids).mean()
        privacy = self.privacy_term(part.tail(s_b_obf, ctx), ids)
        coupling = self.coupling(delta, s_a)
        recovery = sq_norm(s_b_hat - s_b) / sq_norm(s_b).clamp_min(1e-12)
        l_w1 = ce_hat - float(self.s.beta) * privacy + self.lam * coupling
        l_w2 = recovery + (ce_hat if self.s.w2_loss == "mse_task" else 0.0)
        return {"l_w1": l_w1, "l_w2": l_w2, "ce_hat": ce_hat, "privacy": privacy, "coupling": coupling,
                "recovery": recovery, "s_a": s_a, "s_a_obf": s_a_obf, "s_b": s_b, "s_b_obf": s_b_obf}

    def burst(self, step: int, part: Any, align: torch.Tensor, generator: torch.Generator,
              record: Any = None) -> dict[str, float] | None:
        n = burst_length(self.s, step)
        if n == 0:
            return None
        opt1 = torch.optim.Adam(self.w1.parameters(), lr=float(self.s.align_lr))
        opt2 = torch.optim.Adam(self.w2.parameters(), lr=float(self.s.align_lr))
        for i in range(n):
            rows = torch.randint(0, align.shape[0], (min(int(self.s.align_batch_size), align.shape[0]),),
                                 generator=generator)
            out = self.losses(part, align[rows])
            if record is not None:
                # every crossing of this burst step: s_A and s'_A up, s_B and s'_B down, then W1's gradient
                # through B (∂L_W1/∂s'_B up, ∂L_W1/∂s'_A down); read off the same graph, so recording
                # changes no number of the run
                (g_b,) = torch.autograd.grad(out["l_w1"], out["s_b_obf"], retain_graph=True)
                # what the server returns: B's backward of g_b alone (W1's other paths stay on the client)
                (g_a,) = torch.autograd.grad(out["s_b_obf"], out["s_a_obf"], grad_outputs=g_b, retain_graph=True)
                record.align(out["s_a"], out["s_a_obf"], out["s_b"], out["s_b_obf"], g_b, g_a)
            g1 = torch.autograd.grad(out["l_w1"], list(self.w1.parameters()), retain_graph=not self.identity_w2)
            for p, g in zip(self.w1.parameters(), g1):
                p.grad = g
            opt1.step()
            if not self.identity_w2:     # an identity W2 has nothing to train
                g2 = torch.autograd.grad(out["l_w2"], list(self.w2.parameters()))
                for p, g in zip(self.w2.parameters(), g2):
                    p.grad = g
                opt2.step()
        # only the last step's numbers are reported: one read-back per burst (a device sync each on a GPU)
        return {k: float(v.detach()) for k, v in out.items() if v.dim() == 0}

    def state(self) -> dict[str, torch.Tensor]:
        return {**{f"w1.{k}": v.detach().clone() for k, v in self.w1.state_dict().items()},
                **{f"w2.{k}": v.detach().clone() for k, v in self.w2.state_dict().items()}}

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        if not tensors:
            return
        self.w1.load_state_dict({k[3:]: torch.as_tensor(v) for k, v in tensors.items() if k.startswith("w1.")})
        self.w2.load_state_dict({k[3:]: torch.as_tensor(v) for k, v in tensors.items() if k.startswith("w2.")})
