"""Attack runner (paper §7.4, Tables 6-7): can the accelerator reconstruct the prompt from what it sees?

One run = one cell of Table 6: an attacker `setting` (noise_free on t3; noise_oblivious or noise_aware on
ep1 / epn) × a `component` (qkv, composite, lm_head, ...) at one configuration and ε. It reports

- the learned inversion attack (attacks/inversion.py) on the evaluation prompts (the workload): token
  precision / recall / F1, exact match, BLEU, ROUGE-L, semantic similarity, each with a 95% interval;
- the chance floor, the positive control (the same component's noise-free attacker on T3), the negative
  control (the noise-free attacker trained on shuffled pairs, on T3) and the verdict `attack_verdict`:
  leak | at_chance | inconclusive (attacks/controls.py);
- the Bayes-optimal token attacker on the layer-0 QKV exposure under the same configuration, with the
  repeated-submission curve (attacks/splitee/bayes.py) and its own verdict `bayes_verdict`;
- `verdict`: the worst of the two (leak > inconclusive > at_chance);
- the privacy accounting of the configuration: nominal ε and the composed GDP / (ε, δ) bound
  (harness/splitee/accounting.py), for `generation.max_new_tokens` generated tokens.

The cell itself is attacks/splitee/suite.py, its mask replicates attacks/splitee/replicates.py; everything
expensive (captures, trained attackers, reconstructions, Bayes curves) is cached under paths.cache_dir/attacks
(attacks/splitee/pipeline.py), so a sweep trains each attacker once.

    splitbench experiment=attack_smoke
    splitbench -m experiment=attack configuration=t3 attack.setting=noise_free attack.component=qkv,composite,lm_head
    splitbench -m experiment=attack configuration=ep1 epsilon=1,15,100,1000,2500 \\
        attack.setting=noise_oblivious,noise_aware attack.component=qkv,composite
"""
from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import configurations, run_identity
from harness.errors import UserError
from harness.results import RunContext
from harness.splitee import accounting
from runners import common

_TABLE_COLUMNS = ("id", "prompt", "output_text", "token_precision", "token_recall", "token_f1", "exact_match", "bleu",
                  "rouge_l", "semantic_similarity", "bayes_top1", "bayes_top5")

describe_skip = common.epsilon_ignored_note


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """What changes an attack result: the keys the attack runner reads (harness/run_identity.py READS, less the
    sequential attacker's subsection, which runner sequential_attack reads); ε normalised (only ep1 uses it)."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name,
                                                                                  cfg.epsilon))


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _log(message: str) -> None:
    print(f"splitbench: {message}", file=sys.stderr, flush=True)


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    from attacks.splitee import suite
    from attacks.splitee.replicates import attack_replicates
    from harness.models import load_model
    from metrics import roc

    a = cfg.attack
    configuration = cfg.configuration.name
    epsilon = configurations.effective_epsilon(configuration, cfg.epsilon)
    suite.check_setting(configuration, a.setting)
    threads = a.train.threads if a.train.threads is not None else cfg.engine.tee_threads
    if threads is not None:
        torch.set_num_threads(int(threads))

    inputs = common.load_inputs(cfg)
    victim = inputs.loaded
    decoder = load_model(a.decoder, cache_dir=cfg.paths.cache_dir) if a.decoder is not None else victim
    suite.check_decoder(victim, decoder)
    if len(inputs.prompts) < 2:
        raise UserError("the attack needs at least 2 evaluation prompts (the chance floor compares pairs)")
    attack = _plain(a)
    pipe = suite.pipeline(victim, decoder, inputs.prompts, attack, _plain(cfg.engine), seed=cfg.seed,
                          cache_dir=cfg.paths.cache_dir, workload=inputs.workload.name,
                          eval_epsilon_lengths=inputs.epsilon_lengths(cfg.epn_n),
                          victim_config=_plain(cfg.model),
                          decoder_config=attack["decoder"] if a.decoder is not None else _plain(cfg.model), log=_log)
    seeds = common.mask_seeds(cfg)
    replicates = attack_replicates(pipe, seeds, configuration, epsilon, attack, semantic_model=common.load_semantic(cfg))
    cell = replicates.cells[0]

    n_layers, offload = len(victim.model.model.layers), list(cfg.engine.offload)
    sigma_scale = float(cfg.engine.sigma_scale)
    acc = accounting.privacy_summary(configuration, epsilon, [len(p) for p in inputs.prompts], n_layers,
                                     cfg.generation.max_new_tokens, tuple(offload), sigma_scale, float(cfg.dp_delta),
                                     epsilon_lengths=inputs.epsilon_lengths(cfg.epn_n))
    metrics, per_mask_seed = replicates.metrics(acc)
    # the attackers' per-prompt F1 as tests: the learned attacker's unprefixed (as its token_f1), the Bayes one's bayes_
    tests = replicates.roc(pipe.eval_prompts)
    metrics.update(roc.flat(tests["learned"]))
    if "bayes" in tests:
        metrics.update(roc.flat(tests["bayes"], "bayes_"))
    results = {
        **common.results_header(cfg, "attack", inputs, generation=False),
        "configuration": configuration,
        "epsilon": epsilon,
        "decoder": decoder.name,
        "decoder_source": decoder.source,
        "mask_seeds": seeds,
        "metrics": metrics,
        "per_mask_seed": per_mask_seed,
        "roc": tests,
        "metric_definitions": _definitions(cfg),
        **cell.sections(pipe, attack),
        "accounting": {**acc, "n_layers": n_layers, "max_new_tokens": cfg.generation.max_new_tokens,
                       "offload": offload, "sigma_scale": sigma_scale},
        "timings": pipe.timings,
        "cache": pipe.cache_events,
        "semantic_model": cfg.semantic_model,
        "notes": cell.notes(),
    }
    results["tradeoff"] = _tradeoff(metrics, attack)
    return common.finish(cfg, ctx, results, replicates.samples(inputs.workload.prompts), summary=summary,
                         provenance_extra={"bleu_signature": metrics.get("bleu_signature"),
                                           "torch_threads": torch.get_num_threads()},
                         mirror_columns=_TABLE_COLUMNS,
                         mirror_history=common.loss_history(_curves(pipe, cell)))


def _curves(pipe: Any, cell: Any) -> dict[str, dict | None]:
    """The training curves of the run's learned attackers by role (pipe.curves; the mask replicates share
    them): the attack's own, the positive and the negative control's, each attacker once (a noise-free
    attack is its own positive control); a cached attacker's are those saved with it when it was trained."""
    out: dict[str, dict | None] = {}
    seen: set[str] = set()
    for role, key in (("attacker", cell.attacker["key"]), ("positive_control", cell.positive_key),
                      ("negative_control", cell.negative_key)):
        if key not in seen:
            seen.add(key)
            out[role] = pipe.curves.get(key)
    return out


