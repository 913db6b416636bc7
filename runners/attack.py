"""Attack runner (paper §7.4, Tables 6-7): can the accelerator reconstruct the prompt from what it sees?

One run = one cell of Table 6: an attacker `setting` (noise_free on t3; noise_oblivious or noise_aware on
ep1 / epn) × a `component` (qkv, composite, lm_head, ...) at one configuration and ε. It reports

- the learned inversion attack (attacks/inversion.py) on the evaluation prompts (the workload): token
  precision / recall / F1, exact match, BLEU, ROUGE-L, semantic similarity, each with a 95% interval;
- the chance floor, the positive control (the same component's noise-free attacker on T3), the negative
  control (the noise-free attacker trained on shuffled pairs, on T3) and the verdict `attack_gate`
  (attacks/controls.py);
- the Bayes-optimal token attacker on the layer-0 QKV exposure under the same configuration, with the
  repeated-submission curve (attacks/bayes.py);
- the privacy accounting of the configuration: nominal ε and the composed GDP / (ε, δ) bound
  (harness/accounting.py), for `generation.max_new_tokens` generated tokens.

Everything expensive (captures, trained attackers, reconstructions, Bayes curves) is cached under
paths.cache_dir/attacks (attacks/pipeline.py), so a sweep trains each attacker once.

    splitbench experiment=attack_smoke
    splitbench -m experiment=attack configuration=t3 attack.setting=noise_free attack.component=qkv,composite,lm_head
    splitbench -m experiment=attack configuration=ep1 epsilon=1,15,100,1000,2500 \\
        attack.setting=noise_oblivious,noise_aware attack.component=qkv,composite
"""
from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import accounting, provenance, schema
from harness.errors import UserError
from harness.results import RunContext
from harness.wandb_mirror import mirror
from runners.common import metric_lines

_TABLE_COLUMNS = ("id", "prompt", "output_text", "token_precision", "token_recall", "token_f1", "exact_match", "bleu",
                  "rouge_l", "semantic_similarity", "bayes_top1", "bayes_top5")
NOISY = ("ep1", "epn")


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """What changes an attack result: not the baseline or the timing study; ε normalised (only ep1 uses it)."""
    return schema.semantic_config(cfg, drop=("baseline",),
                                  epsilon=schema.effective_epsilon(cfg.configuration.name, cfg.epsilon))


def describe_skip(cfg: DictConfig) -> str | None:
    from runners.fidelity import describe_skip as fidelity_describe_skip

    return fidelity_describe_skip(cfg)


