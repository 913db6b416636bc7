"""Controlled-error runner (paper §7.3.2, Table 5): how much numerical error generation tolerates.

Greedy generation of the workload (generation.max_new_tokens, exactly, in batches) at each error level,
every one compared with T3's generation by the fidelity metrics (metrics/text.py, semantic similarity
first):
- T3: split without masking, zero error: the reference;
- natural: the configuration (EP1 at `epsilon`, or EPN) as it is, its mean absolute error measured;
- one level per target in controlled_error.levels: the same configuration, every offloaded op call's
  natural error pattern rescaled to that mean absolute error (harness/split/controlled_error.py).
The engines share the seed, so every level draws the same masks.

results.json: `table` (one row per level: target, realised and natural mean absolute error, the fidelity
metrics with 95% intervals), `metrics` (flat: natural_mean_abs_error, then <metric>_<level> for each
level, level = t3, natural, ce_<target with . → p>); samples.jsonl one line per prompt with T3's ids
under output_ids and every level's ids and scores.
"""
from __future__ import annotations

import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import provenance, schema
from harness.results import RunContext
from harness.wandb_mirror import mirror
from runners.common import generate_batches, load_inputs, load_semantic, make_engine, results_header
from runners.fidelity import describe_skip  # noqa: F401  (the runner protocol: the same ε rule)

FIDELITY_KEYS = ("semantic_similarity", "exact_match", "token_match_rate", "bleu", "rouge_l")
TABLE_COLUMNS = ("level", "target_mae", "realised_mae", "natural_mae", *FIDELITY_KEYS)


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """Everything but the baseline (T3 is the reference), with ε normalised (ep1 only)."""
    return schema.semantic_config(cfg, drop=("baseline",),
                                  epsilon=schema.effective_epsilon(cfg.configuration.name, cfg.epsilon))


def level_slug(target: float | None, label: str) -> str:
    """Metric-key suffix of a level: t3, natural, ce_0p014 (target 0.014)."""
    if target is None:
        return label
    return "ce_" + f"{target:.2g}".replace(".", "p").replace("-", "m").replace("+", "")


