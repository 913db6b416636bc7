"""Empirical privacy audit runner (issue 52; attacks/splitee/privacy_audit.py, metrics/auditing.py,
docs/privacy_audit.md).

One prompt of the workload (privacy_audit.prompt) cut around a differing token, its worst-case and typical
neighbours, `trials` submissions of each pair through the split engine (a fair coin choosing the prompt), and
the auditor's log-likelihood ratio of every view: ROC, TPR at low FPR with Clopper–Pearson intervals and the
μ-GDP lower bound, per submission and per exposure, beside the pair's own μ and the accountant's.

    splitbench experiment=privacy_audit_smoke
    splitbench -m experiment=privacy_audit epsilon=1,5,15
"""
from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import configurations, run_identity
from harness.errors import UserError
from harness.results import RunContext
from runners import common

describe_skip = common.epsilon_ignored_note


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """The keys this runner reads (harness/run_identity.py READS), ε normalised."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name,
                                                                                  cfg.epsilon))


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    import torch

    from attacks.splitee import privacy_audit as pa
    from attacks.splitee import sequential as sq

    s = pa.Settings.from_config(OmegaConf.to_container(cfg.privacy_audit, resolve=True))
    configuration = cfg.configuration.name
    if not configurations.get(configuration).gaussian:
        raise UserError(f"the privacy audit measures SpliTEE's Gaussian masks (ep1, epn); configuration="
                        f"{configuration} claims no ε")
    offload = [op for op in sq.OPS if op in cfg.engine.offload]
    if not offload:
        raise UserError(f"the privacy audit reads the QKV, O and Gate/Up exposures; engine.offload is "
                        f"{list(cfg.engine.offload)}")
    epsilon = configurations.effective_epsilon(configuration, cfg.epsilon)
    inputs = common.load_inputs(cfg)
    if s.prompt >= len(inputs.prompts):
        raise UserError(f"privacy_audit.prompt={s.prompt}, but the workload has {len(inputs.prompts)} prompts")
    if cfg.engine.tee_threads is not None:
        torch.set_num_threads(int(cfg.engine.tee_threads))
    model, tokenizer = inputs.loaded.model, inputs.loaded.tokenizer
    n_layers = len(model.model.layers)
    keys = [(op, layer) for layer in range(n_layers) for op in offload]
    engine_kw = dict(sigma_scale=float(cfg.engine.sigma_scale), sensitivity_rule=cfg.engine.sensitivity_rule)
    prompt = inputs.prompts[s.prompt]
    start = sq.public_prefix_length(tokenizer, prompt, inputs.workload.chat_template)
    a, i = pa.submission(prompt, start, s)
    # EPN's n of the submission as sent: its text tokens (after the header, if a template put one there) or all
    header = start if inputs.workload.chat_template else 0
    eps_length = len(a) - header if cfg.epn_n == "text" else len(a)
    sigmas = sq.op_sigmas(model, configuration, epsilon, [eps_length], keys, **engine_kw)[0]
    exposure_epsilon = configurations.exposure_epsilons(configuration, epsilon, [eps_length],
                                                        engine_kw["sigma_scale"])[0]
    log = lambda msg: print(f"splitbench: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    games = {}
    for kind in s.pairs:
        pair = pa.build_pair(kind, model, a, i, keys, sigmas, offload, engine_kw["sensitivity_rule"], s.candidates)
        scores = pa.play(model, pair, pa.Scorer(pair, sigmas, keys), s, configuration=configuration, epsilon=epsilon,
                         seed=cfg.seed, offload=offload, epsilon_length=eps_length, keys=keys, log=log, **engine_kw)
        games[kind] = (pair, scores)
    if s.null_game:
        games[pa.NULL] = (games[s.pairs[0]][0], pa.null_game(games[s.pairs[0]][1], cfg.seed))
    acc = pa.accountant(games[s.pairs[0]][0], n_layers, offload, exposure_epsilon)
    metrics, section = pa.summarise(games, acc, sigmas, keys, s, seed=cfg.seed, delta=float(cfg.dp_delta),
                                    decode=tokenizer.decode)
    roc = {g: {scope: entry[scope].pop("roc") for scope in pa.SCOPES} for g, entry in section["games"].items()}
    results = {
        **common.results_header(cfg, "privacy_audit", inputs, generation=False),
        "configuration": configuration,
        "epsilon": epsilon,
        "metrics": metrics,
        "privacy_audit": {**section, "prompt": s.prompt, "prompt_id": inputs.workload.prompts[s.prompt].id,
                          "public_prefix_length": start},
        "roc": roc,
    }
    # one line per game: every trial's label (1 = A) and LLRs, so the audit can be recomputed; output_ids is B
    samples = [{"id": inputs.workload.prompts[s.prompt].id, "game": g, "output_ids": pair.a if g == pa.NULL else pair.b,
                "labels": scores["labels"].tolist(), "submission_llr": scores["submission"].tolist(),
                "exposure_llr": scores["exposure"].tolist()} for g, (pair, scores) in games.items()]
    return common.finish(cfg, ctx, results, samples, summary=summary,
                         provenance_extra={"torch_threads": torch.get_num_threads()})


def summary(results: dict[str, Any]) -> str:
    m, audit = results["metrics"], results["privacy_audit"]
    head = common.summary_head(results, f"{m['n_trials']} trials a pair",
                               f"{audit['accountant_exposures']} exposures influenced")
    lines = [head, f"  {'game':<12}{'scope':<12}{'μ lower':>9}{'μ fit [95% CI]':>24}{'pair μ':>10}{'accountant μ':>14}"]
    for game, entry in audit["games"].items():
        for scope in ("submission", "exposure"):
            e = entry[scope]
            lo, hi = e["mu_estimate_ci"]
            lines.append(f"  {game:<12}{scope:<12}{e['empirical_mu_lower']:>9.3f}"
                         f"{e['mu_estimate']:>10.3f} [{lo:.3f}, {hi:.3f}]{e['pair_mu']:>10.3f}"
                         f"{e['accountant_mu']:>14.3f}")
    lines.append(f"  accountant exceeded: {m['accountant_exceeded']}")
    return "\n".join(lines)
