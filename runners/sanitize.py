"""Token-sanitiser runner (paper 001): how much a sanitiser hides of a prompt, and what it costs in accuracy.

One run = one sanitiser configuration (stencil | dx_noise | dx_stencil | custext_plus) at one value of its
privacy parameter (`epsilon`: η for the dχ mechanisms, ε for CusText+; Stencil has none) with the
`sanitize` section's window L, σ, distance and table:

1. privacy: the workload's prompts are sanitised on the client side (only their text tokens), the
   sanitised sequences are the adversary view (channel `sanitized_tokens`, view.pt), and the attackers of
   attacks/sanitize/ read it: the paper's Pr@5 (neighbours), the mechanism-aware Bayes attacker, and for
   the window mechanisms the window inverter, the ridge inverter (`learned`) and the attack suite's learned
   decoder (`decoder`, the victim model frozen, trained on the sanitised public corpus); with controls and
   the verdict (the worst over them);
2. utility: lm-eval zero-shot accuracy on each task of `sanitize.tasks` with its inputs sanitised, beside
   the same model on the unsanitised inputs.

    splitbench experiment=sanitize_smoke                       # one tiny-model run (dx_stencil)
    splitbench -m experiment=sanitize_smoke                    # every mechanism (the file's sweep)
    splitbench -m experiment=sanitize configuration=dx_stencil epsilon=50,100,200 sanitize.window=4,5
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from omegaconf import DictConfig

from harness import configurations, run_identity
from harness.errors import UserError
from harness.results import RunContext
from harness.sanitize.config import tradeoff_setting
from runners import common

describe_skip = common.epsilon_ignored_note
_TABLE_COLUMNS = ("id", "prompt", "sanitized_text", "unchanged_rate", "neighbours_top1", "bayes_top1", "decoder_top1",
                  "contextual_top1")


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """No generation, engine, baseline or similarity model; ε normalised (Stencil ignores it)."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name, cfg.epsilon))


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import time

    import torch

    from attacks.sanitize import suite
    from harness.adversary_view import view_meta
    from harness.sanitize import experiment, prompts, sanitizer

    section = cfg.sanitize
    if section.threads is not None:
        torch.set_num_threads(int(section.threads))
    configuration = cfg.configuration.name
    epsilon = configurations.effective_epsilon(configuration, cfg.epsilon)
    clock = {"start": time.perf_counter()}
    inputs = common.load_inputs(cfg, placement=section.placement)
    if len(inputs.prompts) < 2:
        raise UserError("the sanitiser attacks need at least 2 prompts (their controls compare prompts)")
    model, tokenizer = inputs.loaded.model, inputs.loaded.tokenizer
    sanitize = sanitizer.build(section, configuration, epsilon, model, tokenizer)
    task_docs = experiment.load_tasks(section, cfg.seed)
    clock["load"] = time.perf_counter()
    sanitized = prompts.sanitize_prompts(sanitize, inputs.workload.prompts, tokenizer, cfg.seed)
    view = prompts.adversary_view(sanitized, view_meta(cfg, system=configurations.SANITIZE,
                                                       model=inputs.loaded.name, workload=inputs.workload.name))
    clock["sanitize"] = time.perf_counter()
    attacks = suite.attack(view, sanitized.original_text_ids, sanitize, section.attack, cfg.seed, tokenizer, model)
    clock["attacks"] = time.perf_counter()
    use = experiment.utility(sanitize, section, inputs.loaded, task_docs, cfg.seed, cfg.paths.cache_dir)
    clock["accuracy"] = time.perf_counter()
    best, utility = attacks.strongest, use.value
    results = {
        **common.results_header(cfg, "sanitize", inputs, generation=False),
        "system": configurations.SANITIZE,
        "configuration": configuration,
        "epsilon": epsilon,
        "privacy_parameter": configurations.privacy_parameter(configuration, epsilon),
        "mechanism": asdict(sanitize.settings),
        "sanitize": {"distance": section.distance, "embeddings": section.embeddings, "vocab_filter": section.vocab_filter,
                     "candidate_vocabulary": int(sanitize.table.candidates.numel()), "embedding_dim": sanitize.table.dim},
        "tasks": task_docs.record(),
        "attack_training": attacks.training,
        "metrics": {**attacks.metrics, **use.metrics},
        "roc": {s.name: s.roc for s in attacks.scores},
        "metric_definitions": _definitions(int(section.attack.top_k)),
        "tradeoff": common.tradeoff(
            leakage_metric="token_f1", leakage=best.f1.mean, leakage_ci=(best.f1.lo, best.f1.hi), attacker=best.name,
            leakage_floor=best.reference, utility_metric="accuracy", utility=utility.mean,
            utility_ci=(utility.lo, utility.hi), reference=f"lm-eval gold labels; {use.reference}",
            point=common.test_point(cfg), setting=tradeoff_setting(task_docs.docs)),
        "timings": {k: round(clock[k] - clock[p], 3) for p, k in zip(list(clock), list(clock)[1:])},
        "notes": [],
    }
    samples = experiment.samples(inputs.workload.prompts, sanitized, attacks, tokenizer)
    # lm-eval's per-example records beside samples.jsonl: the exact prompts its template built, the sanitised
    # inputs in them and each answer's log-likelihood, so an accuracy can be checked example by example.
    return common.finish(cfg, ctx, results, samples, summary=summary,
                         side_files={"lm_eval_samples.json": {name: s.samples for name, s in use.scored.items()}},
                         before_done=lambda: view.save(ctx.run_dir.path / "view.pt"),
                         provenance_extra={"torch_threads": torch.get_num_threads()}, mirror_columns=_TABLE_COLUMNS,
                         placement={"model": inputs.loaded.placement()},
                         mirror_history=common.loss_history(attacks.curves))


