"""SpliTEE's sequential attacker's verdict under calibration (issue 31; the driver, `calibrate`, is
attacks/calibration.py): its `entry` factory, named by `calibration` on its entry of harness/systems.py, and the
schema (`Config`) and range checks (`check`) of its part of the `calibration` section, calibration.splitee.

Torch-free and light at import (harness/calibration_config.py imports it to type the section): the driver, torch
and the system's attackers are imported where a trial needs them.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import numpy as np
from omegaconf import MISSING

from harness.calibration_config import CalibrationPairedPlanning
from harness.checks import check_at_least
from harness.errors import UserError

if TYPE_CHECKING:
    from attacks.calibration import Entry

# runners/calibration.py: its reads of `attack`, in the runner's hash, sit under system_margins (`hashed_margins`)
MARGINS = ("attack",)


@dataclass
class CalibrationSpliteeConfig:
    prompts: int = MISSING         # pool prompts, cut in order from real text
    tokens: int = MISSING          # tokens a prompt (positions 1..tokens-1 are attacked)
    pool_path: Optional[str] = MISSING   # a UTF-8 text file the pool is cut from; null = the built-in corpus
    positions: int = MISSING       # positions per trial, drawn from the pool
    epsilon: float = MISSING       # ep1's ε of the masks
    dose_epsilon: float = MISSING  # ε of a dosed position's own exposure
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING
    planning: CalibrationPairedPlanning = MISSING
    published_n: Optional[int] = MISSING
    published: Optional[str] = MISSING


Config = CalibrationSpliteeConfig


def check(c: Any, cfg: Any) -> None:
    from harness.workloads import read_text

    base, disc = float(c.planning.base), float(c.planning.discordance)
    if not (0 <= base <= 1 and 0 <= disc <= 2 * min(base, 1 - base)):
        raise UserError(f"calibration.splitee.planning needs base in [0, 1] and 0 <= discordance <= "
                        f"2·min(base, 1 − base), got base={base}, discordance={disc}")
    check_at_least("calibration.splitee.prompts", c.prompts, 3)
    check_at_least("calibration.splitee.tokens", c.tokens, 2)
    check_at_least("calibration.splitee.positions", c.positions, 2)
    pool = int(c.prompts) * (int(c.tokens) - 1)
    if int(c.positions) > pool:
        raise UserError(f"calibration.splitee.positions={c.positions} exceeds the pool's {pool} positions "
                        "(prompts x (tokens - 1))")
    if c.get("pool_path") is not None and "splitee" in list(cfg.calibration.systems):
        read_text(Path(str(c.pool_path)), "calibration.splitee.pool_path")   # before anything is written
    for key in ("epsilon", "dose_epsilon"):
        if not (math.isfinite(float(c[key])) and float(c[key]) > 0):
            raise UserError(f"calibration.splitee.{key} must be a number > 0, got {c[key]}")


def hashed_margins(attack: dict[str, Any]) -> dict[str, Any]:
    """What the runner's hash holds of `attack`: the sequential attacker's keys flattened, the layout the
    finished calibration runs were hashed in."""
    sequential = attack.pop("sequential")
    attack["sequential_min_pruning_recall"] = float(sequential["min_pruning_recall"])
    if "map_reference" in sequential:   # absent at prior (unhashed: the runs from before the key keep their hash)
        attack["sequential_map_reference"] = str(sequential["map_reference"])
    return attack


@dataclass
class SpliteeData:
    """What the SpliTEE trials share, computed once: per pool position (prompt r, position p ≥ 1) its true
    token, the model's prior log P(v | true prefix) over the whole vocabulary (one forward per prompt) and
    its argmax (the prior-only floor); the layer-0 QKV codebook μ(v) = RMSNorm₀(E[v]) and its exposure's σ."""

    tokens: list[list[int]]          # the pool prompts
    where: list[tuple[int, int]]     # (prompt, position) of each pool position
    log_prior: Any                   # [positions, V] float32
    prior_guess: list[int]
    book: Any                        # [V, d]
    book_sq: Any                     # [V]
    sigma: float                     # the exposure's σ at the calibrated ε
    dose_sigma: float                # at the dose's ε


