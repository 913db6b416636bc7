"""The empirical privacy audit of SpliTEE's Gaussian masks (issue 52; docs/privacy_audit.md).

The game. Two prompts A and B of n tokens differ in the token at position i alone: neighbours under the
adjacency the accounting composes over (harness/splitee/accounting.py). A is a real prompt of the workload cut
to the public chat-template header, `position` text tokens, the differing token and `suffix` tokens after it.
B replaces its token i with
- `worst_case`: the token whose exposures differ most from A's. The layer-0 QKV input of a token is RMSNorm(E[v])
  alone, so its distance to A's ranks the whole vocabulary at once (the codebook of attacks/splitee/bayes.py);
  the `candidates` farthest are ranked again by the whole submission's distance, pair_mu below, over every
  exposure the token influences;
- `typical`: the token the model itself finds most likely at i after A's prefix, other than A's: the
  plausible neighbour of a real sentence.
For every trial a fair coin picks A (label 1) or B (label 0) and the split engine submits it under the
configuration with masks of its own (each batch of trials a fresh engine seed, each row fresh bank entries):
what the accelerator receives is the prefill's QKV, O and Gate/Up inputs, x_e + σ_e·η_e (the sequential
attacker's record_view).

The statistic. The auditor knows the model, both prompts and σ, so it computes each exposure's clean input
under A and under B (T3's view of the two prompts: the same computation with nothing added) and scores a
trial's view y by the log-likelihood ratio, the most powerful test between the two (Neyman–Pearson):

    LLR(y) = Σ_e log N(y_e; a_e, σ_e²I) − log N(y_e; b_e, σ_e²I)

over every exposure e at positions ≥ i (the earlier ones are equal under A and B and cancel). Per exposure:
the same over layer-0 QKV at position i alone, the first exposure the token reaches. Under the mechanism the
LLR is N(±μ²/2, μ²) with μ = pair_mu = √(Σ_e ‖a_e − b_e‖²/σ_e²), the pair's own Gaussian trade-off; the
accountant's μ is the same sum with every ‖a_e − b_e‖ replaced by the global sensitivity Δ_e, so
pair_mu ≤ accountant's μ, and an audit that reads more than the accountant finds a flaw.

The null game: the trials the coin sent to A, labelled again by a second coin: both hypotheses the same
prompt, independent masks, the same LLR. Its μ is 0, so its lower bound must be ≤ 0.

metrics/auditing.py turns the scores into the ROC curve, TPR at low FPR and the μ lower bound.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attacks.splitee import sequential as sq
from harness.errors import UserError
from harness.splitee import accounting
from harness.splitee.noise_bank import stream_seed

PAIRS = ("worst_case", "typical")
NULL = "null"
Key = sq.Key


@dataclass(frozen=True)
class Settings:
    """privacy_audit (conf/splitee/default.yaml), typed and range-checked by harness/schema.py
    (PrivacyAuditConfig, _check_privacy_audit)."""

    pairs: tuple[str, ...]
    trials: int
    prompt: int
    position: int
    suffix: int
    candidates: int
    null_game: bool
    fpr: tuple[float, ...]
    batch_size: int

    @classmethod
    def from_config(cls, node) -> Settings:
        return cls(pairs=tuple(str(p) for p in node["pairs"]), trials=int(node["trials"]), prompt=int(node["prompt"]),
                   position=int(node["position"]), suffix=int(node["suffix"]), candidates=int(node["candidates"]),
                   null_game=bool(node["null_game"]), fpr=tuple(float(f) for f in node["fpr"]),
                   batch_size=int(node["batch_size"]))


@dataclass
class Pair:
    """Two neighbouring submissions and what the auditor knows of them: each exposure's clean input from
    position i on, [n − i, d] per (op, layer), under A and under B."""

    kind: str
    a: list[int]
    b: list[int]
    position: int
    means_a: dict[Key, torch.Tensor]
    means_b: dict[Key, torch.Tensor]

    @property
    def n(self) -> int:
        return len(self.a)


def submission(prompt: Sequence[int], start: int, settings: Settings) -> tuple[list[int], int]:
    """A: the prompt cut after its differing token i = start + position and `suffix` more; and i."""
    i = start + settings.position
    n = i + 1 + settings.suffix
    if n > len(prompt):
        raise UserError(f"privacy_audit: the prompt has {len(prompt)} tokens, {start} of them the public header; "
                        f"position={settings.position} and suffix={settings.suffix} need {n}")
    return [int(t) for t in prompt[:n]], i


def clean_inputs(model: nn.Module, prompts: Sequence[Sequence[int]], keys: Sequence[Key], offload: Sequence[str],
                 sensitivity_rule: str, start: int) -> list[dict[Key, torch.Tensor]]:
    """Each prompt's exposures as T3 sends them (no mask: the clean inputs), rows from position `start` on.
    The prompts are of one length, one batch."""
    views, _ = sq.record_view(model, prompts, configuration="t3", epsilon=None, seed=0, offload=offload,
                              sigma_scale=1.0, sensitivity_rule=sensitivity_rule, pad_token_id=0,
                              batch_size=len(prompts))
    rows = sq.prompt_rows(views, [len(p) for p in prompts], len(prompts), keys)
    return [{k: r[k][start:] for k in keys} for r in rows]


def pair_mu(a: dict[Key, torch.Tensor], b: dict[Key, torch.Tensor], sigmas: dict[Key, float],
            keys: Sequence[Key] | None = None) -> float:
    """√(Σ_e ‖a_e − b_e‖²/σ_e²): μ of the Gaussian mechanism on this pair (module docstring)."""
    keys = list(a) if keys is None else keys
    return math.sqrt(math.fsum(float(((a[k].double() - b[k].double()) ** 2).sum()) / sigmas[k] ** 2 for k in keys))


def build_pair(kind: str, model: nn.Module, a: list[int], i: int, keys: Sequence[Key], sigmas: dict[Key, float],
               offload: Sequence[str], sensitivity_rule: str, candidates: int) -> Pair:
    """The pair of `kind` around A's token i (module docstring)."""
    true = a[i]
    if kind == "typical":
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([a[:i]])).logits[0, -1]
        logits[true] = -math.inf
        choices = [int(logits.argmax())]
    else:
        book = sq.layer0_codebook(model)
        distance = ((book - book[true]) ** 2).sum(-1)
        distance[true] = -1.0
        choices = distance.topk(min(candidates, distance.numel() - 1)).indices.tolist()
    swapped = [a[:i] + [c] + a[i + 1:] for c in choices]
    rows = clean_inputs(model, [a, *swapped], keys, offload, sensitivity_rule, i)
    best = max(range(len(choices)), key=lambda j: pair_mu(rows[0], rows[j + 1], sigmas, keys))
    return Pair(kind, a, swapped[best], i, rows[0], rows[best + 1])


