"""Collab runner (paper 003): cloud-edge collaborative decoding, audited by DecodeLeak, under a defence.

One run = one configuration (collab_none, coveil, or a baseline) at one parameter (`epsilon`: λ, B or ε)
in one fusion mode (`collab.fusion`), on one benchmark. It decodes every example collaboratively,
records what the cloud receives (adversary view, view.pt), and reports

- private evidence recall Token-ER / ROUGE1-ER / Span-ER / AUC at every K of collab.metrics.ks, each with
  its no-signal floor (the cloud alone) and the paired excess over it (attacks/collab/decodeleak.py);
- private-context inversion ROUGE-1 recall / F1, floor and excess;
- utility: option accuracy (the stated option, or likelihood option scoring with
  `collab.option_scoring=likelihood`) or ROUGE-L to the reference, and the cloud alone's;
- the verdict on the informed attacker's Token-ER@report_k against its null signal (the same defence on an
  edge without x_priv), with the undefended run against its own null as positive control and a second
  null signal (seed + 1) as negative control; `tradeoff` (the paper's Token-ER and its floor) for the cross-system chart.

    splitbench experiment=collab_smoke
    splitbench -m experiment=collab configuration=coveil epsilon=0.5,1,2,4,8,16 collab.fusion=cloud
"""
from __future__ import annotations

import statistics
from typing import Any

from omegaconf import DictConfig

from harness import configurations, run_identity
from harness.collab import config as collab_config
from harness.results import RunContext
from runners import common

describe_skip = common.epsilon_ignored_note


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """What changes a collab result: not the SpliTEE sections or the workload; the parameter normalised."""
    return run_identity.semantic_config(cfg, epsilon=parameter(cfg))


def parameter(cfg: DictConfig) -> float | None:
    """The defence's parameter this run uses: 0 with collab.parameter_zero, else the epsilon knob (None
    for the undefended point)."""
    eps = configurations.effective_epsilon(cfg.configuration.name, cfg.epsilon)
    return 0.0 if eps is not None and cfg.collab.parameter_zero else eps


