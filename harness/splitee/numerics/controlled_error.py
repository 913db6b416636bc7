"""Controlled numerical error (paper §7.3.2, "How much numerical error is too much?", Table 5).

`ErrorRescaler` is an engine output hook (SplitEngine.set_output_hook). On every offloaded op call it
recomputes the clean output W·x(+b) in the TEE, exactly what T3 returns for that input (same tensors,
same F.linear call), and takes the call's natural error pattern e = y − W·x, y being the mechanism's
unmasked output. With a target it returns W·x + e·(target / MAE(e)): the same pattern, at the target
mean absolute error; without one (the natural level) it returns y untouched and only measures.

Why rescale on the fly instead of recording an EP1 run and replaying it: once a rescaled error changes a
token, the inputs of later calls differ from the recording's, and a recorded pattern would belong to
another input. Here every call's pattern is EP1's natural error for the very input and mask of that call
(the engine draws the same masks from a bank with the same seed), which is the recorded pattern whenever
the trajectories coincide.

MAE(e) is taken per call, over the output elements of real positions (ctx.valid: padding rows of a
left-padded prefill are excluded, and get the same scale); the LM head sees only the last position,
which is always real. Sums accumulate in fp64; the rescaled output is computed in the model's dtype
(one rounding of the scaled pattern, one of the sum: relative 2^−23 at most), and the error actually
realised (returned output − clean output) is what is measured.

The levels of the experiment (`levels`): T3 itself (zero error, the reference), the configuration's
natural error (measured, untouched), then one level per target MAE; `level_row` and `level_metrics` shape
what results.json records of each.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from harness.splitee.numerics.study import member_names

# The fidelity metrics (metrics/text.compare_generations) recorded per level, and the W&B table's columns.
FIDELITY_KEYS = ("semantic_similarity", "exact_match", "token_match_rate", "bleu", "rouge_l")
TABLE_COLUMNS = ("level", "target_mae", "realised_mae", "natural_mae", *FIDELITY_KEYS)


def rescale_to_mae(error: torch.Tensor, target: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    """error · target / mean|error| in error's dtype; the mean (accumulated in fp64) over `valid` rows
    (bool over error.shape[:-1]) when given. A pattern that is zero everywhere has no scale to change:
    returned as is (zeros)."""
    mae = _masked_mean_abs(error, valid)
    if mae == 0.0:
        return error
    return error * (float(target) / mae)


def _row_abs_sums(e: torch.Tensor, valid: torch.Tensor | None) -> tuple[float, int]:
    """(Σ|e| over real rows, number of elements there), accumulated in fp64."""
    per_row = e.abs().sum(-1, dtype=torch.float64)
    if valid is None:
        return per_row.sum().item(), e.numel()
    return per_row[valid].sum().item(), int(valid.sum()) * e.shape[-1]


def _masked_mean_abs(e: torch.Tensor, valid: torch.Tensor | None) -> float:
    total, count = _row_abs_sums(e, valid)
    return total / count if count else 0.0


@dataclass
class ErrorTally:
    calls: int = 0
    zero_calls: int = 0            # calls whose natural error was exactly zero (left unchanged)
    elements: int = 0
    natural_abs: float = 0.0       # Σ|y − W·x| over real positions
    realised_abs: float = 0.0      # Σ|returned − W·x|

    @property
    def natural_mae(self) -> float:
        return self.natural_abs / self.elements if self.elements else math.nan

    @property
    def realised_mae(self) -> float:
        return self.realised_abs / self.elements if self.elements else math.nan


@dataclass
class ErrorRescaler:
    """Engine output hook: measure (target None) or set (target > 0) every call's mean absolute error."""

    target: float | None = None
    tallies: dict[str, ErrorTally] = field(default_factory=lambda: defaultdict(ErrorTally))
    per_call_relative_deviation: float = 0.0   # max |realised MAE / target − 1| over calls

    def __call__(self, op, x: torch.Tensor, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        valid = _valid_rows(op.ctx.valid, x)
        returned = []
        for name, (w, b), y in zip(member_names(op.name), op.tee_params, outputs):
            clean = F.linear(x, w, b)                       # T3's output for this input
            # y − clean is exact in the model's dtype wherever the two are within a factor 2 (Sterbenz),
            # and off by one rounding elsewhere: far below the 1% the rescaling promises.
            natural = y - clean
            tally = self.tallies[name]
            nat_abs, count = _row_abs_sums(natural, valid)
            if self.target is None:
                out, realised_abs = y, nat_abs
            else:
                if nat_abs == 0.0:
                    tally.zero_calls += 1
                    out = y
                else:
                    out = clean + natural * (self.target / (nat_abs / count))
                realised = out - clean
                realised_abs, _ = _row_abs_sums(realised, valid)
                if count:
                    dev = abs(realised_abs / count / self.target - 1.0)
                    self.per_call_relative_deviation = max(self.per_call_relative_deviation, dev)
            tally.calls += 1
            tally.elements += count
            tally.natural_abs += nat_abs
            tally.realised_abs += realised_abs
            returned.append(out)
        return returned

    def total(self) -> ErrorTally:
        t = ErrorTally()
        for tally in self.tallies.values():
            for k in ("calls", "zero_calls", "elements"):
                setattr(t, k, getattr(t, k) + getattr(tally, k))
            t.natural_abs += tally.natural_abs
            t.realised_abs += tally.realised_abs
        return t

    def summary(self) -> dict:
        total = self.total()
        return {
            "target_mae": self.target,
            "natural_mae": total.natural_mae,
            "realised_mae": total.realised_mae,
            "calls": total.calls,
            "zero_calls": total.zero_calls,
            "elements": total.elements,
            "max_per_call_relative_deviation": self.per_call_relative_deviation if self.target else None,
            "by_op": {name: {"natural_mae": t.natural_mae, "realised_mae": t.realised_mae, "calls": t.calls}
                      for name, t in sorted(self.tallies.items())},
        }


def _valid_rows(valid: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """The engine's real-position mask when it lines up with this call's rows, else None (all real)."""
    if valid is None or tuple(valid.shape) != tuple(x.shape[:-1]):
        return None
    return valid.to(torch.bool)


# ---------------------------------------------------------------------------------------------------
# The levels of the experiment
# ---------------------------------------------------------------------------------------------------


@dataclass
class Level:
    """One error level: T3 (no hook: the reference itself), natural (a measuring hook) or a target MAE."""

    label: str                        # t3, natural, "ce 0.014"
    target: float | None
    rescaler: ErrorRescaler | None    # None: T3's own generation

    @property
    def slug(self) -> str:
        """Metric-key suffix: t3, natural, ce_0p014 (target 0.014)."""
        if self.target is None:
            return self.label
        return "ce_" + f"{self.target:.2g}".replace(".", "p").replace("-", "m").replace("+", "")


def levels(targets: Iterable[float]) -> list[Level]:
    """T3, the natural error, then one level per target mean absolute error, in that order."""
    return [Level("t3", None, None), Level("natural", None, ErrorRescaler(None)),
            *(Level(f"ce {t:g}", float(t), ErrorRescaler(float(t))) for t in targets)]


def level_row(level: Level, error: dict[str, Any], seconds: float, scores: dict[str, Any]) -> dict[str, Any]:
    """The results.json `table` row of a level: its error (ErrorRescaler.summary) and fidelity scores."""
    return {"level": level.label, "slug": level.slug, "target_mae": level.target,
            "realised_mae": error.get("realised_mae"), "natural_mae": error.get("natural_mae"),
            "error": error, "generation_seconds": seconds, **scores}


def level_metrics(table: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The flat results.json `metrics`: natural_mean_abs_error, max_rescale_deviation, then
    mean_abs_error_<slug> and every FIDELITY_KEYS metric (with its 95% interval) per level."""
    natural = next(r for r in table if r["slug"] == "natural")
    metrics: dict[str, Any] = {"natural_mean_abs_error": natural["realised_mae"],
                               "max_rescale_deviation": max((r["error"].get("max_per_call_relative_deviation") or 0.0)
                                                            for r in table)}
    for row in table:
        metrics[f"mean_abs_error_{row['slug']}"] = row["realised_mae"]
        for key in FIDELITY_KEYS:
            for suffix in ("", "_ci_lo", "_ci_hi"):
                metrics[f"{key}{suffix}_{row['slug']}"] = row.get(f"{key}{suffix}")
    return metrics
