"""Sequential all-exposure attack runner (issues 32, 36; attacks/splitee/sequential.py, docs/sequential_attack.md).

The prompts are submitted once through the split engine under the configuration (prefill, every layer's
QKV / O / Gate-Up input recorded); the attacker reads that view alone and recovers the prompt position by
position with the mechanism's likelihood (and with prior=model also MAP), against the prior-only floor and,
with null_view, against itself on another prompt's view. Reports top-1, token F1, the paired differences
with Newcombe intervals, the pruning recall per stage (with pruning_rule=no_decisive_miss also each scorer's
decisive misses, which the verdict then reads instead), the verdict with its reason, and the cost.

    splitbench experiment=sequential_attack_smoke
    splitbench -m experiment=sequential_attack_smoke configuration=t3,ep1
    splitbench experiment=sequential_attack configuration=ep1 epsilon=15
"""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from harness import configurations, run_identity
from harness.results import RunContext
from runners import common

if TYPE_CHECKING:
    from attacks.splitee.sequential import Settings

describe_skip = common.epsilon_ignored_note


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """The keys this runner reads (harness/run_identity.py READS), of `attack` only its sequential and controls
    subsections: the learned attack's options never move it; ε normalised."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name,
                                                                                  cfg.epsilon))


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    from attacks.splitee import sequential as sq
    from metrics import roc

    s = sq.Settings.from_config(OmegaConf.to_container(cfg.attack.sequential, resolve=True))
    configuration = cfg.configuration.name
    epsilon = configurations.effective_epsilon(configuration, cfg.epsilon)
    if configuration not in configurations.names(split=True) or configurations.get(configuration).mechanism not in (
            "plain", "gaussian"):
        from harness.errors import UserError
        raise UserError(f"the sequential attacker models t3's plain inputs and Gaussian masks (ep1, epn); got "
                        f"configuration={configuration} (slalom: docs/sequential_attack.md, its one-time pad)")
    inputs = common.load_inputs(cfg)
    model, tokenizer = inputs.loaded.model, inputs.loaded.tokenizer
    notes = []
    if s.null_view and len(inputs.prompts) < 2:
        # The null view is another prompt's view; one prompt has none. Attack without it rather than refuse a
        # run the user meant: MAP is then judged against the prior alone, and the results say so.
        notes.append(f"one prompt, so no other prompt's view to serve as the null view: ran without it"
                     f"{' (MAP judged against the prior alone, map_reference=prior)' if s.map_reference == 'null_view' else ''}"
                     "; attack.sequential.null_view needs workload.n_prompts >= 2")
        s = replace(s, null_view=False, map_reference="prior")
        print(f"splitbench: note: {notes[-1]}", file=sys.stderr, flush=True)
    used = sq.check(s, len(model.model.layers), list(cfg.engine.offload))
    keys = [(op, layer) for layer in used for op in s.ops]
    if cfg.engine.tee_threads is not None:
        torch.set_num_threads(int(cfg.engine.tee_threads))
    lengths, eps_lengths = [len(p) for p in inputs.prompts], inputs.epsilon_lengths(cfg.epn_n)
    engine_kw = dict(sigma_scale=float(cfg.engine.sigma_scale), sensitivity_rule=cfg.engine.sensitivity_rule)
    start = time.perf_counter()
    views, table = sq.record_view(model, inputs.prompts, configuration=configuration, epsilon=epsilon,
                                  seed=cfg.seed, offload=list(cfg.engine.offload), pad_token_id=inputs.pad,
                                  batch_size=cfg.generation.batch_size, epsilon_lengths=eps_lengths, **engine_kw)
    capture_s = time.perf_counter() - start
    rows = sq.prompt_rows(views, lengths, cfg.generation.batch_size, keys)
    del views
    sigmas = sq.op_sigmas(model, configuration, epsilon, eps_lengths, keys, table=table, **engine_kw)
    starts = [sq.public_prefix_length(tokenizer, p, inputs.workload.chat_template) for p in inputs.prompts]
    outcome = sq.run(model, inputs.prompts, rows, sigmas, s, keys, starts,
                     log=lambda msg: print(f"splitbench: {msg}", file=sys.stderr, flush=True))
    # no_decisive_miss (teacher-forced, checked at composition): one forward per missed position
    decisive = (sq.decisive_check(model, inputs.prompts, outcome, rows, sigmas, s)
                if s.pruning_rule == "no_decisive_miss" else None)
    metrics = sq.summarise(outcome, s, float(cfg.attack.controls.gate_margin_pp), decisive)
    section = sq.record(outcome, s, used)
    # each scorer's per-position rank of the truth as a test, own view against the null view's (where it ran):
    # MAP's unprefixed where it ran (the scorer the chart takes), the likelihood's sequential_
    tests = sq.roc_tests(outcome)
    for name, record in tests.items():
        metrics.update(roc.flat(record, "sequential_" if name == sq.LIKELIHOOD else "sequential_map_"))
    if tests:
        metrics.update(roc.flat(tests.get(sq.MAP) or tests[sq.LIKELIHOOD]))
    if s.pruning_rule == "no_decisive_miss":
        section["pruning_decisive"] = decisive   # null: no pruning stage, nothing to check
    samples = sq.samples(outcome, [p.id for p in inputs.workload.prompts])
    results = {
        **common.results_header(cfg, "sequential_attack", inputs, generation=False),
        "configuration": configuration,
        "epsilon": epsilon,
        "metrics": metrics,
        "mode": s.mode,
        "layers_used": list(used),
        "pruning_recall": section["pruning_recall"],
        "roc": tests,
        "sequential": {**section, "public_prefix_lengths": starts,
                       "sigma_per_op_layer": {f"{op}[{layer}]": sigmas[0][(op, layer)] for op, layer in keys}
                       if sigmas else {}},
        "timings": {"capture_s": capture_s, "attack_s": outcome.seconds},
        "notes": notes,
        "tradeoff": _tradeoff(metrics, s, used, len(model.model.layers)),
    }
    return common.finish(cfg, ctx, results, samples, summary=summary,
                         provenance_extra={"torch_threads": torch.get_num_threads()})


def _tradeoff(m: dict[str, Any], s: Settings, used: Sequence[int], n_layers: int) -> dict[str, Any]:
    """The leakage half of this run's privacy–utility point (runners/report/tradeoff.py), with no point and no
    setting as runners/splitee/attack.py writes its own, so that it joins the same configuration's fidelity
    run and competes with its attack runs for the strongest attacker. Token F1 on the attacked positions of
    the attacker the verdict reads: MAP where it ran, with its reference as the floor (the prior alone's
    token F1, or MAP's on the null view with map_reference=null_view); else the likelihood attacker, with its
    own token F1 on the null view as the floor where that ran."""
    if "sequential_map_token_f1" in m:
        name, key = "MAP", "sequential_map_token_f1"
        floor = "prior_token_f1" if s.map_reference == "prior" else "sequential_map_null_token_f1"
    else:
        name, key, floor = "likelihood", "sequential_token_f1", "sequential_null_token_f1"
    layers = "every layer" if len(used) == n_layers else f"layers {list(used)}"
    noun, after = ("text token", "") if s.positions == "text" else ("token", " from position 1")
    positions = (f"all {noun}s{after}" if s.max_positions is None else
                 f"first {noun}{after}" if s.max_positions == 1 else f"first {s.max_positions} {noun}s{after}")
    return common.tradeoff(leakage_metric="token_f1", leakage=m[key],
                           leakage_ci=(m.get(f"{key}_ci_lo"), m.get(f"{key}_ci_hi")),
                           attacker=f"sequential {name} ({'/'.join(s.ops)}, {layers}; {positions})",
                           leakage_floor=m.get(floor))


def summary(results: dict[str, Any]) -> str:
    m, s = results["metrics"], results["sequential"]
    head = common.summary_head(results, f"{s['mode']} {s['prior']}", f"MAP against {s['map_reference']}",
                               f"layers {s['layers_used']}",
                               f"{m['n_positions']} positions")
    names = [k for k in ("sequential_top1", "sequential_map_top1", "prior_top1", "sequential_null_top1",
                         "sequential_map_null_top1", "map_minus_prior", "map_null_minus_prior", "map_minus_null",
                         "likelihood_minus_null",
                         "sequential_token_f1", "sequential_map_token_f1", "prior_token_f1") if k in m]
    lines = [head, *common.metric_lines(m, names, width=28),
             f"  pruning recall per stage: {s['pruning_recall']}",
             *([f"  decisive misses (pruning may have cost a hit): {s['pruning_decisive']}"]
               if "pruning_decisive" in s else []),
             f"  {m['seconds_per_position']:.3f} s and {m['candidates_per_position']:.0f} forwarded candidates per position",
             f"  verdict: {m['verdict']} ({m['verdict_reason']})"]
    return "\n".join(lines)
