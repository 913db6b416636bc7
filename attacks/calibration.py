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
- `zero_spread_certifications`: at_chance calls, over null and dosed trials, whose verdict interval had zero
  width (issue 51: a certification must read the bound the sample earned, so this is 0);
- `extra_nulls`: further nulls read with the same verdict, each with its false-leak and certify rates
  (collab: random ids with 2× the null's steps);
- `null_sd`: the spread of the null trials' statistic, and `certifiable_margin_pp`: the margin the
  entry's sample size can certify with 80 % probability at that spread (metrics/equivalence.py);
- `sizing` (`sizing`): why the entry's n is what it is. "at chance" is an equivalence test, so the margin m
  and n go together: with the estimate's standard error se and the 95% interval ± c·se, a null is certified
  with probability ≥ 80 % only if m ≥ (c + 1.28)·se, and a dose of 2m is called a leak with probability
  ≥ 80 % only if m ≥ (c + 0.84)·se. metrics/equivalence.py computes both probabilities at a given n (and the
  n that meets a target) from per-unit spreads (t or Wald intervals) or a paired proportion's base and
  discordance rates (Newcombe's interval); the record holds them at the configured planning values and at
  the values the run measured.

A dose d is in the unit of the verdict's statistic: a reader that reads all of it moves the statistic by
d pp in expectation (the text entries' identity attacker, the collab informed attacker and MAP on a
dosed exposure do; the gradient probe reads most of a strong code), and it is injected into a null
signal, an arm at the floor, never into one that already leaks.

Trials are cheap on purpose: they operate on recorded or constructed signals and call the verdict code the
runners call (attacks/collab/decodeleak.verdict, attacks/sanitize/scoring.score_attacker,
attacks/splitft/cell.assess, attacks/controls.classify on the gradient probe, attacks/controls.
sequential_verdict for SpliTEE), never the systems' models, except the collab entry, which computes its
cloud's no-signal guesses once, and the SpliTEE entry, which computes one prior forward per prompt and the
layer-0 codebook once. What trials share is computed once (the truths, the floor's sets, the priors and
the codebook); each trial redraws every random part of its signal (ids, rows, masks, other prompts, which
units a dose reaches), so trials are independent given the shared part. Adding a system is one more
`Entry` factory in `REGISTRY`.
"""
from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attacks import controls
from harness.errors import UserError
from harness.progress import progress
from metrics import equivalence
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
    # the paired table (both, first only, second only, neither) of a Newcombe verdict (SpliTEE: MAP vs its
    # reference)
    table: tuple[int, int, int, int] | None = None
    # per part, its own statistic (pp), where the entry reads several (SpliTEE: MAP against each reference)
    part_statistics: dict[str, float] | None = None
    # the interval the verdict's at_chance read (pp), where it is not `interval` (the earned one, issue 51)
    certified_by: tuple[float, float] | None = None


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
    unit: str = "examples"                      # what one of the verdict's n units is
    interval: str = "t"                         # the verdict's interval: t | z (means) | newcombe (paired)
    # the planning values the sizing rule chose n with (metrics/equivalence.py): sd_null_pp and sd_dosed_pp
    # per unit for t | z, base and discordance for newcombe
    planning: dict[str, float] | None = None
    # per attacker, what its verdict reads against, where the entry has several (SpliTEE: map, likelihood)
    references: dict[str, str] | None = None
    # further nulls, each read with the entry's verdict (collab: random ids with 2× the null's steps)
    extra_nulls: dict[str, Callable[[np.random.Generator], Trial]] | None = None
    # B of the earned interval the verdict's at_chance reads (metrics/equivalence.py), where it reads one
    per_item_bound_pp: float | None = None
    # the verdict at the n the system's committed reports use (issue 51 item 4), where the config states it
    published: Published | None = None


@dataclass
class Published:
    """The verdict at the n its committed reports use (issue 51 item 4): what the sizing rule predicts there
    (`sizing` at that n) and, where the entry can run trials at that n, its nulls and the gate's dose (collab:
    through the engine), `trials` each. The record says, where that n cannot certify at the margin, how many
    units the margin needs (metrics/equivalence.certification_note)."""

    n: int
    source: str                                 # where that n comes from
    unit: str | None = None                     # what one unit is there, where not the entry's
    nulls: dict[str, Callable[[np.random.Generator], Trial]] | None = None
    dosed: Callable[[float, np.random.Generator], Trial] | None = None
    trials: int = 0


def zero_width(t: Trial, certification: bool = True) -> bool:
    """The interval the trial's at_chance reads (`certified_by`, else `interval`) had zero width; with
    `certification` false, its data interval did."""
    iv = t.certified_by if certification and t.certified_by is not None else t.interval
    return iv is not None and iv[1] <= iv[0]


def proportion(k: int, n: int) -> dict[str, Any]:
    lo, hi = clopper_pearson(k, n)
    return {"k": k, "n": n, "rate": k / n, "ci": [lo, hi]}


def null_summary(runs: Sequence[Trial]) -> dict[str, Any]:
    """A further null's record: its false-leak and certify rates (Clopper–Pearson), the statistic's mean, the
    at_chance calls made on a zero-width interval (issue 51: 0) and the trials whose data interval had zero width
    (a null that reproduces its signal bit for bit has all of them)."""
    return {"false_leak_rate": proportion(sum(t.verdict == controls.LEAK for t in runs), len(runs)),
            "certify_rate": proportion(sum(t.verdict == controls.AT_CHANCE for t in runs), len(runs)),
            "null_statistic_mean_pp": statistics.fmean(t.statistic for t in runs),
            "zero_spread_certifications": sum(t.verdict == controls.AT_CHANCE and zero_width(t) for t in runs),
            "zero_width_intervals": sum(zero_width(t, certification=False) for t in runs)}


def calibrate(entry: Entry, trials: int, seed: int, dosed_trials: int | None = None, target: float = 0.8
              ) -> dict[str, Any]:
    """`trials` null trials and `dosed_trials` (default: as many) per dose of one entry, each trial with its
    own generator (spawned from `seed`)."""
    dosed_trials = trials if dosed_trials is None else dosed_trials
    if trials < 1 or dosed_trials < 1:
        raise ValueError(f"need at least one trial of each kind, got {trials} and {dosed_trials}")
    seeds = np.random.SeedSequence(seed).spawn(1 + len(entry.doses_pp))
    null_rngs = [np.random.default_rng(s) for s in seeds[0].spawn(trials)]
    bar = progress(desc=f"calibration {entry.system}", total=trials + dosed_trials * len(entry.doses_pp),
                   unit="trial")
    nulls = []
    for rng in null_rngs:
        nulls.append(entry.null_trial(rng))
        bar.update(1)
    power, dosed_stats, gate_runs, dosed_runs = {}, {}, [], []
    for dose, ss in zip(entry.doses_pp, seeds[1:]):
        runs = []
        dosed_runs.append(runs)
        for s in ss.spawn(dosed_trials):
            runs.append(entry.dosed_trial(float(dose), np.random.default_rng(s)))
            bar.update(1)
        if float(dose) == float(entry.gate_dose_pp):
            gate_runs = runs
        power[f"{float(dose):g}"] = proportion(sum(t.verdict == controls.LEAK for t in runs), dosed_trials)
        dosed_stats[f"{float(dose):g}"] = statistics.fmean(t.statistic for t in runs)
    extra = {}
    for name, make in (entry.extra_nulls or {}).items():
        extra[name] = null_summary([make(np.random.default_rng(s))
                                    for s in np.random.SeedSequence([seed, len(name)]).spawn(trials)])
    bar.close()
    values = [t.statistic for t in nulls]
    every = nulls + [t for runs in dosed_runs for t in runs]
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
        # at_chance calls, over null and dosed trials, whose verdict interval had zero width (issue 51: the
        # earned bound makes this 0)
        "zero_spread_certifications": sum(t.verdict == controls.AT_CHANCE and zero_width(t) for t in every),
        # trials whose data interval had zero width (the corner the earned bound exists for), any verdict
        "zero_width_intervals": sum(zero_width(t, certification=False) for t in every),
    }
    if extra:
        out["extra_nulls"] = extra
    if entry.references:
        out["references"] = dict(entry.references)
    if by_attacker:   # each attacker's own verdict on the same null trials (the entry's is their worst)
        out["by_attacker"] = {a: {
            "false_leak_rate": proportion(sum((t.parts or {}).get(a) == controls.LEAK for t in nulls), trials),
            "certify_rate": proportion(sum((t.parts or {}).get(a) == controls.AT_CHANCE for t in nulls), trials),
            **({"null_statistic_mean_pp": statistics.fmean(t.part_statistics[a] for t in nulls)}
               if all(t.part_statistics and a in t.part_statistics for t in nulls) else {}),
        } for a in by_attacker}
    # The null statistic's spread across trials is that of the mean over n examples: σ_example = sd·√n.
    if entry.interval == "newcombe":
        # The verdict's interval is not a t interval (SpliTEE: Newcombe's, on proportions near 0), so the
        # t-based helper does not apply: the margin the null trials' own intervals lie within 80 % of the time.
        reach = sorted(max(abs(lo), abs(hi)) for lo, hi in (t.certified_by or t.interval for t in nulls))
        out["certifiable_margin_pp"] = float(np.quantile(reach, 0.8))
        out["certifiable_margin_method"] = "80th percentile over null trials of the verdict interval's reach max(|lo|, |hi|)"
    elif entry.n_examples >= 2:
        out["certifiable_margin_pp"] = certifiable_margin(sd * math.sqrt(entry.n_examples), entry.n_examples,
                                                          per_item_bound=entry.per_item_bound_pp)
        out["certifiable_margin_method"] = ("metrics/equivalence.certifiable_margin at the null statistic's spread"
                                            + ("" if entry.per_item_bound_pp is None else
                                               f", earned bound at B = {entry.per_item_bound_pp:g} pp"))
    out["sizing"] = sizing(entry, nulls, gate_runs, target)
    if entry.published is not None:
        out["published"], engine = published(entry, seed, target)
        if engine:
            out["engine_nulls"] = engine
    out["acceptance"] = {
        "false_leak_upper_le_10pct": out["false_leak_rate"]["ci"][1] <= 0.10,
        "power_at_gate_dose_ge_80pct": out["power_at_gate_dose"] is not None
        and out["power_at_gate_dose"]["rate"] >= 0.80,
        "certify_rate_ge_80pct": out["certify_rate"]["rate"] >= 0.80,
    }
    return out


def published(entry: Entry, seed: int, target: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The verdict at its published n (`Published`): the record (n, its source, the sizing rule's predictions
    there at the planning values and, where trials ran, at the measured ones; the false-leak and certify rates
    over all its null trials together and the power at the gate's dose, Clopper–Pearson each; the sentence
    where n cannot certify the margin) and each null's own record (`null_summary`, by name)."""
    from dataclasses import replace

    pub = entry.published
    assert pub is not None
    streams = np.random.SeedSequence([seed, 51]).spawn(1 + len(pub.nulls or {}))
    by_null = {name: [make(np.random.default_rng(s)) for s in ss.spawn(pub.trials)]
               for (name, make), ss in zip((pub.nulls or {}).items(), streams[1:])}
    gate = ([pub.dosed(float(entry.gate_dose_pp), np.random.default_rng(s)) for s in streams[0].spawn(pub.trials)]
            if pub.dosed is not None and pub.trials else [])
    nulls = [t for runs in by_null.values() for t in runs]
    z = sizing(replace(entry, n_examples=pub.n, unit=pub.unit or entry.unit), nulls, gate, target)
    values = z["measured"] if z["measured"] and "predicted_certify_probability" in z["measured"] else z["planned"]
    out: dict[str, Any] = {"n": pub.n, "source": pub.source, "unit": z["unit"], "margin_pp": entry.margin_pp,
                           "gate_dose_pp": entry.gate_dose_pp, "trials": pub.trials, "nulls": list(by_null)}
    if nulls:
        out["false_leak_rate"] = proportion(sum(t.verdict == controls.LEAK for t in nulls), len(nulls))
        out["certify_rate"] = proportion(sum(t.verdict == controls.AT_CHANCE for t in nulls), len(nulls))
        out["zero_spread_certifications"] = sum(t.verdict == controls.AT_CHANCE and zero_width(t) for t in nulls)
    if gate:
        out["power_at_gate_dose"] = proportion(sum(t.verdict == controls.LEAK for t in gate), len(gate))
        out["dosed_statistic_mean_pp"] = statistics.fmean(t.statistic for t in gate)
    out["sizing"] = z
    out["sizing_from"] = "measured" if values is z["measured"] else "planned"
    if values and "predicted_certify_probability" in values:
        if entry.interval != "newcombe":
            out["certifiable_margin_pp"] = certifiable_margin(values["sd_null_pp"], pub.n,
                                                              per_item_bound=entry.per_item_bound_pp)
        out["n_needed_80pct"] = values["n_needed_80pct"]
        out["note"] = equivalence.certification_note(pub.n, entry.margin_pp, values["predicted_certify_probability"],
                                                     values["n_needed_80pct"])
    return out, {name: {"trials": len(runs), **null_summary(runs)} for name, runs in by_null.items()}


def sizing(entry: Entry, nulls: Sequence[Trial], gate_runs: Sequence[Trial], target: float = 0.8
           ) -> dict[str, Any]:
    """Why n is what it is (metrics/equivalence.py): the verdict's predicted certification probability and
    power at the gate's dose at n, and the n the margin needs for both ≥ `target` and ≥ 80 % (the issue's
    bar), at the planning values the configured n was chosen with and at the values this run measured.
    Measured: for a t or Wald interval, the per-unit spread its intervals imply (sd: half-width / critical
    value × √n, mean over the null and over the gate-dose trials; what a pilot run reports), the estimate's
    own spread across trials × √n (spread) and the statistic's shift at the gate dose; for Newcombe, the null
    tables' mean base rate and discordance."""
    from scipy import stats

    n, m, d = entry.n_examples, entry.margin_pp, entry.gate_dose_pp
    if entry.interval == "newcombe":
        def plan(values: dict[str, float]) -> Callable[[int], equivalence.Plan]:
            return lambda k: equivalence.paired_plan(k, values["base"], values["discordance"], m, d)
        tables = [t.table for t in nulls if t.table is not None]
        measured = None
        if tables:
            base = statistics.fmean((t[0] + t[2]) / sum(t) for t in tables)
            disc = statistics.fmean((t[1] + t[2]) / sum(t) for t in tables)
            measured = {"base": base, "discordance": min(disc, 2 * min(base, 1 - base))}
    else:
        def plan(values: dict[str, float]) -> Callable[[int], equivalence.Plan]:
            return lambda k: equivalence.mean_plan(values["sd_null_pp"], values["sd_dosed_pp"], k, m, d,
                                                   interval=entry.interval, shift_pp=values["gate_shift_pp"],
                                                   spread_null_pp=values["spread_null_pp"],
                                                   spread_dosed_pp=values["spread_dosed_pp"],
                                                   per_item_bound_pp=entry.per_item_bound_pp)
        crit = float(stats.t.ppf(0.975, n - 1) if entry.interval == "t" else stats.norm.ppf(0.975))

        def spread(trials: Sequence[Trial]) -> float | None:
            widths = [(t.interval[1] - t.interval[0]) / 2 for t in trials if t.interval is not None]
            return statistics.fmean(widths) / crit * math.sqrt(n) if widths else None

        sd0, sd1 = spread(nulls), spread(gate_runs)
        # a spread across trials needs two of each (a one-trial pilot measures no planning values)
        measured = None if sd0 is None or sd1 is None or min(len(nulls), len(gate_runs)) < 2 else {
            "sd_null_pp": sd0, "sd_dosed_pp": sd1,
            "spread_null_pp": statistics.stdev(t.statistic for t in nulls) * math.sqrt(n),
            "spread_dosed_pp": statistics.stdev(t.statistic for t in gate_runs) * math.sqrt(n),
            "gate_shift_pp": statistics.fmean(t.statistic for t in gate_runs)
            - statistics.fmean(t.statistic for t in nulls)}

    def needed(values: dict[str, float], goal: float) -> int | None:
        try:
            return equivalence.units_needed(plan(values), goal)
        except ValueError:
            return None

    def at(values: dict[str, float] | None) -> dict[str, Any] | None:
        if values is None:
            return None
        try:
            p = plan(values)(n)
        except ValueError as e:    # e.g. a dose larger than the units the null leaves to leak
            return {**values, "not_planned": str(e)}
        return {**values, "se_null_pp": p.se_null_pp, "se_dosed_pp": p.se_dosed_pp,
                "predicted_certify_probability": p.certify_probability, "predicted_power_at_gate_dose": p.power,
                "n_needed": needed(values, target), "n_needed_80pct": needed(values, 0.8)}

    return {"unit": entry.unit, "n": n, "margin_pp": m, "gate_dose_pp": d, "interval": entry.interval,
            "target": target,
            "rule": ("metrics.equivalence.paired_plan (Newcombe's interval on simulated tables)"
                     if entry.interval == "newcombe" else
                     f"metrics.equivalence.mean_plan ({'Student-t' if entry.interval == 't' else 'Wald'} interval)"),
            "planned": at(entry.planning), "measured": at(measured)}


# --- the entries ---------------------------------------------------------------------------------------------


def corpus_stream(tokenizer: Any, text: str | None = None, limit: int | None = None) -> list[int]:
    """The built-in corpus (or `text`, its paragraphs as harness/text_corpus.paragraphs keeps them) as one
    stream of token ids: real text's token frequencies. With `limit`, paragraphs are tokenised only until
    the stream holds that many ids (a file may be far longer than a pool needs)."""
    from harness.text_corpus import BUILTIN_CORPUS, paragraphs

    text = BUILTIN_CORPUS.read_text() if text is None else text
    stream: list[int] = []
    for p in paragraphs(text):
        stream += [int(i) for i in tokenizer(p)["input_ids"]]
        if limit is not None and len(stream) >= limit:
            break
    return stream


def text_rows(tokenizer: Any, n: int, length: int, text: str | None = None,
              source: str = "the built-in corpus") -> list[list[int]]:
    """n rows of `length` token ids cut in order from real text: the built-in corpus, or `text` (named
    `source` in the error when it is too short)."""
    stream = corpus_stream(tokenizer, text, limit=n * length)
    if len(stream) < n * length:
        raise UserError(f"{source} has {len(stream)} tokens, fewer than {n} rows of {length}")
    return [stream[i * length:(i + 1) * length] for i in range(n)]


def unigram_rows(stream: Sequence[int], n: int, length: int, rng: np.random.Generator) -> list[list[int]]:
    """n rows of `length` token ids drawn independently from the token frequencies of `stream`. The text
    verdicts score multiset token F1, which ignores order, so such rows keep what their null depends on (the
    vocabulary's frequencies) while the built-in corpus (6.3k tokens) is far shorter than the n·L the sizing
    rule asks for."""
    a = np.asarray(stream, dtype=np.int64)
    return a[rng.integers(len(a), size=(n, length))].tolist()


def _dose(truth: Sequence[int], other: Sequence[int], dose_pp: float, rng: np.random.Generator) -> list[int]:
    """`other` carrying a dose of `truth` worth d pp of multiset token F1 in expectation (equal lengths L:
    F1 = matches/L). Each of the U truth tokens `other` does not match is written, with probability
    p = d·L/(100·U), over a position of `other` whose token matches nothing: each write adds exactly one
    match, so F1 rises by p·U/L = d/100 (p capped at 1)."""
    from collections import Counter

    if len(truth) != len(other):
        raise ValueError(f"a dose needs equal lengths, got {len(truth)} and {len(other)}")
    missing = list((Counter(truth) - Counter(other)).elements())
    spare = Counter(other) - Counter(truth)
    free = []
    for j, t in enumerate(other):
        if spare[t] > 0:
            free.append(j)
            spare[t] -= 1
    out = [int(t) for t in other]
    if not missing:
        return out
    p = min(1.0, dose_pp / 100.0 * len(truth) / len(missing))
    for tok, j in zip(rng.permutation(missing).tolist(), free):
        if rng.random() < p:
            out[j] = int(tok)
    return out


def sanitize_entry(rows: list[list[int]], stream: Sequence[int], margin_pp: float, doses_pp: Sequence[float],
                   gate_dose_pp: float, planning: dict[str, float] | None = None,
                   per_item_bound_pp: float = 100.0) -> Entry:
    """Paper 001: the sanitisers' verdict (attacks/sanitize/scoring.score_attacker, the identity attacker that
    reads the sanitised tokens as its guess; at_chance on the earned interval at `per_item_bound_pp`). Null:
    every prompt sanitised independently of the truth (a fresh row of the corpus's token frequencies, `stream`,
    per prompt and trial); dose d: that row carrying d pp of the truth's token F1 (`_dose`)."""
    import torch

    from attacks.sanitize import scoring

    length = len(rows[0])

    def identity(observed):
        return [torch.tensor(o, dtype=torch.long).view(-1, 1) for o in observed]

    def trial(observed: list[list[int]]) -> Trial:
        s, _ = scoring.score_attacker("identity", identity, rows, observed, 1, margin_pp, True,
                                      per_item_bound_pp=per_item_bound_pp)
        return Trial(s.verdict, s.f1.mean - s.reference, interval=(s.f1.lo - s.reference, s.f1.hi - s.reference),
                     certified_by=(s.earned[0] - s.reference, s.earned[1] - s.reference))

    def null(rng):
        return trial(unigram_rows(stream, len(rows), length, rng))

    def dosed(dose, rng):
        return trial([_dose(t, o, dose, rng) for t, o in zip(rows, unigram_rows(stream, len(rows), length, rng))])

    return Entry("sanitize", "prompts sanitised independently of the truth (each prompt's tokens replaced by a "
                 "fresh row drawn from the corpus's token frequencies)",
                 "a verdict that calls the sanitiser's output a leak from the text's shared vocabulary alone",
                 "pp of token F1 the sanitised prompt carries from its truth (a perfect reader's gain)", null, dosed,
                 doses_pp, gate_dose_pp, margin_pp, len(rows), f"prompts of {length} tokens", "t", planning,
                 per_item_bound_pp=per_item_bound_pp)


def splitft_entry(rows: list[list[int]], stream: Sequence[int], margin_pp: float, positive_margin_pp: float,
                  doses_pp: Sequence[float], gate_dose_pp: float, planning: dict[str, float] | None = None,
                  per_item_bound_pp: float = 100.0) -> Entry:
    """Paper 002: the label attack's verdict (attacks/splitft/cell.assess, reference = the larger of the
    exposure-free reference and the constant most-frequent-label guess; at_chance on the earned interval at
    `per_item_bound_pp`). Null: shuffled labels (the guesses
    are a fresh row of the corpus's token frequencies per example and trial); dose d: guesses carrying d pp
    of the true labels' token F1 (`_dose`)."""
    from attacks.labels import constant_guesses
    from attacks.splitft.cell import assess

    constant = constant_guesses(rows)
    length = len(rows[0])

    def trial(guesses: list[list[int]]) -> Trial:
        m = assess("label", rows, guesses, rows, rows, margin_pp, positive_margin_pp, prior_guesses=constant,
                   plain_prior_guesses=constant, per_item_bound_pp=per_item_bound_pp)
        ref = m["label_reference_token_f1"]
        return Trial(m["label_verdict"], m["label_token_f1"] - ref,
                     interval=(m["label_token_f1_ci_lo"] - ref, m["label_token_f1_ci_hi"] - ref),
                     certified_by=(m["label_token_f1_earned_ci_lo"] - ref, m["label_token_f1_earned_ci_hi"] - ref))

    def null(rng):
        return trial(unigram_rows(stream, len(rows), length, rng))

    def dosed(dose, rng):
        return trial([_dose(t, o, dose, rng) for t, o in zip(rows, unigram_rows(stream, len(rows), length, rng))])

    return Entry("splitft", "shuffled labels (the label attack's guesses are labels drawn independently of the "
                 "truth, from the corpus's token frequencies)",
                 "a label verdict that reads the labels' common tokens as a leak",
                 "pp of token F1 the guesses carry from the true labels (a perfect reader's gain)", null, dosed,
                 doses_pp, gate_dose_pp, margin_pp, len(rows), f"label rows of {length} tokens", "t", planning,
                 per_item_bound_pp=per_item_bound_pp)


def grad_audit_entry(rows: int, margin_pp: float, doses_pp: Sequence[float], gate_dose_pp: float, *,
                     top_k: int, l2: float, max_iter: int, code_strength: float,
                     planning: dict[str, float] | None = None) -> Entry:
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
                              negative_passed=neg.ci_pp[1] <= margin_pp, certify=cell.earned_ci_pp)
        e_lo, e_hi = cell.earned_ci_pp
        return Trial(v, cell.effect_pp - reference, interval=(lo - reference, hi - reference),
                     certified_by=(e_lo - reference, e_hi - reference))

    def null(rng):
        seed = int(rng.integers(1 << 30))
        train, test = probe.floor_arm(features(rows, rng), seed + 3), probe.floor_arm(features(rows, rng), seed + 4)
        return read(train, test, probe.run_probe(train, test, seed=seed, **kw), seed)

    def dosed(dose, rng):
        seed = int(rng.integers(1 << 30))
        train, test = features(rows, rng), features(rows, rng)
        cell, _ = probe.dosed_control(train, test, dose_pp=dose, seed=seed, strength=code_strength, **kw)
        floor = probe.floor_arm(train, seed + 3), probe.floor_arm(test, seed + 4)
        return read(*floor, cell, seed)

    return Entry("grad_audit", "shuffled labels (the probe's feature rows permuted against their tokens)",
                 "a probe verdict that reads the probe's own bias or the token frequencies as a leak",
                 "pp a perfect reader of an injected token code gains over the constant guess",
                 null, dosed, doses_pp, gate_dose_pp, margin_pp, rows, "probe rows (test split)", "z", planning,
                 per_item_bound_pp=100.0)    # the B of CellScore.earned_ci_pp, which the verdict reads


