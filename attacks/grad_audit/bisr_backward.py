"""BiSR's backward stage run by the cloud on the audited trainer's returned gradient (paper 004; issue 32):
recover the labels of the real rows, the next tokens, i.e. the training text itself.

Threat model (harness/grad_audit/trainer.py, docs/grad_audit.md):

- **The tensor.** `returned_gradient`: g = ∂ℓ/∂s_B, rows × T × d, at cut b = `resume_at`. s_B is the output
  of the cloud's last block b and the input of the local node's tail f_T (blocks b+1..L, the final norm, the
  LM head); ℓ is the mean next-token cross-entropy over the real rows only,
  ℓ = Σ_{real r} Σ_{t<T−1} CE(f_T(s_B)_{r,t}, x_{r,t+1}) / (n_real·(T − 1)). It is exactly 0 on the decoys
  (the audited bug). Under `decoy_mitigated` the cloud receives g' = clip_c(g) + N(0, (z·c)² I) on every
  entry of every row (harness/grad_audit/transforms.mitigate), c per frame.
- **What the cloud holds.** s_B of every row (it computed it: the `cloud_output` channel, recorded on the
  attacked frames), the frozen public LM and so f_T exactly (only the local bottleneck and the cloud's own
  up-projection train; the LM's weights never change), the frame layout (n_real real rows of T tokens per
  frame: the loss's normaliser n_real·(T − 1)) and the mitigation's protocol (the noise multiplier z and the
  clip rule, config keys). It does not hold the labels, nor which rows are real (but a row whose gradient
  is exactly zero is a decoy), nor a per-frame clip set at a quantile of norms it never sees.
- **So split FT's BiSR(b) applies with C = f_T** (attacks/labels.match_labels, shared as it
  is): soft labels Y per position, started at the cloud's decoding f_T(s_B) / temperature and moved so that
  ∂ℓ(f_T(s_B), Y)/∂s_B matches g; the guess is argmax Y. Rows are independent through f_T (each row is its
  own sequence), so each row is matched on its own.
- **Against the mitigation** the guard handed to match_labels is what the cloud can know: a fixed clip
  (`mitigation.grad_clip`, published) as it is; a quantile clip estimated per frame as c = σ̂/z with
  σ̂ the RMS of every entry of the received frame. Every decoy entry is pure N(0, (z·c)²) and a real
  position adds at most c to a d-wide vector, so σ̂ overestimates σ by a factor of at most
  √(1 + n_real/(rows·z²·d)) (1.4 % on SmolLM2's d = 576, ~5 % on the tiny test models); with z = 0 it is
  c = the largest position norm received (every clipped position sits at c). MAP under that guard (the
  default, `prior`) is match_labels' own.

Rows attacked: the attacker's rule is every row with a non-zero entry (the real rows without the
mitigation, every row with it). Under a guard with the MAP loss the rows are matched independently (the
loss is a sum over rows, AdamW acts per entry), so only the real ones among them are computed: each gets
the guess it would get among all rows, and the decoys' guesses are never scored. `positions_matched`
counts what was computed.

Scores, on the positions 0..T−2 of the real rows of the last `frames` frames of each scored seed, all
pooled over seeds: top-1 of BiSR(b) (`bisr_b_top1`, Wilson 95%); its floor, the constant most-frequent-
token guess on the same labels (attacks/labels.constant_guesses, split FT's `label_top1_floor`);
their paired difference with Newcombe's 95% interval (metrics/proportions.newcombe_paired). Beside it the
cloud's decoding alone (BiSR's start: what it reads with no gradient at all) and BiSR minus it, what the
returned gradient adds.

Controls, on the same frames and rows: *positive*, BiSR on the undefended gradient of the same s_B under
the true labels (the local node's gradient before any mitigation; without the mitigation it is the
returned gradient itself, so the attack is reused): passes when its difference over the floor has a lower
bound ≥ positive_margin_pp; it would catch an attacker that cannot read an unmitigated gradient. *Negative*
(issue 31's null for this system, shuffled labels): the gradient of the same s_B with every real row
labelled by another real row of its frame (a cyclic shift), through the arm's own mitigation (the same
clip rule and noise multiplier, its own noise), scored on the true labels: passes when its difference over
the floor has an upper bound ≤ margin; it would catch an attacker that reads labels from something other
than the gradient's label content (e.g. its own decoding).

Verdict: attacks/controls.classify of the difference over the floor against 0 with the run's margin
(gates.probe_margin_pp) and those two controls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from attacks import controls
from attacks.labels import constant_guesses, match_labels, top1_floor
from harness.grad_audit.trainer import CLOUD_OUTPUT, RETURNED_GRADIENT, TopologySettings, block_ce
from harness.grad_audit.transforms import carrying_norms, frame_clip, mitigate
from harness.partition import Partition
from metrics.proportions import paired_difference_record, rate_record


@dataclass(frozen=True)
class BisrSettings:
    frames: int
    steps: int
    lr: float
    beta: float
    temperature: float
    prior: bool

    @classmethod
    def from_config(cls, b: Any) -> BisrSettings:
        return cls(int(b.frames), int(b.steps), float(b.lr), float(b.beta), float(b.temperature), bool(b.prior))


@dataclass
class SeedBisr:
    """One seed's attacked real rows: their labels and each guesser's guesses, row for row."""

    labels: list[list[int]] = field(default_factory=list)
    attack: list[list[int]] = field(default_factory=list)       # BiSR(b) on the returned gradient
    decode: list[list[int]] = field(default_factory=list)       # the cloud's decoding f_T(s_B): BiSR's start
    positive: list[list[int]] = field(default_factory=list)     # BiSR(b) on the undefended gradient
    null: list[list[int]] = field(default_factory=list)         # BiSR(b) on the shuffled-label gradient
    null_labels: list[list[int]] = field(default_factory=list)  # the labels the null gradient came from
    positions_matched: int = 0
    seconds: float = 0.0


def loss_gradient(part: Partition, s_b: torch.Tensor, tokens: torch.Tensor, is_real: torch.Tensor,
                  real_rows: int) -> torch.Tensor:
    """∂ℓ/∂s_B of the trainer's loss (module docstring) with the real rows labelled by `tokens`: 0 on the
    decoys. Divided by the frame layout's n_real·(T − 1), as the trainer's block_ce(...).mean() is."""
    (grad,) = loss_gradients(part, s_b, [tokens], is_real, real_rows)
    return grad


def loss_gradients(part: Partition, s_b: torch.Tensor, labellings: list[torch.Tensor], is_real: torch.Tensor,
                   real_rows: int) -> list[torch.Tensor]:
    """loss_gradient for each labelling of the same s_B, from one forward pass through the tail: only the
    labels differ, so the positive control (true labels) and the null (shuffled) share the tail's logits."""
    s = s_b.detach().clone().requires_grad_(True)
    real = s[is_real]
    grads = []
    with torch.enable_grad():
        logits = part.tail(real, part.context(real))
        for k, tokens in enumerate(labellings):
            loss = block_ce(logits, tokens[is_real]).sum() / real_rows
            (grad,) = torch.autograd.grad(loss, s, retain_graph=k < len(labellings) - 1)
            grads.append(grad.detach())
    return grads