def _tradeoff(m: dict[str, Any], attack: Any) -> dict[str, Any]:
    """The leakage half of this run's privacy–utility point: token F1 of the stronger of the learned and the
    Bayes attacker, with that attacker's own no-signal floor. Stronger means the larger excess over its own
    floor, the rule the cross-system chart uses across runs (runners/report/tradeoff.py): by raw F1 the
    learned inverter, whose floor is an unrelated prompt's F1, would win where both read nothing."""
    from attacks import controls

    where = f"{attack['component']} layer {attack['layer']}"
    candidates = [("learned inverter", "token_f1", "chance_floor_token_f1"),
                  ("Bayes attacker", "bayes_token_f1", "bayes_token_f1_chance")]
    name, key, floor = max((c for c in candidates if m.get(c[1]) is not None),
                           key=lambda c: controls.strength(m[c[1]], m.get(c[2])))
    return common.tradeoff(leakage_metric="token_f1", leakage=m[key],
                           leakage_ci=(m.get(f"{key}_ci_lo"), m.get(f"{key}_ci_hi")),
                           attacker=f"{name} ({where})", leakage_floor=m.get(floor))


def _definitions(cfg: DictConfig) -> dict[str, str]:
    return {
        "token_precision/recall/f1": "multiset token overlap of reconstruction and prompt, macro over prompts, "
                                     "95% CI: bootstrap for precision and recall, Student t for F1 (the verdicts "
                                     "read it)",
        "chance_floor_token_f1": "mean token F1 over all pairs of distinct evaluation prompts (an unrelated prompt's score)",
        "auc": "the learned attacker's per-prompt token F1 as a test (metrics/roc.py, results.json roc.learned): each "
               "reconstruction against its own prompt (positives) and against the next prompt (re-paired, negatives), "
               "mask seeds pooled; ROC AUC with DeLong's 95% interval; tpr_at_fpr: TPR (%) keyed by the FPR in %, "
               "Clopper-Pearson, null below 1/n_negatives; bayes_auc, bayes_tpr_at_fpr: the Bayes attacker's",
        "attack_verdict": f"the learned attacker, with m = {cfg.attack.controls.gate_margin_pp} pp (gate_margin_pp) "
                          "and its token F1 interval [lo, hi]: leak if lo > floor + m and the negative control "
                          "passed; at_chance if floor - m <= lo and hi <= floor + m and both controls passed; else "
                          "inconclusive (below the floor, an interval past floor ± m, or a failed control)",
        "attack_gate": "true exactly when attack_verdict is at_chance",
        "attack_valid": "both controls passed",
        "attack_at_floor": "token_f1_ci_hi <= floor + m (one-sided; also true far below the floor)",
        "bayes_verdict": "the Bayes attacker, by the same rule on bayes_token_f1 against bayes_token_f1_chance "
                         "(its negative control holds by construction: nothing is trained); bayes_gate: it is "
                         "at_chance",
        "bayes_token_f1_chance": "token F1 of the Bayes attacker's guess for prompt j against prompt i != j, mean "
                                 "over ordered pairs: what its guessing scores from the wrong exposures",
        "bayes_positive_control_token_f1": "the Bayes attacker on unmasked (t3) exposures; _pass: lower CI bound >= "
                                           "its own bayes_token_f1_chance there + positive_margin_pp",
        "verdict": "the run's verdict: the worst (leak > inconclusive > at_chance) of attack_verdict and "
                   "bayes_verdict; a configuration's is the worst over every run against it (the report)",
        "positive_control_token_f1": "the same component's noise-free attacker on unmasked (t3) exposures; must reach "
                                     f"floor + {cfg.attack.controls.positive_margin_pp} pp (lower CI bound)",
        "negative_control_token_f1": "that attacker trained on shuffled (exposure, prompt) pairs, on t3; must stay at or "
                                     "below floor + margin (upper CI bound)",
        "exact_match": "% of prompts reconstructed token for token",
        "bleu": "corpus BLEU of decoded reconstructions vs decoded prompts (sacrebleu), bootstrap 95% CI",
        "rouge_l": "mean ROUGE-L F1, bootstrap 95% CI",
        "semantic_similarity": f"mean cosine x 100 of {cfg.semantic_model} embeddings, bootstrap 95% CI",
        "bayes_top1/top5": "% of prompt positions whose token is the nearest (top-5) layer-0 QKV codeword to the "
                           "exposure (maximum likelihood), macro over prompts, 95% CI: Wilson when every prompt "
                           "sits at 0 or 100 %, else bootstrap",
        "bayes_top1_k{k}": "top-1 when the prompt is submitted k times and the k exposures averaged; _predicted: "
                           "simulated single exposures at sigma/sqrt(k)",
        "bayes_top1_chance": "top-1 of guesses independent of the truth with the same token distributions",
        "bayes_leak_k": "the smallest k of the curve whose bayes_top1_k{k} lower CI bound exceeds bayes_top1_chance + "
                        "margin (repeated submissions leak from there); null if none. Another threat model: not "
                        "part of verdict",
        **accounting.METRIC_DEFINITIONS,
    }