def _definitions(k: int) -> dict[str, str]:
    return {
        "<attacker>_auc": "the attacker's per-prompt token F1 as a test (metrics/roc.py, results.json roc.<attacker>): "
                          "each prompt's F1 of the guesses from its own sanitised tokens (positives) against from the "
                          "next prompt's (the deranged view, negatives); ROC AUC with DeLong's 95% interval; "
                          "<attacker>_tpr_at_fpr: TPR (%) keyed by the FPR in %, Clopper-Pearson, null below 1/n_prompts; "
                          "unprefixed auc, tpr_at_fpr: the strongest attacker's",
        f"pr_at_{k}": f"the paper's Pr@{k}: % of text positions whose original token is among the {k} nearest "
                      "neighbours of the sanitised token's embedding (itself first), macro over prompts, 95% CI: "
                      "Wilson when every prompt sits at 0 or 100 %, else bootstrap (metrics/proportions.py)",
        "<attacker>_top1/_top{k}": "% of text positions whose original token is the attacker's first guess / among "
                                   "its first k (attackers: neighbours, bayes, window, learned, decoder, contextual), macro "
                                   "over prompts; decoder: its greedy decoding first, then its logits' next best",
        "<attacker>_token_f1": "multiset token F1 of the attacker's first guesses against the prompt's text tokens",
        "<attacker>_token_f1_chance": "the same F1 of each prompt's guesses against the other prompts "
                                      "(attacks.controls.exposure_free_f1): the verdict's reference",
        "<attacker>_negative_control_token_f1": "the attacker on a deranged view (prompt i scored on the "
                                                "sanitised tokens of prompt i+1); _pass: lower bound <= reference + m",
        "positive_control_token_f1": "the neighbours attacker on the unsanitised text; _pass: lower bound >= its "
                                     "reference + positive_margin_pp",
        "<attacker>_verdict": "attacks.controls.classify on <attacker>_token_f1 against its reference; for "
                              "contextual: on contextual_prior_gain against 0",
        "contextual_top1/_top{k}": "the contextual reconstruction (per-token posterior times the victim LM's prior, "
                                   "beam search, attacks/sanitize/contextual.py): its best beam first, then the "
                                   "other beams' tokens and the per-token posterior's order",
        "contextual_prior_top1": "% of text positions whose original is the LM's top-1 given the true prefix and no "
                                 "view (the prior alone), macro over prompts",
        "contextual_prior_gain": "contextual_top1 minus contextual_prior_top1, paired per prompt on the same "
                                 "positions, mean and t 95% CI over prompts (percentage points)",
        "<attacker>_seconds/_seconds_per_position": "wall time of the attacker on the view (its controls and, for "
                                                    "the trained ones, training excluded), in all and per text position; "
                                                    "contextual's is its beam search, the posterior it shares with bayes "
                                                    "being counted under bayes",
        "<attacker>_candidates_per_position": "candidate originals it scores per position: the candidate table for "
                                              "neighbours, window and learned (a nearest search), the posterior's "
                                              "candidates for bayes, beam x those for contextual; null for the "
                                              "decoder, which generates over the model's vocabulary",
        "verdict": "the worst of the attackers' verdicts (leak > inconclusive > at_chance)",
        "unchanged_rate": "% of text positions the sanitiser left unchanged",
        "accuracy_<task>": "lm-eval zero-shot acc (its own template) on the sanitised inputs, % of examples, "
                           "Wilson 95% CI",
        "accuracy": "acc pooled over the examples of every task",
        "accuracy_floor_<task>": "the accuracy of the best answer that ignores the input (always the most frequent "
                                 "gold target of these examples), %",
        "accuracy_skill_<task>": "whether the unsanitised accuracy's lower 95% bound is above that floor: without "
                                 "skill, sanitising the inputs cannot lower the accuracy measurably",
        "accuracy_skilled": "acc pooled over the tasks with skill (absent when none has it); the privacy–utility "
                            "chart's utility, or `accuracy` when no task has skill",
        "accuracy_unsanitized[_<task>]": "the same model and template on the unsanitised inputs",
    }


def summary(results: dict[str, Any]) -> str:
    m = results["metrics"]
    head = common.summary_head(results, f"{results['n_prompts']} prompts", f"tasks {', '.join(results['tasks'])}")
    names = ["accuracy", "accuracy_unsanitized", "pr_at_5", "bayes_top1", "bayes_top5", "neighbours_token_f1",
             "bayes_token_f1", "window_top1", "window_token_f1", "learned_top1", "learned_token_f1", "decoder_top1",
             "decoder_token_f1", "contextual_top1", "contextual_prior_top1", "contextual_prior_gain", "unchanged_rate"]
    lines = [head, *common.metric_lines(m, names, width=24)]
    verdicts = ", ".join(f"{k[:-8]} {v}" for k, v in m.items() if k.endswith("_verdict"))
    lines.append(f"  verdict: {m['verdict']} ({verdicts})")
    return "\n".join(lines)
