"""The rotated order in which side-by-side measurements run their arms (benchmarks/rounds.py, the timing
runner): round r starts at arm r, so no arm is always first, where a warm-up, a cold cache, a clock boost
or a noisy neighbour would favour it."""
from __future__ import annotations

from collections.abc import Sequence


def rotated(names: Sequence[str], r: int) -> list[str]:
    """Round r's order: `names` rotated left by r."""
    k = r % len(names)
    return [*names[k:], *names[:k]]
