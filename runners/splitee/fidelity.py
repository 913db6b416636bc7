"""Fidelity runner (paper §7.3.1, Tables 2-3): how much a configuration changes the model's answers.

Greedy generation of exactly `generation.max_new_tokens` tokens for every prompt of the workload, once
with the baseline configuration (gpu, or cpu where there is no CUDA: `baseline=auto`) and once with the
configuration under test; each pair is compared with metrics/text.compare_generations. The baseline
generations are cached under paths.cache_dir, keyed by everything that changes them (model, workload and
its filter, the prompts' token ids, seed, generation settings, baseline configuration, code version), so
a sweep over ε computes them once.

Writes results.json (DESIGN.md contract), samples.jsonl (one line per prompt), sensitivity.json (the
engine's per-op Δ table) and, with engine.record_view=true, view.pt (the adversary view).
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import configurations, provenance, run_identity
from harness.results import GenerationCache, RunContext, cache_key
from harness.splitee import accounting
from metrics.replicates import pool as replicates_pool
from runners.common import (
    BatchedGeneration,
    Inputs,
    batch_history,
    epsilon_ignored_note,
    finish,
    generate_batches,
    load_inputs,
    load_semantic,
    make_engine,
    mask_seeds,
    metric_lines,
    resolve_baseline,
    results_header,
    summary_head,
    test_point,
    test_side,
    tradeoff,
    workload_record,
)

# Samples columns mirrored to W&B (token id lists stay in samples.jsonl).
_TABLE_COLUMNS = ("id", "prompt", "baseline_text", "output_text", "exact_match", "token_match_rate", "bleu",
                  "rouge_l", "semantic_similarity", "first_divergence")
# The headline metrics: the terminal table, and those whose spread across mask seeds is reported.
SUMMARY_METRICS = ("exact_match", "token_match_rate", "bleu", "rouge_l", "semantic_similarity")
NO_CUDA_BASELINE = "no CUDA on this machine: the baseline is the cpu configuration, not gpu"
NO_CUDA_DEVICE = "no CUDA on this machine: the device side ran on the CPU"


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """What it reads (harness/run_identity.py READS: the `sanitize` section only for a sanitiser configuration),
    with ε normalised: configurations that ignore it record None."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name, cfg.epsilon))


describe_skip = epsilon_ignored_note


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    configuration = cfg.configuration.name
    inputs = load_inputs(cfg)
    semantic_model = load_semantic(cfg)  # before generating: a missing similarity model is a user error
    generate = inputs.generate_kwargs(cfg)

    baseline = resolve_baseline(cfg.baseline)
    base = _baseline(cfg, inputs, baseline, generate)
    base_texts = inputs.decode_all(base["output_ids"])
    seeds = mask_seeds(cfg)
    replicates = [_replicate(cfg, inputs, seed, generate, base, base_texts, semantic_model) for seed in seeds]
    engine, test, test_texts, scores = replicates[0]  # the first mask seed's record: samples, view, timings
    test_engine = engine.describe()

    epsilon = configurations.effective_epsilon(configuration, cfg.epsilon)
    n_eps = generate["epsilon_lengths"]   # each prompt's n for EPN's ε (cfg.epn_n)
    # Nominal per-token ε beside the GDP composition over every exposure one prompt token reaches (DESIGN.md):
    # a property of the configuration and the prompts, the same under every mask seed.
    privacy = accounting.privacy_summary(configuration, epsilon, [len(p) for p in inputs.prompts],
                                         len(inputs.loaded.model.model.layers), cfg.generation.max_new_tokens,
                                         tuple(cfg.engine.offload), cfg.engine.sigma_scale, float(cfg.dp_delta),
                                         epsilon_lengths=n_eps)
    per_seed = [_metrics(inputs, r[3].summary(), r[1], base, privacy) for r in replicates]
    notes = [note for note, applies in ((NO_CUDA_BASELINE, baseline == "cpu" and cfg.baseline == "auto"),
                                        (NO_CUDA_DEVICE, test_engine.get("accelerator_is_cpu_fallback"))) if applies]
    # Which n EPN's ε = 1/√n counted: recorded for the configurations whose ε follows the prompt's length.
    epsilon_n = cfg.epn_n if configurations.get(configuration).epsilon_rule == configurations.INVERSE_SQRT_N else None
    samples = [{"id": prompt.id, "prompt": prompt.text, "n_prompt_tokens": len(prompt.input_ids),
                "epsilon": test.epsilons[i] if i < len(test.epsilons) else epsilon,
                **({} if epsilon_n is None else {"epsilon_n_tokens": n_eps[i]}),
                "baseline_ids": base["output_ids"][i], "output_ids": test.output_ids[i],
                "baseline_text": base_texts[i], "output_text": test_texts[i], **scores.rows[i],
                **({} if len(seeds) == 1 else {"output_ids_by_mask_seed": {str(seed): r[1].output_ids[i]
                                                                          for seed, r in zip(seeds, replicates)}})}
               for i, prompt in enumerate(inputs.workload.prompts)]
    results = {
        **results_header(cfg, "fidelity", inputs),
        "configuration": configuration,
        "epsilon": epsilon,
        "epsilon_n": epsilon_n,
        "baseline": baseline,
        "mask_seeds": seeds,
        "metrics": replicates_pool(per_seed, spread=SUMMARY_METRICS),
        "per_mask_seed": None if len(seeds) == 1 else [{"mask_seed": s, "metrics": m} for s, m in zip(seeds, per_seed)],
        "metric_definitions": _definitions(cfg),
        "semantic_model": cfg.semantic_model,
        "timings": {"test": test.timings, "baseline": base["timings"], "test_per_prompt": test.per_prompt()},
        "boundary": test.boundary,
        "bank": test.bank,
        "slalom": test.slalom,  # the first mask seed's (Slalom's products do not depend on its masks)
        "tokens_per_second": test.tokens_per_second,
        "notes": notes,
    }
    results["tradeoff"] = _tradeoff(cfg, results["metrics"], baseline)
    return finish(cfg, ctx, results, samples, summary=summary_text,
                  engines={"baseline": base["engine"], "test": test_engine},
                  provenance_extra={"baseline_cache": base["cache"], "bleu_signature": results["metrics"].get("bleu_signature")},
                  side_files={"sensitivity.json": engine.sensitivity_table()},
                  before_done=_view_writer(cfg, engine, inputs, ctx), mirror_columns=_TABLE_COLUMNS,
                  mirror_history=speed_history(seeds, [r[1].batch_tokens_per_second for r in replicates],
                                               base.get("batch_tokens_per_second")))


