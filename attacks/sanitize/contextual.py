"""The contextual Bayesian reconstruction of sanitised text: the mechanism's likelihood P(t'_i | t_i) combined
with the victim LM's prior over the sequence, P(t_1 … t_n) = Π_i P(t_i | t_<i), by beam search,

    t̂ = argmax_t Σ_i [ log P_LM(t_i | prefix, t_<i) + log P(t'_i | t_i) ],                          (MAP)

the optimal attack of Tong et al. (NAACL 2025, "On the Vulnerability of Text Sanitization", §3: the
contextual maximum-a-posteriori attacker; their practical attack estimates the prior from shadow data, here
the victim model itself is the prior, which the threat model makes public). Each position's candidates and
likelihoods are the per-token Bayes attacker's (attacks/sanitize/bayes.py `posterior`); the LM reads the
public template prefix (the tokens before the text, common to every prompt of the workload) and the beam's
own tokens. The first guess is the best beam's token; the next k − 1 are the other final beams' distinct
tokens at that position, then the per-token posterior's order.

An attacker with an LM prior can score by the prior alone: the floor of its verdict is therefore the
LM's own top-1 given the **true** prefix and no view (`prior_top1`), compared on the same positions
(`prior_gain`: per prompt the difference of the two top-1 rates, macro over prompts, Student-t 95% interval;
the verdict attacks.controls.classify of that interval against 0). The true prefix makes that reference an
upper bound of what the prior alone recovers, so a `leak` is what the sanitised tokens add to the prior.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attacks import controls
from attacks.sanitize import bayes, scoring
from harness.sanitize import mechanisms
from metrics.intervals import Estimate, mean_t_ci, paired_difference_t_ci
from metrics.proportions import proportion_ci

# Mechanisms whose likelihood is exact (a 0 is a true 0); the others' zeros are estimates (no draw reached t').
EXACT = (mechanisms.IDENTITY, mechanisms.CUSTEXT_PLUS)


@dataclass(frozen=True)
class ContextualSettings:
    beam: int          # beams kept per position


def public_prefix(view_prefixes: Sequence[Sequence[int]]) -> list[int]:
    """The longest common prefix of the prompts' tokens before their text spans: the template's part that
    every prompt shares (public, as the template is)."""
    if not view_prefixes:
        return []
    first = list(view_prefixes[0])
    n = len(first)
    for p in view_prefixes[1:]:
        n = next((i for i, (a, b) in enumerate(zip(first, p)) if a != b), min(n, len(p)))
    return first[:n]


def log_likelihoods(post: bayes.Posterior, mechanism: str) -> torch.Tensor:
    """(n, C) log P(t' | c) for the beam. An estimated 0 (no draw reached t') is not impossible: it becomes
    half the row's smallest positive estimate; a row with no positive estimate says nothing, so it is
    uniform (0). Exact zeros stay −inf."""
    lik = post.likelihood.double()
    if mechanism in EXACT:
        return lik.log()
    positive = torch.where(lik > 0, lik, torch.full_like(lik, math.inf)).min(1, keepdim=True).values
    floor = torch.where(torch.isfinite(positive), positive / 2, torch.ones_like(positive))
    filled = torch.where(lik > 0, lik, floor)
    return torch.where(torch.isfinite(positive), filled.log(), torch.zeros_like(lik))


@torch.inference_mode()
def beam_search(model: Any, prefix: Sequence[int], candidates: torch.Tensor, loglik: torch.Tensor, beam: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(MAP) over one prompt's n positions: the final beams (B, n) token ids, best first, and their scores.
    `candidates` (n, C) and `loglik` (n, C) per position; the LM's log-probabilities are of the full vocabulary
    (log_softmax), so the prior is the model's, not renormalised over the candidates."""
    n, c = candidates.shape
    if n == 0:
        return torch.empty(1, 0, dtype=torch.long), torch.zeros(1, dtype=torch.float64)
    device = next(model.parameters()).device
    cache, logp = None, None
    if prefix:
        out = model(input_ids=torch.tensor([list(prefix)], device=device), use_cache=True, logits_to_keep=1)
        cache, logp = out.cache, torch.log_softmax(out.logits[:, -1].double(), -1).cpu()
    scores = torch.zeros(1, dtype=torch.float64)
    tokens = torch.empty(1, 0, dtype=torch.long)
    for i in range(n):
        prior = logp[:, candidates[i]] if logp is not None else torch.zeros(scores.shape[0], c, dtype=torch.float64)
        total = scores.unsqueeze(1) + prior + loglik[i].unsqueeze(0)              # (B, C)
        top = total.flatten().topk(min(beam, total.numel()))
        parent, pick = top.indices // c, top.indices % c
        keep = torch.isfinite(top.values)
        if keep.any():   # beams of probability 0 are dropped (an exact likelihood of 0)
            parent, pick, top_values = parent[keep], pick[keep], top.values[keep]
        else:
            top_values = top.values
        tokens = torch.cat([tokens[parent], candidates[i, pick].unsqueeze(1)], dim=1)
        scores = top_values
        if i + 1 < n:
            if cache is not None:   # without a prefix the first token starts the cache
                cache.reorder_cache(parent.to(device))
            out = model(input_ids=tokens[:, -1:].to(device), cache=cache, use_cache=True, logits_to_keep=1)
            cache, logp = out.cache, torch.log_softmax(out.logits[:, -1].double(), -1).cpu()
    return tokens, scores