def _inject(sets: list[list[int]], tokens: Sequence[int]) -> list[list[int]]:
    """`tokens` written at the head of an example's first step (displacing its last ids), not as a step of their
    own: an injection is content, and with matched steps an extra step would cost the signal its last one."""
    keep = set(tokens)
    first = (list(tokens) + [t for t in sets[0] if t not in keep])[:max(len(sets[0]), len(tokens))]
    return [first] + sets[1:]


def _collab_dose(signal: list[list[list[int]]], evidence: Sequence[Any], floor: Sequence[Any], k: int, dose: float,
                 rng: np.random.Generator) -> list[list[list[int]]]:
    """The signal carrying a dose of d pp of Token-ER@k: each evidence token that neither the example's signal
    nor its floor covers joins the signal (`_inject`) with probability p = d·E/(100·U) (E evidence tokens, U
    uncovered; capped at 1), so the informed attacker's Token-ER rises by d pp in expectation."""
    injected = []
    for ev, fl, sets in zip(evidence, floor, signal):
        covered = {t for st in (*sets, *fl) for t in st[:k]}
        open_ = [t for t in sorted(ev.token_ids) if t not in covered]
        p = min(1.0, dose / 100.0 * len(ev.token_ids) / len(open_)) if open_ else 0.0
        injected.append(_inject(sets, [t for t in open_ if rng.random() < p]))
    return injected


