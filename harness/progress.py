"""Progress bars for every loop a person waits on (generation, training, capture, federated rounds).

One place decides how they look and when they stay quiet: they draw on stderr only when stderr is a
terminal (tqdm's disable=None), so CI logs, pipes and sweep-job logs get no bar noise, and they disappear
when done (leave=False) so the terminal keeps the results table.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def progress(iterable: Iterable[T] | None = None, *, desc: str, total: int | None = None, unit: str = "step",
             **kwargs: Any) -> Any:
    """A tqdm bar over `iterable` (or a manual one of `total` steps: call .update(n), then .close()).
    The rate and ETA are tqdm's own, in `unit`s per second (e.g. unit="token" for generation)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, file=sys.stderr, disable=None,
                dynamic_ncols=True, **kwargs)
