"""The mechanism-aware Bayes attacker: for each sanitised token t', the posterior P(t | t') ∝ P(t' | t)·P(t)
with a uniform prior over the C candidates nearest E[t'] (maximum likelihood), ranked top-1/top-k.

The likelihood P(t' | t) is the mechanism's own:
- custext_plus: exact, the exponential mechanism's probability of t' in t's output set (1[t = t'] for a
  stop word, which CusText+ keeps);
- dx_noise, dx_stencil: estimated by sampling, M draws of the mechanism from each candidate, counting how
  often the nearest token is t'. The nearest-token search of the simulation ranges over the
  `local_vocab` candidates nearest E[t'] (a bounded approximation of the full search: a draw whose nearest
  token lies outside that set is counted as not producing t');
- stencil: deterministic, P(t' | t) ∈ {0, 1} from one noise-free simulation.
The window mechanisms also need the neighbours t_j, which the attacker does not see: it plugs in the
sanitised neighbours t'_j (φ̃_i ≈ f_ii E[t] + Σ_{j≠i} f_ij E[t'_j]). Ties (e.g. every likelihood 0 under
heavy noise) keep the candidates' order by distance to E[t'], so the attacker never does worse than
ranking neighbours.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.sanitize import mechanisms
from harness.sanitize.embeddings import COSINE, Table
from harness.sanitize.mechanisms import Settings


@dataclass(frozen=True)
class BayesSettings:
    candidates: int = 32
    samples: int = 64
    local_vocab: int = 256
    positions_per_batch: int = 8


def rank(observed: Sequence[Sequence[int]], table: Table, settings: Settings, k: int, bayes: BayesSettings,
         seed: int, keep: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per prompt (n_i, k) guesses, most probable original first."""
    lengths = [len(s) for s in observed]
    ids = torch.tensor([t for s in observed for t in s], dtype=torch.long)
    if ids.numel() == 0:
        return [torch.empty(0, k, dtype=torch.long) for _ in observed]
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    n_cand = max(bayes.candidates, k)
    # Candidates: t' itself first, then its nearest candidates (the original is one of them, or missed).
    cands = torch.cat([ids.unsqueeze(1), table.nearest(table.vectors[ids], n_cand - 1, exclude=ids)], dim=1)
    lik = _likelihoods(ids, segment, cands, table, settings, bayes, seed, keep)
    # A token outside the candidate vocabulary was left as it is by every mechanism: it is its own original.
    fixed = ~table.is_candidate[ids]
    lik[fixed] = 0.0
    lik[fixed, 0] = 1.0
    order = torch.sort(-lik, dim=1, stable=True).indices[:, :k]
    return list(torch.split(cands.gather(1, order), lengths))


def _likelihoods(ids, segment, cands, table, settings, bayes, seed, keep) -> torch.Tensor:
    m = settings.mechanism
    if m == mechanisms.IDENTITY:
        return (cands == ids.unsqueeze(1)).float()
    if m == mechanisms.CUSTEXT_PLUS:
        return _custext(ids, cands, table, settings, keep)
    return _simulated(ids, segment, cands, table, settings, bayes, seed)


def _custext(ids, cands, table, settings, keep) -> torch.Tensor:
    uniq, inverse = torch.unique(cands.reshape(-1), return_inverse=True)
    sets, probs = mechanisms.custext_sets(table, uniq, settings.custext_k, float(settings.parameter))
    sets, probs = sets[inverse].view(*cands.shape, -1), probs[inverse].view(*cands.shape, -1)
    lik = (probs * (sets == ids.view(-1, 1, 1))).sum(-1)
    if keep is not None:
        kept = keep[cands] | ~table.is_candidate[cands]
        lik = torch.where(kept, (cands == ids.unsqueeze(1)).float(), lik)
    return lik


def _simulated(ids, segment, cands, table, settings, bayes, seed) -> torch.Tensor:
    """Monte-Carlo P(t' | c) for every candidate c of every position (batched over positions)."""
    m = settings.mechanism
    generator = torch.Generator().manual_seed(int(seed))
    draws = 1 if m == mechanisms.STENCIL else bayes.samples
    exclude_original = m == mechanisms.STENCIL or (m == mechanisms.DX_STENCIL and not settings.may_return_original)
    e_obs = table.vectors[ids]
    if settings.uses_window:
        own = mechanisms.own_weights(segment, settings.window, settings.sigma).unsqueeze(1)
        context = mechanisms.quasi_embeddings(table.vectors, ids, segment, settings.window, settings.sigma) - own * e_obs
    local_k = max(bayes.local_vocab, cands.shape[1])
    local = torch.cat([ids.unsqueeze(1), table.nearest(e_obs, local_k - 1, exclude=ids)], dim=1)   # t' is slot 0
    n, c = cands.shape
    lik = torch.zeros(n, c)
    for start in range(0, n, bayes.positions_per_batch):
        sl = slice(start, start + bayes.positions_per_batch)
        base = table.vectors[cands[sl]]                                         # (b, c, d)
        if settings.uses_window:
            base = own[sl].unsqueeze(2) * base + context[sl].unsqueeze(1)
        q = base.unsqueeze(2).expand(-1, -1, draws, -1).clone()                  # (b, c, M, d)
        if m in mechanisms.DX:
            q += mechanisms.dx_noise(q[..., 0].numel(), table.dim, float(settings.parameter),
                                     generator).view(q.shape)
        lv = table.vectors[local[sl]]                                           # (b, L, d)
        flat = q.flatten(1, 2)                                                  # (b, c·M, d)
        if table.distance == COSINE:
            s = -torch.nn.functional.normalize(flat, dim=-1) @ torch.nn.functional.normalize(lv, dim=-1).transpose(1, 2)
        else:
            s = (lv * lv).sum(-1).unsqueeze(1) - 2.0 * flat @ lv.transpose(1, 2)  # (b, c·M, L)
        s = s.view(s.shape[0], c, draws, -1)
        if exclude_original:  # the candidate itself may not be the output
            s = s.masked_fill((local[sl].unsqueeze(1) == cands[sl].unsqueeze(2)).unsqueeze(2), float("inf"))
        lik[sl] = (s.argmin(-1) == 0).float().mean(-1)
    return lik
