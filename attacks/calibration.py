"""Verdicts calibrated against nulls (issue 31): each system's verdict run on signals with no private
information and on signals with a known dose of it, as one measures an instrument before reading it.

An entry of `REGISTRY` is one system's verdict under test: how to build a **null trial** (a signal built to
carry nothing about the private data), a **dosed trial** at a known dose (pp: how much of the private data
the signal carries, in the unit of the verdict's statistic) and which verdict function reads them. A trial
returns the verdict (leak | at_chance | inconclusive) and the value of its statistic. `calibrate` runs
`trials` null trials and `trials` trials per dose and reports, each with its Clopper–Pearson 95% interval
(metrics/proportions.py):

- `false_leak_rate`: the share of null trials read as leak;
- `certify_rate`: the share of null trials read at_chance (the verdict's power to certify);
- `power`: per dose, the share of dosed trials read as leak;
- `null_sd`: the spread of the null trials' statistic, and `certifiable_margin_pp`: the margin the
  entry's sample size can certify with 80 % probability at that spread (metrics/equivalence.py).

Trials are cheap on purpose: they operate on recorded or constructed signals and call the verdict code the
runners call (attacks/collab_decodeleak.verdict, attacks/sanitize/scoring.score_attacker,
attacks/splitft/cell.assess, attacks/controls.classify on the gradient probe, attacks/controls.
sequential_verdict for SpliTEE), never the systems' models, except the collab entry, which computes its
cloud's no-signal guesses once, and the SpliTEE entry, which computes one prior forward per prompt and the
layer-0 codebook once. Adding a system is one more `Entry` factory in `REGISTRY`.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attacks import controls
from metrics.equivalence import certifiable_margin
from metrics.proportions import clopper_pearson


@dataclass(frozen=True)
class Trial:
    verdict: str
    statistic: float          # the verdict's statistic minus its reference (pp)
    # per attacker, where the entry's verdict is the worst over several (SpliTEE: map, likelihood)
    parts: dict[str, str] | None = None
    # the verdict's own 95% interval of the statistic (pp), where it is not a t interval of a mean
    interval: tuple[float, float] | None = None


@dataclass
class Entry:
    """One system's verdict under calibration (module docstring)."""

    system: str
    null: str                                   # what the null signal is
    rules_out: str                              # what a clean null calibration rules out
    dose_unit: str                              # what a dose of d pp means for this system
    null_trial: Callable[[np.random.Generator], Trial]
    dosed_trial: Callable[[float, np.random.Generator], Trial]
    doses_pp: Sequence[float]
    gate_dose_pp: float                         # the dose the verdict must call a leak (power ≥ 80 %)
    margin_pp: float
    n_examples: int


def proportion(k: int, n: int) -> dict[str, Any]:
    lo, hi = clopper_pearson(k, n)
    return {"k": k, "n": n, "rate": k / n, "ci": [lo, hi]}