def guesses_from_beams(beams: torch.Tensor, fallback: torch.Tensor, k: int) -> torch.Tensor:
    """(n, k) per position: the best beam's token, the other beams' distinct tokens in beam order, then the
    per-token posterior's order (`fallback` (n, C)), without repeats."""
    n = beams.shape[1]
    out = torch.empty(n, k, dtype=torch.long)
    for i in range(n):
        seen: list[int] = []
        for t in [*beams[:, i].tolist(), *fallback[i].tolist()]:
            if t not in seen:
                seen.append(t)
            if len(seen) == k:
                break
        seen += [seen[-1]] * (k - len(seen))
        out[i] = torch.tensor(seen)
    return out


def rank(observed: Sequence[Sequence[int]], model: Any, prefix: Sequence[int], posterior_of: Callable,
         mechanism: str, settings: ContextualSettings, k: int) -> list[torch.Tensor]:
    """Per prompt (n_i, k) guesses. `posterior_of(observed)` gives the per-token Bayes posterior of all the
    prompts concatenated (the suite shares it with the per-token attacker)."""
    lengths = [len(s) for s in observed]
    if sum(lengths) == 0:
        return [torch.empty(0, k, dtype=torch.long) for _ in observed]
    post = posterior_of(observed)
    loglik = log_likelihoods(post, mechanism)
    order = bayes.ranked(post)
    out = []
    for cands, ll, fallback in zip(torch.split(post.candidates, lengths), torch.split(loglik, lengths),
                                   torch.split(order, lengths)):
        beams, _ = beam_search(model, prefix, cands, ll, settings.beam)
        out.append(guesses_from_beams(beams, fallback, k))
    return out


@torch.inference_mode()
def prior_hits(model: Any, prefix: Sequence[int], originals: Sequence[Sequence[int]]) -> list[list[bool]]:
    """Per prompt and position: whether the LM's top-1 given the true prefix (no view) is the true token.
    The first position has no prediction without a template prefix: a miss."""
    device = next(model.parameters()).device
    hits = []
    for orig in originals:
        ids = list(prefix) + list(orig)
        if not orig:
            hits.append([])
            continue
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].cpu()
        pred = logits.argmax(-1)       # pred[j] guesses ids[j + 1]
        p = len(prefix)
        hits.append([bool(p + i >= 1 and int(pred[p + i - 1]) == t) for i, t in enumerate(orig)])
    return hits


