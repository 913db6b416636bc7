"""The edge-side baselines of paper 003 (§5.1, A.1.4): CusText, LDP-Sampler and InvisibleInk.

Each picks the token the edge synchronises to the cloud from the edge's p_S and the cloud-sent p_L (both
float64 probability vectors over the shared vocabulary). The paper gives each in one sentence; what it
leaves open is taken from the original method and written in docs/collab.md, with the alternative an option:

- CusText (Chen et al. 2023): the token the undefended edge would append (argmax p_fuse; option: argmax p_S)
  is replaced by one drawn from its customised output set, its k most similar tokens by embedding (itself
  included), with the exponential mechanism P(t'|t) ∝ exp(ε·u(t, t')/2), u the similarity min-max
  normalised to [0, 1] over the set (Δu = 1). The sampler is harness/token_embeddings.custext_sets
  (the sanitisers' CusText+, here without the stop-word exemption: plain CusText sanitises every token).
- LDP-Sampler (Ghoukasian et al. 2025, the locally minimax-optimal pure ε-LDP sampler around a public
  P0): p_S is the private distribution, P0 = p_L the public anchor. Q(x) = clip(p_S(x)/r, c·p_L(x),
  e^ε·c·p_L(x)) with c = 1/(a·e^ε + 1 − a), a = (1 − c1)/(c2 − c1) for the neighbourhood
  N_γ(P0) = {P : P0/γ ≤ P ≤ γ·P0} (c1 = 1/γ, c2 = γ, so c = (γ+1)/(e^ε+γ)), and r the scale that makes Q
  sum to 1 (bisection). Every Q lies in [c·p_L, e^ε·c·p_L], so Q(x)/Q'(x) ≤ e^ε for any two private inputs:
  ε-LDP whatever p_S is; γ only chooses the inputs the sampler is optimal for. The token is drawn from
  α·p_L + (1−α)·Q (Q takes p_S's place in the fusion, as in DP-Fusion; option: from Q alone).
- InvisibleInk (Vinod et al. 2025): DClip clips the private-minus-public logit residual,
  z = ℓ_L + clip(ℓ_S − ℓ_L, −C, C) (ℓ = log-probabilities, one private reference, s = 1), and the token is
  sampled from softmax(z/τ) over the Top-k+ set {i : ℓ_L(i) ≥ ℓ_L^(k) − 2C} (the full vocabulary when k is
  null). InvisibleInk's neighbour of a private reference is its removal: here the edge without x_priv
  (p_S = p_L, residual 0), so z moves by at most C per token and the sampling is an exponential mechanism of
  utility range 2C: ε_tok = 2C/τ pure, ρ_tok = ½(C/τ)² zCDP (two different private contexts: 2·ε_tok). With
  `accounting: sequence` (InvisibleInk's own) ε is the (ε, δ)-DP of the whole answer of T = max_new_tokens
  tokens: ρ = ρ(ε, δ) of the zCDP → (ε, δ) conversion (Canonne, Kamath, Steinke 2020, Prop. 12), ρ_tok = ρ/T,
  C = τ·√(2ρ_tok). With `accounting: token` ε is each token's pure ε = 2C/τ, so C = ε·τ/2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from harness.collab.fusion import Defence, fuse, plain


class SampledDefence(Defence):
    """An edge-side defence that draws the synced token from `distribution`."""

    random_modes = ("edge",)

    def select(self, p_S, p_L, rng):
        return int(torch.multinomial(self.distribution(p_S, p_L, "edge", rng).float(), 1, generator=rng))


# --- CusText ---------------------------------------------------------------------------------------------


class CusText(SampledDefence):
    name = "collab_custext"

    def __init__(self, alpha: float, epsilon: float, table: Any, k: int, select_from: str = "fused"):
        super().__init__(alpha)
        self.epsilon, self.table, self.k, self.select_from = float(epsilon), table, int(k), select_from

    def identity(self) -> dict[str, Any]:
        out = {"name": self.name, **{k: plain(v) for k, v in sorted(vars(self).items()) if k != "table"}}
        table = self.table      # by its content: the embedding rows, the candidates and the distance
        if table is not None and "identity" not in table.memo:
            table.memo["identity"] = {"vectors": plain(table.vectors), "candidates": plain(table.candidates),
                                      "distance": table.distance}
        out["table"] = None if table is None else table.memo["identity"]
        return out

    def chosen(self, p_S: torch.Tensor, p_L: torch.Tensor) -> int:
        """The token the edge would append without the defence (what CusText then sanitises)."""
        return int(torch.argmax(fuse(p_L, p_S, self.alpha) if self.select_from == "fused" else p_S))

    def distribution(self, p_S, p_L, mode, rng):
        from harness.token_embeddings import custext_sets

        token = self.chosen(p_S, p_L)
        out = torch.zeros_like(p_S)
        if not bool(self.table.is_candidate[token]):    # special tokens (EOS) are never replaced
            out[token] = 1.0
            return out
        sets, probs = custext_sets(self.table, torch.tensor([token]), self.k, self.epsilon)
        out[sets[0]] = probs[0].to(out.dtype)
        return out


def custext_table(model: Any, tokenizer: Any, embeddings: str, distance: str) -> Any:
    """CusText's embedding table: the edge model's input embeddings (or a .pt/.npy file), every non-special
    token a candidate (harness/token_embeddings.py)."""
    from harness import token_embeddings as emb

    vectors = emb.load_vectors(embeddings, model)
    size = emb.vocab_size(tokenizer, vectors)
    return emb.Table(vectors[:size], emb.candidate_ids(tokenizer, vectors, None), distance)


# --- LDP-Sampler -----------------------------------------------------------------------------------------


def ldp_clip_bounds(epsilon: float, gamma: float) -> tuple[float, float]:
    """(c, e^ε·c): the factors of p_L between which the locally optimal sampler keeps Q, for the
    neighbourhood N_γ(p_L) (c1 = 1/γ, c2 = γ)."""
    c1, c2 = 1.0 / gamma, gamma
    a = (1.0 - c1) / (c2 - c1) if c2 > c1 else 0.5       # γ = 1: the limit a → 1/2 of (γ+1)⁻¹
    hi = 1.0 / (a + (1.0 - a) * math.exp(-epsilon))      # = e^ε/(a·e^ε + 1 − a), without overflow at large ε
    return hi * math.exp(-epsilon), hi


def ldp_sample_distribution(p: torch.Tensor, p0: torch.Tensor, epsilon: float, gamma: float,
                            iterations: int = 100) -> torch.Tensor:
    """Q = clip(p/r, c·p0, e^ε·c·p0) with Σ Q = 1, r by bisection on log r (Σ Q falls as r grows)."""
    lo_f, hi_f = ldp_clip_bounds(epsilon, gamma)
    lo, hi = lo_f * p0, hi_f * p0
    log_p = p.log()                     # −inf where p = 0: exp(−inf − log r) = 0, never 0·inf

    def scaled(log_r: float) -> torch.Tensor:
        return torch.minimum(torch.maximum(torch.exp(log_p - log_r), lo), hi)

    a, b = -800.0, 800.0                # Σ scaled(a) = Σ hi ≥ 1 ≥ Σ lo = Σ scaled(b)
    for _ in range(iterations):
        mid = (a + b) / 2
        if float(scaled(mid).sum()) > 1.0:
            a = mid
        else:
            b = mid
    q = scaled((a + b) / 2)
    return q / q.sum()                  # removes the bisection's last rounding only


class LDPSampler(SampledDefence):
    name = "collab_ldp_sampler"

    def __init__(self, alpha: float, epsilon: float, gamma: float, fuse_public: bool = True):
        super().__init__(alpha)
        self.epsilon, self.gamma, self.fuse_public = float(epsilon), float(gamma), fuse_public

    def distribution(self, p_S, p_L, mode, rng):
        q = ldp_sample_distribution(p_S, p_L, self.epsilon, self.gamma)
        return fuse(p_L, q, self.alpha) if self.fuse_public else q


# --- InvisibleInk ----------------------------------------------------------------------------------------


def zcdp_delta(rho: float, epsilon: float) -> float:
    """δ of ρ-zCDP at ε (Canonne, Kamath, Steinke 2020, Prop. 12): min over α > 1 of
    exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α; the log of it is convex in α, its derivative
    (2α−1)ρ − ε + log(1 − 1/α) increasing, so the minimiser is found by bisection on the derivative."""
    if rho <= 0:
        return 0.0
    lo, hi = 1.0 + 1e-12, max(2.0, (epsilon + 1.0) / (2.0 * rho) + 2.0)
    for _ in range(200):
        a = (lo + hi) / 2
        if (2 * a - 1) * rho - epsilon + math.log1p(-1.0 / a) < 0:
            lo = a
        else:
            hi = a
    a = (lo + hi) / 2
    log_delta = (a - 1) * (a * rho - epsilon) - math.log(a - 1) + a * math.log1p(-1.0 / a)
    return min(1.0, math.exp(log_delta))


def zcdp_rho(epsilon: float, delta: float) -> float:
    """The largest ρ whose ρ-zCDP implies (ε, δ)-DP (bisection: δ grows with ρ)."""
    lo, hi = 0.0, epsilon + 1.0
    while zcdp_delta(hi, epsilon) <= delta:   # ρ ≤ ε + 1 always suffices; kept for safety
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if zcdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def invisibleink_clip(epsilon: float, *, accounting: str, temperature: float, tokens: int, delta: float) -> float:
    """DClip's C for a budget ε (module docstring)."""
    if accounting == "token":
        return epsilon * temperature / 2.0
    return temperature * math.sqrt(2.0 * zcdp_rho(epsilon, delta) / tokens)