def accountant(pair: Pair, n_layers: int, offload: Sequence[str], exposure_epsilon: float) -> dict:
    """The accountant's μ for the same submission: every exposure the token influences (accounting.
    exposure_count, prefill only) at its ε, composed in closed form √(Σ ε_k²) (accounting.composed_mu; Dong et
    al. 2022 Cor. 3.3), beside the accountant's per-exposure ε."""
    count = accounting.exposure_count(pair.n, pair.position, n_layers, 1, [op for op in offload if op != "lm_head"])
    return {"exposures": count.total, "exposure_epsilon": exposure_epsilon,
            "mu": accounting.composed_mu([exposure_epsilon] * count.total)}


class Scorer:
    """The LLR of a trial's rows (from position i on), per submission and for the first exposure alone, through
    the sequential attacker's Gaussian log-likelihood (sq.gaussian_scores). Each exposure is centred on the
    midpoint of the two means, so the two candidates are ±(a − b)/2: their scores are exact negatives, and a
    float32 dot product of a large-σ view with two nearly equal means cancels nothing."""

    def __init__(self, pair: Pair, sigmas: dict[Key, float], keys: Sequence[Key]) -> None:
        self.keys, self.sigmas = list(keys), sigmas
        self.mid = {k: ((pair.means_a[k] + pair.means_b[k]) / 2).reshape(-1) for k in self.keys}
        half = {k: ((pair.means_a[k] - pair.means_b[k]) / 2).reshape(-1) for k in self.keys}
        self.pm = {k: torch.stack([half[k], -half[k]]) for k in self.keys}
        first = self.keys[0]
        width = pair.means_a[first].shape[-1]
        self.first = (first, self.pm[first][:, :width], self.mid[first][:width], width)

    def __call__(self, rows: dict[Key, torch.Tensor]) -> tuple[float, float]:
        total = 0.0
        for k in self.keys:
            s = sq.gaussian_scores(self.pm[k], rows[k].reshape(-1) - self.mid[k], self.sigmas[k])
            total += float(s[0] - s[1])
        key, pm, mid, width = self.first
        s = sq.gaussian_scores(pm, rows[key][0] - mid, self.sigmas[key])
        return total, float(s[0] - s[1])


