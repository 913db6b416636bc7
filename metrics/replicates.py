"""Metrics over mask replicates: one run's test configuration generated once per mask seed (issue: one mask
realisation is not a distribution).

Each seed's generations are scored against the same baseline (metrics/text.py). The run reports, for every
numeric metric, the mean over seeds; for the 95% intervals, the mean over seeds of each seed's interval over
prompts (the prompts are the sampled unit; the seeds add the mask's own variation, reported separately as
`<metric>_seed_sd`, `_seed_min` and `_seed_max` across seeds). With one seed the metrics are that seed's, unchanged.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def pool(per_seed: Sequence[Mapping[str, Any]], spread: Sequence[str]) -> dict[str, Any]:
    """The mean over seeds of every numeric metric (booleans and strings taken from the first seed when all
    seeds agree, else None), plus the spread across seeds of each metric named in `spread`."""
    if not per_seed:
        raise ValueError("pool needs the metrics of at least one mask seed")
    if len(per_seed) == 1:
        return dict(per_seed[0])
    out: dict[str, Any] = {}
    for key in per_seed[0]:
        values = [m.get(key) for m in per_seed]
        numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numeric) == len(values):
            out[key] = statistics.fmean(numeric)
        else:
            out[key] = values[0] if all(v == values[0] for v in values) else None
    for key in spread:
        values = [m.get(key) for m in per_seed]
        if all(isinstance(v, (int, float)) for v in values):
            out[f"{key}_seed_sd"] = statistics.stdev(values)
            out[f"{key}_seed_min"] = min(values)
            out[f"{key}_seed_max"] = max(values)
    return out