# Configurations with a natural error to rescale (Gaussian masks).
CONFIGURATIONS = ("ep1", "epn")


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    from harness.errors import UserError
    from harness.split.controlled_error import ErrorRescaler
    from metrics.text import compare_generations

    configuration = cfg.configuration.name
    if configuration not in CONFIGURATIONS:
        raise UserError(f"experiment controlled_error rescales the natural error of {' or '.join(CONFIGURATIONS)}; "
                        f"configuration={configuration} has none")
    gen = cfg.generation
    semantic_model = load_semantic(cfg.semantic_model)
    inputs = load_inputs(cfg)
    loaded, workload, prompts = inputs.loaded, inputs.workload, inputs.prompts
    generate = inputs.generate_kwargs(gen)
    decode = lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731

    started = time.perf_counter()
    reference_engine = make_engine(cfg, "t3", loaded.model)
    reference = generate_batches(reference_engine, prompts, desc="t3", **generate)
    t3_seconds = time.perf_counter() - started
    ref_texts = [decode(ids) for ids in reference.output_ids]
    engines = {"t3": reference_engine.describe()}

    levels: list[tuple[str, float | None, Any]] = [("t3", None, None), ("natural", None, ErrorRescaler(None))]
    levels += [(f"ce {target:g}", float(target), ErrorRescaler(float(target))) for target in cfg.controlled_error.levels]
    table, per_level_ids, per_level_rows = [], {}, {}
    for label, target, rescaler in levels:
        started = time.perf_counter()
        if rescaler is None:
            outputs, summary = reference.output_ids, {"natural_mae": 0.0, "realised_mae": 0.0}
            seconds = t3_seconds
        else:
            engine = make_engine(cfg, configuration, loaded.model)
            engine.set_output_hook(rescaler)
            outputs = generate_batches(engine, prompts, desc=label, **generate).output_ids
            engines[label] = engine.describe()
            summary = rescaler.summary()
            seconds = time.perf_counter() - started
        scores = compare_generations(ref_texts, [decode(ids) for ids in outputs], reference.output_ids, outputs,
                                     semantic_model=semantic_model)
        slug = level_slug(target, label if target is None else "")
        per_level_ids[slug], per_level_rows[slug] = outputs, scores.rows
        table.append({"level": label, "slug": slug, "target_mae": target,
                      "realised_mae": summary.get("realised_mae"), "natural_mae": summary.get("natural_mae"),
                      "error": summary, "generation_seconds": seconds, **scores.summary()})

    natural = next(r for r in table if r["slug"] == "natural")
    metrics: dict[str, Any] = {"natural_mean_abs_error": natural["realised_mae"],
                               "max_rescale_deviation": max((r["error"].get("max_per_call_relative_deviation") or 0.0)
                                                            for r in table)}
    for row in table:
        metrics[f"mean_abs_error_{row['slug']}"] = row["realised_mae"]
        for key in FIDELITY_KEYS:
            for suffix in ("", "_ci_lo", "_ci_hi"):
                metrics[f"{key}{suffix}_{row['slug']}"] = row.get(f"{key}{suffix}")

    samples = []
    for i, prompt in enumerate(workload.prompts):
        samples.append({
            "id": prompt.id, "prompt": prompt.text, "n_prompt_tokens": len(prompt.input_ids),
            "output_ids": reference.output_ids[i], "output_text": ref_texts[i],
            "levels": {slug: {"output_ids": ids[i], **{k: per_level_rows[slug][i].get(k) for k in
                                                        ("semantic_similarity", "exact_match", "token_match_rate",
                                                         "first_divergence")}}
                       for slug, ids in per_level_ids.items()},
        })
    epsilon = schema.effective_epsilon(configuration, cfg.epsilon)
    results = {
        **results_header(cfg, "controlled_error", inputs),
        "configuration": configuration,
        "epsilon": epsilon,
        "reference": "t3",
        "levels": list(cfg.controlled_error.levels),
        "metrics": metrics,
        "metric_definitions": {
            "mean_abs_error": "mean over the output elements of real positions of every offloaded op call of "
                              "|returned output - T3's output for the same input| (0 for T3)",
            "natural_mean_abs_error": "the configuration's own error (no rescaling)",
            "max_rescale_deviation": "largest |realised MAE / target - 1| over op calls (rounding to fp32)",
            "semantic_similarity": f"mean cosine x 100 of {cfg.semantic_model} embeddings against T3, t 95% CI",
            "exact_match": "% of prompts whose generated ids equal T3's",
        },
        "semantic_model": cfg.semantic_model,
        "table": table,
        "tags": list(cfg.tags),
        "config_hash": ctx.config_hash,
        "run_dir": ctx.name,
        "provenance": provenance.collect(OmegaConf.to_container(cfg, resolve=True), cfg.seed, engines=engines,
                                         extra={"bleu_signature": table[0].get("bleu_signature")}),
    }
    ctx.run_dir.write_results(results, samples)
    print_summary(results)
    mirror(cfg, ctx.run_dir.path, results, table, name=ctx.name, table_columns=TABLE_COLUMNS)
    return results


def print_summary(results: dict[str, Any]) -> None:
    eps = results["epsilon"]
    lines = [f"{results['experiment_name']}: {results['model']} · {results['configuration']}"
             f"{'' if eps is None else f' (ε={eps:g})'} vs t3 · {results['n_prompts']} prompts · "
             f"{results['generation']['max_new_tokens']} new tokens",
             f"  {'level':<14}{'mean abs error':>16}{'semantic sim.':>15}{'exact match':>13}{'token match':>13}"
             f"{'seconds':>10}"]
    for r in results["table"]:
        sim = r.get("semantic_similarity")
        lines.append(f"  {r['level']:<14}{r['realised_mae']:>16.3g}{('—' if sim is None else f'{sim:.2f}'):>15}"
                     f"{r['exact_match']:>13.2f}{r['token_match_rate']:>13.2f}{r['generation_seconds']:>10.1f}")
    print("\n".join(lines), flush=True)