def _parameter_unit(cfg: DictConfig) -> str | None:
    """What the parameter measures where the settings change it (InvisibleInk's accounting), else None (the
    registry's unit)."""
    if cfg.configuration.name == "collab_invisibleink" and cfg.collab.invisibleink.accounting == "token":
        return "ε-DP per token (pure)"
    return None


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    from attacks.collab import suite
    from harness.collab import benchmarks, experiment

    c = cfg.collab
    name, lam = cfg.configuration.name, parameter(cfg)
    if c.threads is not None:
        torch.set_num_threads(int(c.threads))
    ks, k_rep = sorted(int(k) for k in c.metrics.ks), int(c.metrics.report_k)
    parties = experiment.load_parties(cfg, common.special_ids)
    bench = experiment.load_examples(cfg, parties.pair)
    examples = bench.examples
    runs = experiment.decode(cfg, parties, bench, name, lam, top=max(ks))
    audit = suite.audit(c, cfg.paths.cache_dir, parties, examples, runs, ks, k_rep)
    use = experiment.utility(cfg, parties, bench, runs)
    util, v, curves_out, rep = use.value, audit.verdict, audit.curves_out, str(k_rep)

    metrics: dict[str, Any] = {**suite.metrics(audit, k_rep), **util.flat(use.metric),
                               f"cloud_only_{use.metric}": use.cloud_only.mean}
    if use.accuracy_floor is not None:
        metrics["accuracy_floor"] = use.accuracy_floor
        metrics["accuracy_skill"] = util.lo is not None and util.lo > use.accuracy_floor
    metrics.update({k: v[k] for k in ("verdict", "positive_control_pass", "negative_control_pass")})
    steps = runs.signals.step_seconds
    metrics["seconds_per_step"] = statistics.fmean(steps) if steps else None
    metrics["defence_seconds_per_step"] = runs.signals.defence_seconds / len(steps) if steps else None
    accuracy = use.metric == "accuracy"
    results = {
        **common.results_header(cfg, "collab", model=parties.edge, workload=f"collab:{bench.name}",
                                n_prompts=len(examples), generation=experiment.generation(cfg)),
        "system": configurations.COLLAB, "configuration": name,
        "epsilon": lam, "privacy_parameter": configurations.privacy_parameter(name, lam, unit=_parameter_unit(cfg)),
        "fusion": c.fusion, "alpha": float(c.alpha), "candidates": int(c.candidates) if name == "coveil" else None,
        "cloud_model": parties.cloud.name, "cloud_model_source": parties.cloud.source,
        "evidence_tokenisation": "leading_space" if c.evidence.leading_space else "bare",
        "option_scoring": c.option_scoring if bench.has_options else None, "ks": ks, "metrics": metrics,
        **curves_out, **audit.informed_out,
        "accuracy": util.mean if accuracy else None, "accuracy_ci": [util.lo, util.hi] if accuracy else None,
        "utility": {"metric": use.metric, "value": util.mean, "ci": [util.lo, util.hi],
                    "cloud_only": use.cloud_only.mean, "constant_answer_floor": use.accuracy_floor},
        "controls": v, "verdict": v["verdict"], "roc": audit.roc,
        "tradeoff": common.tradeoff(leakage_metric=f"token_er_at_{k_rep}", leakage=curves_out["token_er_at_k"][rep],
                                    leakage_ci=curves_out["token_er_at_k_ci"][rep],
                                    attacker="decodeleak (the paper's exposure sets)",
                                    leakage_floor=curves_out["floor_token_er_at_k"][rep], utility_metric=use.metric,
                                    utility=util.mean, utility_ci=[util.lo, util.hi],
                                    reference="gold answer" if accuracy else "reference response",
                                    setting=collab_config.tradeoff_setting(bench.name, c.fusion, c.alpha,
                                                                           parties.edge.name, parties.cloud.name),
                                    point=collab_config.tradeoff_point(name, c.candidates, _parameter_unit(cfg) is not None)),
        "benchmark": benchmarks.describe(bench), "metric_definitions": _definitions(cfg),
        # Which decodes ran, came from the disk cache or were the same computation as an earlier one (issue 50).
        "decodes": runs.decodes.record, "batch_size": parties.pair.batch_size, "rng": parties.pair.rng,
        "prompt_forwards": {"computed": parties.pair.prompt_cache.computed, "reused": parties.pair.prompt_cache.reused},
    }
    samples = [_sample(i, e, runs, audit, use, k_rep, bench.has_options) for i, e in enumerate(examples)]
    return common.finish(cfg, ctx, results, samples, summary=summary,
                         provenance_extra={"torch_threads": torch.get_num_threads()},
                         placement={"edge": parties.edge.placement(), "cloud": parties.cloud.placement()},
                         before_done=lambda: runs.signals.view.save(ctx.run_dir.path / "view.pt"),
                         mirror_columns=("id", "output_text", f"token_er_at_{k_rep}", "utility"),
                         mirror_history=experiment.example_history(
                             samples, k_rep, use.metric,
                             experiment.decode_rates(runs.signals.output_ids, runs.signals.step_seconds)))


def _sample(i: int, e: Any, runs: Any, audit: Any, use: Any, k_rep: int, has_options: bool) -> dict[str, Any]:
    """samples.jsonl's row of example `e` (the i-th)."""
    from attacks.collab.decodeleak import METRICS

    curves, floor_curves = audit.curves, audit.floor_curves
    row = {"id": e.id, "query": e.query, "evidence": list(e.evidence), "output_ids": runs.signals.output_ids[i],
           "output_text": runs.signals.texts[i], "cloud_only_text": runs.floor.texts[i], "utility": use.per[i],
           **{f"{m}_at_{k_rep}": curves.rows[i][m][k_rep] for m in METRICS},
           **{f"floor_{m}_at_{k_rep}": floor_curves.rows[i][m][k_rep] for m in METRICS}}
    if curves.inversion:
        row.update(curves.inversion[i], inversion_text=curves.inversion_text[i])
    if has_options:
        row["gold"] = e.answer
    if use.option_scores is not None:
        row["option_loglik"] = use.option_scores[i]
    return row