def summary(results: dict[str, Any]) -> str:
    """The terminal summary of one run (results.json has everything)."""
    m = results["metrics"]
    a = results["attack"]
    head = common.summary_head(results, a["setting"], f"{a['component']} layer {a['layer']}",
                               f"{results['n_prompts']} prompts")
    lines = [head, *common.metric_lines(m, ("token_precision", "token_recall", "token_f1",
                                            "positive_control_token_f1", "negative_control_token_f1",
                                            "semantic_similarity", "bayes_top1", "bayes_top5", "bayes_token_f1"),
                                        width=28)]
    lines.append(f"  {'chance floor (token F1)':<28}{m['chance_floor_token_f1']:>8.2f}")
    ks = sorted(int(k[len("bayes_top1_k"):]) for k in m if k.startswith("bayes_top1_k") and k[12:].isdigit())
    if len(ks) > 1:
        leak = m.get("bayes_leak_k")
        lines.append("  bayes top-1 vs k: " + ", ".join(f"k={k}: {m[f'bayes_top1_k{k}']:.1f}" for k in ks)
                     + (f" (repeated submissions leak from k={leak})" if leak else ""))
    if m.get("gdp_mu_composed") is not None:
        lines.append(f"  privacy: ε per token {m['epsilon_nominal']:.4g}; composed over {m['gdp_exposures_composed']} "
                     f"exposures μ = {m['gdp_mu_composed']:.4g} (GDP) ≈ ({m['dp_epsilon_composed']:.4g}, "
                     f"{m['dp_delta']:g})-DP")
    bayes = f", Bayes attacker {m['bayes_verdict']}" if m.get("bayes_verdict") else ""
    lines.append(f"  verdict: {m['verdict']} (learned attacker {m['attack_verdict']}{bayes})")
    for note in results.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)
