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

import dataclasses
import statistics
from typing import Any

from omegaconf import DictConfig

from harness import configurations, schema
from harness.errors import UserError
from harness.results import RunContext
from runners import common, identity

describe_skip = common.epsilon_ignored_note


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """What changes a collab result: not the SpliTEE sections or the workload; the parameter normalised."""
    return schema.semantic_config(cfg, identity.keys(cfg), epsilon=parameter(cfg))


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

    from attacks.collab import decodeleak as leak
    from attacks.collab.evidence_recall import Vocabulary, tokenise_evidence
    from harness.adversary_view import view_meta
    from harness.collab import benchmarks, edge_baselines, engine, prompts, protocol
    from harness.collab.defences import make_defence
    from harness.models import load_model
    from metrics.answers import constant_answer_floor, option_correct, scored_correct
    from metrics.intervals import mean_ci
    from metrics.text import rouge_l

    c = cfg.collab
    name, lam = cfg.configuration.name, parameter(cfg)
    if c.threads is not None:
        torch.set_num_threads(int(c.threads))
    ks, k_rep = sorted(int(k) for k in c.metrics.ks), int(c.metrics.report_k)
    edge = load_model(cfg.model, cache_dir=cfg.paths.cache_dir, placement=c.placement.edge)
    # One model for both parties only where both are placed alike; else each party loads its own copy.
    cloud = (edge if c.cloud is None and c.placement.cloud == c.placement.edge else
             load_model(c.cloud if c.cloud is not None else cfg.model, cache_dir=cfg.paths.cache_dir,
                        placement=c.placement.cloud))
    try:
        vocab = engine.shared_vocab(edge.tokenizer, cloud.tokenizer)
    except ValueError:
        raise UserError(f"the edge model {edge.name} and the cloud model {cloud.name} have different tokenizers; "
                        "collaborative decoding fuses distributions over one shared vocabulary") from None
    critical = bool(c.benchmark.answer_critical)
    bench = benchmarks.load_benchmark(c.benchmark, n_examples=None if critical else c.benchmark.n_examples)
    pad, eos = common.special_ids(edge.tokenizer)
    pair = protocol.Pair(edge.model, cloud.model, edge.tokenizer, vocab, eos)
    if critical:
        if not bench.has_options:
            raise UserError(f"collab.benchmark.answer_critical=true needs an option benchmark; {bench.name} has references")
        bench.examples = protocol.answer_critical(pair, bench.examples, n=c.benchmark.n_examples)
        bench.filter["answer_critical"] = True
        if len(bench.examples) < 2:
            raise UserError(f"collab.benchmark.answer_critical=true kept {len(bench.examples)} example(s); the paired "
                            "intervals need at least 2")
    examples = bench.examples
    top = max(ks)
    settings = dict(alpha=float(c.alpha), candidates=int(c.candidates), dp_delta=float(c.dp_delta),
                    renyi_order=float(c.renyi_order),
                    baselines=edge_baselines.options_of(c, name, edge.model, edge.tokenizer))
    defence = make_defence(name, lam, **settings)
    common_kw = dict(mode=c.fusion, max_new_tokens=int(c.max_new_tokens), seed=int(cfg.seed), view_top=int(c.view_top))
    meta = view_meta(cfg, system=configurations.COLLAB, workload=bench.name, epsilon=lam if lam is not None else cfg.epsilon)
    meta.update(fusion=c.fusion, alpha=float(c.alpha), cloud_model=cloud.name, edge_model=edge.name)

    key = dict(edge=edge.source, cloud=cloud.source, examples=[dataclasses.asdict(e) for e in examples],
               max_new_tokens=int(c.max_new_tokens), top=top)
    floor = protocol.cached(cfg.paths.cache_dir, {**key, "run": "cloud_alone"}, lambda: protocol.cloud_alone(
        pair, examples, max_new_tokens=int(c.max_new_tokens), top=top))
    key.update(common_kw, alpha=float(c.alpha))
    undefended = protocol.cached(cfg.paths.cache_dir, {**key, "run": "undefended"}, lambda: protocol.collaborate_all(
        pair, examples, make_defence("collab_none", None, **settings), desc="positive control (undefended)",
        **common_kw))
    if name == "collab_none":  # the undefended point is its own positive control
        signals, undefended = undefended, None
        signals.view.meta = meta
    else:
        signals = protocol.collaborate_all(pair, examples, defence, meta=meta,
                                           desc=f"{name} ({c.fusion}-side)", **common_kw)
    no_context = protocol.cached(cfg.paths.cache_dir, {**key, "run": "no_context"}, lambda: protocol.collaborate_all(
        pair, examples, make_defence("collab_none", None, **settings), private=False,
        desc="null of the undefended run (edge without x_priv)", **common_kw))
    # The verdict's null signal: this defence, parameter and seed with an edge that does not hold x_priv.
    null = no_context if name == "collab_none" else protocol.collaborate_all(
        pair, examples, make_defence(name, lam, **settings), private=False,
        desc=f"null signal: {name} without x_priv", **common_kw)
    # The negative control's second null: the same, another seed (identical for a deterministic defence).
    null_again = protocol.collaborate_all(pair, examples, make_defence(name, lam, **settings), private=False,
                                          desc="negative control: null signal, seed + 1",
                                          **{**common_kw, "seed": int(cfg.seed) + 1})

    vocab_info = Vocabulary(edge.tokenizer)
    evidence = [tokenise_evidence(e.evidence, vocab_info, bool(c.evidence.leading_space)) for e in examples]

    def sets_of(sig: protocol.Signals) -> list[list[list[int]]]:
        return [leak.exposure_sets(sig.view, e.id, cloud=cloud.model, vocab=vocab, top=top) for e in examples]

    run_sets = sets_of(signals)
    curves = leak.score_sets(run_sets, evidence, vocab_info, ks)
    floor_curves = leak.score_sets(floor.sets, evidence, vocab_info, ks)
    # The verdict: the informed attacker (signal ∪ its own no-signal guesses) on the signal against the same
    # attacker on the null signal; the controls likewise (attacks/collab/decodeleak.py).
    null_sets = sets_of(null)
    informed = leak.score_sets(run_sets, evidence, vocab_info, ks, prior=floor.sets)
    informed_null = leak.score_sets(null_sets, evidence, vocab_info, ks, prior=floor.sets)
    pos = None if undefended is None else (
        leak.score_sets(sets_of(undefended), evidence, vocab_info, ks, prior=floor.sets),
        leak.score_sets(sets_of(no_context), evidence, vocab_info, ks, prior=floor.sets))
    neg = (leak.score_sets(sets_of(null_again), evidence, vocab_info, ks, prior=floor.sets), informed_null)
    inv = c.inversion
    if inv.enabled:
        def inversions(all_sets: list[list[list[int]]]) -> list[str]:
            return [leak.invert(cloud.model, cloud.tokenizer, prompts.encode(cloud.tokenizer, prompts.inversion_text(
                e, cloud.tokenizer, s, int(inv.k), int(inv.max_steps))), int(inv.max_new_tokens))
                for e, s in zip(examples, all_sets)]

        inv_key = {"edge": edge.source, "cloud": cloud.source, "examples": key["examples"], "top": top,
                   "max_new_tokens": int(c.max_new_tokens), "inversion": dict(inv), "run": "floor_inversion"}
        guesses = {"run": inversions(run_sets),
                   "floor": protocol.cached(cfg.paths.cache_dir, inv_key, lambda: inversions(floor.sets))}
        for curves_, texts in ((curves, guesses["run"]), (floor_curves, guesses["floor"])):
            curves_.inversion = [leak.rouge1(e.context, g) for e, g in zip(examples, texts)]
            curves_.inversion_text = list(texts)

    option_scores = None
    if bench.has_options and c.option_scoring == "likelihood":
        utility_metric = "accuracy"
        option_scores = protocol.option_loglik(pair, examples, defence, mode=c.fusion, seed=int(cfg.seed))
        cloud_scores = protocol.cached(cfg.paths.cache_dir, {"edge": edge.source, "cloud": cloud.source,
                                                             "examples": key["examples"], "run": "cloud_option_loglik"},
                                       lambda: protocol.option_loglik(pair, examples, None, mode=c.fusion, seed=0))
        per = [scored_correct(sc, e.answer) for sc, e in zip(option_scores, examples)]
        cloud_per = [scored_correct(sc, e.answer) for sc, e in zip(cloud_scores, examples)]
    elif bench.has_options:
        utility_metric = "accuracy"
        per = [option_correct(t, e.options, e.answer) for t, e in zip(signals.texts, examples)]
        cloud_per = [option_correct(t, e.options, e.answer) for t, e in zip(floor.texts, examples)]
    else:
        utility_metric = "rouge_l"
        per = [rouge_l(e.reference, t) for t, e in zip(signals.texts, examples)]
        cloud_per = [rouge_l(e.reference, t) for t, e in zip(floor.texts, examples)]
    util, cloud_util = mean_ci(per, bounds=(0.0, 100.0)), mean_ci(cloud_per, bounds=(0.0, 100.0))
    # Accuracy that does not clear the constant answer's (always the most frequent gold option) shows no skill:
    # a defence cannot lower it measurably, so the benchmark says nothing about that defence's cost.
    accuracy_floor = constant_answer_floor([e.answer for e in examples]) if utility_metric == "accuracy" else None

    curves_out = leak.summarise(curves, floor_curves, ks)
    v = leak.verdict(informed, informed_null, pos, neg, k_rep, float(c.controls.gate_margin_pp),
                     float(c.controls.positive_margin_pp))
    informed_out = {f"informed_{k}": val for k, val in leak.summarise(informed, floor_curves, ks).items()
                    if not k.startswith("floor_") and "inversion" not in k}
    rep = str(k_rep)
    metrics: dict[str, Any] = {}
    for m in leak.METRICS:
        metrics[f"{m}_at_{k_rep}"] = curves_out[f"{m}_at_k"][rep]
        metrics[f"floor_{m}_at_{k_rep}"] = curves_out[f"floor_{m}_at_k"][rep]
        metrics[f"excess_{m}_at_{k_rep}"] = curves_out[f"excess_{m}_at_k"][rep]
    metrics[f"informed_token_er_at_{k_rep}"] = informed_out["informed_token_er_at_k"][rep]
    metrics[f"informed_excess_token_er_at_{k_rep}"] = informed_out["informed_excess_token_er_at_k"][rep]
    metrics[f"null_excess_token_er_at_{k_rep}"] = v["null_excess_token_er"]
    metrics[f"null_excess_token_er_at_{k_rep}_ci"] = v["null_excess_token_er_ci"]
    metrics.update({k: curves_out[k] for k in ("inversion_rouge1_recall", "inversion_rouge1_f1",
                                               "floor_inversion_rouge1_recall", "excess_inversion_rouge1_recall")
                    if k in curves_out})
    metrics.update(util.flat(utility_metric))
    metrics[f"cloud_only_{utility_metric}"] = cloud_util.mean
    if accuracy_floor is not None:
        metrics["accuracy_floor"] = accuracy_floor
        metrics["accuracy_skill"] = util.lo is not None and util.lo > accuracy_floor
    metrics.update({k: v[k] for k in ("verdict", "positive_control_pass", "negative_control_pass")})
    steps = signals.step_seconds
    metrics["seconds_per_step"] = statistics.fmean(steps) if steps else None
    metrics["defence_seconds_per_step"] = signals.defence_seconds / len(steps) if steps else None

    leak_ci = curves_out["token_er_at_k_ci"][rep]
    results = {
        **_header(cfg, edge, bench),
        "system": configurations.COLLAB,
        "configuration": name,
        "epsilon": lam,
        "privacy_parameter": configurations.privacy_parameter(name, lam, unit=_parameter_unit(cfg)),
        "fusion": c.fusion,
        "alpha": float(c.alpha),
        "candidates": int(c.candidates) if name == "coveil" else None,
        "cloud_model": cloud.name,
        "cloud_model_source": cloud.source,
        "evidence_tokenisation": "leading_space" if c.evidence.leading_space else "bare",
        "option_scoring": c.option_scoring if bench.has_options else None,
        "ks": ks,
        "metrics": metrics,
        **curves_out,
        **informed_out,
        "accuracy": util.mean if utility_metric == "accuracy" else None,
        "accuracy_ci": [util.lo, util.hi] if utility_metric == "accuracy" else None,
        "utility": {"metric": utility_metric, "value": util.mean, "ci": [util.lo, util.hi],
                    "cloud_only": cloud_util.mean, "constant_answer_floor": accuracy_floor},
        "controls": v,
        "verdict": v["verdict"],
        "tradeoff": common.tradeoff(leakage_metric=f"token_er_at_{k_rep}",
                                    leakage=curves_out["token_er_at_k"][rep], leakage_ci=leak_ci,
                                    attacker="decodeleak (the paper's exposure sets)",
                                    leakage_floor=curves_out["floor_token_er_at_k"][rep], utility_metric=utility_metric,
                                    utility=util.mean, utility_ci=[util.lo, util.hi],
                                    reference="gold answer" if utility_metric == "accuracy" else "reference response"),
        "benchmark": benchmarks.describe(bench),
        "metric_definitions": _definitions(cfg),
    }
    samples = []
    for i, e in enumerate(examples):
        row = {"id": e.id, "query": e.query, "evidence": list(e.evidence), "output_ids": signals.output_ids[i],
               "output_text": signals.texts[i], "cloud_only_text": floor.texts[i], "utility": per[i],
               **{f"{m}_at_{k_rep}": curves.rows[i][m][k_rep] for m in leak.METRICS},
               **{f"floor_{m}_at_{k_rep}": floor_curves.rows[i][m][k_rep] for m in leak.METRICS}}
        if curves.inversion:
            row.update(curves.inversion[i], inversion_text=curves.inversion_text[i])
        if bench.has_options:
            row["gold"] = e.answer
        if option_scores is not None:
            row["option_loglik"] = option_scores[i]
        samples.append(row)
    return common.finish(cfg, ctx, results, samples, summary=summary,
                         provenance_extra={"torch_threads": torch.get_num_threads()},
                         placement={"edge": edge.placement(), "cloud": cloud.placement()},
                         before_done=lambda: signals.view.save(ctx.run_dir.path / "view.pt"),
                         mirror_columns=("id", "output_text", f"token_er_at_{k_rep}", "utility"))