def _collab_trial(v: dict[str, Any]) -> Trial:
    """A trial from decodeleak.verdict's record: its verdict, statistic, t interval and the earned interval."""
    return Trial(v["verdict"], v["null_excess_token_er"], interval=tuple(v["null_excess_token_er_ci"]),
                 certified_by=tuple(v["null_excess_token_er_earned_ci"]))


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


def collab_entry(data: CollabData, *, units: int, ids_per_step: int, k: int, margin_pp: float,
                 positive_margin_pp: float, doses_pp: Sequence[float], gate_dose_pp: float,
                 planning: dict[str, float] | None = None, per_item_bound_pp: float = 100.0,
                 step_matching: str = "matched") -> Entry:
    """Paper 003: the collab verdict (attacks/collab/decodeleak.verdict on the informed attacker's Token-ER
    against its null signal) over `units` examples: the built-in examples in turn (unit i is example
    i mod 12, with its evidence and its cloud's no-signal sets), each unit with its own random signal. The
    built-in set has 12 examples, and the sizing rule asks for far more units than that (a 2 pp leak of
    Token-ER is a fraction of one evidence token per example), so units repeat examples: the verdict is
    calibrated at n units of built-in-like examples, the randomness of every unit independent.

    Null: random ids, `ids_per_step` uniformly drawn token ids a step for the signal (only the first k of a
    step count at Token-ER@k, so k are drawn), an independent draw for its null signal and another for the
    negative control (harsher than the runner, whose null shares the run's seed). Dose d: each evidence
    token that neither the signal nor the floor already covers joins the signal with probability
    p = d·E/(100·U) (E evidence tokens, U uncovered; capped at 1), so the informed attacker's Token-ER rises
    by d pp in expectation. Positive control: the whole evidence injected. Every pair (signal and null,
    positive control, negative control) has its steps paired by `step_matching` and the verdict's at_chance
    reads the earned interval at `per_item_bound_pp`, as the runner's (decodeleak.verdict). A second null,
    `long_random_ids`, gives the signal 2× the null's steps of random ids (issue 51 item 3): a signal with no
    content and more steps must read at chance."""
    from attacks.collab import decodeleak as leak

    n_ex = len(data.evidence)
    evidence = [data.evidence[i % n_ex] for i in range(units)]
    floor = [data.floor[i % n_ex] for i in range(units)]
    drawn = min(ids_per_step, k)

    def draw(rng, steps: int = data.steps) -> list[list[list[int]]]:
        return [[rng.choice(data.vocab_size, drawn, replace=False).tolist() for _ in range(steps)]
                for _ in evidence]

    def pair(signal, null):
        # the verdict's statistic is Token-ER@k; the other curves (ROUGE1-ER decodes every id) are not scored
        return leak.paired_scores(signal, null, evidence, data.vocab, [k], prior=floor, step_matching=step_matching,
                                  metrics=("token_er",))

    def trial(signal, rng) -> Trial:
        null_sets, again = draw(rng), draw(rng)
        full = [_inject(s, sorted(ev.token_ids)) for ev, s in zip(evidence, null_sets)]
        return _collab_trial(leak.verdict(*pair(signal, null_sets), pair(full, null_sets), pair(again, null_sets),
                                          k, margin_pp, positive_margin_pp, per_item_bound_pp))

    def null(rng):
        return trial(draw(rng), rng)

    def dosed(dose, rng):
        return trial(_collab_dose(draw(rng), evidence, floor, k, dose, rng), rng)

    return Entry("collab", f"random ids ({ids_per_step} uniform token ids a step, signal and null drawn "
                 "independently)",
                 "a leak statistic that credits a signal for coverage it gains without information (the informed "
                 "excess over the floor did: +4.3 pp on random ids, issue 31)",
                 "pp of Token-ER@K the signal gains from injected evidence tokens the signal and floor do not cover",
                 null, dosed, doses_pp, gate_dose_pp, margin_pp, units,
                 f"examples (the {n_ex} built-in ones in turn, {data.steps} steps, K = {k})", "t", planning,
                 extra_nulls={"long_random_ids": lambda rng: trial(draw(rng, 2 * data.steps), rng)},
                 per_item_bound_pp=per_item_bound_pp)


