"""Verdicts calibrated against nulls (issue 31): each system's verdict run on signals with no private
information and on signals with a known dose of it, as one measures an instrument before reading it.

An `Entry` is one system's verdict under test: how to build a **null trial** (a signal built to
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
units a dose reaches), so trials are independent given the shared part.

Each system's entry lives in its own attacks/NAME/calibration.py (its `entry` factory, the schema and checks of
calibration.NAME) and is named by `calibration` on its entry of harness/systems.py; `entries()` finds them
there. This module holds what they share: the driver (`calibrate`, `sizing`, `published`), `Trial`, `Entry`,
`Published` and the text helpers (`corpus_stream`, `text_rows`, `unigram_rows`, `dose_row`, `truth_rows`).
Adding a system is its own module and the `calibration` field of its entry, no edit here.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


def dose_row(truth: Sequence[int], other: Sequence[int], dose_pp: float, rng: np.random.Generator) -> list[int]:
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


def entries() -> dict[str, Callable[[Any, Any], Entry]]:
    """system → factory(cfg, model) -> Entry, from the systems registry: each system's `calibration`
    (harness/systems.py), `module:function`, its module imported here, when a calibration runs. `cfg` is the
    whole composed config (each entry reads its own system's margins there, so the calibrated verdict is the
    configured one) and `model` the loaded tokenizer/model."""
    import importlib

    from harness import systems

    out = {}
    for s in systems.SYSTEMS:
        if s.calibration is not None:
            module, _, name = s.calibration.partition(":")
            out[s.name] = getattr(importlib.import_module(module), name)
    return out


def planning_of(section: Any) -> dict[str, float]:
    from omegaconf import OmegaConf

    return {k: float(v) for k, v in OmegaConf.to_container(section.planning, resolve=True).items()}


def published_of(section: Any) -> Published | None:
    """The section's published n (`published_n`, `published`), where the config states one."""
    n = section.get("published_n")
    return None if n is None else Published(int(n), str(section.get("published") or "calibration config"))


def truth_rows(cfg: Any, model: Any, name: str) -> tuple[list[list[int]], list[int]]:
    """The text entries' truths (unigram rows drawn once from the calibration seed) and their source stream."""
    c = cfg.calibration[name]
    stream = corpus_stream(model.tokenizer)
    rng = np.random.default_rng([int(cfg.calibration.seed), len(name)])
    return unigram_rows(stream, int(c.examples), int(c.tokens), rng), stream