def splitee_data(model: Any, tokens: list[list[int]], *, epsilon: float, dose_epsilon: float, sigma_scale: float,
                 sensitivity_rule: str) -> SpliteeData:
    """The pool's priors (one forward per prompt, teacher-forced: position p's prior reads tokens 0..p−1)
    and the layer-0 QKV exposure's σ under ep1 at ε and at the dose's ε (attacks/splitee/sequential.op_sigmas, the
    engine's σ)."""
    import torch

    from attacks.splitee import sequential as sq

    priors, where = [], []
    with torch.no_grad():
        for r, row in enumerate(tokens):
            logits = model(input_ids=torch.as_tensor([row], dtype=torch.long)).logits[0].float()
            priors.append(torch.log_softmax(logits[:-1], -1))     # row p−1 predicts position p
            where += [(r, p) for p in range(1, len(row))]
    log_prior = torch.cat(priors)
    book = sq.layer0_codebook(model).float()
    sigma = [sq.op_sigmas(model, "ep1", e, [len(tokens[0])], [("qkv", 0)], sigma_scale=sigma_scale,
                          sensitivity_rule=sensitivity_rule)[0][("qkv", 0)] for e in (epsilon, dose_epsilon)]
    return SpliteeData(tokens, where, log_prior, log_prior.argmax(-1).tolist(), book, (book * book).sum(-1),
                       sigma[0], sigma[1])