def _definitions(cfg: DictConfig) -> dict[str, str]:
    c = cfg.collab
    return {
        "token_er_at_k": "Token-ER@K (eq. 6), % of the evidence's content token ids in the union of the per-step "
                         "top-K exposure sets; mean over examples; _ci: bootstrap 95%",
        "rouge1_er_at_k": "ROUGE1-ER@K (eq. 7): % of the evidence's content words among the words the exposed ids decode to",
        "span_er_at_k": "Span-ER@K (eq. 8): per-span token recall averaged over spans",
        "auc_at_k": "AUC@K (eq. 9): mean Token-ER@k over k = 1..K",
        "floor_*": "the same metric on the cloud alone's own top-K along its greedy generation from x_pub (no signal)",
        "excess_*": "per-example metric minus its floor, mean with a paired bootstrap 95% interval",
        "inversion_rouge1_recall": f"ROUGE-1 recall (%) of the cloud's reconstruction (Prompt D, top-{c.inversion.k} "
                                   f"per step, first {c.inversion.max_steps} steps) against x_priv",
        "accuracy": ("% of examples whose gold option has the highest log-likelihood as the answer's opening under "
                     "the step's decoding distribution (protocol.option_loglik)" if c.option_scoring == "likelihood"
                     else "% of examples whose generation states the gold option first (metrics/answers.py)"),
        "accuracy_floor": "the constant-answer floor: % of examples whose gold option is the most frequent one "
                          "(metrics.answers.constant_answer_floor); accuracy_skill: the accuracy's lower bound clears it",
        "informed_*": "the informed attacker: the signal's exposure sets united with the cloud's own no-signal "
                      "top-K (the floor's sets); its excess over the floor (>= 0) is NOT a leak statistic: uniting "
                      "sets credits extra coverage, so random ids read above it",
        "null_excess_token_er_at_k": "the verdict's statistic: the informed attacker's Token-ER on the signal minus "
                                     "on the null signal (the same defence, parameter and seed, the edge without "
                                     "x_priv), per example over steps paired by collab.controls.step_matching "
                                     f"({c.controls.step_matching}), mean with a paired Student-t 95% interval",
        "controls.null_excess_token_er_earned_ci": "the interval the sample earned (metrics/equivalence.py, issue 51) "
                                                   "at per_item_bound_pp = "
                                                   f"{c.controls.per_item_bound_pp} pp: what at_chance reads; never "
                                                   "narrower than ±B·CP_U(0, n)",
        "roc": "the verdict's per-example scores as a test (metrics/roc.py): positives the informed Token-ER@"
               f"{c.metrics.report_k} on the signal, negatives on the null signal; auc with DeLong's 95% interval, "
               "tpr_at_fpr (%) keyed by the FPR in % with Clopper–Pearson intervals, null below 1/n_null",
        "verdict": f"attacks/controls.classify on null_excess_token_er_at_{c.metrics.report_k} against 0 with m = "
                   f"{c.controls.gate_margin_pp} pp (leak: its t interval; at_chance: its earned interval); "
                   "positive control: the undefended run against the undefended "
                   f"edge without x_priv, lower bound >= {c.controls.positive_margin_pp} pp; negative control: a second "
                   "null signal (seed + 1) against the null does not read leak (lower bound <= m)",
    }


def summary(results: dict[str, Any]) -> str:
    m = results["metrics"]
    k = results["controls"]["verdict_k"]
    head = common.summary_head(results, f"{results['fusion']}-side", f"{results['n_prompts']} examples",
                               model=f"{results['model']} edge / {results['cloud_model']} cloud")
    lines = [head]
    for name in ("token_er", "rouge1_er", "span_er", "auc"):
        lines.append(f"  {name}@{k:<4}{m[f'{name}_at_{k}']:>8.2f}   floor {m[f'floor_{name}_at_{k}']:>6.2f}   "
                     f"excess {m[f'excess_{name}_at_{k}']:>+7.2f}")
    if "inversion_rouge1_recall" in m:
        lines.append(f"  inversion ROUGE-1 recall {m['inversion_rouge1_recall']:.2f} (floor "
                     f"{m['floor_inversion_rouge1_recall']:.2f})")
    u = results["utility"]
    floor = u.get("constant_answer_floor")
    lines.append(f"  {u['metric']} {u['value']:.1f} [{u['ci'][0]:.1f}, {u['ci'][1]:.1f}] (cloud alone {u['cloud_only']:.1f}"
                 + (f"; constant-answer floor {floor:.1f}" if floor is not None else "") + ")")
    c = results["controls"]
    lines.append(f"  excess over the null signal (verdict) {c['null_excess_token_er']:+.2f} "
                 f"[{c['null_excess_token_er_ci'][0]:.2f}, {c['null_excess_token_er_ci'][1]:.2f}]"
                 + (f", earned [{c['null_excess_token_er_earned_ci'][0]:.2f}, {c['null_excess_token_er_earned_ci'][1]:.2f}]"
                    if "null_excess_token_er_earned_ci" in c else ""))
    lines.append(f"  verdict: {results['verdict']} (positive control {'pass' if m['positive_control_pass'] else 'fail'}, "
                 f"negative control {'pass' if m['negative_control_pass'] else 'fail'})")
    return "\n".join(lines)