def _header(cfg: DictConfig, edge: Any, bench: Any) -> dict[str, Any]:
    return {"experiment": "collab", "experiment_name": cfg.experiment_name, "status": "ok", "model": edge.name,
            "model_source": edge.source, "workload": f"collab:{bench.name}", "n_prompts": len(bench.examples),
            "generation": {"max_new_tokens": int(cfg.collab.max_new_tokens), "greedy": True, "stop_at_eos": True}}


def _definitions(cfg: DictConfig) -> dict[str, str]:
    c = cfg.collab
    return {
        "token_er_at_k": "Token-ER@K (eq. 6), % of the evidence's content token ids in the union of the per-step "
                         "top-K exposure sets; mean over examples; _ci: Student-t 95%",
        "rouge1_er_at_k": "ROUGE1-ER@K (eq. 7): % of the evidence's content words among the words the exposed ids decode to",
        "span_er_at_k": "Span-ER@K (eq. 8): per-span token recall averaged over spans",
        "auc_at_k": "AUC@K (eq. 9): mean Token-ER@k over k = 1..K",
        "floor_*": "the same metric on the cloud alone's own top-K along its greedy generation from x_pub (no signal)",
        "excess_*": "per-example metric minus its floor, mean with a paired Student-t 95% interval",
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
                                     "x_priv), per example, mean with a paired Student-t 95% interval",
        "verdict": f"attacks/controls.classify on null_excess_token_er_at_{c.metrics.report_k} against 0 with m = "
                   f"{c.controls.gate_margin_pp} pp; positive control: the undefended run against the undefended "
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
                 f"[{c['null_excess_token_er_ci'][0]:.2f}, {c['null_excess_token_er_ci'][1]:.2f}]")
    lines.append(f"  verdict: {results['verdict']} (positive control {'pass' if m['positive_control_pass'] else 'fail'}, "
                 f"negative control {'pass' if m['negative_control_pass'] else 'fail'})")
    return "\n".join(lines)