def shuffled_tokens(tokens: torch.Tensor, is_real: torch.Tensor) -> torch.Tensor:
    """`tokens` with every real row's replaced by the next real row's (cyclically, in the cloud's order):
    labels from another row of the same frame, the null."""
    out = tokens.clone()
    idx = torch.nonzero(is_real).flatten()
    out[idx] = tokens[idx.roll(-1)]
    return out


def guard_of(grad: torch.Tensor, mitigation: tuple[float | None, float] | None) -> dict[str, float] | None:
    """The guard on this frame as the cloud can know it (module docstring); None without the mitigation."""
    if mitigation is None:
        return None
    fixed, z = mitigation
    if fixed is not None:
        return {"clip": float(fixed), "noise_multiplier": float(z)}
    if z > 0:
        return {"clip": float(grad.double().pow(2).mean().sqrt()) / float(z), "noise_multiplier": float(z)}
    return {"clip": float(grad.norm(dim=-1).max()), "noise_multiplier": 0.0}


def _match(part: Partition, s_b: torch.Tensor, grad: torch.Tensor, is_real: torch.Tensor, real_rows: int,
           guard: dict[str, float] | None, b: BisrSettings) -> tuple[torch.Tensor, list[list[int]]]:
    """(the real rows it scores, in the cloud's order; BiSR(b)'s guesses for them) on one frame, and the
    rows it computed (module docstring: every row with support; only its real ones when rows are
    independent)."""
    support = (grad != 0).flatten(1).any(dim=1)
    rows = support & is_real if (guard is not None and b.prior and guard["noise_multiplier"] > 0) else support
    n_tokens = real_rows * (grad.shape[1] - 1)
    guesses = match_labels(part, s_b[rows], grad[rows], n_tokens, steps=b.steps, lr=b.lr, beta=b.beta,
                           temperature=b.temperature, guard=guard, prior=b.prior)
    index = torch.nonzero(rows).flatten().tolist()
    keep = [k for k, r in enumerate(index) if bool(is_real[r])]
    return rows, [guesses[k] for k in keep]