def play(model: nn.Module, pair: Pair, scorer: Scorer, settings: Settings, *, configuration: str,
         epsilon: float | None, seed: int, offload: Sequence[str], sigma_scale: float, sensitivity_rule: str,
         epsilon_length: int, keys: Sequence[Key], log=None) -> dict[str, np.ndarray]:
    """`settings.trials` trials of the game (module docstring): labels (1 = A), the submission's LLR and the
    first exposure's."""
    labels = np.random.default_rng(stream_seed("privacy_audit", seed, pair.kind)).integers(0, 2, settings.trials)
    submission_llr, exposure_llr = [], []
    for c, start in enumerate(range(0, settings.trials, settings.batch_size)):
        batch = labels[start:start + settings.batch_size]
        prompts = [pair.a if label else pair.b for label in batch]
        views, _ = sq.record_view(model, prompts, configuration=configuration, epsilon=epsilon,
                                  seed=stream_seed("privacy_audit", seed, pair.kind, c), offload=offload,
                                  sigma_scale=sigma_scale, sensitivity_rule=sensitivity_rule, pad_token_id=0,
                                  batch_size=len(prompts), epsilon_lengths=[epsilon_length] * len(prompts))
        for rows in sq.prompt_rows(views, [pair.n] * len(prompts), len(prompts), keys):
            whole, first = scorer({k: rows[k][pair.position:] for k in keys})
            submission_llr.append(whole)
            exposure_llr.append(first)
        if log is not None:
            log(f"privacy audit: {pair.kind}: {min(start + len(batch), settings.trials)}/{settings.trials} trials")
    return {"labels": labels, "submission": np.array(submission_llr), "exposure": np.array(exposure_llr)}


