"""Models by the names `model=` takes, for the benchmarks' --model NAME: harness.models.model_entry's file,
so a benchmark and a run of the same name load the same weights; an unknown name ends the benchmark with
one line and exit code 2, as the CLI does."""
from __future__ import annotations

import sys

from harness.errors import UserError


def load_named_model(name: str):
    from harness.models import load_model, model_entry

    try:
        entry = model_entry(name)
    except UserError as err:
        print(f"benchmarks: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return load_model(entry)