@torch.no_grad()
def decoding(part: Partition, s_b: torch.Tensor) -> list[list[int]]:
    """argmax f_T(s_B) at positions 0..T−2: the cloud's own next-token guesses, BiSR's start."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):     # the kernel match_labels' start is computed with
        return part.tail(s_b, part.context(s_b))[:, :-1].argmax(-1).tolist()


def attack_seed(run: Any, model: torch.nn.Module, settings: TopologySettings, b: BisrSettings,
                real_rows: int) -> SeedBisr:
    """BiSR(b), its decoding start and its two controls on every frame of `run` (a harness.grad_audit
    SeedRun) whose view holds the cloud's s_B; scored on the real rows (run.truth, used only to score,
    to build the controls' gradients and to skip computing the decoys' guesses, module docstring)."""
    start = time.perf_counter()
    part = Partition(model, settings.cut_after, settings.resume_at)   # the cloud's copy of the public LM
    grads = {e.step: e.tensor for e in run.view.select(channel=RETURNED_GRADIENT)}
    out = SeedBisr()
    for e in run.view.select(channel=CLOUD_OUTPUT):
        i, s_b = e.step, e.tensor
        grad, real, tokens = grads[i], run.truth.is_real[i], run.truth.tokens[i]
        rows, attack = _match(part, s_b, grad, real, real_rows, guard_of(grad, settings.mitigation), b)
        out.positions_matched += int(rows.sum()) * (grad.shape[1] - 1)
        out.attack += attack
        out.labels += tokens[real][:, 1:].tolist()
        out.decode += decoding(part, s_b[real])
        other = shuffled_tokens(tokens, real)
        if settings.mitigation is None:      # the returned gradient is the undefended one
            out.positive += attack
            null = loss_gradient(part, s_b, other, real, real_rows)
        else:   # the positive control's gradient and the null's, from one pass through the tail
            clean, null = loss_gradients(part, s_b, [tokens, other], real, real_rows)
            rows, positive = _match(part, s_b, clean, real, real_rows, None, b)
            out.positive += positive
            out.positions_matched += int(rows.sum()) * (grad.shape[1] - 1)
        if settings.mitigation is not None:
            clip = frame_clip(carrying_norms(null[real]), settings.mitigation[0], settings.clip_quantile)
            null = mitigate(null, clip, settings.mitigation[1],
                            torch.Generator().manual_seed(40_000 + 1_000 * int(run.seed) + int(i)))
        rows, guesses = _match(part, s_b, null, real, real_rows, guard_of(null, settings.mitigation), b)
        out.positions_matched += int(rows.sum()) * (grad.shape[1] - 1)
        out.null += guesses
        out.null_labels += other[real][:, 1:].tolist()
    out.seconds = time.perf_counter() - start
    return out


def _flat_hits(labels: list[list[int]], guesses: list[list[int]]) -> list[bool]:
    return [a == g for ref, hyp in zip(labels, guesses, strict=True) for a, g in zip(ref, hyp, strict=True)]


def top1(labels: list[list[int]], guesses: list[list[int]], name: str) -> dict[str, float]:
    """`name` top-1 (%) pooled over positions and its Wilson 95% interval."""
    return rate_record(_flat_hits(labels, guesses), name)


def difference(labels: list[list[int]], first: list[list[int]], second: list[list[int]],
               name: str) -> dict[str, float]:
    """top-1(first) − top-1(second) (pp) on the same positions, with Newcombe's paired 95% interval."""
    return paired_difference_record(_flat_hits(labels, first), _flat_hits(labels, second), name)


def summarise(seeds: list[SeedBisr], margin_pp: float, positive_margin_pp: float) -> dict[str, Any]:
    """The results.json keys of the attack over the scored seeds (module docstring); `bisr_b_verdict`."""
    labels = [r for s in seeds for r in s.labels]
    guess = {k: [r for s in seeds for r in getattr(s, k)] for k in ("attack", "decode", "positive", "null")}
    floor = constant_guesses(labels)
    m: dict[str, Any] = {"bisr_b_positions": sum(len(r) for r in labels), "bisr_b_rows": len(labels),
                         "bisr_b_positions_matched": sum(s.positions_matched for s in seeds),
                         "bisr_b_seconds": sum(s.seconds for s in seeds)}
    m.update(top1(labels, guess["attack"], "bisr_b_top1"))
    m["bisr_b_top1_floor"] = top1_floor(labels)
    m.update(difference(labels, guess["attack"], floor, "bisr_b_minus_floor_pp"))
    m.update(top1(labels, guess["decode"], "bisr_b_decode_top1"))
    m.update(difference(labels, guess["attack"], guess["decode"], "bisr_b_minus_decode_pp"))
    m.update(top1(labels, guess["positive"], "bisr_b_positive_top1"))
    m.update(difference(labels, guess["positive"], floor, "bisr_b_positive_minus_floor_pp"))
    m.update(top1(labels, guess["null"], "bisr_b_null_top1"))
    m.update(difference(labels, guess["null"], floor, "bisr_b_null_minus_floor_pp"))
    m["bisr_b_positive_pass"] = m["bisr_b_positive_minus_floor_pp_ci_lo"] >= positive_margin_pp
    m["bisr_b_negative_pass"] = m["bisr_b_null_minus_floor_pp_ci_hi"] <= margin_pp
    m["bisr_b_verdict"] = controls.classify(m["bisr_b_minus_floor_pp_ci_lo"], m["bisr_b_minus_floor_pp_ci_hi"], 0.0,
                                            margin_pp, positive_passed=m["bisr_b_positive_pass"],
                                            negative_passed=m["bisr_b_negative_pass"],
                                            certify=(m["bisr_b_minus_floor_pp_earned_ci_lo"],
                                                     m["bisr_b_minus_floor_pp_earned_ci_hi"]))
    m["bisr_b_margin_pp"] = margin_pp
    return m

