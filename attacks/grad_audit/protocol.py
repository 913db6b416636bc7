"""The audit protocol of paper 004, locked before scoring: explore, lock, score, pool, gate.

1. explore (seeds 42–47 in the paper): each arm's probe regularisation is chosen from `l2_grid` by the mean
   paired effect over the explore seeds. Nothing else is tuned.
2. lock: the protocol (seeds to score, per-arm l2, top_k, target, thresholds, α and the Bonferroni count m,
   the control dose, the decision rules) is written to protocol.json in the run directory *before* any
   scored seed is trained; results.json records its sha256.
3. score (replicate and test seeds): per seed, the partition attacks (attacks/grad_audit/partition.py), the
   probe per arm with its locked l2 and its shuffled-label twin (the probe's bias), the dosed positive
   controls on the gradient arm put at the floor (attacks/grad_audit/probe.dosed_control: dose 0 and
   gates.injected_doses_pp), the held-out cross-entropy increase over the unsplit model and its curve.
4. pool and gate: per arm, the DerSimonian–Laird pool of the per-seed paired effects
   (metrics/random_effects.py). The privacy gate fails when any scored cell's Bonferroni–Wilson upper bound
   exceeds the constant guess by more than probe_margin_pp + offset, offset = min(0, that cell's
   shuffled-label effect): the gate moved by the probe's measured bias (issue 31). The utility gate passes
   when the mean held-out CE increase is at most utility_max_nats and every seed converged (its CE fell by
   at most train.flat_nats over the curve's last segment); it is `unknown` otherwise.

Verdicts (attacks/controls.py vocabulary): the probe's is `classify` of the headline arm's pooled effect
interval against 0 with margin probe_margin_pp and the probe controls of every scored seed; the partition's
is the norm-rank attacker's (attacks/grad_audit/partition.py); the run's `verdict` is the worst of the two.
"""
from __future__ import annotations

import hashlib
import statistics
from pathlib import Path
from typing import Any

import torch

from attacks import controls
from attacks.grad_audit.partition import partition_attack, returned_gradients
from attacks.grad_audit.probe import (
    arm_tensors,
    dosed_control,
    earned_pp,
    fit_probe,
    probe_rows,
    row_scores,
    run_probe,
    score_probe,
)
from harness.results import atomic_write_json
from metrics import roc
from metrics.intervals import mean_ci
from metrics.random_effects import dersimonian_laird

CONTROL_ARM = "gradient"   # the probe's controls run on the channel under audit
PARTITION_TEST = "partition_norm"


def roc_tests(scored: list[dict[str, Any]], arms: list[str]) -> dict[str, dict[str, Any]]:
    """The per-row scores of the scored seeds, pooled, as membership-style tests (metrics/roc.py): the norm-rank
    attacker's gradient norm of real rows against decoys, and each arm's probe: the log-probability of a row's
    own token from its own features against from another row's."""
    def pooled(pairs):
        pairs = list(pairs)
        return [v for pos, _ in pairs for v in pos], [v for _, neg in pairs for v in neg]

    tests = {PARTITION_TEST: roc.roc(*pooled(s["partition"]["row_norms"] for s in scored),
                                     positive="returned-gradient norm of each real row",
                                     negative="returned-gradient norm of each decoy row")}
    for arm in arms:
        tests[f"probe_{arm}"] = roc.roc(*pooled(s["cells"][arm]["row_scores"] for s in scored),
                                        positive=f"probe ({arm}) log-probability of a scored row's token from its "
                                                 "own features",
                                        negative="the same from another row's features (rows permuted against "
                                                 "their labels)")
    return tests


def _split(view, truth, arm: str, target: str):
    feats = arm_tensors(view, arm)
    return probe_rows(feats, truth, 0, target), probe_rows(feats, truth, 1, target)