def null_game(game: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The trials the coin sent to A, labelled again by a second coin (module docstring)."""
    keep = game["labels"] == 1
    labels = np.random.default_rng(stream_seed("privacy_audit", seed, NULL)).integers(0, 2, int(keep.sum()))
    return {"labels": labels, "submission": game["submission"][keep], "exposure": game["exposure"][keep]}


SCOPES = ("submission", "exposure")


def summarise(games: dict[str, tuple[Pair, dict[str, np.ndarray]]], acc: dict, sigmas: dict[Key, float],
              keys: Sequence[Key], settings: Settings, *, seed: int, delta: float, decode) -> tuple[dict, dict]:
    """(results.json `metrics`, the `privacy_audit` section) of a run's games. Per game and scope (the whole
    submission, the first exposure alone): the audit (metrics/auditing.py: TPR at each target FPR with
    Clopper–Pearson intervals, the μ lower bound, the Gaussian fit's μ, the ROC curve), the pair's own μ and the
    accountant's. Flat metrics `<game>_<scope>_<name>`, and the first pair's whole submission unprefixed: the
    headline (`empirical_mu_lower`, `accountant_mu`, `tpr_at_fpr` in % keyed by the target FPR in %)."""
    from metrics import auditing

    first_key = keys[0]
    metrics: dict = {"n_trials": settings.trials}
    section: dict = {"games": {}, "exposure": f"{first_key[0]}[{first_key[1]}]", "accountant_exposures": acc["exposures"],
                     "accountant_dp_delta": delta, "sigma_per_op_layer": {f"{op}[{layer}]": sigmas[(op, layer)]
                                                                          for op, layer in keys}}
    for game, (pair, scores) in games.items():
        own = {"submission": pair_mu(pair.means_a, pair.means_b, sigmas, keys),
               "exposure": pair_mu({first_key: pair.means_a[first_key][:1]}, {first_key: pair.means_b[first_key][:1]},
                                   sigmas)}
        accounted = {"submission": acc["mu"], "exposure": acc["exposure_epsilon"]}
        b = pair.a if game == NULL else pair.b     # the null game submits A under both labels
        entry = {"pair": game, "position": pair.position, "n_tokens": pair.n,
                 "token_a": pair.a[pair.position], "token_b": b[pair.position],
                 "text_a": decode([pair.a[pair.position]]), "text_b": decode([b[pair.position]]),
                 "n_trials": int(scores["labels"].size), "n_a": int(scores["labels"].sum())}
        for scope in SCOPES:
            audit = auditing.audit(scores[scope], scores["labels"], targets=settings.fpr, seed=seed).record()
            audit["pair_mu"] = 0.0 if game == NULL else own[scope]
            audit["accountant_mu"] = accounted[scope]
            entry[scope] = audit
            prefix = f"{game}_{scope}_"
            flat = _flat(audit)
            metrics.update({prefix + k: v for k, v in flat.items()})
            if game == settings.pairs[0] and scope == "submission":
                metrics.update(flat)
        section["games"][game] = entry
    metrics["accountant_dp_epsilon"] = accounting.dp_epsilon(acc["mu"], delta)
    # an audit that certifies more than the accountant allows found a flaw in the mechanism or its accounting
    metrics["accountant_exceeded"] = any(metrics[f"{g}_{s}_empirical_mu_lower"] > metrics[f"{g}_{s}_accountant_mu"]
                                         for g in games for s in SCOPES)
    return metrics, section


def _flat(audit: dict) -> dict:
    """One scope's flat metrics: the bound, the AUC of all trials with its DeLong interval (metrics/roc.py), the
    fit with its interval, the pair's and the accountant's μ, and TPR at each target FPR (%, keyed by the target
    in %) with its Clopper–Pearson interval, read on the held-out half (metrics/auditing.py)."""
    lo, hi = audit["mu_estimate_ci"]
    auc_lo, auc_hi = audit["roc"]["auc_ci"]
    return {"empirical_mu_lower": audit["empirical_mu_lower"], "mu_cap": audit["mu_cap"],
            "auc": audit["roc"]["auc"], "auc_ci_lo": auc_lo, "auc_ci_hi": auc_hi,
            "mu_estimate": audit["mu_estimate"],
            "mu_estimate_ci_lo": lo, "mu_estimate_ci_hi": hi, "pair_mu": audit["pair_mu"],
            "accountant_mu": audit["accountant_mu"],
            "tpr_at_fpr": {f"{p['fpr_target_pct']:g}": p["tpr_pct"] for p in audit["tpr_at_fpr"]},
            "tpr_at_fpr_ci": {f"{p['fpr_target_pct']:g}": p["tpr_ci_pct"] for p in audit["tpr_at_fpr"]}}