def prior_gain(attacker_top1: Sequence[float], prior_top1: Sequence[float], margin_pp: float, *,
               positive_passed: bool, negative_passed: bool, per_item_bound_pp: float = 100.0
               ) -> tuple[Estimate, str]:
    """The verdict of an attacker with an LM prior: its per-prompt top-1 rates (%) minus the prior-alone
    rates on the same positions (paired, Student-t 95% interval over prompts), classified against 0 with
    margin m (attacks.controls.classify: leak when the lower bound clears m; at_chance on the interval the
    paired differences earned at per-prompt bound `per_item_bound_pp`, `gain_earned`)."""
    gain = paired_difference_t_ci(list(attacker_top1), list(prior_top1))
    earned = gain_earned(attacker_top1, prior_top1, gain, per_item_bound_pp)
    return gain, controls.classify(gain.lo, gain.hi, 0.0, margin_pp, positive_passed=positive_passed,
                                   negative_passed=negative_passed, certify=earned)


def gain_earned(attacker_top1: Sequence[float], prior_top1: Sequence[float], gain: Estimate,
                per_item_bound_pp: float) -> tuple[float, float]:
    """The interval the per-prompt gains earned (controls.earned around 0): what `prior_gain`'s at_chance reads."""
    return controls.earned([a - b for a, b in zip(attacker_top1, prior_top1)], 0.0, gain.lo, gain.hi,
                           per_item_bound_pp)


def score(attacker: scoring.Attacker, model: Any, prefix: Sequence[int], originals: Sequence[Sequence[int]],
          observed: Sequence[Sequence[int]], k: int, margin_pp: float, positive_passed: bool, name: str = "contextual",
          candidates: int | None = None, per_item_bound_pp: float = 100.0
          ) -> tuple[scoring.AttackScore, list[torch.Tensor], dict[str, Any]]:
    """The contextual attacker scored as the others (top-1/top-k, token F1 against the exposure-free reference,
    the deranged-view negative control), with the verdict against the prior-alone reference instead, and the
    extra keys <name>_prior_top1 and <name>_prior_gain (flat, with 95% intervals)."""
    guesses, seconds, positions = scoring.timed(attacker, observed)
    top1, topk = scoring.hit_rates(originals, guesses, k)
    firsts = scoring.first_guesses(guesses)
    f1 = mean_t_ci(scoring.f1_values(originals, firsts), bounds=(0, 100))
    reference = controls.exposure_free_f1(originals, firsts)
    shuffled = scoring.first_guesses(attacker(scoring.derange(observed)))
    negative = mean_t_ci(scoring.f1_values(originals, shuffled), bounds=(0, 100))
    negative_passed = negative.lo <= reference + margin_pp
    prior = [100.0 * sum(h) / len(h) for h in prior_hits(model, prefix, originals) if h]
    gain, verdict = prior_gain(top1, prior, margin_pp, positive_passed=positive_passed,
                               negative_passed=negative_passed, per_item_bound_pp=per_item_bound_pp)
    earned = gain_earned(top1, prior, gain, per_item_bound_pp)
    rows = [{"top1": a, f"top{k}": b} for a, b in zip(top1, topk)]
    # Rates over positions, as the other attackers' (scoring.score): Wilson where every prompt sits at 0 or 100 %.
    result = scoring.AttackScore(name, proportion_ci(top1), proportion_ci(topk), f1, reference,
                                 negative, negative_passed, verdict, rows, seconds, positions, candidates,
                                 scoring.f1_test(originals, firsts, shuffled))
    extra = {**proportion_ci(prior).flat(f"{name}_prior_top1"), **gain.flat(f"{name}_prior_gain"),
             **controls.earned_flat(f"{name}_prior_gain", earned, per_item_bound_pp)}
    return result, guesses, extra