def explore(runs: list[Any], probe: Any) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Per arm, the l2 of `probe.l2_grid` with the largest mean paired effect over the explore seeds."""
    chosen, table = {}, []
    for arm in probe.arms:
        means = {}
        for l2 in probe.l2_grid:
            effects = []
            for run in runs:
                train, test = _split(run.view, run.truth, arm, probe.target)
                cell = run_probe(train, test, top_k=probe.top_k, l2=l2, max_iter=probe.max_iter,
                                 max_rows=probe.max_rows, seed=run.seed)
                effects.append(cell.effect_pp)
                table.append({"seed": run.seed, "arm": arm, "l2": float(l2), "effect_pp": cell.effect_pp})
            means[float(l2)] = statistics.fmean(effects)
        chosen[arm] = max(means, key=lambda k: (means[k], -k))
    return chosen, table


def protocol(g: Any, l2: dict[str, float], *, configuration: str, model: str) -> dict[str, Any]:
    """The locked protocol: everything the scoring may use, fixed before it starts."""
    scored = [*g.seeds.replicate, *g.seeds.test]
    arms = list(g.probe.arms)
    return {
        "paper": "004 (returned-gradient audit)",
        "configuration": configuration, "model": model,
        "topology": {"cut_after": g.cut_after, "resume_at": g.resume_at, "latent_dim": g.latent_dim,
                     "real_rows": g.real_rows, "decoy_rows": g.decoy_rows, "block_tokens": g.block_tokens,
                     "clip": g.clip, "noise_ratio": g.noise_ratio, "frames": g.train.frames,
                     "init": g.train.init},
        "seeds": {"explore": list(g.seeds.explore), "replicate": list(g.seeds.replicate), "test": list(g.seeds.test)},
        "probe": {"arms": arms, "l2": l2, "top_k": g.probe.top_k, "target": g.probe.target,
                  "max_iter": g.probe.max_iter, "max_rows": g.probe.max_rows, "control_arm": CONTROL_ARM},
        "thresholds": {"probe_margin_pp": g.gates.probe_margin_pp, "partition_margin_pp": g.gates.partition_margin_pp,
                       "alpha": g.gates.alpha,
                       "bonferroni_m": len(scored) * len(arms), "utility_max_nats": g.gates.utility_max_nats,
                       "injected_doses_pp": list(g.gates.injected_doses_pp),
                       "positive_margin_pp": g.gates.positive_margin_pp, "flat_nats": g.train.flat_nats,
                       "per_item_bound_pp": g.gates.per_item_bound_pp},
        "rules": {
            "gate": "fail if any scored (seed, arm) cell has Bonferroni-Wilson UB(probe accuracy) - constant "
                    "accuracy > probe_margin_pp + offset, offset = min(0, that cell's shuffled-label probe "
                    "effect): the gate moved by the probe's measured bias below the constant guess",
            "positive_control": "per seed, on the control arm made to sit at the floor (features permuted against "
                                "labels) with a token code injected at each dose of injected_doses_pp: passes when "
                                "the gate fires on every dose and does not fire at dose 0 (the floor arm itself)",
            "utility_gate": "pass if mean held-out CE increase over the unsplit model <= utility_max_nats and every "
                            "scored seed converged (its held-out CE fell by at most flat_nats over the curve's last "
                            "segment); unknown when a seed had not converged",
            "probe_verdict": "attacks.controls.classify on the headline arm's DerSimonian-Laird pooled effect "
                             "interval vs 0, margin probe_margin_pp, with every scored seed's probe controls; "
                             "at_chance reads the interval the rows earned at per_item_bound_pp",
            "partition_verdict": "attacks.controls.classify on the norm-rank row agreement vs its chance "
                                 "agreement, margin partition_margin_pp, with its planted / other-frame-label controls; "
                                 "at_chance reads the interval the rows earned at per_item_bound_pp",
        },
    }


def lock(proto: dict[str, Any], run_dir: Path) -> str:
    """Write protocol.json (atomically) before scoring; its sha256 goes into results.json."""
    path = Path(run_dir) / "protocol.json"
    atomic_write_json(path, proto)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def score_seed(run: Any, base_ce: torch.Tensor, proto: dict[str, Any], phase: str) -> dict[str, Any]:
    """Every measurement of one scored seed."""
    p, th = proto["probe"], proto["thresholds"]
    t = proto["topology"]
    part = partition_attack(returned_gradients(run.view), run.truth.is_real, t["real_rows"],
                            margin_pp=th["partition_margin_pp"], positive_margin_pp=th["positive_margin_pp"],
                            seed=run.seed, per_item_bound_pp=th["per_item_bound_pp"])
    cells = {}
    margin = th["probe_margin_pp"]
    for arm in p["arms"]:
        train, test = _split(run.view, run.truth, arm, p["target"])
        kw = dict(top_k=p["top_k"], l2=p["l2"][arm], max_iter=p["max_iter"], max_rows=p["max_rows"], seed=run.seed)
        probe = fit_probe(train, **kw)
        cell = score_probe(probe, test)
        # The probe's bias: on shuffled labels it sits below the constant guess; the gate moves down by it.
        neg = run_probe(train, test, shuffle_labels=True, **kw)
        offset = min(0.0, neg.effect_pp)
        ub = cell.upper_bound_pp(th["alpha"], th["bonferroni_m"])
        cells[arm] = {"cell": cell, "upper_bound_pp": ub, "negative": neg, "offset_pp": offset,
                      "gate_fires": ub > margin + offset, "row_scores": row_scores(probe, test, run.seed + 5)}
        if arm == p["control_arm"]:
            dosed = []
            # dose 0 first: the floor arm itself. A gate that fires there too cannot tell a leak from none.
            for dose in [0.0, *th["injected_doses_pp"]]:
                pos, expected = dosed_control(train, test, dose_pp=float(dose), **kw)
                pub = pos.upper_bound_pp(th["alpha"], th["bonferroni_m"])
                dosed.append({"dose_pp": float(dose), "expected_pp": expected, "effect_pp": pos.effect_pp,
                              "ci_pp": list(pos.ci_pp), "upper_bound_pp": pub, "gate_fires": pub > margin + offset})
            cells[arm].update(negative_pass=neg.ci_pp[1] <= margin, dosed=dosed,
                              positive_pass=not dosed[0]["gate_fires"] and all(d["gate_fires"] for d in dosed[1:]))
    diff = (run.heldout_ce - base_ce).tolist()
    curve = [list(point) for point in run.ce_curve]
    converged = len(curve) >= 2 and curve[-2][1] - curve[-1][1] <= th["flat_nats"]
    clips = run.clip_record
    return {"seed": run.seed, "phase": phase, "partition": part, "cells": cells, "ce_increase": diff,
            "ce_split": float(run.heldout_ce.mean()), "final_loss": run.losses[-1], "ce_curve": curve,
            "converged": bool(converged),
            "clipped": sum(c[1] for c in clips), "positions": sum(c[2] for c in clips),
            "clips": [c[0] for c in clips]}


def summarise(scored: list[dict[str, Any]], proto: dict[str, Any], base_ce: torch.Tensor,
              tests: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The flat results.json metrics of the scored seeds (module docstring); the ROC of the partition attacker
    unprefixed (`auc`, `tpr_at_fpr`), of the headline arm's probe `probe_`-prefixed (`tests`: `roc_tests`'
    records, computed here when not given)."""
    p, th = proto["probe"], proto["thresholds"]
    margin = th["probe_margin_pp"]
    m: dict[str, Any] = {}
    tests = roc_tests(scored, p["arms"]) if tests is None else tests
    zs = [s["partition"]["zero_support"] for s in scored]
    nr = [s["partition"]["norm_rank"] for s in scored]
    m["zero_support_agreement"] = sum(a.rows_agree for a in zs) / sum(a.rows for a in zs)
    m["zero_support_frames_identified"] = sum(a.frames_identified for a in zs)
    m["frames_scored"] = sum(a.frames for a in zs)
    m["norm_rank_agreement_pct"] = 100 * sum(a.rows_agree for a in nr) / sum(a.rows for a in nr)
    m["norm_rank_frames_identified"] = sum(a.frames_identified for a in nr)
    m["partition_chance_agreement_pct"] = scored[0]["partition"]["chance_agreement_pct"]
    m["partition_verdict"] = controls.worst([s["partition"]["verdict"] for s in scored])
    m["partition_controls_pass"] = all(s["partition"]["positive_pass"] and s["partition"]["negative_pass"]
                                       for s in scored)
    pooled = {}
    for arm in p["arms"]:
        cells = [s["cells"][arm]["cell"] for s in scored]
        pool = dersimonian_laird([c.effect_pp for c in cells], [c.variance_pp2 for c in cells])
        pooled[arm] = pool
        m[f"probe_effect_pp_{arm}"] = pool.mean
        m[f"probe_effect_pp_{arm}_ci_lo"], m[f"probe_effect_pp_{arm}_ci_hi"] = pool.lo, pool.hi
        m[f"probe_tau2_{arm}"] = pool.tau2
        m[f"probe_upper_bound_pp_{arm}"] = max(s["cells"][arm]["upper_bound_pp"] for s in scored)
        m[f"probe_accuracy_pct_{arm}"] = 100 * sum(c.probe_correct for c in cells) / sum(c.n for c in cells)
    head = max(p["arms"], key=lambda a: pooled[a].mean)
    m["probe_arm"] = head
    m["probe_effect_pp"], m["probe_effect_pp_ci_lo"], m["probe_effect_pp_ci_hi"] = (
        pooled[head].mean, pooled[head].lo, pooled[head].hi)
    m["probe_upper_bound_pp"] = max(m[f"probe_upper_bound_pp_{a}"] for a in p["arms"])
    cells = [s["cells"][head]["cell"] for s in scored]
    m["probe_accuracy_pct"] = m[f"probe_accuracy_pct_{head}"]
    m["constant_guess_accuracy_pct"] = 100 * sum(c.const_correct for c in cells) / sum(c.n for c in cells)
    m["probe_rows_scored"] = sum(c.n for c in cells)
    every = [s["cells"][a] for s in scored for a in p["arms"]]
    m["gate"] = "fail" if any(c["gate_fires"] for c in every) else "pass"
    m["probe_gate_offset_pp"] = min(c["offset_pp"] for c in every)
    m["probe_upper_bound_over_gate_pp"] = max(c["upper_bound_pp"] - c["offset_pp"] for c in every)
    for arm in p["arms"]:
        m[f"probe_bias_pp_{arm}"] = statistics.fmean(s["cells"][arm]["negative"].effect_pp for s in scored)
    ctrl = [s["cells"][p["control_arm"]] for s in scored if p["control_arm"] in s["cells"]]
    m["negative_control_effect_pp"] = max((c["negative"].effect_pp for c in ctrl), key=abs, default=None)
    m["negative_control_pass"] = bool(ctrl) and all(c["negative_pass"] for c in ctrl)
    doses = [0.0, *th["injected_doses_pp"]]
    m["positive_control_doses_pp"] = list(doses)
    for j, dose in enumerate(doses):
        key = f"positive_control_{_dose_key(dose)}"
        m[f"{key}_effect_pp"] = min((c["dosed"][j]["effect_pp"] for c in ctrl), default=None)
        m[f"{key}_expected_pp"] = min((c["dosed"][j]["expected_pp"] for c in ctrl), default=None)
        m[f"{key}_gate_fires"] = bool(ctrl) and all(c["dosed"][j]["gate_fires"] for c in ctrl)
        m[f"{key}_gate_fires_seeds"] = sum(bool(c["dosed"][j]["gate_fires"]) for c in ctrl)
    m["positive_control_pass"] = bool(ctrl) and all(c["positive_pass"] for c in ctrl)
    reference = statistics.fmean(s["cells"][head]["offset_pp"] for s in scored)
    m["probe_verdict_reference_pp"] = reference
    # at_chance reads the interval the rows earned (issue 51): the pooled interval widened to at least what every
    # scored row of the headline arm earns as one sample (a probe at the constant guess everywhere pools to [0, 0])
    n_rows, k_rows = sum(c.n for c in cells), sum(c.discordant for c in cells)
    mean_row = sum(c.effect_pp * c.n for c in cells) / n_rows
    var_row = max(0.0, (1e4 * k_rows - n_rows * mean_row ** 2) / max(1, n_rows - 1)) / n_rows
    earned = earned_pp(n_rows, k_rows, pooled[head].mean, var_row, pooled[head].lo, pooled[head].hi,
                       th["per_item_bound_pp"])
    m["probe_effect_pp_earned_ci"] = list(earned)
    m["per_item_bound_pp"] = th["per_item_bound_pp"]
    m["probe_verdict"] = controls.classify(pooled[head].lo, pooled[head].hi, reference, margin,
                                           positive_passed=m["positive_control_pass"],
                                           negative_passed=m["negative_control_pass"], certify=earned)
    m["verdict"] = controls.worst([m["probe_verdict"], m["partition_verdict"]])
    m.update(roc.flat(tests[PARTITION_TEST]))
    m.update(roc.flat(tests[f"probe_{head}"], "probe_"))
    diffs = [d for s in scored for d in s["ce_increase"]]
    ce = mean_ci(diffs)
    m["heldout_ce_increase"], m["heldout_ce_increase_ci_lo"], m["heldout_ce_increase_ci_hi"] = ce.mean, ce.lo, ce.hi
    m["heldout_ce_base"] = float(base_ce.mean())
    m["heldout_ce_split"] = statistics.fmean(s["ce_split"] for s in scored)
    m["converged"] = all(s["converged"] for s in scored)
    m["utility_gate"] = ("unknown" if not m["converged"] else "pass" if ce.mean <= th["utility_max_nats"] else "fail")
    positions = sum(s["positions"] for s in scored)
    # Mitigated runs: the share of real rows' position vectors carrying a gradient that the clip shortened
    # (0.0: nothing was clipped,
    # which is also what an unmitigated run records); the median of the per-frame clips.
    m["clipped_fraction"] = sum(s["clipped"] for s in scored) / positions if positions else 0.0
    clips = [c for s in scored for c in s["clips"]]
    m["grad_clip_median"] = statistics.median(clips) if clips else None
    m["gate_margin_pp"] = margin
    return m


