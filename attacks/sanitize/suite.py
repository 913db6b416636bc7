"""Every attacker on one sanitised view, with the controls and the run's verdict (the worst over them)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attacks import controls
from attacks.sanitize import (
    bayes,
    contextual,
    decoder,
    learned,
    neighbours,
    scoring,
    window,
)
from harness.adversary_view import AdversaryView
from harness.sanitize.prompts import read_prefixes, read_view
from metrics import roc
from metrics.proportions import proportion_ci

NEIGHBOURS, BAYES, WINDOW, LEARNED, DECODER = "neighbours", "bayes", "window", "learned", "decoder"
CONTEXTUAL = "contextual"


@dataclass
class SuiteResult:
    metrics: dict[str, Any]
    scores: list[scoring.AttackScore]
    guesses: dict[str, list[list[int]]] = field(default_factory=dict)   # first guesses per attacker
    training: dict[str, dict] = field(default_factory=dict)             # the trained attackers' training records
    # The trained decoder's loss curves, (step, loss) at each validation step: the W&B step history only.
    curves: dict[str, dict] = field(default_factory=dict)

    @property
    def strongest(self) -> scoring.AttackScore:
        """The attacker with the largest token-F1 excess over its own exposure-free reference (the run's point
        on the cross-system chart): the rule the chart uses across runs (runners/report/tradeoff.py), since
        each attacker's reference differs (a prior-driven guesser scores high on any prompt)."""
        return max(self.scores, key=lambda s: controls.strength(s.f1.mean, s.reference))


