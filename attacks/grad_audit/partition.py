"""The partition attack on the returned gradient (paper 004): which rows of a frame are real?

The cloud reads only the `returned_gradient` channel of the view (one (rows, T, d) tensor per frame).

- zero support (the paper's attack): a row is real when any entry of its returned gradient is non-zero.
  The loss ignores the decoys, so their gradient is exactly zero and the pattern of zeros is the real/decoy
  split; `agreement` is the share of rows it labels right, a frame is identified when every row is.
- norm rank (a stronger attacker where nothing is exactly zero, e.g. under the mitigation): the n_real rows
  with the largest gradient norm are real. It always names exactly n_real rows, so a guess with no signal
  agrees on (r² + (n − r)²)/n² of the rows in expectation (`chance_agreement`), its floor.

Controls of the norm-rank attacker, as attacks/controls.py asks of every attack: the positive control plants
a known partition (the gradient zeroed outside a seeded random set of n_real rows per frame, the audited
bug at full dose) and must be recovered; the negative control scores the attacker against the other frames'
real/decoy labels (`other_frames`) and must sit at the chance floor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attacks import controls
from harness.adversary_view import AdversaryView
from harness.grad_audit.trainer import RETURNED_GRADIENT
from metrics.proportions import wilson


def returned_gradients(view: AdversaryView) -> list[torch.Tensor]:
    return [e.tensor for e in view.select(channel=RETURNED_GRADIENT)]


def zero_support(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per frame, rows whose gradient has any non-zero entry (predicted real)."""
    return [(g != 0).flatten(1).any(dim=1) for g in grads]


def norm_rank(grads: list[torch.Tensor], n_real: int) -> list[torch.Tensor]:
    """Per frame, the n_real rows of largest gradient norm (predicted real)."""
    out = []
    for g in grads:
        pred = torch.zeros(g.shape[0], dtype=torch.bool)
        pred[torch.topk(g.flatten(1).norm(dim=1), n_real).indices] = True
        out.append(pred)
    return out


def row_norms(grads: list[torch.Tensor], is_real: list[torch.Tensor]) -> tuple[list[float], list[float]]:
    """The norm-rank attacker's per-row score as a membership-style test (metrics/roc.py): the returned gradient's
    norm of every real row (positives) and of every decoy (negatives), over all frames."""
    norms = torch.cat([g.flatten(1).norm(dim=1) for g in grads]).double()
    real = torch.cat(is_real).bool()
    return norms[real].tolist(), norms[~real].tolist()


def chance_agreement(n_real: int, n_rows: int) -> float:
    """Expected row agreement of a uniformly random guess of exactly n_real real rows."""
    return (n_real ** 2 + (n_rows - n_real) ** 2) / n_rows ** 2


@dataclass
class Agreement:
    rows_agree: int
    rows: int
    frames_identified: int
    frames: int

    @property
    def rate(self) -> float:
        return self.rows_agree / self.rows

    def interval(self, alpha: float = 0.05) -> tuple[float, float]:
        return wilson(self.rows_agree, self.rows, alpha)


def agreement(predicted: list[torch.Tensor], is_real: list[torch.Tensor]) -> Agreement:
    agree = [(p == t) for p, t in zip(predicted, is_real, strict=True)]
    return Agreement(int(sum(int(a.sum()) for a in agree)), int(sum(a.numel() for a in agree)),
                     int(sum(bool(a.all()) for a in agree)), len(agree))


def other_frames(predicted: list[torch.Tensor], is_real: list[torch.Tensor]) -> Agreement:
    """The negative control: every frame's prediction scored against every other frame's labels (all
    ordered pairs i != j). A fresh permutation per frame makes those labels independent of the prediction,
    so this sits at the chance agreement unless the attacker reads something frame-independent (a row
    order that is not random, say)."""
    pred = torch.stack(predicted).long()          # (F, rows)
    real = torch.stack(is_real).long()
    f, n = pred.shape
    # agreements of pred_i with real_j summed over rows: matches of ones plus matches of zeros
    ones = pred @ real.T
    zeros = (1 - pred) @ (1 - real).T
    agree = ones + zeros
    off = ~torch.eye(f, dtype=torch.bool)
    return Agreement(int(agree[off].sum()), int(off.sum()) * n, int((agree[off] == n).sum()), int(off.sum()))


def planted(grads: list[torch.Tensor], n_real: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The positive control's frames: each gradient zeroed outside a seeded random set of n_real rows."""
    gen = torch.Generator().manual_seed(seed)
    out, labels = [], []
    for g in grads:
        keep = torch.zeros(g.shape[0], dtype=torch.bool)
        keep[torch.randperm(g.shape[0], generator=gen)[:n_real]] = True
        g2 = g.clone()
        g2[~keep] = 0
        # rows kept but exactly zero (none in practice) would be unrecoverable: give them a tiny mark
        g2[keep & ~(g2 != 0).flatten(1).any(dim=1)] = 1e-30
        out.append(g2)
        labels.append(keep)
    return out, labels


def partition_attack(grads: list[torch.Tensor], is_real: list[torch.Tensor], n_real: int, *, margin_pp: float,
                     positive_margin_pp: float, seed: int, per_item_bound_pp: float = 100.0) -> dict:
    """Zero support and norm rank against the truth, the norm-rank controls and its verdict (in %; at_chance on
    the interval the rows earned, per row 100 or 0 % against the chance agreement, at `per_item_bound_pp`)."""
    n_rows = int(grads[0].shape[0])
    chance = 100 * chance_agreement(n_real, n_rows)
    zs = agreement(zero_support(grads), is_real)
    nr = agreement(norm_rank(grads, n_real), is_real)
    pg, pl = planted(grads, n_real, seed)
    pos = agreement(norm_rank(pg, n_real), pl)
    neg = other_frames(norm_rank(grads, n_real), is_real) if len(grads) > 1 else None
    lo, hi = (100 * x for x in nr.interval())
    pos_ok = 100 * pos.interval()[0] >= chance + positive_margin_pp
    neg_ok = neg is not None and 100 * neg.interval()[1] <= chance + margin_pp
    rows = [100.0] * nr.rows_agree + [0.0] * (nr.rows - nr.rows_agree)
    earned = controls.earned(rows, chance, lo, hi, per_item_bound_pp)
    verdict = controls.classify(lo, hi, chance, margin_pp, positive_passed=pos_ok, negative_passed=neg_ok,
                                certify=earned)
    return {
        "zero_support": zs, "norm_rank": nr, "chance_agreement_pct": chance,
        "norm_rank_ci_pct": (lo, hi), "norm_rank_earned_ci_pct": earned, "positive": pos, "positive_pass": pos_ok,
        "negative": neg, "negative_pass": neg_ok, "verdict": verdict, "row_norms": row_norms(grads, is_real),
    }