def splitee_entry(data: SpliteeData, *, positions: int, margin_pp: float, min_recall: float,
                  doses_pp: Sequence[float], gate_dose_pp: float, map_reference: str,
                  planning: dict[str, float] | None = None, chunk: int = 128, block: int = 4096,
                  pool: str = "the built-in corpus") -> Entry:
    """SpliTEE (issue 36 item 3): the sequential attacker's verdict (attacks/controls.sequential_verdict,
    worst of MAP against its reference and the likelihood attacker against itself on a null view), on
    the layer-0 QKV exposure under ep1, the whole vocabulary scored (no pruning), teacher-forced: the
    sequential attacker with layers=[0], ops=[qkv], prune=null (its codebook scores, no forward pass).
    MAP's reference is `map_reference` (attack.sequential.map_reference, as the runner reads it): `prior`,
    the prior alone; `null_view`, MAP on the likelihood attacker's reference view (a second other prompt's),
    as sequential.summarise pairs MAP with MAP on the runner's null view. MAP's verdict against the other
    reference is computed on the same trials and reported as its own part (`map_against_<reference>`), not
    part of the entry's verdict: a calibration shows both references' false-leak and certify rates.

    A trial draws `positions` pool positions without replacement. Null: at each, the attacker reads the
    exposure of a *different* prompt (a random other pool prompt's token at that position, masked afresh
    at ε: y = μ(t_q) + σ·η, the engine's Gaussian mask) and is scored against the true token; the
    likelihood attacker's reference reads a second, independent other prompt's view. Dose d: among the
    positions where the prior alone is wrong, each reads instead, with probability d/(100·(1 − π)) (π the
    prior's hit rate on the trial's positions), its own prompt's exposure masked at the dose's ε (σ small
    enough that the exposure names its token), for MAP and the likelihood attacker alike (the reference
    stays null): MAP − prior rises by about d pp, and so does MAP − MAP on the null view (which is right
    about as often as the prior at those positions, where the prior is wrong). What the trials share: the
    pool's prompts, priors and codebook (computed once); each trial draws its positions, other prompts and
    masks afresh.

    Scores are computed `chunk` positions × `block` tokens at a time (`splitee_guesses`): the Gaussian
    log-likelihood (y·μ(v) − ‖μ(v)‖²/2)/σ² of every token v (sequential.gaussian_scores up to the shared
    constant), its argmax (the likelihood attacker), then plus the prior, its argmax (MAP)."""
    import torch

    from attacks import controls
    from attacks.calibration import Entry, Trial
    from attacks.splitee.sequential import MAP_REFERENCES, MAP_VERDICT
    from metrics.proportions import newcombe_earned, newcombe_paired, paired_table

    if map_reference not in MAP_REFERENCES:
        raise ValueError(f"map_reference must be one of {MAP_REFERENCES}, got {map_reference!r}")
    map_against = MAP_VERDICT[map_reference][1]
    others = [r for r in MAP_REFERENCES if r != map_reference]
    tokens, book = data.tokens, data.book
    n_pool, n_prompts = len(data.where), len(tokens)
    if positions > n_pool:
        raise ValueError(f"a SpliTEE trial draws {positions} positions from a pool of {n_pool}")
    if n_prompts < 3:
        raise ValueError("the SpliTEE null needs at least 3 prompts (two other prompts per position)")
    book_t = book.T.contiguous()
    half_sq = -0.5 * data.book_sq
    where_row = np.asarray([r for r, _ in data.where])
    where_pos = np.asarray([p for _, p in data.where])
    token_at = np.full((n_prompts, max(len(t) for t in tokens)), -1, dtype=np.int64)
    for r, row in enumerate(tokens):
        token_at[r, :len(row)] = row
    truth_all = token_at[where_row, where_pos]
    prior_right = np.asarray(data.prior_guess) == truth_all

    def other(rows: np.ndarray, rng, avoid: np.ndarray | None = None) -> np.ndarray:
        """A uniformly random other prompt per position (≠ its own, and ≠ `avoid` where given)."""
        out = (rows + 1 + rng.integers(n_prompts - 1, size=len(rows))) % n_prompts
        if avoid is not None:
            bad = out == avoid
            while bad.any():   # rejection: uniform over the prompts left
                out[bad] = (rows[bad] + 1 + rng.integers(n_prompts - 1, size=int(bad.sum()))) % n_prompts
                bad = out == avoid
        return out

    def view(sources: np.ndarray, pos: np.ndarray, sigma: np.ndarray, rng) -> torch.Tensor:
        """Fresh masked layer-0 QKV exposures of the source prompts' tokens at those positions."""
        clear = book[torch.as_tensor(token_at[sources, pos])]
        noise = torch.as_tensor(rng.standard_normal(clear.shape), dtype=clear.dtype)
        return clear + torch.as_tensor(sigma, dtype=clear.dtype)[:, None] * noise

    def verdict(first, second, reference: str):
        table = paired_table(first.tolist(), second.tolist())
        theta, lo, hi = newcombe_paired(*table)
        e_lo, e_hi = newcombe_earned(*table)
        v, _why = controls.sequential_verdict(100 * lo, 100 * hi, margin_pp, teacher_forced=True,
                                              pruning_recall=None, min_recall=min_recall, reference=reference,
                                              certify=(100 * e_lo, 100 * e_hi))
        return v, 100 * theta, (100 * lo, 100 * hi), table, (100 * e_lo, 100 * e_hi)

    def trial(dose: float, rng) -> Trial:
        idx = rng.choice(n_pool, positions, replace=False)
        rows, pos, truth = where_row[idx], where_pos[idx], truth_all[idx]
        prior_hits = prior_right[idx]
        share = dose / 100.0 / max(1e-12, 1.0 - float(prior_hits.mean()))
        own = (rng.random(positions) < min(1.0, share)) & ~prior_hits
        first = np.where(own, rows, other(rows, rng))
        second = other(rows, rng, avoid=first)
        sigma1 = np.where(own, data.dose_sigma, data.sigma)
        lik1, map1 = splitee_guesses(data, book_t, half_sq, view(first, pos, sigma1, rng), sigma1, idx, chunk, block)
        sigma2 = np.full(positions, data.sigma)
        ref, ref_map = splitee_guesses(data, book_t, half_sq, view(second, pos, sigma2, rng), sigma2, idx, chunk,
                                      block)
        # MAP against both references on the same trial: the configured one decides, the other is reported
        against = {"prior": prior_hits, "null_view": ref_map == truth}
        read = {r: verdict(map1 == truth, against[r], MAP_VERDICT[r][1]) for r in MAP_REFERENCES}
        v_map, diff, interval, table, earned = read[map_reference]
        v_lik, lik_diff, _, _, _ = verdict(lik1 == truth, ref == truth, "the same attacker on a null view")
        parts, stats = {"map": v_map, "likelihood": v_lik}, {"map": diff, "likelihood": lik_diff}
        for r in others:
            parts[f"map_against_{r}"], stats[f"map_against_{r}"] = read[r][0], read[r][1]
        return Trial(controls.worst([v_map, v_lik]), diff, parts, interval, table, stats, earned)

    reads = "MAP − prior" if map_reference == "prior" else "MAP − MAP on the null view"
    return Entry("splitee", "masks of a different prompt (each position reads another pool prompt's layer-0 QKV "
                 "exposure, masked afresh; the likelihood reference, and with map_reference=null_view MAP's, a "
                 f"second other prompt's); MAP's verdict reads {reads}; the pool: {n_prompts} prompts of "
                 f"{len(tokens[0])} tokens from {pool}",
                 "a verdict that calls the model's prior, or an exposure of unrelated text, a leak of the prompt",
                 "pp of positions, among those the prior misses, whose exposure is their own prompt's (masked at "
                 f"the dose's ε, where it names the token): {reads} rises by about d pp",
                 lambda rng: trial(0.0, rng), trial, doses_pp, gate_dose_pp, margin_pp, positions,
                 "positions", "newcombe", planning,
                 {"map": map_against, "likelihood": "the same attacker on a null view",
                  **{f"map_against_{r}": f"{MAP_VERDICT[r][1]} (reported, not part of the verdict)" for r in others}})