# --- collab through the engine (issue 51 items 2 and 4) -------------------------------------------------------
# The entry above calibrates the verdict on constructed signals at the sized n. These nulls are built through the
# engine itself (protocol.collaborate_all on the calibration's model in both roles, as the n30 runs), paired and
# read as the runner reads them (attacks/collab/suite.audit: the informed attacker over matched steps,
# decodeleak.verdict with its positive and negative controls and the earned bound), at the n the committed
# reports use (`Published`).

ENGINE_NULLS = ("random_ids_along_undefended_steps", "dp_fusion_eps0_edge")


@dataclass
class CollabEngineData:
    """What the engine trials share, decoded once: the units (the built-in examples in turn, a repeat under its
    own id so that its draws and its place in the view are its own), their evidence, the cloud alone's sets (the
    informed attacker's prior) and, per fusion mode, the exposure sets of the undefended private run and of its
    null, the undefended edge without x_priv (`no_context`): greedy undefended decoding draws nothing, so one
    decode each serves every trial."""

    pair: Any                                  # protocol.Pair: the model in both roles
    units: list[Any]                           # benchmarks.Example per unit
    evidence: list[Any]
    vocab: Any                                 # evidence_recall.Vocabulary
    floor: list[list[list[int]]]
    undefended: dict[str, list[list[list[int]]]]   # fusion mode -> per unit
    no_context: dict[str, list[list[list[int]]]]
    steps: int
    k: int
    alpha: float

    def sets(self, sig: Any, units: Sequence[Any] | None = None, memo: dict | None = None) -> list[list[list[int]]]:
        """Each unit's exposure sets read from a decode's view (decodeleak.exposure_sets, as the runner reads).
        `memo` only for the shared decodes: a trial's draws rarely repeat, and their sets would pile up."""
        from attacks.collab import decodeleak as leak

        return [leak.exposure_sets(sig.view, u.id, cloud=self.pair.cloud, vocab=self.pair.vocab, top=self.k,
                                   memo=memo) for u in (self.units if units is None else units)]

    def decode(self, defence: Any, mode: str, *, private: bool, seed: int, desc: str,
               units: Sequence[Any] | None = None) -> Any:
        from harness.collab import protocol

        return protocol.collaborate_all(self.pair, self.units if units is None else units, defence, mode=mode,
                                        max_new_tokens=self.steps, seed=seed, view_top=self.k, private=private,
                                        desc=desc)


