"""Floating-point error runner (paper §7.3.2, Table 4): measured unmasking error against the proven bound.

1. Capture (harness/splitee/numerics/op_inputs.py): T3 greedy generation over the workload with the adversary view
   recorded; `fp_error.vectors_per_prompt` real positions per prompt kept for every op instance (the
   Down input through a forward pre-hook: it never crosses). Cached under paths.cache_dir, keyed by
   everything that changes it, so an ε sweep captures once.
2. Instances (harness/splitee/numerics/study.py): every weight matrix of every offloaded op (q, k, v, o, gate, up
   per layer, the LM head), each with its op's Δ; Down per layer as the non-offloaded reference with its
   own Δ (harness/splitee/sensitivity.down_sensitivity). σ = Δ times the configuration's noise factor
   (harness/configurations.py: 1/ε for ep1, √n for epn, 0 for t3).
3. Trials: `fp_error.trials` output elements per instance, in every precision of `fp_error.precisions`
   (Down: `fp_error.down_precisions`) and every kernel, against the exact reference and the bound.

results.json `metrics` (harness/splitee/numerics/summary.py): the headline (the first precision and kernel listed:
fp32 with torch's own kernel by default, as the engine computes) over all offloaded instances —
mean_true_error (with a 95% t interval over instances), mean_bound, bound_ratio, bound_violation_rate (a
fraction, 0–1) — then per op type, per precision × kernel, and Down. `table` holds every summary row;
fp_instances.json every instance's sums; samples.jsonl one line per prompt (the capture's T3 generation).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import configurations, run_identity
from harness.results import RunContext
from runners.common import (
    Inputs,
    epsilon_ignored_note,
    finish,
    load_inputs,
    results_header,
    summary_head,
    workload_record,
)

TABLE_COLUMNS = ("precision", "kernel", "op", "accumulate", "n_trials", "mean_true_error", "mean_bound",
                 "bound_ratio", "bound_violation_rate", "first_order_violation_rate", "n_overflow")


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """What the study depends on: model, workload, configuration, ε (where it is used), seed, the offloaded
    ops, the sensitivity rule, σ's scale and fp_error; generation settings, baseline and the similarity
    model play no part."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name,
                                                                                  cfg.epsilon))


describe_skip = epsilon_ignored_note


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    from harness.errors import UserError
    from harness.splitee.numerics import op_inputs, study, summary

    fp = cfg.fp_error
    configuration = cfg.configuration.name
    if configuration not in study.studied_configurations():
        raise UserError(f"experiment fp_error studies the masks of {', '.join(study.studied_configurations())}; "
                        f"configuration={configuration} has none")
    epsilon = configurations.effective_epsilon(configuration, cfg.epsilon)
    inputs = load_inputs(cfg)
    loaded = inputs.loaded

    started = time.perf_counter()
    captured, capture_info = op_inputs.cached_capture(
        loaded.model, inputs.prompts, cache_dir=cfg.paths.cache_dir, identity=_capture_identity(cfg, inputs),
        new_tokens=int(fp.capture_new_tokens), batch_size=int(fp.capture_batch_size),
        vectors_per_prompt=int(fp.vectors_per_prompt), seed=int(cfg.seed), pad_token_id=inputs.pad,
        include_down=bool(fp.include_down), threads=cfg.engine.tee_threads,
        epsilon_lengths=inputs.epsilon_lengths(cfg.epn_n))
    capture_s = time.perf_counter() - started

    precisions, kernels = list(fp.precisions), list(fp.kernels)
    down_precisions = list(fp.down_precisions) if fp.include_down else []
    started = time.perf_counter()
    found = study.study_model(loaded.model, captured, configuration, epsilon, offload=tuple(cfg.engine.offload),
                              sensitivity_rule=cfg.engine.sensitivity_rule, sigma_scale=float(cfg.engine.sigma_scale),
                              precisions=precisions, kernels=kernels, trials=int(fp.trials),
                              rows_per_vector=int(fp.rows_per_vector), seed=int(cfg.seed),
                              include_down=bool(fp.include_down), down_precisions=down_precisions, threads=fp.threads)
    study_s = time.perf_counter() - started

    table = summary.summary_table(found.stats, list(dict.fromkeys(precisions + down_precisions)), kernels)
    epsilons = configurations.mask_epsilons(configuration, epsilon, inputs.epsilon_lengths(cfg.epn_n))
    metrics = {**summary.flat_metrics(table, precisions[0], kernels[0]),
               # the mean per-row ε (exactly the knob where every row has it); None without noise
               "epsilon_mean": statistics.mean(epsilons) if epsilons and epsilons[0] is not None else None,
               "capture_seconds": capture_s, "study_seconds": study_s}
    samples = [{"id": p.id, "prompt": p.text, "n_prompt_tokens": len(p.input_ids), "epsilon": e, "output_ids": ids}
               for p, e, ids in zip(inputs.workload.prompts, epsilons, captured.output_ids)]
    results = {
        **results_header(cfg, "fp_error", inputs),
        "configuration": configuration,
        "epsilon": epsilon,
        **found.design(precisions, down_precisions, kernels, int(fp.trials), int(fp.rows_per_vector)),
        "capture": {**capture_info, "vectors_per_instance": captured.vectors_per_op()},
        "accumulation_probes": found.probes,
        "metrics": metrics,
        "metric_definitions": summary.METRIC_DEFINITIONS,
        "table": table,
    }
    side = {"fp_instances.json": [s.as_dict() for s in found.stats], "sensitivity.json": found.sensitivities()}
    return finish(cfg, ctx, results, samples, summary=summary_text,
                  provenance_extra={"capture_cache": capture_info.get("cache")}, side_files=side,
                  mirror_rows=table, mirror_columns=TABLE_COLUMNS)


def _capture_identity(cfg: DictConfig, inputs: Inputs) -> dict[str, Any]:
    """The model and workload records the capture cache key covers (besides prompts, seed, settings, code)."""
    loaded = inputs.loaded
    return {"model": {"name": loaded.name, "source": loaded.source,
                      "config": OmegaConf.to_container(cfg.model, resolve=True)},
            "workload": workload_record(inputs.workload)}


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def summary_text(results: dict[str, Any]) -> str:
    """The terminal summary: the offloaded and Down rows of every precision and kernel."""
    m = results["metrics"]
    lines = [summary_head(results, f"{results['n_prompts']} prompts",
                          f"{results['n_instances']['offloaded']} offloaded op instances + "
                          f"{results['n_instances']['down']} Down"),
             f"  {'prec.':<6}{'kernel':<12}{'ops':<10}{'mean error':>12}{'mean bound':>12}{'bound/err':>11}"
             f"{'violations':>12}{'overflow':>10}"]
    for r in results["table"]:
        if r["op"] not in ("offloaded", "down"):
            continue
        lines.append(f"  {r['precision']:<6}{r['kernel']:<12}{r['op']:<10}{_fmt(r['mean_true_error']):>12}"
                     f"{_fmt(r['mean_bound']):>12}{_fmt(r['bound_ratio']):>11}{_fmt(r['bound_violation_rate']):>12}"
                     f"{r['n_overflow']:>10}")
    lines.append(f"  capture {m.get('capture_seconds', 0):.1f} s, trials {m.get('study_seconds', 0):.1f} s")
    return "\n".join(lines)
