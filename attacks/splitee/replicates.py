"""The mask replicates of one attack run (`mask_seeds`): the evaluation prompts masked afresh under each
seed while the attackers are trained once (attacks/splitee/pipeline.py caches them), each replicate one
Table 6 cell (attacks/splitee/suite.py), pooled into the run's metrics with every verdict the worst over the
seeds, so that a replicate that leaks is never averaged away."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Reported with their spread across mask seeds; the verdicts are the worst over seeds, not a mean.
SEED_SPREAD = ("token_f1", "token_precision", "token_recall", "semantic_similarity", "bayes_top1", "bayes_token_f1")
VERDICT_KEYS = ("attack_verdict", "bayes_verdict", "verdict")


@dataclass
class Replicates:
    """One attack cell per mask seed, in the order of `seeds`."""

    seeds: list[int]
    cells: list[Any]    # attacks.splitee.suite.Cell

    def metrics(self, privacy: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        """results.json `metrics` (pooled over the seeds; the accounting's flat `privacy` keys in each) and
        `per_mask_seed` (each seed's spread and verdict keys; None for one seed)."""
        per_seed = [c.metrics(privacy) for c in self.cells]
        record = None if len(self.seeds) == 1 else [
            {"mask_seed": s, "metrics": {k: m.get(k) for k in (*SEED_SPREAD, *VERDICT_KEYS)}}
            for s, m in zip(self.seeds, per_seed)]
        return pool_mask_seeds(per_seed), record

    def roc(self, prompts: Sequence[Sequence[int]]) -> dict[str, dict[str, Any]]:
        """The learned attacker's and the Bayes attacker's per-prompt token F1 as membership-style tests
        (metrics/roc.py): each reconstruction against its own prompt and against the next prompt, re-paired
        within its mask seed (metrics.privacy.repaired_f1), pooled over the seeds. `prompts`: the evaluation
        prompts' token ids."""
        from attacks import controls
        from metrics import roc
        from metrics.privacy import REPAIRED_NEGATIVE, REPAIRED_POSITIVE, repaired_f1

        def pooled(guesses_by_seed: list[list[list[int]]]) -> dict[str, Any]:
            sides = [repaired_f1(prompts, g, controls.PRF_MODE) for g in guesses_by_seed]
            return roc.roc([v for own, _ in sides for v in own], [v for _, other in sides for v in other],
                           positive=REPAIRED_POSITIVE, negative=REPAIRED_NEGATIVE)

        tests = {"learned": pooled([c.reconstructions for c in self.cells])}
        if all(c.bayes is not None for c in self.cells):
            tests["bayes"] = pooled([c.bayes["guesses"] for c in self.cells])
        return tests

    def samples(self, prompts: Sequence[Any]) -> list[dict[str, Any]]:
        """samples.jsonl: the first seed's rows, with every seed's reconstruction where there are several."""
        samples = self.cells[0].samples(prompts)
        if len(self.seeds) > 1:
            for i, row in enumerate(samples):
                row["output_ids_by_mask_seed"] = {str(s): c.reconstructions[i] for s, c in zip(self.seeds, self.cells)}
        return samples


def attack_replicates(pipe: Any, seeds: Sequence[int], configuration: str, epsilon: float | None,
                      attack: Mapping[str, Any], *, semantic_model: Any) -> Replicates:
    """The cell `attack` names under each mask seed of `seeds` (pipe: attacks.splitee.pipeline.Pipeline)."""
    from attacks.splitee import suite

    cells = []
    for mask_seed in seeds:   # mask replicates: the prompts masked afresh, the attackers trained once
        pipe.mask_seed = mask_seed
        cells.append(suite.attack_cell(pipe, configuration, epsilon, attack, semantic_model=semantic_model))
    return Replicates(list(seeds), cells)


def pool_mask_seeds(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's metrics over its mask replicates (metrics/replicates.py `pool`: means, each interval the
    mean of the seeds' intervals, the spread across seeds), with each verdict the worst over the seeds, so
    that a replicate that leaks is never averaged away."""
    from attacks import controls
    from metrics.replicates import pool

    if len(per_seed) == 1:
        return dict(per_seed[0])
    m = pool(per_seed, spread=[k for k in SEED_SPREAD if per_seed[0].get(k) is not None])
    for key in VERDICT_KEYS:
        m[key] = controls.worst([s.get(key) for s in per_seed])
    m["attack_gate"] = m["attack_verdict"] == controls.AT_CHANCE
    if m.get("bayes_verdict") is not None:
        m["bayes_gate"] = m["bayes_verdict"] == controls.AT_CHANCE
    return m
