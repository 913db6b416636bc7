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
attacks/splitft/cell.assess, attacks/controls.classify on the gradient probe), never the systems' models,
except the collab entry, which computes its cloud's no-signal guesses once. Adding a system (SpliTEE's
sequential attacker, say) is one more `Entry` factory in `REGISTRY`.
"""
from __future__ import annotations

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
    # The null statistic's spread across trials is that of the mean over n examples: σ_example = sd·√n.
    if entry.n_examples >= 2:
        out["certifiable_margin_pp"] = certifiable_margin(sd * entry.n_examples ** 0.5, entry.n_examples)
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

    from attacks import grad_audit_probe as probe

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

    from harness.collab import benchmarks, engine, protocol
    from metrics.evidence_recall import Vocabulary, tokenise_evidence

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
    from attacks import collab_decodeleak as leak

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