def collab_engine_data(model: Any, n_units: int, steps: int, k: int, alpha: float) -> CollabEngineData:
    """The built-in examples through the engine (module section above): `n_units` units, `steps` tokens, K = k;
    the undefended run and its null in both fusion modes, the cloud alone's sets."""
    from dataclasses import replace

    from omegaconf import OmegaConf

    from attacks.collab.evidence_recall import Vocabulary, tokenise_evidence
    from harness.collab import batching, benchmarks, engine, protocol
    from harness.collab.fusion import Defence

    examples = benchmarks.load_benchmark(OmegaConf.create(dict(
        name="builtin", path=None, hub_id=None, n_examples=None, max_context_words=None,
        answer_critical=False))).examples
    distinct = examples[:n_units]
    units = [ex if i < len(examples) else replace(ex, id=f"{ex.id}#{i // len(examples)}")
             for i, ex in ((i, examples[i % len(examples)]) for i in range(n_units))]
    eos = model.tokenizer.eos_token_id
    eos = (eos[0] if eos else None) if isinstance(eos, (list, tuple)) else eos
    pair = protocol.Pair(model.model, model.model, model.tokenizer, engine.shared_vocab(model.tokenizer, model.tokenizer),
                         None if eos is None else int(eos), prompt_cache=batching.PromptCache())
    info = Vocabulary(model.tokenizer)
    data = CollabEngineData(pair, units, [tokenise_evidence(u.evidence, info, True) for u in units], info, [], {}, {},
                            steps, k, alpha)

    def tiled(sets: list[list[list[int]]]) -> list[list[list[int]]]:
        return [sets[i % len(distinct)] for i in range(n_units)]

    # a repeat's deterministic decodes are its example's: decode the distinct examples once, then tile
    floor = protocol.cloud_alone(pair, distinct, max_new_tokens=steps, top=k).sets
    data.floor = tiled(floor)
    undefended, memo = Defence(alpha), {}
    for mode in ("cloud", "edge"):
        for private, into in ((True, data.undefended), (False, data.no_context)):
            sig = data.decode(undefended, mode, private=private, seed=0, units=distinct,
                              desc=f"engine null: undefended {mode}-side{'' if private else ' without x_priv'}")
            into[mode] = tiled(data.sets(sig, distinct, memo))
    return data


