"""The returned-gradient audit runner (paper 004): does the gradient the local node returns unmask the decoys?

One run = one configuration (decoy_trainer as audited, or decoy_mitigated) of the trainer of
harness/grad_audit/ at one topology (cut_after, resume_at, latent_dim) on one model, through the locked
protocol of attacks/grad_audit/protocol.py: the explore seeds choose the probe's regularisation, the
protocol is written to protocol.json, then every replicate and test seed trains the trainer, records what
the cloud receives, and is scored (zero-support partition, norm-rank partition with controls,
frequent-token probe per arm with its negative and positive controls, held-out CE increase); the seeds are
pooled (DerSimonian–Laird) and gated (attacks/grad_audit/audit.py runs it). With
`grad_audit.bisr_backward.enabled`, BiSR's backward stage attacks the returned gradient of each scored seed's
last frames (attacks/grad_audit/bisr_backward.py).

    splitbench experiment=grad_audit_smoke
    splitbench -m experiment=grad_audit configuration=decoy_trainer,decoy_mitigated \\
        grad_audit.corpus.source=text grad_audit.corpus.path=../shared/data/wikitext2/wiki.test.raw
"""
from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig

from harness import configurations, run_identity
from harness.results import RunContext
from runners import common

describe_skip = common.epsilon_ignored_note
EXPERIMENT = "grad_audit"


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """The audit's config hash: without what it ignores; the mitigation's settings only where it runs
    (harness/systems.py: the runner's `reads_only_for`)."""
    return run_identity.semantic_config(cfg, epsilon=None)


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    from attacks.grad_audit.audit import audit
    from harness import adversary_view
    from harness.grad_audit.data import load_text, make_blocks
    from harness.grad_audit.trainer import topology_settings
    from harness.models import load_model

    g, configuration = cfg.grad_audit, cfg.configuration.name
    if g.train.threads is not None:
        torch.set_num_threads(int(g.train.threads))
    loaded = load_model(cfg.model, cache_dir=cfg.paths.cache_dir, placement=g.placement)
    text, source = load_text(g.corpus)
    workload = source.split(" ")[0]
    blocks = make_blocks(text, source, loaded.tokenizer, block_tokens=g.block_tokens,
                         heldout_blocks=g.train.heldout_blocks, min_train_blocks=2 * g.real_rows)
    topo = topology_settings(g, configuration)
    meta = adversary_view.view_meta(cfg, system=configurations.GRAD_AUDIT, epsilon=None, workload=workload)
    out = audit(loaded, blocks, topo, g, meta, configuration=configuration, run_dir=ctx.run_dir.path)
    metrics = out.metrics
    results = {
        **common.results_header(cfg, EXPERIMENT, model=loaded, workload=workload,
                                n_prompts=int(blocks.heldout.shape[0]), generation=False),
        "system": configurations.GRAD_AUDIT, "configuration": configuration, "epsilon": None,
        "corpus": {"source": source, "n_stream_tokens": blocks.n_stream_tokens,
                   "train_blocks": int(blocks.train.shape[0]), "heldout_blocks": int(blocks.heldout.shape[0])},
        "topology": {**out.protocol["topology"], "delegated_layers": g.resume_at - g.cut_after,
                     "n_layers": int(loaded.model.config.num_hidden_layers)},
        "mitigation": None if topo.mitigation is None else {"grad_clip": topo.mitigation[0],
                                                            "clip_quantile": topo.clip_quantile,
                                                            "noise_multiplier": topo.mitigation[1]},
        # the mitigation's σ (grad_audit.mitigation.noise_multiplier), not the epsilon knob; None for the trainer
        "privacy_parameter": configurations.privacy_parameter(
            configuration, None if topo.mitigation is None else topo.mitigation[1]),
        "protocol_sha256": out.digest,
        "protocol_l2": out.l2,
        "exploration": out.exploration,
        "metrics": metrics,
        # The headline keys, also at the top level.
        **{k: metrics[k] for k in ("zero_support_agreement", "probe_effect_pp", "probe_upper_bound_pp", "gate",
                                   "heldout_ce_increase", "verdict", "clipped_fraction", "converged")},
        "bisr_backward": None if out.bisr is None else {**vars(out.bisr), "enabled": True},
        "seeds": out.seeds,
        "roc": out.roc,
        "metric_definitions": DEFINITIONS,
    }
    results["tradeoff"] = _tradeoff(metrics, workload)
    return common.finish(cfg, ctx, results, out.seeds, summary=summary,
                         provenance_extra={"torch_threads": torch.get_num_threads()},
                         placement={"model": loaded.placement()},
                         mirror_history=common.step_history(out.losses))