class RunningArgmax:
    """The argmax of each row of a matrix seen one block of rows × columns at a time: a later block's maximum
    replaces the best so far only when strictly greater, so ties keep the first maximal column, as argmax does
    over the whole row (torch's and numpy's alike)."""

    def __init__(self, rows: int) -> None:
        self.value = np.full(rows, -np.inf, np.float32)
        self.index = np.zeros(rows, np.int64)

    def update(self, block: np.ndarray, row: int, col: int) -> None:
        # numpy's argmax: torch's CPU argmax over a row is ~20× slower, a third of the SpliTEE entry's time
        at = block.argmax(-1)
        best = block[np.arange(len(block)), at]
        value, index = self.value[row:row + len(block)], self.index[row:row + len(block)]
        better = best > value
        value[better], index[better] = best[better], at[better] + col


def splitee_guesses(data: SpliteeData, book_t: Any, half_sq: Any, y: Any, sigma: np.ndarray, idx: np.ndarray,
                    chunk: int = 128, block: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per exposure row of `y`: the argmax over tokens v of the Gaussian log-likelihood
    (y·μ(v) − ‖μ(v)‖²/2)/σ² (`book_t` = μᵀ, `half_sq` = −‖μ(v)‖²/2), and of it plus the prior of pool row
    `idx`. The scores are computed a tile of `chunk` rows × `block` tokens at a time (a tile stays in the
    cache; the whole [rows, V] matrix never exists), each entry with the same arithmetic as the full matrix
    (addmm, then × 1/σ², then + the prior), so the argmaxes are the full matrix's exactly."""
    import torch

    inv = torch.as_tensor(1.0 / (sigma * sigma), dtype=y.dtype)[:, None]
    rows = torch.as_tensor(idx)
    lik, post = RunningArgmax(len(y)), RunningArgmax(len(y))
    for c in range(0, book_t.shape[1], block):
        book_c, half_c, prior_c = book_t[:, c:c + block], half_sq[c:c + block], data.log_prior[:, c:c + block]
        for s in range(0, len(y), chunk):
            scores = torch.addmm(half_c, y[s:s + chunk], book_c).mul_(inv[s:s + chunk])
            lik.update(scores.numpy(), s, c)
            post.update(scores.add_(prior_c.index_select(0, rows[s:s + chunk])).numpy(), s, c)
    return lik.index, post.index


def entry(cfg: Any, model: Any) -> Entry:
    from attacks.calibration import planning_of, published_of, text_rows

    c = cfg.calibration.splitee
    path = c.get("pool_path")
    if path is None:
        rows, pool = text_rows(model.tokenizer, int(c.prompts), int(c.tokens)), "the built-in corpus"
    else:   # one read: the text for the rows, its bytes for the provenance hash
        from harness.workloads import read_text

        text, raw = read_text(Path(path), "calibration.splitee.pool_path")
        rows = text_rows(model.tokenizer, int(c.prompts), int(c.tokens), text,
                         source=f"calibration.splitee.pool_path={path}")
        pool = f"{path} (sha256 {hashlib.sha256(raw).hexdigest()[:16]})"
    data = splitee_data(model.model, rows, epsilon=float(c.epsilon), dose_epsilon=float(c.dose_epsilon),
                        sigma_scale=float(cfg.engine.sigma_scale),
                        sensitivity_rule=str(cfg.engine.sensitivity_rule))
    entry = splitee_entry(data, positions=int(c.positions), margin_pp=float(cfg.attack.controls.gate_margin_pp),
                          min_recall=float(cfg.attack.sequential.min_pruning_recall), doses_pp=list(c.doses_pp),
                          gate_dose_pp=float(c.gate_dose_pp),
                          map_reference=str(cfg.attack.sequential.map_reference), planning=planning_of(c),
                          pool=pool)
    entry.published = published_of(c)
    return entry
