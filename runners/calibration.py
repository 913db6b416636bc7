"""Calibration runner (issue 31): every system's verdict against null signals and known doses.

For each system of `calibration.systems` (its entry: attacks/NAME/calibration.py, named on its entry of
harness/systems.py), `calibration.trials` null trials and `calibration.dosed_trials` trials per dose;
results.json holds per system `false_leak_rate`, `certify_rate` and `power` (per dose), each a proportion with
its Clopper–Pearson 95% interval, the null statistic's spread, the margin the sample size can certify, and the
issue's acceptance checks, measured and reported whether they pass or not.

    splitbench experiment=calibration_smoke
    splitbench experiment=calibration
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from harness import run_identity
from harness.results import RunContext
from runners import common


def _margins() -> dict[str, Any]:
    """Each calibrated system's calibration module (harness/calibration_config.py), by the config sections
    whose reads sit under `system_margins` in its hash (the module's MARGINS), the layout its finished runs
    were hashed in."""
    from harness import calibration_config

    modules = [calibration_config.module(name) for name in calibration_config.SYSTEMS]
    return {section: m for m in modules for section in getattr(m, "MARGINS", ())}


def describe_skip(cfg: DictConfig) -> str | None:
    return None


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """Its own section, the model (the collab entry's cloud and every entry's tokenizer), the margins it reads
    from each system's section, the sequential attacker's recall threshold and MAP reference, the engine's σ settings
    (harness/run_identity.py READS), the margins grouped as its finished runs' hashes have them."""
    out = run_identity.semantic_config(cfg)
    margins = {}
    for section, module in _margins().items():   # a module may reshape its part (splitee: `hashed_margins`)
        hashed = getattr(module, "hashed_margins", None)
        margins[section] = out.pop(section) if hashed is None else hashed(out.pop(section))
    return {**out, "system_margins": margins}


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import time

    import torch

    from attacks import calibration
    from harness.models import load_model

    c = cfg.calibration
    torch.set_num_threads(int(c.threads))
    loaded = load_model(cfg.model, cache_dir=cfg.paths.cache_dir)
    entries = calibration.entries()
    systems, seconds = {}, {}
    for i, name in enumerate(c.systems):
        start = time.perf_counter()
        entry = entries[name](cfg, loaded)
        systems[name] = calibration.calibrate(entry, int(c.trials), int(c.seed) + i, int(c.dosed_trials),
                                              float(c.plan_target))
        seconds[name] = time.perf_counter() - start
    metrics: dict[str, Any] = {}
    for name, r in systems.items():
        metrics[f"{name}_false_leak_rate"] = r["false_leak_rate"]["rate"]
        metrics[f"{name}_false_leak_rate_ci_hi"] = r["false_leak_rate"]["ci"][1]
        metrics[f"{name}_certify_rate"] = r["certify_rate"]["rate"]
        gate = r["power_at_gate_dose"]
        metrics[f"{name}_power_at_gate_dose"] = None if gate is None else gate["rate"]
        metrics[f"{name}_zero_spread_certifications"] = r["zero_spread_certifications"]
        metrics[f"{name}_zero_width_intervals"] = r["zero_width_intervals"]
        for null, x in r.get("extra_nulls", {}).items():     # collab: random ids with 2× the null's steps
            metrics[f"{name}_{null}_false_leak_rate"] = x["false_leak_rate"]["rate"]
            metrics[f"{name}_{null}_certify_rate"] = x["certify_rate"]["rate"]
        for null, x in r.get("engine_nulls", {}).items():   # collab: its nulls through the engine (issue 51)
            metrics[f"{name}_{null}_false_leak_rate"] = x["false_leak_rate"]["rate"]
            metrics[f"{name}_{null}_certify_rate"] = x["certify_rate"]["rate"]
            metrics[f"{name}_{null}_zero_spread_certifications"] = x["zero_spread_certifications"]
        pub = r.get("published")
        if pub is not None:     # the verdict at the n its committed reports use (issue 51 item 4)
            metrics[f"{name}_published_n"] = pub["n"]
            for key in ("false_leak_rate", "certify_rate", "power_at_gate_dose"):
                if key in pub:
                    metrics[f"{name}_published_{key}"] = pub[key]["rate"]
        for attacker, a in r.get("by_attacker", {}).items():   # splitee: MAP's own (and against the other reference)
            metrics[f"{name}_{attacker}_false_leak_rate"] = a["false_leak_rate"]["rate"]
            metrics[f"{name}_{attacker}_false_leak_rate_ci_hi"] = a["false_leak_rate"]["ci"][1]
            metrics[f"{name}_{attacker}_certify_rate"] = a["certify_rate"]["rate"]
            if "null_statistic_mean_pp" in a:
                metrics[f"{name}_{attacker}_null_statistic_mean_pp"] = a["null_statistic_mean_pp"]
    results = {
        **common.results_header(cfg, "calibration", model=loaded, workload="calibration:null-and-dosed-trials",
                                n_prompts=int(c.trials), generation=False),
        "configuration": "calibration", "epsilon": None,
        "metrics": metrics, "systems": systems, "timings": {"seconds_per_system": seconds},
        "metric_definitions": DEFINITIONS,
    }
    return common.finish(cfg, ctx, results, [], summary=summary,
                         provenance_extra={"torch_threads": torch.get_num_threads()})


DEFINITIONS = {
    "systems.<system>.false_leak_rate": "share of null trials the system's verdict read as leak, {k, n, rate, "
                                        "ci: Clopper-Pearson 95%}",
    "systems.<system>.certify_rate": "share of null trials read at_chance (the verdict's power to certify)",
    "systems.<system>.zero_spread_certifications": "at_chance calls (null and dosed trials) whose verdict "
                                                   "interval had zero width; 0 since at_chance reads the bound "
                                                   "the sample earned (metrics/equivalence.py, issue 51)",
    "systems.<system>.zero_width_intervals": "trials (null and dosed) whose data interval had zero width, whatever "
                                             "their verdict: the corner the earned bound exists for",
    "systems.<system>.extra_nulls": "further nulls read with the same verdict, each with false_leak_rate and "
                                    "certify_rate (collab: long_random_ids, random ids with 2x the null's steps)",
    "systems.<system>.engine_nulls": "collab: nulls built through the engine at its published n (issue 51), "
                                     "random_ids_along_undefended_steps and dp_fusion_eps0_edge, each read by the "
                                     "runner's verdict: trials, false_leak_rate, certify_rate (Clopper-Pearson), "
                                     "null_statistic_mean_pp, zero_spread_certifications",
    "systems.<system>.published": "the verdict at the n its committed reports use (issue 51 item 4): n, source, the "
                                  "sizing rule's predictions there (sizing, sizing_from: planned or measured), "
                                  "n_needed_80pct, and `note`, the sentence a report prints where that n cannot "
                                  "certify the margin (null where it can); collab adds its engine trials' pooled "
                                  "false_leak_rate and certify_rate and power_at_gate_dose",
    "systems.<system>.power": "per dose (pp, in the unit dose_unit says), the share of dosed trials read as leak",
    "systems.<system>.certifiable_margin_pp": "the margin the entry's sample size certifies with 80% probability "
                                              "at the null trials' spread (metrics/equivalence.py), or, where the "
                                              "verdict's interval is not a t interval (splitee), the 80th percentile "
                                              "of the null trials' interval reach (certifiable_margin_method)",
    "systems.splitee.by_attacker": "MAP (against its reference, attack.sequential.map_reference: the prior-only "
                                   "floor or MAP on a null view) and the likelihood attacker (against itself on a "
                                   "null view) each on the same null trials; metrics splitee_map_false_leak_rate "
                                   "is MAP's",
    "systems.<system>.references": "per attacker, what its verdict reads against (splitee)",
    "systems.<system>.acceptance": "issue 31: false-leak upper bound <= 10%, power at gate_dose_pp >= 80%, "
                                   "certify rate >= 80%; measured, not enforced",
    "systems.<system>.sizing": "why n is what it is (metrics/equivalence.py): the unit, n, margin and gate dose; "
                               "`planned`: at the planning values of the config (per-unit spreads, or a paired "
                               "proportion's base and discordance rates) the predicted certification probability and "
                               "power at the gate dose at n, and n_needed (for both >= target, calibration.plan_target) "
                               "and n_needed_80pct; `measured`: the same at the values this run measured",
}


def summary(results: dict[str, Any]) -> str:
    from runners.report.calibration import reading

    lines = [f"{results['experiment_name']}: {results['model']} · {results['n_prompts']} null trials per system"]
    for name, r in results["systems"].items():
        fl, cert = r["false_leak_rate"], r["certify_rate"]
        power = ", ".join(f"{d} pp {p['rate']:.0%}" for d, p in r["power"].items())
        planned = (r.get("sizing") or {}).get("planned") or {}
        lines.append(f"  {name:<11} false leak {fl['k']}/{fl['n']} (≤ {fl['ci'][1]:.1%}), at chance {cert['k']}/"
                     f"{cert['n']}, power {power}; certifiable margin "
                     f"{r.get('certifiable_margin_pp', float('nan')):.2f} pp at n = {r['n_examples']} "
                     f"(sized for {planned.get('n_needed', '?')}); zero-spread certifications "
                     f"{r['zero_spread_certifications']} (zero-width intervals {r['zero_width_intervals']})")
        for null, x in {**r.get("extra_nulls", {}), **r.get("engine_nulls", {})}.items():
            lines.append(f"    {null}: false leak {x['false_leak_rate']['k']}/{x['false_leak_rate']['n']}, "
                         f"at chance {x['certify_rate']['k']}/{x['certify_rate']['n']}, zero-spread "
                         f"certifications {x['zero_spread_certifications']}")
        pub = r.get("published")
        if pub is not None:
            gate = pub.get("power_at_gate_dose")
            lines.append(f"    at the published n = {pub['n']}: " + (
                f"power at {pub['gate_dose_pp']:g} pp {gate['k']}/{gate['n']}; " if gate else "") + reading(pub))
    return "\n".join(lines)
