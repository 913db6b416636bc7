"""The fidelity section's rows and tables (runners/report/splitee/fidelity.py, paper Table 2): a row is one finished
fidelity run, a group the rows whose numbers are comparable. Its own module so that the example responses
under each table (example_responses.py, paper Table 3), which fidelity.py renders, can read them without
importing fidelity.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runners.report.format import ci, configuration_label, file_slug, tagged
from runners.report.runs import Run


@dataclass
class FidelityRow:
    run: Run
    configuration: str
    epsilon: float | None           # the knob's ε where the configuration takes it; None for the others
    epsilon_mean: float | None      # the mean per-token ε actually used (epn: mean of 1/√n)
    variant: str
    n_prompts: int | None
    metrics: dict[str, Any]

    def label(self, show_variant: bool = False) -> str:
        text = configuration_label(self.configuration, self.epsilon, self.epsilon_mean)
        return f"{text} · {self.variant}" if show_variant and self.variant else text

    def ci(self, key: str) -> tuple[float | None, float | None, float | None]:
        return ci(self.metrics, key)


@dataclass
class FidelityGroup:
    """Runs whose numbers are comparable: same experiment, model, workload, output length, baseline,
    similarity model and tags."""

    experiment_name: str
    model: str
    workload: str
    max_new_tokens: int | None
    baseline: str | None
    semantic_model: str | None
    tags: tuple[str, ...]
    rows: list[FidelityRow]

    @property
    def title(self) -> str:
        parts = [self.model, self.workload, f"{self.max_new_tokens} new tokens", f"baseline {self.baseline}"]
        return tagged(f"{self.experiment_name}: " + " · ".join(str(p) for p in parts), self.tags)

    @property
    def variants(self) -> list[str]:
        return sorted({r.variant for r in self.rows})

    @property
    def show_variant(self) -> bool:
        """Name each row's overrides only when they differ between rows (else the header says them)."""
        return len(self.variants) > 1

    @property
    def slug(self) -> str:
        raw = "_".join(str(x) for x in (self.experiment_name, self.model, self.workload, self.max_new_tokens,
                                         *self.tags))
        return file_slug(raw)
