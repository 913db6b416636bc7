"""The mechanism-aware Bayes attacker: for each sanitised token t', the posterior P(t | t') ∝ P(t' | t)·P(t)
with a uniform prior over the C candidates nearest E[t'] (maximum likelihood), ranked top-1/top-k.

The likelihood P(t' | t) is the mechanism's own:
- custext_plus: exact, the exponential mechanism's probability of t' in t's output set (1[t = t'] for a
  stop word, which CusText+ keeps);
- dx_noise, dx_stencil: P(t' | c) = Pr[μ_c + p ∈ Vor(t')], the probability that the candidate's (quasi-)
  embedding μ_c plus the dχ noise p (density f(p) ∝ exp(−η‖p‖), mechanisms.dx_noise) falls in t''s Voronoi
  cell over the FULL candidate vocabulary. Estimated by multiple importance sampling (Veach & Guibas 1995,
  the balance heuristic): M draws from each candidate's own mechanism, pooled into N = C·M draws of the
  mixture g = (1/C) Σ_c f_c, and

      P̂(t' | c) = (1/N) Σ_q 1[nearest(q) = t'] · f_c(q) / g(q),                                    (MIS)

  unbiased, with weights f_c/g ≤ C, so each term's variance is at most C·P and the standard error at most
  √(P / M): never worse than M plain draws of c alone, and far better when the candidates' noise
  distributions overlap (every draw then counts for every candidate). The per-position standard errors are
  returned beside the estimates. `nearest(q) = t'` is decided exactly over the full vocabulary: a draw is
  first scored against the `local_vocab` tokens nearest E[t'] (if one of them beats t', t' is not the
  nearest token, whatever lies outside); only the draws t' wins locally are searched over the full table;
- stencil: deterministic, P(t' | t) ∈ {0, 1} from one noise-free simulation over the full vocabulary.
The window mechanisms also need the neighbours t_j, which the attacker does not see: it plugs in the
sanitised neighbours t'_j (φ̃_i ≈ f_ii E[t] + Σ_{j≠i} f_ij E[t'_j]).

The simulation draws from the attacker's own random stream (`attacker_generator`), independent of the
sanitiser's: the attacker does not know the seed the client used. Ranking is by the estimated likelihood,
ties (e.g. every estimate 0 when no draw reached t') kept in the candidates' order by distance to E[t'],
which is Pr@5's order: with exact likelihoods and a uniform prior over the candidates this is the Bayes
rule for top-k, and where the estimates say nothing it is Pr@5 itself.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from harness.sanitize import mechanisms
from harness.sanitize.mechanisms import Settings
from harness.token_embeddings import COSINE, Table

# Tags the attacker's random stream, so that it never coincides with the sanitiser's (seeded by `seed` itself).
ATTACKER_STREAM = 0x5A_B4_7E
# Positions whose posteriors are computed at once: a memory bound, not part of the method.
POSITIONS_PER_BATCH = 8


@dataclass(frozen=True)
class BayesSettings:
    """sanitize.attack's bayes_candidates, bayes_samples and bayes_local_vocab (conf/sanitize/default.yaml)."""

    candidates: int
    samples: int
    local_vocab: int


@dataclass
class Posterior:
    """Per position: the candidates (n, C), t' first then by distance to E[t'], their likelihoods
    P(t' | c) (n, C) and the likelihoods' standard errors (n, C; 0 where exact)."""

    candidates: torch.Tensor
    likelihood: torch.Tensor
    std_error: torch.Tensor


