"""Controlled-error runner (paper §7.3.2, Table 5): how much numerical error generation tolerates.

Greedy generation of the workload (generation.max_new_tokens, exactly, in batches) at each error level,
every one compared with T3's generation by the fidelity metrics (metrics/text.py, semantic similarity
first):
- T3: split without masking, zero error: the reference;
- natural: the configuration (EP1 at `epsilon`, or EPN) as it is, its mean absolute error measured;
- one level per target in controlled_error.levels: the same configuration, every offloaded op call's
  natural error pattern rescaled to that mean absolute error (harness/splitee/numerics/controlled_error.py).
The engines share the seed, so every level draws the same masks.

results.json: `table` (one row per level: target, realised and natural mean absolute error, the fidelity
metrics with 95% intervals), `metrics` (flat: natural_mean_abs_error, then <metric>_<level> for each
level, level = t3, natural, ce_<target with . → p>); samples.jsonl one line per prompt with T3's ids
under output_ids and every level's ids and scores.
"""
from __future__ import annotations

import time
from typing import Any

from omegaconf import DictConfig

from harness import configurations, run_identity
from harness.results import RunContext
from runners.common import (
    batch_history,
    epsilon_ignored_note,
    finish,
    generate_batches,
    load_inputs,
    load_semantic,
    make_engine,
    results_header,
    summary_head,
)


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """Everything but the baseline (T3 is the reference), with ε normalised (where it is used)."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name, cfg.epsilon))


describe_skip = epsilon_ignored_note


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    from harness.errors import UserError
    from harness.splitee.numerics import controlled_error as ce
    from metrics.text import compare_generations

    configuration = cfg.configuration.name
    rescalable = configurations.names(gaussian=True)   # a natural error to rescale: Gaussian masks
    if configuration not in rescalable:
        raise UserError(f"experiment controlled_error rescales the natural error of {' or '.join(rescalable)}; "
                        f"configuration={configuration} has none")
    semantic_model = load_semantic(cfg)
    inputs = load_inputs(cfg)
    generate = inputs.generate_kwargs(cfg)

    started = time.perf_counter()
    reference_engine = make_engine(cfg, "t3", inputs.loaded.model)
    reference = generate_batches(reference_engine, inputs.prompts, desc="t3", **generate)
    t3_seconds = time.perf_counter() - started
    ref_texts = inputs.decode_all(reference.output_ids)
    engines = {"t3": reference_engine.describe()}

    table, per_level_ids, per_level_rows, rates = [], {}, {}, {}
    for level in ce.levels(cfg.controlled_error.levels):
        started = time.perf_counter()
        if level.rescaler is None:
            outputs, error, seconds = reference.output_ids, {"natural_mae": 0.0, "realised_mae": 0.0}, t3_seconds
            rates[level.slug] = reference.batch_tokens_per_second
        else:
            engine = make_engine(cfg, configuration, inputs.loaded.model)
            engine.set_output_hook(level.rescaler)
            generated = generate_batches(engine, inputs.prompts, desc=level.label, **generate)
            outputs, rates[level.slug] = generated.output_ids, generated.batch_tokens_per_second
            engines[level.label] = engine.describe()
            error, seconds = level.rescaler.summary(), time.perf_counter() - started
        scores = compare_generations(ref_texts, inputs.decode_all(outputs), reference.output_ids, outputs,
                                     semantic_model=semantic_model)
        per_level_ids[level.slug], per_level_rows[level.slug] = outputs, scores.rows
        table.append(ce.level_row(level, error, seconds, scores.summary()))

    samples = [{"id": prompt.id, "prompt": prompt.text, "n_prompt_tokens": len(prompt.input_ids),
                "output_ids": reference.output_ids[i], "output_text": ref_texts[i],
                "levels": {slug: {"output_ids": ids[i], **{k: per_level_rows[slug][i].get(k) for k in SAMPLE_SCORES}}
                           for slug, ids in per_level_ids.items()}}
               for i, prompt in enumerate(inputs.workload.prompts)]
    results = {
        **results_header(cfg, "controlled_error", inputs),
        "configuration": configuration,
        "epsilon": configurations.effective_epsilon(configuration, cfg.epsilon),
        "reference": "t3",
        "levels": list(cfg.controlled_error.levels),
        "metrics": ce.level_metrics(table),
        "metric_definitions": _definitions(cfg),
        "semantic_model": cfg.semantic_model,
        "table": table,
    }
    return finish(cfg, ctx, results, samples, summary=summary_text, engines=engines,
                  provenance_extra={"bleu_signature": table[0].get("bleu_signature")},
                  mirror_rows=table, mirror_columns=ce.TABLE_COLUMNS, mirror_history=speed_history(rates))


def speed_history(rates: dict[str, list[float | None]]) -> list[dict[str, Any]]:
    """The W&B step history of a controlled-error run, one step per batch: `batch_tokens_per_second/<level>`,
    each batch's generated tokens over its wall time at every level (slug: t3, natural, ce_<target>; t3's
    from the reference generation), so the cost of the rescaling hook shows beside the levels' fidelity."""
    return batch_history({f"batch_tokens_per_second/{slug}": r for slug, r in rates.items()})


# Per-prompt scores each level's sample line keeps (samples.jsonl).
SAMPLE_SCORES = ("semantic_similarity", "exact_match", "token_match_rate", "first_divergence")


def _definitions(cfg: DictConfig) -> dict[str, str]:
    return {
        "mean_abs_error": "mean over the output elements of real positions of every offloaded op call of "
                          "|returned output - T3's output for the same input| (0 for T3)",
        "natural_mean_abs_error": "the configuration's own error (no rescaling)",
        "max_rescale_deviation": "largest |realised MAE / target - 1| over op calls (rounding to fp32)",
        "semantic_similarity": f"mean cosine x 100 of {cfg.semantic_model} embeddings against T3, bootstrap 95% CI",
        "exact_match": "% of prompts whose generated ids equal T3's",
    }


def summary_text(results: dict[str, Any]) -> str:
    """The terminal summary: one line per level, its realised error and fidelity against T3."""
    lines = [summary_head(results, f"{results['n_prompts']} prompts",
                          f"{results['generation']['max_new_tokens']} new tokens", against="t3"),
             f"  {'level':<14}{'mean abs error':>16}{'semantic sim.':>15}{'exact match':>13}{'token match':>13}"
             f"{'seconds':>10}"]
    for r in results["table"]:
        sim = r.get("semantic_similarity")
        lines.append(f"  {r['level']:<14}{r['realised_mae']:>16.3g}{('—' if sim is None else f'{sim:.2f}'):>15}"
                     f"{r['exact_match']:>13.2f}{r['token_match_rate']:>13.2f}{r['generation_seconds']:>10.1f}")
    return "\n".join(lines)
