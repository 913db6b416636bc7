"""Timing runner (paper §7.1-7.2, Table 1, Fig. 4): average time per prompt, by component.

For every configuration in `timing.configurations` and every limit in `timing.max_new_tokens`, the
workload runs in batches of `generation.batch_size` (the paper: 45 prompts, batches of 15, limits
100/200/400/800) and the engine's timings (GenerationResult.timings) are summed over batches and divided
by the number of prompts. All rows come from one process on one machine, measured side by side: each
batch runs every configuration in turn, in an order rotated by the batch (harness/splitee/rotation.py), so a
slow spell of a shared machine falls on all configurations alike rather than on whichever ran then.

`timing.mode=prefix` (the default) generates each batch once, to the largest limit, and reads every
smaller limit's time as the generation passes it (SplitEngine.generate checkpoints): with greedy decoding
and no early stop the first L steps are the L-token generation, so this is the same quantity for 800
steps a batch instead of 1,500. `separate` runs one generation per limit, as the protocol reads literally;
the two differ only in when the bounded noise bank refills (docs/noise_bank.md).

`seconds_per_prompt` is the generation wall time (prefill + decode) divided by the number of prompts; the
noise bank's precompute runs before generation (offline in the paper, §6.2) and is reported on its own
(`components_s.bank_precompute`). A warm-up generation per configuration is not timed (`timing.warmup`).

Without CUDA every configuration still runs, with the device side on the CPU; results.json and the
terminal say so, since the numbers then compare CPU against CPU.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from harness import configurations, run_identity
from harness.results import RunContext
from runners.common import (
    BatchedGeneration,
    Inputs,
    batch_history,
    finish,
    load_inputs,
    make_engine,
    overridden,
    results_header,
)

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
    return run_identity.semantic_config(cfg, epsilon=_epsilon(cfg))


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

    engines = {c: make_engine(cfg, c, inputs.loaded.model) for c in configuration_names}
    measured = _time_side_by_side(cfg, inputs, engines, limits)
    table: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for configuration in configuration_names:
        description = engines[configuration].describe()
        for limit in limits:
            res = measured[configuration][limit]
            table.append(_row(configuration, limit, res, description, len(inputs.prompts)))
            samples += [{"id": prompt.id, "configuration": configuration, "max_new_tokens": limit,
                         "n_prompt_tokens": len(prompt.input_ids), "epsilon": eps, "output_ids": ids}
                        for prompt, ids, eps in zip(inputs.workload.prompts, res.output_ids, res.epsilons)]

    results = {
        **results_header(cfg, "timing", inputs),
        "configuration": None,  # one run covers every configuration in `configurations`
        "configurations": configuration_names,
        "max_new_tokens": limits,
        "mode": str(cfg.timing.mode),
        "epsilon": _epsilon(cfg),
        # the privacy parameter of the timed configuration that uses the knob (none: all None)
        "privacy_parameter": configurations.privacy_parameter(
            next((c for c in cfg.timing.configurations if configurations.get(c).uses_epsilon), None), _epsilon(cfg)),
        "metrics": {f"seconds_per_prompt_{r['configuration']}_{r['max_new_tokens']}": r["seconds_per_prompt"]
                    for r in table},
        "table": table,
        "cuda": cuda,
        "notes": [] if cuda else [NO_CUDA_NOTE],
    }
    return finish(cfg, ctx, results, samples, summary=summary_text,
                  engines={c: e.describe() for c, e in engines.items()},
                  provenance_extra={"timing_warmup": bool(cfg.timing.warmup), "timing_mode": str(cfg.timing.mode)},
                  side_files={"sensitivity.json": {c: e.sensitivity_table() for c, e in engines.items()}},
                  mirror_rows=table,
                  mirror_columns=("configuration", "max_new_tokens", "seconds_per_prompt", *[f"{c}_s" for c in COMPONENTS]),
                  mirror_history=speed_history({c: {limit: res.batch_tokens_per_second for limit, res in by_limit.items()}
                                                for c, by_limit in measured.items()}))


def speed_history(rates: dict[str, dict[int, list[float | None]]]) -> list[dict[str, Any]]:
    """The W&B step history of a timing run, one step per batch: `batch_tokens_per_second/<configuration>_<limit>`,
    each batch's generated tokens over its wall time for every configuration and limit (rates[c][limit])."""
    return batch_history({f"batch_tokens_per_second/{c}_{limit}": r for c, by_limit in rates.items()
                          for limit, r in by_limit.items()})


def _time_side_by_side(cfg: DictConfig, inputs: Inputs, engines: dict[str, Any],
                       limits: list[int]) -> dict[str, dict[int, BatchedGeneration]]:
    """Every batch through every configuration (order rotated by the batch) at every limit, joined per
    configuration and limit."""
    from harness.progress import progress
    from harness.splitee.rotation import rotated

    gen, prompts = cfg.generation, inputs.prompts
    common = {"pad_token_id": inputs.pad, "eos_token_id": inputs.eos, "stop_at_eos": gen.stop_at_eos}
    if cfg.timing.warmup:
        for engine in engines.values():
            engine.generate(prompts[: gen.batch_size], min(2, min(limits)), **common)
    lengths = inputs.epsilon_lengths(cfg.epn_n)
    measured = {c: {limit: BatchedGeneration() for limit in limits} for c in engines}
    starts = list(range(0, len(prompts), gen.batch_size))
    bar = progress(desc="timing", total=len(starts) * len(engines), unit="generation")
    try:
        for b, start in enumerate(starts):
            batch = [list(p) for p in prompts[start:start + gen.batch_size]]
            batch_lengths = None if lengths is None else list(lengths[start:start + gen.batch_size])
            for configuration in rotated(list(engines), b):
                engine = engines[configuration]
                if cfg.timing.mode == "prefix":
                    res = engine.generate(batch, max(limits), checkpoints=tuple(limits), epsilon_lengths=batch_lengths,
                                          **common)
                    per_limit = {limit: res.at(limit) for limit in limits}
                else:
                    per_limit = {limit: engine.generate(batch, limit, epsilon_lengths=batch_lengths, **common)
                                 for limit in limits}
                for limit, r in per_limit.items():
                    measured[configuration][limit].add(r, len(batch))
                bar.update(1)
    finally:
        bar.close()
    return measured


def _row(configuration: str, limit: int, res: BatchedGeneration, description: dict, n_prompts: int) -> dict[str, Any]:
    """One table row: per-prompt seconds by component, bytes and crossings per prompt."""
    n = max(1, n_prompts)
    per_prompt = res.per_prompt()
    return {
        "configuration": configuration,
        "max_new_tokens": limit,
        "n_prompts": n_prompts,
        "seconds_per_prompt": per_prompt.get("total"),
        **{f"{c}_s": per_prompt.get(c) for c in COMPONENTS},
        "components_s": per_prompt,
        "tokens_per_second": res.tokens_per_second,
        "batch_seconds_per_prompt": res.batch_seconds_per_prompt,
        "bytes_to_device_per_prompt": res.boundary.get("bytes_to_device", 0) / n,
        "bytes_from_device_per_prompt": res.boundary.get("bytes_from_device", 0) / n,
        "crossings_per_prompt": res.boundary.get("crossings", 0) / n,
        "bank": res.bank,
        "slalom": res.slalom,  # slalom: wrap-arounds per op and the input bits it ran with; else None
        "epsilon_mean": _mean([e for e in res.epsilons if e is not None]),
        "device": description.get("accelerator") or "cpu",
        "device_is_cpu_fallback": bool(description.get("accelerator_is_cpu_fallback")),
    }


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