def collab_engine_trials(data: CollabEngineData, *, ids_per_step: int, margin_pp: float, positive_margin_pp: float,
                         per_item_bound_pp: float, step_matching: str, renyi_order: float
                         ) -> tuple[dict[str, Callable[[np.random.Generator], Trial]],
                                    Callable[[float, np.random.Generator], Trial]]:
    """The two engine nulls (`ENGINE_NULLS`) and a trial at a dose, each read by decodeleak.verdict as the
    runner reads a point (signal against its null over `step_matching` steps, the informed attacker with the
    cloud alone's sets, the point's positive control: its mode's undefended run against `no_context`; its
    negative control: a second null against the null).

    - `random_ids_along_undefended_steps`: per unit, as many steps as its undefended private run (cloud-side)
      decoded, each `ids_per_step` uniformly random ids (at most K count); its null is the same mechanism on
      the runner's null run, random ids along `no_context`'s steps, drawn independently, and the negative
      control another such draw. The private run decodes more steps than its null (issue 51 item 3), so this
      null fails if the verdict credits steps.
    - `dp_fusion_eps0_edge`: DP-Fusion at ε = 0 edge-side (the synced token drawn from the cloud's own p_L: the
      mechanism ignores x_priv) decoded through the engine with a fresh seed s per trial, the private signal at
      s, its null (no x_priv) at s + NULL_SEED_OFFSET and the negative control at s + NEGATIVE_CONTROL_SEED_OFFSET,
      as harness/collab/experiment.decode seeds them.
    - the dose: the gate's dose written into the first null's signal (`_collab_dose`, as the sized entry doses)."""
    from attacks.collab import decodeleak as leak
    from harness.collab.defences import DPFusion
    from harness.collab.experiment import NEGATIVE_CONTROL_SEED_OFFSET, NULL_SEED_OFFSET

    k, vocab_size, drawn = data.k, data.pair.vocab, min(ids_per_step, data.k)

    def pair(signal, null):
        return leak.paired_scores(signal, null, data.evidence, data.vocab, [k], prior=data.floor,
                                  step_matching=step_matching, metrics=("token_er",))

    positive = {mode: pair(data.undefended[mode], data.no_context[mode]) for mode in ("cloud", "edge")}

    def read(signal, null, again, mode: str) -> Trial:
        return _collab_trial(leak.verdict(*pair(signal, null), positive[mode], pair(again, null), k, margin_pp,
                                          positive_margin_pp, per_item_bound_pp))

    def along(runs: list[list[list[int]]], rng) -> list[list[list[int]]]:
        return [[rng.choice(vocab_size, drawn, replace=False).tolist() for _ in steps] for steps in runs]

    def random_ids(rng, dose: float = 0.0) -> Trial:
        signal = along(data.undefended["cloud"], rng)
        if dose:
            signal = _collab_dose(signal, data.evidence, data.floor, k, dose, rng)
        return read(signal, along(data.no_context["cloud"], rng), along(data.no_context["cloud"], rng), "cloud")

    def dp_fusion(rng) -> Trial:
        s = int(rng.integers(1 << 30))
        mechanism = DPFusion(data.alpha, 0.0, renyi_order)
        signal, null, again = (data.sets(data.decode(mechanism, "edge", private=private, seed=seed, desc=desc))
                               for private, seed, desc in ((True, s, "engine null: DP-Fusion ε = 0 edge-side"),
                                                           (False, s + NULL_SEED_OFFSET, "its null"),
                                                           (False, s + NEGATIVE_CONTROL_SEED_OFFSET, "second null")))
        return read(signal, null, again, "edge")

    return dict(zip(ENGINE_NULLS, (random_ids, dp_fusion))), lambda dose, rng: random_ids(rng, dose)


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