def _tradeoff(m: dict[str, Any], workload: str) -> dict[str, Any]:
    """Leakage: the stronger (larger excess over its own floor, attacks.controls.strength) of the headline
    probe's accuracy (%) on the real rows, floor the constant guess, and, where it ran, BiSR's backward
    stage's next-token top-1 (%), floor the constant guess on the same labels; utility: the held-out
    perplexity of the unsplit model over the split one's, in % (100·exp(−ΔCE)); both on `workload`'s text,
    the point's setting. Before BiSR(b) was a candidate, the trainer's point read +13 pp (the probe) while
    BiSR(b) read +94."""
    from attacks import controls

    const = m["constant_guess_accuracy_pct"]
    candidates = [{"leakage_metric": "probe_accuracy_pct", "leakage": const + m["probe_effect_pp"],
                   "leakage_ci": (const + m["probe_effect_pp_ci_lo"], const + m["probe_effect_pp_ci_hi"]),
                   "attacker": f"frequent-token probe ({m['probe_arm']})", "leakage_floor": const}]
    if m.get("bisr_b_top1") is not None:
        candidates.append({"leakage_metric": "bisr_b_top1", "leakage": m["bisr_b_top1"],
                           "leakage_ci": (m.get("bisr_b_top1_ci_lo"), m.get("bisr_b_top1_ci_hi")),
                           "attacker": "BiSR backward (next-token labels)", "leakage_floor": m.get("bisr_b_top1_floor")})
    return common.tradeoff(
        **max(candidates, key=lambda c: controls.strength(c["leakage"], c["leakage_floor"])),
        utility_metric="heldout_perplexity_ratio_pct", utility=100 * math.exp(-m["heldout_ce_increase"]),
        utility_ci=(100 * math.exp(-m["heldout_ce_increase_ci_hi"]), 100 * math.exp(-m["heldout_ce_increase_ci_lo"])),
        reference="the unsplit model", setting=workload)


DEFINITIONS = {
    "auc": "the norm-rank attacker's per-row score as a test (metrics/roc.py, results.json roc.partition_norm): the "
           "returned-gradient norm of real rows (positives) against decoys (negatives), scored seeds pooled; "
           "ROC AUC with DeLong's 95% interval; tpr_at_fpr: TPR (%) keyed by the FPR in %, Clopper-Pearson, null "
           "below 1/n_decoys",
    "probe_auc": "the headline arm's probe as a test (roc.probe_<arm>): the log-probability of a scored row's token "
                 "from its own features against from another row's (rows permuted against labels); probe_tpr_at_fpr "
                 "likewise",
    "zero_support_agreement": "share of scored rows whose real/decoy label the zero-support attacker gets right "
                              "(a row is real when its returned gradient has a non-zero entry); paper: 1.000",
    "zero_support_frames_identified": "frames whose every row it labels right, of frames_scored",
    "norm_rank_agreement_pct": "the same for the n_real rows of largest gradient norm; its floor "
                               "partition_chance_agreement_pct; partition_verdict by attacks.controls.classify",
    "probe_effect_pp": "DerSimonian-Laird pool over the scored seeds of the paired accuracy gain (pp) of the "
                       "frequent-token probe over the constant most-frequent-token guess, headline arm probe_arm "
                       "(the arm with the largest pooled effect); _ci_lo/_ci_hi its 95% interval; _earned_ci the "
                       "interval the headline arm's rows earned (metrics/equivalence.py, issue 51), which the "
                       "probe verdict's at_chance reads",
    "probe_upper_bound_pp": "the largest over scored (seed, arm) cells of the Bonferroni-Wilson upper bound of "
                            "the probe's accuracy minus the constant guess's (pp); a cell fails the gate above probe_margin_pp plus "
                            "its offset (see gate)",
    "gate": "the privacy gate: pass when every cell's upper bound <= gate_margin_pp + its offset (min(0, the "
            "cell's shuffled-label probe effect): the gate moved by the probe's measured bias); "
            "probe_upper_bound_over_gate_pp: the largest upper bound minus offset",
    "probe_bias_pp_<arm>": "the shuffled-label probe's effect over the constant guess, mean over scored seeds",
    "clipped_fraction": "share of the real rows' per-position returned-gradient vectors longer than the "
                        "mitigation's clip (0.0 without mitigation); grad_clip_median: the per-frame clips' median",
    "converged": "every scored seed's held-out CE fell by at most train.flat_nats over its curve's last segment "
                 "(seeds[].ce_curve); otherwise utility_gate is unknown",
    "heldout_ce_increase": "mean over held-out blocks and scored seeds of the split pipeline's cross-entropy minus "
                           "the unsplit model's (nats), bootstrap 95% CI; utility_gate passes at <= utility_max_nats",
    "negative_control_effect_pp": "the probe trained on shuffled labels (largest |effect| over seeds); passes when "
                                  "every seed's 95% upper bound <= margin",
    "positive_control_<dose>_effect_pp": "the probe on the gradient arm made to sit at the floor (features "
                                         "permuted against labels) with a token code worth <dose> pp to a perfect "
                                         "reader (smallest over seeds; 0pp is the floor arm itself); _gate_fires: "
                                         "the gate fired on it in every seed; positive_control_pass: it fired at "
                                         "every dose > 0 and at 0pp in no seed",
    "bisr_b_top1": "BiSR's backward stage run by the cloud on the returned gradient of the last "
                   "bisr_backward.frames frames of each scored seed (attacks/grad_audit/bisr_backward.py): % of "
                   "the real rows' label positions (next tokens) it recovers, pooled, Wilson 95%; bisr_b_top1_floor: "
                   "the constant most-frequent-token guess on the same labels",
    "bisr_b_minus_floor_pp": "bisr_b_top1 minus the floor on the same positions (pp), Newcombe's paired 95% "
                             "interval; bisr_b_verdict: attacks.controls.classify of it against 0 with the "
                             "gate's margin and the two controls",
    "bisr_b_decode_top1": "the cloud's own decoding of s_B through the public tail (BiSR's start, no gradient); "
                          "bisr_b_minus_decode_pp: what the returned gradient adds to it",
    "bisr_b_positive_top1": "positive control: BiSR on the undefended gradient of the same frames (passes: its "
                            "difference over the floor has lower bound >= positive_margin_pp)",
    "bisr_b_null_top1": "negative control: BiSR on the gradient of shuffled labels (another real row's) through "
                        "the same mitigation, scored on the true labels (passes: upper bound over the floor <= margin)",
    "bisr_b_seconds": "wall time of the attack and its controls; bisr_b_positions_matched: label positions "
                      "matched (attack and controls), bisr_b_positions: positions scored",
    "verdict": "worst of probe_verdict, partition_verdict and, when it ran, bisr_b_verdict "
               "(leak > inconclusive > at_chance)",
}