def check_setting(configuration: str, setting: str) -> None:
    """noise_free attacks unmasked inputs (t3); the other settings attack masked ones (ep1, epn)."""
    if configuration not in ("t3", *NOISY):
        raise UserError(f"the attack runner handles configurations t3, ep1 and epn, got {configuration!r}")
    if setting == "noise_free" and configuration != "t3":
        raise UserError(f"attack.setting=noise_free attacks unmasked inputs: use configuration=t3 "
                        f"(got {configuration}); for masked inputs use noise_oblivious or noise_aware")
    if setting != "noise_free" and configuration == "t3":
        raise UserError(f"attack.setting={setting} needs masked inputs (configuration=ep1 or epn); t3 has no "
                        "noise, so its attack is attack.setting=noise_free")


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _log(message: str) -> None:
    print(f"splitbench: {message}", file=sys.stderr, flush=True)


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    from attacks import controls
    from attacks.capture import check_component
    from attacks.corpus import load_corpus
    from attacks.inversion import TrainSettings
    from attacks.pipeline import Pipeline, Store
    from harness.models import load_model
    from harness.workloads import load_workload
    from runners.common import load_semantic, workload_record

    a = cfg.attack
    configuration = cfg.configuration.name
    epsilon = schema.effective_epsilon(configuration, cfg.epsilon)
    check_setting(configuration, a.setting)
    semantic_model = load_semantic(cfg.semantic_model)
    threads = a.train.threads if a.train.threads is not None else cfg.engine.tee_threads
    if threads is not None:
        torch.set_num_threads(int(threads))

    victim = load_model(cfg.model)
    decoder = load_model(a.decoder) if a.decoder is not None else victim
    workload = load_workload(cfg.workload, victim.tokenizer, cfg.seed)
    prompts = [list(p.input_ids) for p in workload.prompts]
    if len(prompts) < 2:
        raise UserError("the attack needs at least 2 evaluation prompts (the chance floor compares pairs)")
    corpus = load_corpus(a.corpus, victim.tokenizer, cfg.seed)
    corpus_record = {**_plain(a.corpus), "provenance": corpus.source, "seed": cfg.seed}
    settings = TrainSettings(**{k: v for k, v in _plain(a.train).items() if k != "threads"}, seed=cfg.seed)
    try:
        settings.validate()
    except ValueError as exc:
        raise UserError(f"attack.train: {exc}") from None
    pipe = Pipeline(victim=victim, decoder=decoder, eval_prompts=prompts, corpus=corpus, corpus_record=corpus_record,
                    store=Store(cfg.paths.cache_dir), seed=cfg.seed, train_settings=settings,
                    offload=tuple(cfg.engine.offload), sigma_scale=float(cfg.engine.sigma_scale),
                    sensitivity_rule=cfg.engine.sensitivity_rule, capture_batch_size=a.capture.batch_size,
                    capture_max_new_tokens=a.capture.max_new_tokens,
                    code=provenance.source_digest(dirs=("harness", "metrics", "attacks")), log=_log,
                    victim_config=_plain(cfg.model), decoder_config=_plain(a.decoder) if a.decoder is not None
                    else _plain(cfg.model))
    check_component(a.component, a.layer, tuple(cfg.engine.offload), len(victim.model.model.layers))
    decode = lambda ids: victim.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    floor = controls.floor(prompts)

    # The attack itself.
    train_conf, train_eps = ("t3", None) if a.setting in ("noise_free", "noise_oblivious") else (configuration, epsilon)
    inverter, attacker = pipe.attacker(train_conf, train_eps, a.component, a.layer)
    cap = pipe.eval_capture(configuration, epsilon, a.component, a.layer)
    recon = pipe.reconstruct(inverter, attacker["key"], cap, a.component)
    scores = controls.score(prompts, recon, decode, semantic_model=semantic_model)

    # Controls: the noise-free attacker on T3 (positive), the shuffled-pairs attacker on T3 (negative).
    t3_cap = cap if configuration == "t3" else pipe.eval_capture("t3", None, a.component, a.layer)
    if a.setting == "noise_free":
        positive_f1 = scores.f1
        positive_key = attacker["key"]
    else:
        clean, clean_rec = pipe.attacker("t3", None, a.component, a.layer)
        positive_f1 = controls.score(prompts, pipe.reconstruct(clean, clean_rec["key"], t3_cap, a.component),
                                     decode, text_metrics=False).f1
        positive_key = clean_rec["key"]
    shuffled, shuffled_rec = pipe.attacker("t3", None, a.component, a.layer, shuffled=True)
    negative_f1 = controls.score(prompts, pipe.reconstruct(shuffled, shuffled_rec["key"], t3_cap, a.component),
                                 decode, text_metrics=False).f1
    margin = float(a.controls.gate_margin_pp)
    positive = controls.positive_control(positive_f1, floor, float(a.controls.positive_margin_pp))
    negative = controls.negative_control(negative_f1, floor, margin)
    verdict = controls.verdict(scores.f1, floor, margin, positive, negative)

    # The Bayes-optimal token attacker on layer-0 QKV.
    bayes_out, bayes_metrics = None, {}
    if a.bayes.enabled and "qkv" in cfg.engine.offload:
        bayes_out = pipe.bayes(configuration, epsilon, list(a.bayes.k), a.bayes.top_k, a.bayes.prior,
                               a.bayes.rows_per_chunk, a.bayes.vocab_per_chunk)
        bayes_metrics = _bayes_metrics(bayes_out, prompts, floor, margin)

    acc = accounting.privacy_summary(configuration, epsilon, [len(p) for p in prompts],
                                     len(victim.model.model.layers), cfg.generation.max_new_tokens,
                                     tuple(cfg.engine.offload), float(cfg.engine.sigma_scale))

    metrics: dict[str, Any] = {"chance_floor_token_f1": floor, **scores.metrics, **verdict,
                               "gate_margin_pp": margin}
    metrics.update(positive.f1.flat("positive_control_token_f1"))
    metrics["positive_control_pass"] = positive.passed
    metrics.update(negative.f1.flat("negative_control_token_f1"))
    metrics["negative_control_pass"] = negative.passed
    metrics.update(bayes_metrics)
    metrics.update(acc)
    training = attacker.get("training") or {}
    metrics["train_steps"] = training.get("steps")
    metrics["train_minutes"] = (training.get("seconds") or 0.0) / 60.0 if training else None
    metrics["train_best_val_loss"] = training.get("best_val_loss")
    metrics["epsilon_mean"] = (sum(e for e in cap.epsilons if e is not None) / len(cap.epsilons)
                               if configuration in NOISY else None)

    samples = []
    for i, prompt in enumerate(workload.prompts):
        row = {"id": prompt.id, "prompt": prompt.text, "prompt_ids": list(prompt.input_ids),
               "n_prompt_tokens": len(prompt.input_ids), "epsilon": cap.epsilons[i],
               "output_ids": recon[i], **scores.rows[i]}
        if bayes_out is not None:
            row.update({"bayes_top1": bayes_out["top1"][i], "bayes_top5": bayes_out["topk"][i],
                        "bayes_output_ids": bayes_out["guesses"][i]})
        samples.append(row)

    notes = []
    if a.component == "lm_head":
        notes.append("the LM head exposes only the positions whose logits are computed (the last prompt position at "
                     "prefill, then one per decode step), not every position")
    if verdict["attack_verdict"] == "invalid":
        why = [n for n, c in (("positive", positive), ("negative", negative)) if not c.passed]
        notes.append(f"INVALID: the {' and '.join(why)} control failed; this run certifies nothing")

    results = {
        "experiment": "attack",
        "experiment_name": cfg.experiment_name,
        "status": "ok",
        "configuration": configuration,
        "epsilon": epsilon,
        "model": victim.name,
        "model_source": victim.source,
        "decoder": decoder.name,
        "decoder_source": decoder.source,
        "workload": workload.name,
        "workload_info": {k: v for k, v in workload_record(workload).items() if k != "name"},
        "n_prompts": len(prompts),
        "attack": {"setting": a.setting, "component": a.component, "layer": a.layer,
                   "trained_under": {"configuration": train_conf, "epsilon": train_eps},
                   "train": _plain(a.train), "corpus": {**corpus_record, "n_stream_tokens": corpus.n_stream_tokens},
                   "capture": _plain(a.capture)},
        "metrics": metrics,
        "metric_definitions": _definitions(cfg),
        "controls": {"chance_floor_token_f1": floor, "positive": {"attacker": positive_key, "passed": positive.passed},
                     "negative": {"attacker": shuffled_rec["key"], "passed": negative.passed}},
        "training": {"attacker": {k: v for k, v in attacker.items() if k != "state"},
                     "positive_control": positive_key, "negative_control": shuffled_rec["key"]},
        "bayes": None if bayes_out is None else {k: v for k, v in bayes_out.items()
                                                 if k not in ("top1", "topk", "guesses")},
        "accounting": {**acc, "n_layers": len(victim.model.model.layers),
                       "max_new_tokens": cfg.generation.max_new_tokens, "offload": list(cfg.engine.offload),
                       "sigma_scale": float(cfg.engine.sigma_scale)},
        "timings": pipe.timings,
        "cache": pipe.cache_events,
        "semantic_model": cfg.semantic_model,
        "notes": notes,
        "tags": list(cfg.tags),
        "config_hash": ctx.config_hash,
        "run_dir": ctx.name,
        "provenance": provenance.collect(OmegaConf.to_container(cfg, resolve=True), cfg.seed, engines={},
                                         extra={"bleu_signature": metrics.get("bleu_signature"),
                                                "torch_threads": torch.get_num_threads()}),
    }
    ctx.run_dir.write_results(results, samples)
    print_summary(results)
    mirror(cfg, ctx.run_dir.path, results, samples, name=ctx.name, table_columns=_TABLE_COLUMNS)
    return results


