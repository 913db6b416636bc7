"""Models by the names `model=` takes: a benchmark's --model NAME loads conf/model/NAME.yaml, the entry the
CLI composes, so a benchmark and a run of the same name load the same weights."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

MODELS = Path(__file__).resolve().parents[1] / "conf" / "model"


def load_named_model(name: str):
    """harness.models.load_model on conf/model/<name>.yaml; an unknown name exits with one line, code 2."""
    from harness.models import load_model

    path = MODELS / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in MODELS.glob("*.yaml")))
        print(f"benchmarks: error: unknown model {name!r}; conf/model has: {known}", file=sys.stderr)
        raise SystemExit(2)
    return load_model(OmegaConf.load(path))