def calibrate(entry: Entry, trials: int, seed: int, dosed_trials: int | None = None) -> dict[str, Any]:
    """`trials` null trials and `dosed_trials` (default: as many) per dose of one entry, each trial with its
    own generator (spawned from `seed`)."""
    dosed_trials = trials if dosed_trials is None else dosed_trials
    if trials < 1 or dosed_trials < 1:
        raise ValueError(f"need at least one trial of each kind, got {trials} and {dosed_trials}")
    seeds = np.random.SeedSequence(seed).spawn(1 + len(entry.doses_pp))
    null_rngs = [np.random.default_rng(s) for s in seeds[0].spawn(trials)]
    nulls = [entry.null_trial(rng) for rng in null_rngs]
    power, dosed_stats = {}, {}
    for dose, ss in zip(entry.doses_pp, seeds[1:]):
        runs = [entry.dosed_trial(float(dose), np.random.default_rng(s)) for s in ss.spawn(dosed_trials)]
        power[f"{float(dose):g}"] = proportion(sum(t.verdict == controls.LEAK for t in runs), dosed_trials)
        dosed_stats[f"{float(dose):g}"] = statistics.fmean(t.statistic for t in runs)
    values = [t.statistic for t in nulls]
    by_attacker = sorted({a for t in nulls if t.parts for a in t.parts})
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    out = {
        "null": entry.null, "rules_out": entry.rules_out, "dose_unit": entry.dose_unit,
        "n_examples": entry.n_examples, "margin_pp": entry.margin_pp, "trials": trials,
        "dosed_trials": dosed_trials,
        "false_leak_rate": proportion(sum(t.verdict == controls.LEAK for t in nulls), trials),
        "certify_rate": proportion(sum(t.verdict == controls.AT_CHANCE for t in nulls), trials),
        "null_verdicts": {v: sum(t.verdict == v for t in nulls) for v in controls.VERDICTS},
        "null_statistic_mean_pp": statistics.fmean(values), "null_statistic_sd_pp": sd,
        "power": power, "dosed_statistic_mean_pp": dosed_stats,
        "gate_dose_pp": entry.gate_dose_pp,
        "power_at_gate_dose": power.get(f"{float(entry.gate_dose_pp):g}"),
    }
    if by_attacker:   # each attacker's own verdict on the same null trials (the entry's is their worst)
        out["by_attacker"] = {a: {
            "false_leak_rate": proportion(sum((t.parts or {}).get(a) == controls.LEAK for t in nulls), trials),
            "certify_rate": proportion(sum((t.parts or {}).get(a) == controls.AT_CHANCE for t in nulls), trials),
        } for a in by_attacker}
    # The null statistic's spread across trials is that of the mean over n examples: σ_example = sd·√n.
    if all(t.interval is not None for t in nulls):
        # The verdict's interval is not a t interval (SpliTEE: Newcombe's, on proportions near 0), so the
        # t-based helper does not apply: the margin the null trials' own intervals lie within 80 % of the time.
        reach = sorted(max(abs(lo), abs(hi)) for lo, hi in (t.interval for t in nulls))
        out["certifiable_margin_pp"] = float(np.quantile(reach, 0.8))
        out["certifiable_margin_method"] = "80th percentile over null trials of the verdict interval's reach max(|lo|, |hi|)"
    elif entry.n_examples >= 2:
        out["certifiable_margin_pp"] = certifiable_margin(sd * math.sqrt(entry.n_examples), entry.n_examples)
        out["certifiable_margin_method"] = "metrics/equivalence.certifiable_margin at the null statistic's spread"
    out["acceptance"] = {
        "false_leak_upper_le_10pct": out["false_leak_rate"]["ci"][1] <= 0.10,
        "power_at_gate_dose_ge_80pct": out["power_at_gate_dose"] is not None
        and out["power_at_gate_dose"]["rate"] >= 0.80,
        "certify_rate_ge_80pct": out["certify_rate"]["rate"] >= 0.80,
    }
    return out


# --- the entries ---------------------------------------------------------------------------------------------


def _others(pool: Sequence[Sequence[int]], n: int, rng: np.random.Generator) -> list[list[int]]:
    """n rows of `pool` (text that is none of the evaluated examples) in a random order: a signal built
    independently of every example's truth. (Another *evaluated* example's truth would not do: the
    exposure-free reference scores each guess against every other example, its source included.)"""
    return [list(pool[j]) for j in rng.permutation(len(pool))[:n]]


def _dose(truth: Sequence[int], other: Sequence[int], dose_pp: float, rng: np.random.Generator) -> list[int]:
    """`other` with each position replaced by the truth's with probability dose/100."""
    keep = rng.random(len(truth)) < dose_pp / 100.0
    return [int(t) if k else int(o) for t, o, k in zip(truth, other, keep)]


def text_rows(tokenizer: Any, n: int, length: int) -> list[list[int]]:
    """n rows of `length` token ids cut from the built-in corpus (real text's token frequencies)."""
    from harness.text_corpus import BUILTIN_CORPUS, paragraphs

    stream = [int(i) for p in paragraphs(BUILTIN_CORPUS.read_text()) for i in tokenizer(p)["input_ids"]]
    if len(stream) < n * length:
        raise ValueError(f"the built-in corpus has {len(stream)} tokens, fewer than {n} rows of {length}")
    return [stream[i * length:(i + 1) * length] for i in range(n)]