# system → factory(cfg, model) -> Entry. `cfg` is the whole composed config (each entry reads its own system's
# margins there, so the calibrated verdict is the configured one) and `model` the loaded tokenizer/model.
REGISTRY: dict[str, Callable[[Any, Any], Entry]] = {}


def _register(name: str):
    def add(factory):
        REGISTRY[name] = factory
        return factory
    return add


def _planning(section: Any) -> dict[str, float]:
    from omegaconf import OmegaConf

    return {k: float(v) for k, v in OmegaConf.to_container(section.planning, resolve=True).items()}


def _published(section: Any) -> Published | None:
    """The section's published n (`published_n`, `published`), where the config states one."""
    n = section.get("published_n")
    return None if n is None else Published(int(n), str(section.get("published") or "calibration config"))


@_register("collab")
def _collab(cfg: Any, model: Any) -> Entry:
    c, controls_ = cfg.calibration.collab, cfg.collab.controls
    verdict = dict(margin_pp=float(controls_.gate_margin_pp), positive_margin_pp=float(controls_.positive_margin_pp),
                   per_item_bound_pp=float(controls_.per_item_bound_pp), step_matching=str(controls_.step_matching))
    data = collab_data(model, int(c.examples), int(c.steps), int(c.k))
    entry = collab_entry(data, units=int(c.units), ids_per_step=int(c.ids_per_step), k=int(c.k),
                         doses_pp=list(c.doses_pp), gate_dose_pp=float(c.gate_dose_pp), planning=_planning(c), **verdict)
    e = c.engine
    engine = collab_engine_data(model, int(e.n_examples), int(e.max_new_tokens), int(c.k), float(cfg.collab.alpha))
    nulls, dosed = collab_engine_trials(engine, ids_per_step=int(c.ids_per_step),
                                        renyi_order=float(cfg.collab.renyi_order), **verdict)
    entry.published = Published(int(e.n_examples), "calibration.collab.engine.n_examples (the committed n30 runs: "
                                "30 examples, 48 tokens, K = 100; docs/results/collab/n30)",
                                f"examples (the built-in ones in turn, {int(e.max_new_tokens)} steps, K = {int(c.k)}, "
                                "through the engine)", nulls, dosed, int(e.trials))
    return entry