def _dose_key(dose: float) -> str:
    """1.0 → '1pp', 0.5 → '0p5pp': a results.json key part."""
    return f"{float(dose):g}".replace(".", "p") + "pp"


def seed_record(s: dict[str, Any], alpha: float, m: int) -> dict[str, Any]:
    """One scored seed as plain JSON (results.json `seeds`)."""
    part = s["partition"]
    out = {"seed": s["seed"], "phase": s["phase"], "final_loss": s["final_loss"], "ce_split": s["ce_split"],
           "ce_increase": statistics.fmean(s["ce_increase"]), "ce_curve": s["ce_curve"],
           "converged": s["converged"],
           "clipped_fraction": s["clipped"] / s["positions"] if s["positions"] else 0.0,
           "zero_support_agreement": part["zero_support"].rate,
           "zero_support_frames_identified": part["zero_support"].frames_identified,
           "frames": part["zero_support"].frames,
           "norm_rank_agreement_pct": 100 * part["norm_rank"].rate,
           "norm_rank_ci_pct": list(part["norm_rank_ci_pct"]),
           "norm_rank_earned_ci_pct": list(part["norm_rank_earned_ci_pct"]),
           "partition_verdict": part["verdict"], "partition_positive_pass": part["positive_pass"],
           "partition_negative_pass": part["negative_pass"], "arms": {}}
    for arm, c in s["cells"].items():
        cell = c["cell"]
        row = {"n": cell.n, "effect_pp": cell.effect_pp, "ci_pp": list(cell.ci_pp),
               "probe_accuracy_pct": 100 * cell.probe_correct / cell.n,
               "constant_accuracy_pct": 100 * cell.const_correct / cell.n,
               "upper_bound_pp": c["upper_bound_pp"], "negative_effect_pp": c["negative"].effect_pp,
               "gate_offset_pp": c["offset_pp"], "gate_fires": c["gate_fires"]}
        if "dosed" in c:
            row.update(negative_pass=c["negative_pass"], dosed=c["dosed"], positive_pass=c["positive_pass"])
        out["arms"][arm] = row
    return out