def _bayes_metrics(out: dict, prompts: list[list[int]], floor: float, margin: float) -> dict[str, Any]:
    from attacks import controls
    from metrics.intervals import mean_ci

    m: dict[str, Any] = {}
    m.update(mean_ci(out["top1"], bounds=(0.0, 100.0)).flat("bayes_top1"))
    m.update(mean_ci(out["topk"], bounds=(0.0, 100.0)).flat(f"bayes_top{out['top_k']}"))
    f1 = controls.score(prompts, out["guesses"], None, text_metrics=False).f1
    m.update(f1.flat("bayes_token_f1"))
    m["bayes_gate"] = controls.gate(f1, floor, margin)
    m["bayes_top1_chance"] = out["chance_top1"]
    m["bayes_sigma_mean"] = out["sigma_mean"]
    for point in out["k_curve"]:
        k = point["k"]
        m[f"bayes_top1_k{k}"] = point["top1"]
        m[f"bayes_top1_k{k}_ci_lo"] = point["top1_ci_lo"]
        m[f"bayes_top1_k{k}_ci_hi"] = point["top1_ci_hi"]
        if "top1_predicted" in point:
            m[f"bayes_top1_k{k}_predicted"] = point["top1_predicted"]
    return m


def _definitions(cfg: DictConfig) -> dict[str, str]:
    return {
        "token_precision/recall/f1": "multiset token overlap of reconstruction and prompt, macro over prompts, t 95% CI",
        "chance_floor_token_f1": "mean token F1 over all pairs of distinct evaluation prompts (an unrelated prompt's score)",
        "attack_gate": f"true when the controls passed and token_f1_ci_hi <= floor + {cfg.attack.controls.gate_margin_pp} pp",
        "attack_verdict": "pass (at chance) | fail (reconstructs above chance) | invalid (a control failed)",
        "positive_control_token_f1": "the same component's noise-free attacker on unmasked (t3) exposures; must reach "
                                     f"floor + {cfg.attack.controls.positive_margin_pp} pp (lower CI bound)",
        "negative_control_token_f1": "that attacker trained on shuffled (exposure, prompt) pairs, on t3; must stay at or "
                                     "below floor + margin (upper CI bound)",
        "exact_match": "% of prompts reconstructed token for token",
        "bleu": "corpus BLEU of decoded reconstructions vs decoded prompts (sacrebleu), bootstrap 95% CI",
        "rouge_l": "mean ROUGE-L F1, t 95% CI",
        "semantic_similarity": f"mean cosine x 100 of {cfg.semantic_model} embeddings, t 95% CI",
        "bayes_top1/top5": "% of prompt positions whose token is the nearest (top-5) layer-0 QKV codeword to the "
                           "exposure (maximum likelihood), macro over prompts, t 95% CI",
        "bayes_top1_k{k}": "top-1 when the prompt is submitted k times and the k exposures averaged; _predicted: "
                           "simulated single exposures at sigma/sqrt(k)",
        "bayes_top1_chance": "top-1 of guesses independent of the truth with the same token distributions",
        **accounting.METRIC_DEFINITIONS,
    }


