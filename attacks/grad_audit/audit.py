"""One audit of the decoy trainer end to end (paper 004): the protocol of protocol.py run over the seeds the
trainer trains (harness/grad_audit/seed_run.py). The explore seeds choose the probe's regularisation, the
protocol is locked (protocol.json in the run directory) before any scored seed trains, then every
replicate and test seed is trained, recorded and scored, and the scored seeds are pooled and gated. With
`grad_audit.bisr_backward.enabled`, BiSR's backward stage (bisr_backward.py) attacks the returned gradient of
each scored seed's last frames, and its verdict joins the run's (worst of)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attacks import controls
from attacks.grad_audit import bisr_backward, protocol


@dataclass
class Audit:
    """What one audit measured."""

    l2: dict[str, float]               # each arm's locked probe regularisation
    exploration: list[dict[str, Any]]  # the explore seeds' effects per l2
    protocol: dict[str, Any]           # the locked protocol
    digest: str                        # protocol.json's sha256
    metrics: dict[str, Any]            # pooled and gated (protocol.summarise)
    seeds: list[dict[str, Any]]        # each scored seed's record (protocol.seed_record)
    losses: dict[str, list[float]]     # each scored seed's per-step training loss, by "loss/<phase>_seed<seed>"
    bisr: bisr_backward.BisrSettings | None  # BiSR(b)'s settings, None when it did not run
    roc: dict[str, Any]                # the per-row scores as membership-style tests (protocol.roc_tests)


def audit(loaded: Any, blocks: Any, topology: Any, g: Any, meta: dict[str, Any], *, configuration: str,
          run_dir: Path) -> Audit:
    """Audit the trainer of `topology` (harness.grad_audit.trainer.TopologySettings) on `loaded`'s model over
    `blocks` with the grad_audit section `g`; `meta`: the adversary views' meta."""
    from harness.grad_audit.seed_run import train_seed
    from harness.grad_audit.trainer import base_ce

    bisr = bisr_backward.BisrSettings.from_config(g.bisr_backward) if g.bisr_backward.enabled else None

    def train(seed: int, phase: str, attacked_frames: int = 0):
        return train_seed(loaded.model, blocks, topology, seed=seed, frames=g.train.frames, real_rows=g.real_rows,
                          decoy_rows=g.decoy_rows, meta=meta, desc=f"{phase} seed {seed}",
                          init_blocks=g.train.init_blocks, curve_points=int(g.train.curve_points),
                          cloud_output_frames=attacked_frames)

    l2, exploration = protocol.explore([train(s, "explore") for s in g.seeds.explore], g.probe)
    proto = protocol.protocol(g, l2, configuration=configuration, model=loaded.name)
    digest = protocol.lock(proto, run_dir)            # locked before any scored seed trains
    reference = base_ce(loaded.model, blocks.heldout)
    losses: dict[str, list[float]] = {}
    attacked = []                                     # BiSR(b) per scored seed

    def scored_seed(seed: int, phase: str) -> dict[str, Any]:
        run = train(seed, phase, bisr.frames if bisr else 0)
        losses[f"loss/{phase}_seed{seed}"] = [float(x) for x in run.losses]
        if bisr:
            attacked.append(bisr_backward.attack_seed(run, loaded.model, topology, bisr, int(g.real_rows)))
        return protocol.score_seed(run, reference, proto, phase)

    scored = [scored_seed(s, phase) for phase in ("replicate", "test") for s in g.seeds[phase]]
    tests = protocol.roc_tests(scored, list(g.probe.arms))
    metrics = protocol.summarise(scored, proto, reference, tests)
    if bisr:
        metrics.update(bisr_backward.summarise(attacked, float(g.gates.probe_margin_pp),
                                               float(g.gates.positive_margin_pp)))
        metrics["verdict"] = controls.worst([metrics["verdict"], metrics["bisr_b_verdict"]])
    th = proto["thresholds"]
    seeds = [protocol.seed_record(s, th["alpha"], th["bonferroni_m"]) for s in scored]
    return Audit(l2, exploration, proto, digest, metrics, seeds, losses, bisr, tests)