def _truth_rows(cfg: Any, model: Any, name: str) -> tuple[list[list[int]], list[int]]:
    """The text entries' truths (unigram rows drawn once from the calibration seed) and their source stream."""
    c = cfg.calibration[name]
    stream = corpus_stream(model.tokenizer)
    rng = np.random.default_rng([int(cfg.calibration.seed), len(name)])
    return unigram_rows(stream, int(c.examples), int(c.tokens), rng), stream


@_register("sanitize")
def _sanitize(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.sanitize
    rows, stream = _truth_rows(cfg, model, "sanitize")
    entry = sanitize_entry(rows, stream, float(cfg.sanitize.attack.gate_margin_pp), list(c.doses_pp),
                           float(c.gate_dose_pp), _planning(c),
                           per_item_bound_pp=float(cfg.sanitize.attack.per_item_bound_pp))
    entry.published = _published(c)
    return entry


@_register("splitft")
def _splitft(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.splitft
    rows, stream = _truth_rows(cfg, model, "splitft")
    entry = splitft_entry(rows, stream, float(cfg.splitft.attack.gate_margin_pp),
                          float(cfg.splitft.attack.positive_margin_pp), list(c.doses_pp), float(c.gate_dose_pp),
                          _planning(c), per_item_bound_pp=float(cfg.splitft.attack.per_item_bound_pp))
    entry.published = _published(c)
    return entry


@_register("grad_audit")
def _grad_audit(cfg: Any, model: Any) -> Entry:
    c = cfg.calibration.grad_audit
    entry = grad_audit_entry(int(c.rows), float(cfg.grad_audit.gates.probe_margin_pp), list(c.doses_pp),
                             float(c.gate_dose_pp), top_k=int(c.top_k), l2=float(c.l2), max_iter=int(c.max_iter),
                             code_strength=float(c.code_strength), planning=_planning(c))
    entry.published = _published(c)
    return entry


@_register("splitee")
def _splitee(cfg: Any, model: Any) -> Entry:
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
                          map_reference=str(cfg.attack.sequential.map_reference), planning=_planning(c),
                          pool=pool)
    entry.published = _published(c)
    return entry