def print_summary(results: dict[str, Any]) -> None:
    m = results["metrics"]
    eps = results["epsilon"]
    a = results["attack"]
    head = (f"{results['experiment_name']}: {results['model']} · {results['configuration']}"
            f"{'' if eps is None else f' (ε={eps:g})'} · {a['setting']} · {a['component']} layer {a['layer']} · "
            f"{results['n_prompts']} prompts")
    lines = [head, *metric_lines(m, ("token_precision", "token_recall", "token_f1", "positive_control_token_f1",
                                     "negative_control_token_f1", "semantic_similarity", "bayes_top1", "bayes_top5",
                                     "bayes_token_f1"), width=28)]
    lines.append(f"  {'chance floor (token F1)':<28}{m['chance_floor_token_f1']:>8.2f}")
    ks = sorted(int(k[len("bayes_top1_k"):]) for k in m if k.startswith("bayes_top1_k") and k[12:].isdigit())
    if len(ks) > 1:
        lines.append("  bayes top-1 vs k: " + ", ".join(f"k={k}: {m[f'bayes_top1_k{k}']:.1f}" for k in ks))
    if m.get("gdp_mu_composed") is not None:
        lines.append(f"  privacy: ε per token {m['epsilon_nominal']:.4g}; composed over {m['gdp_exposures_composed']} "
                     f"exposures μ = {m['gdp_mu_composed']:.4g} (GDP) ≈ ({m['dp_epsilon_composed']:.4g}, "
                     f"{m['dp_delta']:g})-DP")
    lines.append(f"  verdict: {m['attack_verdict']} (attack_gate={m['attack_gate']})")
    for note in results.get("notes", []):
        lines.append(f"  note: {note}")
    print("\n".join(lines), flush=True)
