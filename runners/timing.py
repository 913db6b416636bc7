"""Timing runner (paper §7.1-7.2, Table 1, Fig. 4): average time per prompt, by component.

For every configuration in `timing.configurations` and every limit in `timing.max_new_tokens`, the
workload runs in batches of `generation.batch_size` (the paper: 45 prompts, batches of 15, limits
100/200/400/800) and the engine's timings (GenerationResult.timings) are summed over batches and divided
by the number of prompts. All rows come from one process on one machine, measured side by side.

`seconds_per_prompt` is the generation wall time (prefill + decode) divided by the number of prompts; the
noise bank's precompute runs before generation (offline in the paper, §6.2) and is reported on its own
(`components_s.bank_precompute`). A warm-up generation per configuration is not timed (`timing.warmup`).

Without CUDA every configuration still runs, with the device side on the CPU; results.json and the
terminal say so, since the numbers then compare CPU against CPU.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from harness import configurations, schema
from harness.results import RunContext
from runners.common import Inputs, finish, generate_batches, load_inputs, make_engine, overridden, results_header

# Components shown in the table, in the paper's order (Fig. 4 legend), then the rest the engine reports.
COMPONENTS = ("attention_proj", "ffn_proj", "lm_head", "masking", "crossing", "other")
NO_CUDA_NOTE = "no CUDA on this machine: the device side ran on the CPU"


def _epsilon(cfg: DictConfig) -> float | None:
    """ε matters only if one of the timed configurations uses it."""
    uses = any(configurations.get(c).uses_epsilon for c in cfg.timing.configurations)
    return float(cfg.epsilon) if uses else None


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """The `configuration` group, baseline and semantic model play no part; ε only through the timed
    configurations that use it."""
    return schema.semantic_config(cfg, drop=("configuration", "baseline", "semantic_model"), epsilon=_epsilon(cfg))


def describe_skip(cfg: DictConfig) -> str | None:
    if overridden("configuration"):
        return "the timing experiment runs every configuration in timing.configurations; the configuration group is ignored"
    return None


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    inputs = load_inputs(cfg)
    configuration_names = list(cfg.timing.configurations)
    limits = [int(x) for x in cfg.timing.max_new_tokens]
    cuda = torch.cuda.is_available()

    table: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    engines: dict[str, dict] = {}
    sensitivity: dict[str, list] = {}
    for configuration in configuration_names:
        engine = make_engine(cfg, configuration, inputs.loaded.model)
        engines[configuration] = engine.describe()
        sensitivity[configuration] = engine.sensitivity_table()
        rows, rows_samples = _time_configuration(cfg, inputs, engine, configuration, limits)
        table += rows
        samples += rows_samples
        del engine

    results = {
        **results_header(cfg, "timing", inputs),
        "configuration": None,  # one run covers every configuration in `configurations`
        "configurations": configuration_names,
        "max_new_tokens": limits,
        "epsilon": _epsilon(cfg),
        "metrics": {f"seconds_per_prompt_{r['configuration']}_{r['max_new_tokens']}": r["seconds_per_prompt"]
                    for r in table},
        "table": table,
        "cuda": cuda,
        "notes": [] if cuda else [NO_CUDA_NOTE],
    }
    return finish(cfg, ctx, results, samples, summary=summary_text, engines=engines,
                  provenance_extra={"timing_warmup": bool(cfg.timing.warmup)},
                  side_files={"sensitivity.json": sensitivity}, mirror_rows=table,
                  mirror_columns=("configuration", "max_new_tokens", "seconds_per_prompt", *[f"{c}_s" for c in COMPONENTS]))


def _time_configuration(cfg: DictConfig, inputs: Inputs, engine: Any, configuration: str,
                        limits: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One configuration at every generation limit: a table row per limit (per-prompt seconds by
    component, bytes and crossings per prompt) and a sample per prompt and limit."""
    gen, prompts = cfg.generation, inputs.prompts
    description = engine.describe()
    if cfg.timing.warmup:
        engine.generate(prompts[: gen.batch_size], min(2, min(limits)), pad_token_id=inputs.pad,
                        eos_token_id=inputs.eos, stop_at_eos=gen.stop_at_eos)
    rows, samples = [], []
    n = max(1, len(prompts))
    for limit in limits:
        res = generate_batches(engine, prompts, batch_size=gen.batch_size, max_new_tokens=limit,
                               pad_token_id=inputs.pad, eos_token_id=inputs.eos, stop_at_eos=gen.stop_at_eos,
                               desc=f"{configuration} {limit} tokens",
                               epsilon_lengths=inputs.epsilon_lengths(cfg.epn_n))
        per_prompt = res.per_prompt()
        rows.append({
            "configuration": configuration,
            "max_new_tokens": limit,
            "n_prompts": len(prompts),
            "seconds_per_prompt": per_prompt.get("total"),
            **{f"{c}_s": per_prompt.get(c) for c in COMPONENTS},
            "components_s": per_prompt,
            "tokens_per_second": res.tokens_per_second,
            "bytes_to_device_per_prompt": res.boundary.get("bytes_to_device", 0) / n,
            "bytes_from_device_per_prompt": res.boundary.get("bytes_from_device", 0) / n,
            "crossings_per_prompt": res.boundary.get("crossings", 0) / n,
            "bank": res.bank,
            "slalom": res.slalom,  # slalom: wrap-arounds per op and the input bits it ran with; else None
            "epsilon_mean": _mean([e for e in res.epsilons if e is not None]),
            "device": description.get("accelerator") or "cpu",
            "device_is_cpu_fallback": bool(description.get("accelerator_is_cpu_fallback")),
        })
        samples += [{"id": prompt.id, "configuration": configuration, "max_new_tokens": limit,
                     "n_prompt_tokens": len(prompt.input_ids), "epsilon": eps, "output_ids": ids}
                    for prompt, ids, eps in zip(inputs.workload.prompts, res.output_ids, res.epsilons)]
    return rows, samples


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary_text(results: dict[str, Any]) -> str:
    lines = [f"{results['experiment_name']}: {results['model']} · {results['n_prompts']} prompts · "
             f"batch {results['generation']['batch_size']} · seconds per prompt"]
    header = f"  {'configuration':<14}{'tokens':>7}{'total':>9}" + "".join(f"{c[:9]:>10}" for c in COMPONENTS)
    lines.append(header)
    for r in results["table"]:
        cells = "".join(f"{(r.get(f'{c}_s') or 0.0):>10.3f}" for c in COMPONENTS)
        lines.append(f"  {r['configuration']:<14}{r['max_new_tokens']:>7}{r['seconds_per_prompt']:>9.3f}{cells}")
    for note in results["notes"]:
        lines.append(f"  note: {note}")
    return "\n".join(lines)