def sanitize_entry(rows: list[list[int]], pool: list[list[int]], margin_pp: float, doses_pp: Sequence[float],
                   gate_dose_pp: float) -> Entry:
    """Paper 001: the sanitisers' verdict (attacks/sanitize/scoring.score_attacker, the identity attacker that
    reads the sanitised tokens as its guess). Null: every prompt sanitised independently of the truth (its
    positions filled with a row of other text, `pool`, in a random order per trial); dose d: each position
    passes its true token with probability d/100."""
    import torch

    from attacks.sanitize import scoring

    def identity(observed):
        return [torch.tensor(o, dtype=torch.long).view(-1, 1) for o in observed]

    def trial(observed: list[list[int]]) -> Trial:
        s, _ = scoring.score_attacker("identity", identity, rows, observed, 1, margin_pp, True)
        return Trial(s.verdict, s.f1.mean - s.reference)

    def null(rng):
        return trial(_others(pool, len(rows), rng))

    def dosed(dose, rng):
        return trial([_dose(t, o, dose, rng) for t, o in zip(rows, _others(pool, len(rows), rng))])

    return Entry("sanitize", "prompts sanitised independently of the truth (each prompt's tokens replaced by a "
                 "row of other text of the same corpus)",
                 "a verdict that calls the sanitiser's output a leak from the text's shared vocabulary alone",
                 "% of positions whose true token passes through", null, dosed, doses_pp, gate_dose_pp, margin_pp,
                 len(rows))


def splitft_entry(rows: list[list[int]], pool: list[list[int]], margin_pp: float, positive_margin_pp: float,
                  doses_pp: Sequence[float], gate_dose_pp: float) -> Entry:
    """Paper 002: the label attack's verdict (attacks/splitft/cell.assess, reference = the larger of the
    exposure-free reference and the constant most-frequent-label guess). Null: shuffled labels (the guesses
    are the labels of other text, `pool`, in a random order); dose d: each guessed label is the true one
    with probability d/100."""
    from attacks.splitft.cell import assess
    from attacks.splitft.label import constant_guesses

    constant = constant_guesses(rows)

    def trial(guesses: list[list[int]]) -> Trial:
        m = assess("label", rows, guesses, rows, rows, margin_pp, positive_margin_pp, prior_guesses=constant,
                   plain_prior_guesses=constant)
        return Trial(m["label_verdict"], m["label_token_f1"] - m["label_reference_token_f1"])

    def null(rng):
        return trial(_others(pool, len(rows), rng))

    def dosed(dose, rng):
        return trial([_dose(t, o, dose, rng) for t, o in zip(rows, _others(pool, len(rows), rng))])

    return Entry("splitft", "shuffled labels (the label attack's guesses are labels of other text)",
                 "a label verdict that reads the labels' common tokens as a leak",
                 "% of label positions guessed right beyond the shuffled guess", null, dosed, doses_pp,
                 gate_dose_pp, margin_pp, len(rows))


