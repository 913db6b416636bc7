"""Floating-point error runner (paper §7.3.2, Table 4): measured unmasking error against the proven bound.

1. Capture (harness/split/op_inputs.py): T3 greedy generation over the workload with the adversary view
   recorded; `fp_error.vectors_per_prompt` real positions per prompt kept for every op instance (the
   Down input through a forward pre-hook: it never crosses). Cached under paths.cache_dir, keyed by
   everything that changes it, so an ε sweep captures once.
2. Instances: every weight matrix of every offloaded op (q, k, v, o, gate, up per layer, the LM head),
   each with its op's Δ; Down per layer as the non-offloaded reference with its own Δ
   (harness/split/sensitivity.down_sensitivity). σ = Δ/ε (ep1), Δ·√n (epn), 0 (t3).
3. Trials (harness/split/fp_error.py): `fp_error.trials` output elements per instance, in every precision
   of `fp_error.precisions` (Down: `fp_error.down_precisions`) and every kernel, against the exact
   reference and the bound.

results.json `metrics`: the headline (the first precision and kernel listed: fp32 with torch's own
kernel by default, as the engine computes) over all offloaded instances — mean_true_error (with a 95% t
interval over instances), mean_bound, bound_ratio, bound_violation_rate (a fraction, 0–1) — then per op
type, per precision × kernel, and Down. `table` holds every summary row; fp_instances.json every
instance's sums; samples.jsonl one line per prompt (the capture's T3 generation).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import provenance, schema
from harness.results import RunContext, cache_key
from harness.wandb_mirror import mirror
from runners.common import load_inputs, overridden, results_header, workload_record

TABLE_COLUMNS = ("precision", "kernel", "op", "accumulate", "n_trials", "mean_true_error", "mean_bound",
                 "bound_ratio", "bound_violation_rate", "first_order_violation_rate", "n_overflow")


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """What the study depends on: model, workload, configuration, ε (ep1 only), seed, the offloaded ops,
    the sensitivity rule, σ's scale and fp_error; generation settings, baseline and the similarity model
    play no part."""
    full = OmegaConf.to_container(cfg.engine, resolve=True)
    engine = {k: full[k] for k in ("offload", "sensitivity_rule", "sigma_scale")}
    return schema.semantic_config(cfg, drop=("generation", "baseline", "semantic_model", "engine"),
                                  epsilon=schema.effective_epsilon(cfg.configuration.name, cfg.epsilon), engine=engine)


def describe_skip(cfg: DictConfig) -> str | None:
    if not cfg.configuration.uses_epsilon and overridden("epsilon"):
        return (f"configuration {cfg.configuration.name} ignores epsilon, so epsilon={cfg.epsilon:g} "
                "is the same run")
    return None


# Configurations whose masking the study models: Gaussian masks (σ = Δ/ε, Δ·√n), or none (t3: σ = 0).
CONFIGURATIONS = ("ep1", "epn", "t3")


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    from harness.errors import UserError
    from harness.split import fp_error as fe

    fp = cfg.fp_error
    configuration = cfg.configuration.name
    if configuration not in CONFIGURATIONS:
        raise UserError(f"experiment fp_error studies the masks of {', '.join(CONFIGURATIONS)}; "
                        f"configuration={configuration} has none")
    epsilon = schema.effective_epsilon(configuration, cfg.epsilon)
    inputs = load_inputs(cfg)
    loaded, workload, prompts, pad = inputs.loaded, inputs.workload, inputs.prompts, inputs.pad

    started = time.perf_counter()
    captured, capture_info = _capture(cfg, loaded, workload, prompts, pad)
    capture_s = time.perf_counter() - started

    precisions, kernels = list(fp.precisions), list(fp.kernels)
    down_precisions = list(fp.down_precisions) if fp.include_down else []
    threads_before = torch.get_num_threads()
    if fp.threads:
        torch.set_num_threads(int(fp.threads))
    try:
        started = time.perf_counter()
        probes = {p: fe.probe_accumulation(p) for p in dict.fromkeys(precisions + down_precisions)}
        instances = fe.build_instances(loaded.model, captured, configuration, epsilon,
                                       offload=tuple(cfg.engine.offload), sensitivity_rule=cfg.engine.sensitivity_rule,
                                       sigma_scale=float(cfg.engine.sigma_scale), include_down=bool(fp.include_down))
        common = dict(kernels=kernels, trials=int(fp.trials), rows_per_vector=int(fp.rows_per_vector), seed=int(cfg.seed),
                      probes=probes)
        stats = fe.run_study([i for i in instances if i.offloaded], precisions=precisions, **common)
        if down_precisions:
            stats += fe.run_study([i for i in instances if not i.offloaded], precisions=down_precisions, **common)
        study_s = time.perf_counter() - started
    finally:
        torch.set_num_threads(threads_before)

    table = fe.summary_table(stats, list(dict.fromkeys(precisions + down_precisions)), kernels)
    metrics = _metrics(table, precisions[0], kernels[0])
    lengths = [len(p) for p in prompts]
    if configuration == "epn":
        metrics["epsilon_mean"] = sum(n ** -0.5 for n in lengths) / len(lengths)
    else:
        metrics["epsilon_mean"] = epsilon
    metrics["capture_seconds"] = capture_s
    metrics["study_seconds"] = study_s

    samples = [{"id": p.id, "prompt": p.text, "n_prompt_tokens": len(p.input_ids),
                "epsilon": (len(p.input_ids) ** -0.5 if configuration == "epn" else epsilon),
                "output_ids": ids}
               for p, ids in zip(workload.prompts, captured.output_ids)]
    n_offloaded = sum(1 for i in instances if i.offloaded)
    results = {
        **results_header(cfg, "fp_error", inputs),
        "configuration": configuration,
        "epsilon": epsilon,
        "headline": {"precision": precisions[0], "kernel": kernels[0]},
        "precisions": precisions,
        "down_precisions": down_precisions,
        "kernels": kernels,
        "n_instances": {"offloaded": n_offloaded, "down": len(instances) - n_offloaded},
        "trials_per_instance": {"requested": int(fp.trials), "rows_per_vector": int(fp.rows_per_vector),
                                "actual": _actual_trials(int(fp.trials), int(fp.rows_per_vector))},
        "capture": {**capture_info, "vectors_per_instance": {op: int(t.shape[0]) for (op, layer), t
                                                             in captured.inputs.items() if layer in (0, None)}},
        "accumulation_probes": probes,
        "metrics": metrics,
        "metric_definitions": METRIC_DEFINITIONS,
        "table": table,
        "tags": list(cfg.tags),
        "config_hash": ctx.config_hash,
        "run_dir": ctx.name,
        "provenance": provenance.collect(OmegaConf.to_container(cfg, resolve=True), cfg.seed,
                                         extra={"capture_cache": capture_info.get("cache")}),
    }
    side = {"fp_instances.json": [s.as_dict() for s in stats],
            "sensitivity.json": {"offloaded": _deltas(instances, True), "down": _deltas(instances, False)}}
    ctx.run_dir.write_results(results, samples, side_files=side)
    print_summary(results)
    mirror(cfg, ctx.run_dir.path, results, table, name=ctx.name, table_columns=TABLE_COLUMNS)
    return results


METRIC_DEFINITIONS = {
    "mean_true_error": "mean over trials of |fl(<w,x+eta>) - fl(<w,eta>) - <w,x>| (exact reference), headline "
                       "precision and kernel, offloaded ops; 95% t interval over op instances' means",
    "mean_bound": "mean over the same trials of the proven bound (docs/fp_bound.md)",
    "bound_ratio": "mean_bound / mean_true_error (the paper reports about 4)",
    "bound_violation_rate": "fraction (0-1) of trials whose error exceeds the bound (plus the reference's own "
                            "tolerance); 0 wherever the kernel follows the bound's model",
    "first_order_violation_rate": "fraction of trials above gamma_d * (sum|w||x+eta| + sum|w||eta|), the two dot "
                                  "products' terms only (not a proven bound)",
    "overflow_rate": "fraction of trials whose working-precision result overflowed (excluded from the means)",
}


def _actual_trials(trials: int, rows: int) -> str:
    vectors = -(-trials // rows)
    return f"{vectors} vectors x min({rows}, out_features) rows"


def _deltas(instances, offloaded: bool) -> list[dict]:
    seen, out = set(), []
    for i in instances:
        if i.offloaded == offloaded and (i.op, i.layer) not in seen:
            seen.add((i.op, i.layer))
            out.append({"op": i.op, "layer": i.layer, "delta": i.delta, "sigma_mean": float(i.sigma.mean())})
    return out


def _metrics(table: list[dict], precision: str, kernel: str) -> dict[str, Any]:
    """The flat results.json metrics from the summary rows (harness/split/fp_error.summary_table)."""
    m: dict[str, Any] = {}
    rows = {(r["precision"], r["kernel"], r["op"]): r for r in table}
    head = rows.get((precision, kernel, "offloaded"))
    if head is not None:
        ci = head.get("instance_error_ci") or (None, None)
        m.update({
            "mean_true_error": head["mean_true_error"], "mean_true_error_ci_lo": ci[0], "mean_true_error_ci_hi": ci[1],
            "mean_bound": head["mean_bound"], "bound_ratio": head["bound_ratio"],
            "bound_violation_rate": head["bound_violation_rate"],
            "first_order_violation_rate": head["first_order_violation_rate"],
            "max_error_over_bound": head["max_error_over_bound"],
            "overflow_rate": head["n_overflow"] / max(1, head["n_trials"] + head["n_overflow"]),
            "n_trials": head["n_trials"], "n_instances": head["n_instances"],
        })
    for (p, k, op), r in rows.items():
        if (p, k) == (precision, kernel) and op not in ("offloaded", "down"):
            for key in ("mean_true_error", "mean_bound", "bound_violation_rate"):
                m[f"{key}_{op}"] = r[key]
    for (p, k, op), r in rows.items():
        if op == "offloaded":
            prefix = ""
        elif op == "down":
            prefix = "down_"
        else:
            continue
        for key in ("mean_true_error", "mean_bound", "bound_violation_rate"):
            m[f"{prefix}{key}_{p}_{k}"] = r[key]
        m[f"{prefix}overflow_rate_{p}_{k}"] = r["n_overflow"] / max(1, r["n_trials"] + r["n_overflow"])
    return m


def _capture(cfg: DictConfig, loaded: Any, workload: Any, prompts: list[list[int]], pad: int):
    """The captured op inputs from the cache, or captured now and cached (atomically)."""
    import torch

    from harness.split.op_inputs import CapturedInputs, capture_op_inputs

    fp = cfg.fp_error
    settings = {k: fp[k] for k in ("vectors_per_prompt", "capture_new_tokens", "capture_batch_size", "include_down")}
    key = cache_key({
        "kind": "fp_capture",
        "model": {"name": loaded.name, "source": loaded.source, "config": OmegaConf.to_container(cfg.model, resolve=True)},
        "workload": workload_record(workload),
        "input_ids": prompts,
        "seed": cfg.seed,
        "capture": settings,
        "code": provenance.source_digest(),
    })
    path = Path(cfg.paths.cache_dir).expanduser() / "fp_capture" / f"{key}.pt"
    if path.exists():
        try:
            payload = torch.load(path, weights_only=False)
            if payload.get("key") == key:
                return CapturedInputs.from_payload(payload), {"cache": {"key": key, "hit": True}, **settings}
        except Exception as exc:  # a torn or foreign file: capture again, and say so
            print(f"splitbench: warning: ignoring unreadable capture cache {path}: {type(exc).__name__}", file=sys.stderr)
    captured = capture_op_inputs(loaded.model, prompts, new_tokens=int(fp.capture_new_tokens),
                                 batch_size=int(fp.capture_batch_size), vectors_per_prompt=int(fp.vectors_per_prompt),
                                 seed=int(cfg.seed), pad_token_id=pad, include_down=bool(fp.include_down),
                                 threads=cfg.engine.tee_threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save({**captured.to_payload(), "key": key}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return captured, {"cache": {"key": key, "hit": False}, **settings}


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def print_summary(results: dict[str, Any]) -> None:
    eps = results["epsilon"]
    m = results["metrics"]
    lines = [f"{results['experiment_name']}: {results['model']} · {results['configuration']}"
             f"{'' if eps is None else f' (ε={eps:g})'} · {results['n_prompts']} prompts · "
             f"{results['n_instances']['offloaded']} offloaded op instances + {results['n_instances']['down']} Down",
             f"  {'prec.':<6}{'kernel':<12}{'ops':<10}{'mean error':>12}{'mean bound':>12}{'bound/err':>11}"
             f"{'violations':>12}{'overflow':>10}"]
    for r in results["table"]:
        if r["op"] not in ("offloaded", "down"):
            continue
        lines.append(f"  {r['precision']:<6}{r['kernel']:<12}{r['op']:<10}{_fmt(r['mean_true_error']):>12}"
                     f"{_fmt(r['mean_bound']):>12}{_fmt(r['bound_ratio']):>11}{_fmt(r['bound_violation_rate']):>12}"
                     f"{r['n_overflow']:>10}")
    lines.append(f"  capture {m.get('capture_seconds', 0):.1f} s, trials {m.get('study_seconds', 0):.1f} s")
    print("\n".join(lines), flush=True)