def summary(results: dict[str, Any]) -> str:
    m, t = results["metrics"], results["topology"]
    bisr = ([f"  BiSR backward on the returned gradient: top-1 {m['bisr_b_top1']:.2f}% vs floor "
             f"{m['bisr_b_top1_floor']:.2f}% → {m['bisr_b_minus_floor_pp']:+.2f} pp "
             f"[{m['bisr_b_minus_floor_pp_ci_lo']:+.2f}, {m['bisr_b_minus_floor_pp_ci_hi']:+.2f}] "
             f"({m['bisr_b_positions']} positions, {m['bisr_b_seconds']:.0f} s) → {m['bisr_b_verdict']}; "
             f"decoding alone {m['bisr_b_decode_top1']:.2f}%"] if "bisr_b_verdict" in m else [])
    lines = [common.summary_head(results, f"cut {t['cut_after']}→{t['resume_at']} ({t['delegated_layers']} delegated)",
                                 f"D={t['latent_dim']}", f"{len(results['seeds'])} scored seeds"),
             f"  zero-support agreement {m['zero_support_agreement']:.3f} "
             f"({m['zero_support_frames_identified']}/{m['frames_scored']} frames identified); norm rank "
             f"{m['norm_rank_agreement_pct']:.1f}% vs chance {m['partition_chance_agreement_pct']:.1f}% "
             f"→ {m['partition_verdict']}",
             f"  probe ({m['probe_arm']}) effect {m['probe_effect_pp']:+.2f} pp "
             f"[{m['probe_effect_pp_ci_lo']:+.2f}, {m['probe_effect_pp_ci_hi']:+.2f}], Bonferroni-Wilson UB "
             f"{m['probe_upper_bound_pp']:+.2f} pp → gate {m['gate']}; controls: negative "
             f"{'pass' if m['negative_control_pass'] else 'FAIL'}, positive {'pass' if m['positive_control_pass'] else 'FAIL'}",
             f"  held-out CE increase {m['heldout_ce_increase']:.3f} nats → utility gate {m['utility_gate']} "
             f"({'converged' if m['converged'] else 'not converged'}); clipped fraction {m['clipped_fraction']:.3f}",
             *bisr,
             f"  verdict: {m['verdict']} (probe {m['probe_verdict']}, partition {m['partition_verdict']})"]
    return "\n".join(lines)