def speed_history(seeds: list[int], test: list[list[float | None]], baseline: list[float | None] | None,
                  ) -> list[dict[str, Any]]:
    """The W&B step history of a fidelity run, one step per batch: `batch_tokens_per_second` of the tested
    configuration under the first mask seed (the replicate whose aggregate is results.json's
    tokens_per_second), `batch_tokens_per_second/mask_seed<s>` under each further seed, and
    `baseline/batch_tokens_per_second` where the baseline's batches were timed (generated now, or cached
    with their rates)."""
    series = {("batch_tokens_per_second" if i == 0 else f"batch_tokens_per_second/mask_seed{seed}"): rates
              for i, (seed, rates) in enumerate(zip(seeds, test))}
    if baseline:
        series["baseline/batch_tokens_per_second"] = baseline
    return batch_history(series)


def _tradeoff(cfg: DictConfig, m: dict[str, Any], baseline: str) -> dict[str, Any]:
    """The utility half of this run's privacy–utility point: semantic similarity of the generations to the
    unprotected baseline's (token match where no similarity model ran)."""
    key = "semantic_similarity" if m.get("semantic_similarity") is not None else "token_match_rate"
    return tradeoff(utility_metric=key, utility=m[key], utility_ci=(m.get(f"{key}_ci_lo"), m.get(f"{key}_ci_hi")),
                    reference=f"{baseline} generations", point=test_point(cfg))


def _replicate(cfg: DictConfig, inputs: Inputs, seed: int, generate: dict[str, Any], base: dict[str, Any],
               base_texts: list[str], semantic_model: Any) -> tuple[Any, BatchedGeneration, list[str], Any]:
    """The test configuration under one mask seed, scored against the baseline."""
    from metrics.text import compare_generations

    # A sanitiser's prompts are sanitised (seeded by the mask seed) and then run on the plain engine.
    engine_configuration, prompts = test_side(cfg, inputs, seed)
    engine = make_engine(cfg, engine_configuration, inputs.loaded.model, seed=seed)
    test = generate_batches(engine, prompts, desc=f"{cfg.configuration.name} mask seed {seed}", **generate)
    texts = inputs.decode_all(test.output_ids)
    scores = compare_generations(base_texts, texts, base["output_ids"], test.output_ids, semantic_model=semantic_model)
    return engine, test, texts, scores


def _metrics(inputs: Inputs, metrics: dict[str, Any], test: BatchedGeneration, base: dict[str, Any],
             privacy: dict[str, Any]) -> dict[str, Any]:
    """One mask seed's comparison summary plus the ε it ran under, the privacy accounting and its speed."""
    used = [e for e in test.epsilons if e is not None]
    # EPN's ε is 1/√n per prompt: its mean is what the paper quotes (0.0773 in §7.3.1).
    metrics["epsilon_mean"] = sum(used) / len(used) if used else None
    metrics.update(privacy)
    metrics["slalom_wraps"] = test.slalom["wraps"] if test.slalom else None
    metrics["seconds_per_prompt"] = test.per_prompt().get("total")
    metrics["baseline_seconds_per_prompt"] = base["timings"].get("total", 0.0) / max(1, len(inputs.prompts))
    return metrics