@dataclass(frozen=True)
class InvisibleInkSettings:
    accounting: str = "sequence"
    temperature: float = 1.0
    top_k: int | None = None


class InvisibleInk(SampledDefence):
    name = "collab_invisibleink"

    def __init__(self, alpha: float, epsilon: float, settings: InvisibleInkSettings, *, tokens: int, delta: float):
        super().__init__(alpha)
        self.settings = settings
        self.clip = invisibleink_clip(float(epsilon), accounting=settings.accounting,
                                      temperature=settings.temperature, tokens=tokens, delta=delta)

    def distribution(self, p_S, p_L, mode, rng):
        l_s, l_l = p_S.clamp_min(1e-300).log(), p_L.clamp_min(1e-300).log()
        z = l_l + (l_s - l_l).clamp(-self.clip, self.clip)
        k = self.settings.top_k
        if k is not None and k < z.numel():
            # Top-k+: every token the private top-k could contain, read from public logits only
            threshold = torch.topk(l_l, k).values[-1] - 2.0 * self.clip
            z = torch.where(l_l >= threshold, z, torch.full_like(z, -math.inf))
        return torch.softmax(z / self.settings.temperature, 0)


# --- from the config -------------------------------------------------------------------------------------


@dataclass
class Options:
    """The `collab` section's settings of the edge-side baselines (conf/collab/default.yaml), with the
    CusText table (built from the edge model only when the run is CusText's)."""

    custext_k: int = 20
    custext_select_from: str = "fused"
    custext_table: Any = None
    ldp_gamma: float = 10.0
    ldp_fuse: bool = True
    invisibleink: InvisibleInkSettings = InvisibleInkSettings()
    max_new_tokens: int = 256


def options_of(section: Any, configuration: str, edge: Any = None, tokenizer: Any = None) -> Options:
    ct, ldp, ink = section.custext, section.ldp_sampler, section.invisibleink
    table = (custext_table(edge, tokenizer, str(ct.embeddings), str(ct.distance))
             if configuration == "collab_custext" else None)
    return Options(int(ct.k), str(ct.select_from), table, float(ldp.gamma), bool(ldp.fuse),
                   InvisibleInkSettings(str(ink.accounting), float(ink.temperature),
                                        None if ink.top_k is None else int(ink.top_k)),
                   int(section.max_new_tokens))


def make(configuration: str, epsilon: float, *, alpha: float, delta: float, options: Options) -> Defence:
    if configuration == "collab_custext":
        return CusText(alpha, epsilon, options.custext_table, options.custext_k, options.custext_select_from)
    if configuration == "collab_ldp_sampler":
        return LDPSampler(alpha, epsilon, options.ldp_gamma, options.ldp_fuse)
    if configuration == "collab_invisibleink":
        return InvisibleInk(alpha, epsilon, options.invisibleink, tokens=options.max_new_tokens, delta=delta)
    raise AssertionError(f"no edge-side baseline {configuration!r}")