def attacker_generator(seed: int) -> torch.Generator:
    """The attacker's own generator: derived from the run's seed through a tagged SeedSequence, so that its
    draws are independent of the sanitiser's (`torch.Generator().manual_seed(seed)`)."""
    state = np.random.SeedSequence([int(seed), ATTACKER_STREAM]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


def rank(observed: Sequence[Sequence[int]], table: Table, settings: Settings, k: int, bayes: BayesSettings,
         seed: int, keep: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per prompt (n_i, k) guesses, most probable original first."""
    lengths = [len(s) for s in observed]
    if sum(lengths) == 0:
        return [torch.empty(0, k, dtype=torch.long) for _ in observed]
    return top_k(posterior(observed, table, settings, max(bayes.candidates, k), bayes, seed, keep), lengths, k)


def top_k(post: Posterior, lengths: Sequence[int], k: int) -> list[torch.Tensor]:
    """Per prompt (n_i, k): the first k of `ranked`."""
    return list(torch.split(ranked(post)[:, :k], list(lengths)))


def ranked(post: Posterior) -> torch.Tensor:
    """(n, C) every position's candidates by likelihood, ties in distance order (Pr@5's)."""
    return post.candidates.gather(1, torch.sort(-post.likelihood, dim=1, stable=True).indices)


def posterior(observed: Sequence[Sequence[int]], table: Table, settings: Settings, n_candidates: int,
              bayes: BayesSettings, seed: int, keep: torch.Tensor | None = None) -> Posterior:
    """The likelihoods P(t' | c) of every position's candidates (all prompts concatenated)."""
    lengths = [len(s) for s in observed]
    ids = torch.tensor([t for s in observed for t in s], dtype=torch.long)
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    # Candidates: t' itself first, then its nearest candidates (the original is one of them, or missed).
    n_cand = min(n_candidates, int(table.candidates.numel()))
    cands = torch.cat([ids.unsqueeze(1), table.nearest(table.vectors[ids], n_cand - 1, exclude=ids)], dim=1)
    lik, se = _likelihoods(ids, segment, cands, table, settings, bayes, seed, keep)
    # A token outside the candidate vocabulary was left as it is by every mechanism: it is its own original.
    fixed = ~table.is_candidate[ids]
    lik[fixed], se[fixed] = 0.0, 0.0
    lik[fixed, 0] = 1.0
    return Posterior(cands, lik, se)


def _likelihoods(ids, segment, cands, table, settings, bayes, seed, keep) -> tuple[torch.Tensor, torch.Tensor]:
    m = settings.mechanism
    if m == mechanisms.IDENTITY:
        lik = (cands == ids.unsqueeze(1)).float()
    elif m == mechanisms.CUSTEXT_PLUS:
        lik = _custext(ids, cands, table, settings, keep)
    else:
        return _simulated(ids, segment, cands, table, settings, bayes, attacker_generator(seed))
    return lik, torch.zeros_like(lik)


def _custext(ids, cands, table, settings, keep) -> torch.Tensor:
    uniq, inverse = torch.unique(cands.reshape(-1), return_inverse=True)
    sets, probs = mechanisms.custext_sets(table, uniq, settings.custext_k, float(settings.parameter))
    sets, probs = sets[inverse].view(*cands.shape, -1), probs[inverse].view(*cands.shape, -1)
    lik = (probs * (sets == ids.view(-1, 1, 1))).sum(-1)
    if keep is not None:
        kept = keep[cands] | ~table.is_candidate[cands]
        lik = torch.where(kept, (cands == ids.unsqueeze(1)).float(), lik)
    return lik


def _simulated(ids, segment, cands, table, settings, bayes, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t' | c) for every candidate c of every position (batched over positions): (MIS) for the dχ
    mechanisms, one noise-free simulation for Stencil."""
    m = settings.mechanism
    stencil = m == mechanisms.STENCIL
    draws = 1 if stencil else bayes.samples
    exclude_original = stencil or (m == mechanisms.DX_STENCIL and not settings.may_return_original)
    e_obs = table.vectors[ids]
    if settings.uses_window:
        own = mechanisms.own_weights(segment, settings.window, settings.sigma).unsqueeze(1)
        context = mechanisms.quasi_embeddings(table.vectors, ids, segment, settings.window, settings.sigma) - own * e_obs
    local_k = min(max(bayes.local_vocab, 2), int(table.candidates.numel()))
    local = torch.cat([ids.unsqueeze(1), table.nearest(e_obs, local_k - 1, exclude=ids)], dim=1)   # t' is slot 0
    n, c = cands.shape
    lik, se = torch.zeros(n, c), torch.zeros(n, c)
    eta = float(settings.parameter) if not stencil else 0.0
    for start in range(0, n, POSITIONS_PER_BATCH):
        sl = slice(start, start + POSITIONS_PER_BATCH)
        mu = table.vectors[cands[sl]]                                           # (b, c, d)
        if settings.uses_window:
            mu = own[sl].unsqueeze(2) * mu + context[sl].unsqueeze(1)
        b = mu.shape[0]
        q = mu.unsqueeze(2).expand(-1, -1, draws, -1).clone()                   # (b, c, M, d): M draws per candidate
        if not stencil:
            q += mechanisms.dx_noise(b * c * draws, table.dim, eta, generator).view(q.shape)
        q = q.flatten(1, 2)                                                     # (b, N = c·M, d)
        hit = _hits(q, ids[sl], cands[sl], local[sl], table, exclude_original)  # (b, N, c)
        if stencil:   # each candidate's own single draw, weight 1
            terms = hit * torch.eye(c, dtype=torch.bool).unsqueeze(0)
        else:         # balance-heuristic weights f_c(q) / g(q) ≤ C, g the equal mixture of the f_c
            logf = -eta * torch.cdist(q, mu)                                    # (b, N, c); normalisers cancel
            w = torch.exp(logf - (torch.logsumexp(logf, dim=2, keepdim=True) - math.log(c)))
            terms = hit * w
        terms = terms.float()
        lik[sl] = terms.mean(1) if not stencil else terms.sum(1)
        if not stencil:
            se[sl] = terms.std(1, correction=1) / math.sqrt(terms.shape[1])
    return lik, se


def _local_scores(q: torch.Tensor, vectors: torch.Tensor, table: Table) -> torch.Tensor:
    """Table.scores of queries (b, N, d) against per-position token sets (b, L, d): smaller is nearer."""
    if table.distance == COSINE:
        nq = torch.nn.functional.normalize(q, dim=-1)
        return -(nq @ torch.nn.functional.normalize(vectors, dim=-1).transpose(1, 2))
    return (vectors * vectors).sum(-1).unsqueeze(1) - 2.0 * q @ vectors.transpose(1, 2)


def _hits(q, obs, cands, local, table, exclude_original) -> torch.Tensor:
    """(b, N, c) bool: whether draw q's output is t' had it come from candidate c. Without exclusion the
    output is the nearest candidate token, the same for every c; with it (Stencil, dχ-Stencil without the
    original), the nearest token other than c: t' if t' is nearest and c ≠ t', or c is nearest and t' next."""
    b, n_draws, _ = q.shape
    c = cands.shape[1]
    s = _local_scores(q, table.vectors[local], table)                          # (b, N, L), t' in column 0
    beaten_by = (s[..., 1:] < s[..., :1]).sum(-1)                               # local tokens nearer than t'
    # If t' loses to (one, with exclusion two) local tokens it is not the output, whatever lies farther away.
    maybe = beaten_by <= (1 if exclude_original else 0)
    top = torch.full((b, n_draws, 2), -1, dtype=torch.long)
    rows = torch.nonzero(maybe)
    if rows.numel():
        top[rows[:, 0], rows[:, 1]] = table.nearest(q[rows[:, 0], rows[:, 1]], 2)   # full vocabulary, exact
    t_obs = obs.view(b, 1, 1)
    first, second = top[..., :1], top[..., 1:]
    if not exclude_original:
        return (first == t_obs).expand(-1, -1, c)
    cc = cands.unsqueeze(1)                                                     # (b, 1, c)
    return ((first == t_obs) & (cc != t_obs)) | ((first == cc) & (second == t_obs))
