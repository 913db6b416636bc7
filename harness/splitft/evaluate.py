"""Utility of the fine-tuned model the server ends up with (f = C∘B∘A, no adapters: paper 002 §V "the
server holds the complete fine-tuned model"): next-token cross-entropy and top-1 accuracy per held-out
block, so intervals are over blocks (metrics/intervals.py)."""
from __future__ import annotations

import math
from typing import Any

import torch

from harness.splitft.privpair import token_ce
from metrics.intervals import mean_ci
from metrics.proportions import proportion_ci


@torch.no_grad()
def heldout_scores(model: Any, blocks: list[list[int]], batch_size: int = 8) -> dict[str, list[float]]:
    """Per block: its mean next-token cross-entropy (nats) and top-1 accuracy (%)."""
    ce, top1 = [], []
    for start in range(0, len(blocks), batch_size):
        ids = torch.tensor(blocks[start:start + batch_size], dtype=torch.long)
        logits = model(input_ids=ids).logits
        ce.extend(token_ce(logits, ids).mean(1).tolist())
        top1.extend((100.0 * (logits[:, :-1].argmax(-1) == ids[:, 1:]).float().mean(1)).tolist())
    return {"ce": ce, "top1": top1}


def summarise(scores: dict[str, list[float]]) -> dict[str, float]:
    """heldout_ce, heldout_ppl = exp(heldout_ce) (perplexity of the mean per-block CE) and heldout_top1, with
    their 95% intervals over blocks."""
    ce = mean_ci(scores["ce"])
    top1 = proportion_ci(scores["top1"])
    return {**ce.flat("heldout_ce"), "heldout_ppl": math.exp(ce.mean), "heldout_ppl_ci_lo": math.exp(ce.lo),
            "heldout_ppl_ci_hi": math.exp(ce.hi), **top1.flat("heldout_top1")}