def grad_audit_entry(rows: int, margin_pp: float, doses_pp: Sequence[float], gate_dose_pp: float, *,
                     top_k: int, l2: float, max_iter: int) -> Entry:
    """Paper 004: the frequent-token probe's verdict (attacks/controls.classify of one cell's effect interval
    against the gate's moved reference, min(0, the shuffled-label probe's effect)). Features: 8 Gaussian
    features carrying a fixed code of each row's token (5 tokens, 30/20/20/15/15 %), the probe's unit test's
    data. Null: shuffled labels (the feature rows permuted against the labels, `probe.floor_arm`); dose d:
    `probe.dosed_control`, a code worth d pp to a perfect reader injected into the floor arm."""
    import torch

    from attacks.grad_audit import probe

    def features(n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.as_tensor(rng.choice(5, size=n, p=[0.3, 0.2, 0.2, 0.15, 0.15]) + 100)
        codes = torch.as_tensor(np.random.default_rng(99).standard_normal((5, 8)))
        x = torch.as_tensor(rng.standard_normal((n, 8))) + 3.0 * codes[y - 100]
        return x, y

    kw = dict(top_k=top_k, l2=l2, max_iter=max_iter, max_rows=rows)

    def read(train, test, cell, seed: int) -> Trial:
        neg = probe.run_probe(train, test, shuffle_labels=True, seed=seed, **kw)
        reference = min(0.0, neg.effect_pp)
        lo, hi = cell.ci_pp
        v = controls.classify(lo, hi, reference, margin_pp, positive_passed=True,
                              negative_passed=neg.ci_pp[1] <= margin_pp)
        return Trial(v, cell.effect_pp - reference)

    def null(rng):
        seed = int(rng.integers(1 << 30))
        train, test = probe.floor_arm(features(rows, rng), seed + 3), probe.floor_arm(features(rows, rng), seed + 4)
        return read(train, test, probe.run_probe(train, test, seed=seed, **kw), seed)

    def dosed(dose, rng):
        seed = int(rng.integers(1 << 30))
        train, test = features(rows, rng), features(rows, rng)
        cell, _ = probe.dosed_control(train, test, dose_pp=dose, seed=seed, **kw)
        floor = probe.floor_arm(train, seed + 3), probe.floor_arm(test, seed + 4)
        return read(*floor, cell, seed)

    return Entry("grad_audit", "shuffled labels (the probe's feature rows permuted against their tokens)",
                 "a probe verdict that reads the probe's own bias or the token frequencies as a leak",
                 "pp a perfect reader of an injected token code gains over the constant guess",
                 null, dosed, doses_pp, gate_dose_pp, margin_pp, rows)


@dataclass
class CollabData:
    """What the collab trials share: per example the evidence, the cloud's own no-signal sets (the floor,
    computed once with the cloud model) and the vocabulary."""

    evidence: list[Any]
    floor: list[list[list[int]]]
    vocab: Any
    vocab_size: int
    steps: int


def collab_data(model: Any, n_examples: int, steps: int, top: int) -> CollabData:
    """The built-in examples through the cloud alone (model in the cloud's role), `steps` tokens."""
    from omegaconf import OmegaConf

    from attacks.collab.evidence_recall import Vocabulary, tokenise_evidence
    from harness.collab import benchmarks, engine, protocol

    examples = benchmarks.load_benchmark(OmegaConf.create(dict(
        name="builtin", path=None, hub_id=None, n_examples=n_examples, max_context_words=None,
        answer_critical=False))).examples
    vocab = engine.shared_vocab(model.tokenizer, model.tokenizer)
    pair = protocol.Pair(model.model, model.model, model.tokenizer, vocab, None)
    floor = protocol.cloud_alone(pair, examples, max_new_tokens=steps, top=top).sets
    info = Vocabulary(model.tokenizer)
    return CollabData([tokenise_evidence(e.evidence, info, True) for e in examples], floor, info, vocab, steps)


def collab_entry(data: CollabData, *, ids_per_step: int, k: int, margin_pp: float, positive_margin_pp: float,
                 doses_pp: Sequence[float], gate_dose_pp: float) -> Entry:
    """Paper 003: the collab verdict (attacks/collab_decodeleak.verdict on the informed attacker's Token-ER
    against its null signal). Null: random ids, `ids_per_step` uniformly drawn token ids a step for the
    signal, an independent draw for its null signal and another for the negative control (harsher than the
    runner, whose null shares the run's seed); dose d: each of the evidence's content tokens joins the
    signal with probability d/100. Positive control: the whole evidence injected."""
    from attacks.collab import decodeleak as leak

    def draw(rng) -> list[list[list[int]]]:
        return [[rng.choice(data.vocab_size, ids_per_step, replace=False).tolist() for _ in range(data.steps)]
                for _ in data.evidence]

    def score(sets):
        return leak.score_sets(sets, data.evidence, data.vocab, [k], prior=data.floor)

    def trial(signal, rng) -> Trial:
        null_sets, again = draw(rng), draw(rng)
        full = [[sorted(ev.token_ids)] + s for ev, s in zip(data.evidence, null_sets)]
        v = leak.verdict(score(signal), score(null_sets), (score(full), score(null_sets)),
                         (score(again), score(null_sets)), k, margin_pp, positive_margin_pp)
        return Trial(v["verdict"], v["null_excess_token_er"])

    def null(rng):
        return trial(draw(rng), rng)

    def dosed(dose, rng):
        signal = draw(rng)
        injected = [[[t for t in sorted(ev.token_ids) if rng.random() < dose / 100.0]] + s
                    for ev, s in zip(data.evidence, signal)]
        return trial(injected, rng)

    return Entry("collab", f"random ids ({ids_per_step} uniform token ids a step, signal and null drawn "
                 "independently)",
                 "a leak statistic that credits a signal for coverage it gains without information (the informed "
                 "excess over the floor did: +4.3 pp on random ids, issue 31)",
                 "% of the evidence's content tokens injected into the signal", null, dosed, doses_pp,
                 gate_dose_pp, margin_pp, len(data.evidence))


@dataclass
class SpliteeData:
    """What the SpliTEE trials share, computed once: per pool position (prompt r, position p ≥ 1) its true
    token, the model's prior log P(v | true prefix) over the whole vocabulary (one forward per prompt) and
    its argmax (the prior-only floor); the layer-0 QKV codebook μ(v) = RMSNorm₀(E[v]) and its exposure's σ."""

    tokens: list[list[int]]          # the pool prompts
    where: list[tuple[int, int]]     # (prompt, position) of each pool position
    log_prior: Any                   # [positions, V] float64
    prior_guess: list[int]
    book: Any                        # [V, d]
    book_sq: Any                     # [V]
    sigma: float                     # the exposure's σ at the calibrated ε
    dose_sigma: float                # at the dose's ε


def splitee_data(model: Any, tokens: list[list[int]], *, epsilon: float, dose_epsilon: float, sigma_scale: float,
                 sensitivity_rule: str) -> SpliteeData:
    """The pool's priors (one forward per prompt, teacher-forced: position p's prior reads tokens 0..p−1)
    and the layer-0 QKV exposure's σ under ep1 at ε and at the dose's ε (attacks/sequential.op_sigmas, the
    engine's σ)."""
    import torch

    from attacks.splitee import sequential as sq

    priors, where = [], []
    with torch.no_grad():
        for r, row in enumerate(tokens):
            logits = model(input_ids=torch.as_tensor([row], dtype=torch.long)).logits[0].double()
            priors.append(torch.log_softmax(logits[:-1], -1))     # row p−1 predicts position p
            where += [(r, p) for p in range(1, len(row))]
    log_prior = torch.cat(priors)
    book = sq.layer0_codebook(model).float()
    sigma = [sq.op_sigmas(model, "ep1", e, [len(tokens[0])], [("qkv", 0)], sigma_scale=sigma_scale,
                          sensitivity_rule=sensitivity_rule)[0][("qkv", 0)] for e in (epsilon, dose_epsilon)]
    return SpliteeData(tokens, where, log_prior.float(), log_prior.argmax(-1).tolist(), book, (book * book).sum(-1),
                       sigma[0], sigma[1])


def splitee_entry(data: SpliteeData, *, positions: int, margin_pp: float, min_recall: float,
                  doses_pp: Sequence[float], gate_dose_pp: float) -> Entry:
    """SpliTEE (issue 36 item 3): the sequential attacker's verdict (attacks/controls.sequential_verdict,
    worst of MAP against the prior alone and the likelihood attacker against itself on a null view), on
    the layer-0 QKV exposure under ep1, the whole vocabulary scored (no pruning), teacher-forced: the
    sequential attacker with layers=[0], ops=[qkv], prune=null (its codebook scores, no forward pass).

    A trial draws `positions` pool positions without replacement. Null: at each, the attacker reads the
    exposure of a *different* prompt (a random other pool prompt's token at that position, masked afresh
    at ε: y = μ(t_q) + σ·η, the engine's Gaussian mask) and is scored against the true token; the
    likelihood attacker's reference reads a second, independent other prompt's view. Dose d: each position
    reads instead, with probability d/100, its own prompt's exposure masked at the dose's ε (σ small enough
    that the exposure names its token), for MAP and the likelihood attacker alike (the reference stays
    null): a leak of about d pp of the positions beyond the prior, `dosed_statistic_mean_pp` the shift of
    MAP − prior it made."""
    import torch

    from metrics.proportions import newcombe_paired, paired_table

    tokens, book, book_sq = data.tokens, data.book, data.book_sq
    n_pool = len(data.where)
    if positions > n_pool:
        raise ValueError(f"a SpliTEE trial draws {positions} positions from a pool of {n_pool}")
    if len(tokens) < 3:
        raise ValueError("the SpliTEE null needs at least 3 prompts (two other prompts per position)")

    def scores(idx, sources, sigmas, rng) -> torch.Tensor:
        """The Gaussian log-likelihood [n, V] of every token (sequential.gaussian_scores, up to the shared
        constant) given fresh masked layer-0 QKV exposures of the source prompts' tokens at those positions."""
        clear = book[[tokens[q][data.where[i][1]] for i, q in zip(idx, sources)]]
        sig = torch.as_tensor(sigmas, dtype=clear.dtype)[:, None]
        y = clear + sig * torch.as_tensor(rng.standard_normal(clear.shape), dtype=clear.dtype)
        return (2.0 * (y @ book.T) - book_sq) / (2.0 * sig * sig)

    def other(r: int, rng, avoid: int = -1) -> int:
        choices = [q for q in range(len(tokens)) if q != r and q != avoid]
        return int(choices[int(rng.integers(len(choices)))])

    def verdict(first, second, reference: str):
        theta, lo, hi = newcombe_paired(*paired_table(first, second))
        v, _why = controls.sequential_verdict(100 * lo, 100 * hi, margin_pp, teacher_forced=True,
                                              pruning_recall=None, min_recall=min_recall, reference=reference)
        return v, 100 * theta, (100 * lo, 100 * hi)

    def trial(dose: float, rng) -> Trial:
        idx = rng.choice(n_pool, positions, replace=False).tolist()
        rows = [data.where[i][0] for i in idx]
        truth = torch.as_tensor([tokens[r][data.where[i][1]] for i, r in zip(idx, rows)])
        own = rng.random(positions) < dose / 100.0
        first = [r if o else other(r, rng) for r, o in zip(rows, own)]
        second = [other(r, rng, avoid=q) for r, q in zip(rows, first)]
        s1 = scores(idx, first, [data.dose_sigma if o else data.sigma for o in own], rng)
        s2 = scores(idx, second, [data.sigma] * positions, rng)
        hits = lambda guess: (guess == truth).tolist()
        map_hits, lik_hits = hits((s1 + data.log_prior[idx]).argmax(-1)), hits(s1.argmax(-1))
        ref_hits = hits(s2.argmax(-1))
        prior_hits = hits(torch.as_tensor([data.prior_guess[i] for i in idx]))
        v_map, diff, interval = verdict(map_hits, prior_hits, "the prior alone")
        v_lik, _, _ = verdict(lik_hits, ref_hits, "the same attacker on a null view")
        return Trial(controls.worst([v_map, v_lik]), diff, {"map": v_map, "likelihood": v_lik}, interval)

    return Entry("splitee", "masks of a different prompt (each position reads another pool prompt's layer-0 QKV "
                 "exposure, masked afresh; the likelihood reference a second other prompt's)",
                 "a verdict that calls the model's prior, or an exposure of unrelated text, a leak of the prompt",
                 "% of positions whose exposure is their own prompt's (masked at the dose's ε, where it names "
                 "the token)", lambda rng: trial(0.0, rng), trial, doses_pp, gate_dose_pp, margin_pp, positions)


# system → factory(cfg, model) -> Entry. `cfg` is the whole composed config (each entry reads its own system's
# margins there, so the calibrated verdict is the configured one) and `model` the loaded tokenizer/model.
REGISTRY: dict[str, Callable[[Any, Any], Entry]] = {}


def _register(name: str):
    def add(factory):
        REGISTRY[name] = factory
        return factory
    return add


@_register("collab")
def _collab(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.collab
    data = collab_data(model, int(c.examples), int(c.steps), int(c.k))
    return collab_entry(data, ids_per_step=int(c.ids_per_step), k=int(c.k),
                        margin_pp=float(cfg.collab.controls.gate_margin_pp),
                        positive_margin_pp=float(cfg.collab.controls.positive_margin_pp),
                        doses_pp=list(c.doses_pp), gate_dose_pp=float(c.gate_dose_pp))


@_register("sanitize")
def _sanitize(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.sanitize
    rows = text_rows(model.tokenizer, 2 * int(c.examples), int(c.tokens))
    return sanitize_entry(rows[:int(c.examples)], rows[int(c.examples):], float(cfg.sanitize.attack.gate_margin_pp),
                          list(c.doses_pp), float(c.gate_dose_pp))


@_register("splitft")
def _splitft(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.splitft
    rows = text_rows(model.tokenizer, 2 * int(c.examples), int(c.tokens))
    return splitft_entry(rows[:int(c.examples)], rows[int(c.examples):], float(cfg.splitft.attack.gate_margin_pp), float(cfg.splitft.attack.positive_margin_pp),
                         list(c.doses_pp), float(c.gate_dose_pp))


@_register("grad_audit")
def _grad_audit(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.grad_audit
    return grad_audit_entry(int(c.rows), float(cfg.grad_audit.gates.probe_margin_pp), list(c.doses_pp),
                            float(c.gate_dose_pp), top_k=int(c.top_k), l2=float(c.l2), max_iter=int(c.max_iter))


@_register("splitee")
def _splitee(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.splitee
    rows = text_rows(model.tokenizer, int(c.prompts), int(c.tokens))
    data = splitee_data(model.model, rows, epsilon=float(c.epsilon), dose_epsilon=float(c.dose_epsilon),
                        sigma_scale=float(cfg.engine.sigma_scale),
                        sensitivity_rule=str(cfg.engine.sensitivity_rule))
    return splitee_entry(data, positions=int(c.positions), margin_pp=float(cfg.attack.controls.gate_margin_pp),
                         min_recall=float(cfg.attack.sequential.min_pruning_recall), doses_pp=list(c.doses_pp),
                         gate_dose_pp=float(c.gate_dose_pp))