def attack(view: AdversaryView, originals: Sequence[Sequence[int]], sanitizer: Any, cfg: Any, seed: int,
           tokenizer: Any = None, model: Any = None) -> SuiteResult:
    """`cfg` is the sanitize.attack section; `sanitizer` (harness.sanitize.sanitizer.Sanitizer) gives the
    public mechanism, table and parameters; the observed tokens come from `view` alone. With a `tokenizer`
    and cfg.learned_corpus_tokens > 0 the learned (ridge) inverter is trained (on public text) and run too;
    with the victim `model` as well and cfg.decoder_steps > 0, the attack suite's learned decoder
    (attacks/sanitize/decoder.py, the model frozen as its decoder). With the `model` and cfg.contextual_beam > 0,
    the contextual reconstruction (attacks/sanitize/contextual.py: the per-token posterior and the model's prior,
    by beam search), judged against the prior alone."""
    observed = read_view(view)
    table, settings, k, margin = sanitizer.table, sanitizer.settings, int(cfg.top_k), float(cfg.gate_margin_pp)
    bound = float(cfg.per_item_bound_pp)
    identity = neighbours.rank(originals, table, k, chunk=sanitizer.chunk)
    pos_f1, pos_ref, pos_ok = scoring.positive_control(originals, identity, float(cfg.positive_margin_pp))
    bayes_settings = bayes.BayesSettings(int(cfg.bayes_candidates), int(cfg.bayes_samples), int(cfg.bayes_local_vocab))
    posteriors: dict[tuple, bayes.Posterior] = {}   # per view (and deranged view): the per-token and contextual share it

    def posterior_of(obs) -> bayes.Posterior:
        key = tuple(map(tuple, obs))
        if key not in posteriors:
            posteriors[key] = bayes.posterior(obs, table, settings, max(bayes_settings.candidates, k), bayes_settings,
                                              seed, keep=sanitizer.keep)
        return posteriors[key]

    def bayes_rank(obs) -> list[torch.Tensor]:
        lengths = [len(s) for s in obs]
        if sum(lengths) == 0:
            return [torch.empty(0, k, dtype=torch.long) for _ in obs]
        return bayes.top_k(posterior_of(obs), lengths, k)

    attackers = {
        NEIGHBOURS: lambda obs: neighbours.rank(obs, table, k, chunk=sanitizer.chunk),
        BAYES: bayes_rank,
    }
    if settings.uses_window:
        attackers[WINDOW] = lambda obs: window.rank(obs, table, settings, k)
    pairs: dict[int, tuple] = {}     # the sanitised public corpus per token budget: the trained attackers share it

    def public(n: int) -> tuple:
        if n not in pairs:
            pairs[n] = learned.public_pairs(sanitizer, tokenizer, n, seed, path=cfg.get("corpus_path"))
        return pairs[n]

    training: dict[str, dict] = {}
    curves: dict[str, dict] = {}
    if tokenizer is not None and int(cfg.learned_corpus_tokens) > 0:
        n = int(cfg.learned_corpus_tokens)
        inverter = learned.LearnedInverter(sanitizer, tokenizer, n, seed, pairs=public(n))
        attackers[LEARNED] = lambda obs: inverter.rank(obs, k)
        training[LEARNED] = {"n_train_tokens": inverter.n_train_tokens}
    if tokenizer is not None and model is not None and int(cfg.decoder_steps) > 0:
        n = int(cfg.decoder_corpus_tokens)
        dec = decoder.DecoderInverter(sanitizer, model, tokenizer, decoder_settings(cfg), seed, pairs=public(n))
        attackers[DECODER] = lambda obs: dec.rank(obs, k)
        training[DECODER] = dec.record()
        curves = {DECODER: {"train_history": dec.log.train_history, "val_history": dec.log.val_history}}
    # Candidate originals scored per position: a nearest search over the candidate table, or the Bayes
    # posterior's candidates; the learned decoder generates over the model's vocabulary (no explicit set).
    table_size = int(table.candidates.numel())
    posterior_size = max(bayes_settings.candidates, k)
    candidates = {NEIGHBOURS: table_size, WINDOW: table_size, LEARNED: table_size, BAYES: posterior_size}
    scores, guesses = [], {}
    for name, fn in attackers.items():
        s, g = scoring.score_attacker(name, fn, originals, observed, k, margin, pos_ok, candidates.get(name),
                                      per_item_bound_pp=bound)
        scores.append(s)
        guesses[name] = scoring.first_guesses(g)
    extra: dict[str, Any] = {}
    if model is not None and int(cfg.contextual_beam) > 0:
        prefix = contextual.public_prefix(read_prefixes(view))
        ctx = contextual.ContextualSettings(beam=int(cfg.contextual_beam))
        fn = lambda obs: contextual.rank(obs, model, prefix, posterior_of, settings.mechanism, ctx, k)
        # each beam is extended by each of the position's posterior candidates
        s, g, extra = contextual.score(fn, model, prefix, originals, observed, k, margin, pos_ok, name=CONTEXTUAL,
                                       candidates=ctx.beam * posterior_size, per_item_bound_pp=bound)
        scores.append(s)
        guesses[CONTEXTUAL] = scoring.first_guesses(g)
    unchanged = proportion_ci([100.0 * sum(a == b for a, b in zip(o, c)) / len(o)
                               for o, c in zip(originals, observed) if len(o)])
    metrics: dict[str, Any] = {}
    for s in scores:
        metrics.update(s.flat(k))
    metrics.update(extra)
    metrics.update({
        f"pr_at_{k}": metrics[f"{NEIGHBOURS}_top{k}"],
        f"pr_at_{k}_ci_lo": metrics[f"{NEIGHBOURS}_top{k}_ci_lo"],
        f"pr_at_{k}_ci_hi": metrics[f"{NEIGHBOURS}_top{k}_ci_hi"],
        **unchanged.flat("unchanged_rate"),
        **pos_f1.flat("positive_control_token_f1"),
        "positive_control_token_f1_chance": pos_ref,
        "positive_control_pass": pos_ok,
        "gate_margin_pp": margin,
        "per_item_bound_pp": bound,
        "verdict": controls.worst([s.verdict for s in scores]),
        "mechanism": settings.mechanism,
    })
    result = SuiteResult(metrics, scores, guesses, training, curves)
    # the run's headline test (`auc`, `tpr_at_fpr`): the strongest attacker's, the one its chart point takes
    metrics.update(roc.flat(result.strongest.roc))
    return result


def decoder_settings(cfg: Any) -> decoder.DecoderSettings:
    """The learned decoder's budget from the sanitize.attack section."""
    return decoder.DecoderSettings(steps=int(cfg.decoder_steps), minutes=float(cfg.decoder_minutes),
                                   corpus_tokens=int(cfg.decoder_corpus_tokens), window=int(cfg.decoder_window),
                                   evidence_scale=float(cfg.decoder_evidence_scale))