def _definitions(cfg: DictConfig) -> dict[str, str]:
    return {
        "exact_match": "% of prompts whose generated ids equal the baseline's",
        "token_match_rate": "% of generated positions with the same id as the baseline (position-wise, "
                            "over max(len) positions)",
        "bleu": "corpus BLEU (sacrebleu defaults), bootstrap 95% CI over prompts",
        "bleu_sentence_mean": "mean sentence BLEU (effective order), bootstrap 95% CI",
        "rouge_l": "mean ROUGE-L F1 (rouge-score, Porter stemmer), bootstrap 95% CI",
        "semantic_similarity": f"mean cosine x 100 of {cfg.semantic_model} embeddings, bootstrap 95% CI",
        "epsilon_mean": "mean per-token epsilon the configuration ran under (None: no noise)",
        "slalom_wraps": "slalom only: outputs whose integer product |W_q x_q| passed (q-1)/2, so that the centred "
                        "residue was wrong, counted exactly over the run (None: not slalom); results.json `slalom` "
                        "has them per op instance and type with the input bits each op ran with "
                        "(harness/splitee/mechanisms.py)",
        "mask seeds": "with several mask_seeds every metric is the mean over seeds (a _ci_lo/_ci_hi the mean of the "
                      "per-seed 95% intervals over prompts) and <metric>_seed_sd/_seed_min/_seed_max its spread "
                      "across seeds; per_mask_seed holds each seed's metrics (metrics/replicates.py)",
        "epsilon_n": "EPN only: which n its epsilon = 1/sqrt(n) counts (text: the prompt's own text tokens; input_ids: "
                     "every token the model sees); samples carry each prompt's epsilon_n_tokens",
    }


def _view_writer(cfg: DictConfig, engine: Any, inputs: Inputs, ctx: RunContext):
    """Saves the adversary view (view.pt) with its meta, when engine.record_view asks for it."""
    if not cfg.engine.record_view:
        return None

    def write() -> None:
        from harness.adversary_view import view_meta

        engine.view.meta.update(view_meta(cfg, model=inputs.loaded.name, workload=inputs.workload.name))
        engine.view.save(ctx.run_dir.path / "view.pt")

    return write


def _baseline(cfg: DictConfig, inputs: Inputs, baseline: str, generate: dict[str, Any]) -> dict[str, Any]:
    """Baseline generations from the cache, or generated now and cached."""
    loaded, workload, prompts = inputs.loaded, inputs.workload, inputs.prompts
    key = cache_key({
        "kind": "baseline_generation",
        "model": {"name": loaded.name, "source": loaded.source, "config": _plain(cfg.model)},
        "workload": workload_record(workload),
        "input_ids": prompts,
        "seed": cfg.seed,
        "generation": {k: generate[k] for k in ("batch_size", "max_new_tokens", "stop_at_eos", "pad_token_id",
                                                 "eos_token_id")},
        "configuration": baseline,
        "engine": {k: v for k, v in _plain(cfg.engine).items() if k in ("tee_threads", "allow_cpu_fallback")},
        # The sources, not the git commit: a commit that touches only docs keeps the cache, an
        # uncommitted edit to harness/ or metrics/ invalidates it.
        "code": provenance.source_digest(),
    })
    cache = GenerationCache(cfg.paths.cache_dir)
    hit = cache.get(key)
    if hit is not None:
        return {**hit, "cache": {"key": key, "hit": True}}
    engine = make_engine(cfg, baseline, loaded.model)
    res = generate_batches(engine, prompts, desc=f"baseline {baseline}", **generate)
    entry = {"output_ids": res.output_ids, "timings": res.timings, "engine": engine.describe(),
             "batch_tokens_per_second": res.batch_tokens_per_second}
    cache.put(key, entry)
    return {**entry, "cache": {"key": key, "hit": False}}


def _plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def summary_text(results: dict[str, Any]) -> str:
    """A short table for the terminal; results.json has everything."""
    m = results["metrics"]
    head = summary_head(results, f"{results['n_prompts']} prompts",
                        f"{results['generation']['max_new_tokens']} new tokens", against=results["baseline"])
    lines = [head, *metric_lines(m, SUMMARY_METRICS,
                                 width=22)]
    if m.get("mean_first_divergence") is not None:
        lines.append(f"  {'mean_first_divergence':<22}{m['mean_first_divergence']:>8.1f}   (over diverging prompts)")
    for note in results.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)
