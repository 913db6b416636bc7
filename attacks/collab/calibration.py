"""Cloud-edge decoding's verdict under calibration (issue 31; the driver, `calibrate`, is attacks/calibration.py):
its `entry` factory, named by `calibration` on its entry of harness/systems.py, and the schema (`Config`) and
range checks (`check`) of its part of the `calibration` section, calibration.collab.

Torch-free and light at import (harness/calibration_config.py imports it to type the section): the driver, torch
and the system's attackers are imported where a trial needs them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List

import numpy as np
from omegaconf import MISSING

from harness.calibration_config import CalibrationMeanPlanning
from harness.checks import check_at_least

if TYPE_CHECKING:
    from attacks.calibration import Entry, Trial

MARGINS = ("collab",)   # runners/calibration.py: its reads, in the runner's hash, sit under system_margins


@dataclass
class CalibrationCollabEngineConfig:
    """Collab's nulls built through the engine, at the n its committed reports use (issue 51 items 2, 4)."""

    n_examples: int = MISSING      # units (the built-in examples in turn): the n30 runs' 30
    max_new_tokens: int = MISSING  # tokens decoded (the n30 runs' 48)
    trials: int = MISSING          # trials per engine null, and at the gate's dose


@dataclass
class CalibrationCollabConfig:
    examples: int = MISSING        # built-in examples (the cloud's no-signal sets are computed once)
    units: int = MISSING           # the verdict's n: the examples in turn, each unit its own random signal
    steps: int = MISSING           # decoding steps of the signal
    k: int = MISSING               # the verdict's K (Token-ER@K)
    ids_per_step: int = MISSING    # the random-id null: uniform token ids a step
    doses_pp: List[float] = MISSING
    gate_dose_pp: float = MISSING
    planning: CalibrationMeanPlanning = MISSING
    engine: CalibrationCollabEngineConfig = MISSING


Config = CalibrationCollabConfig


def check(c: Any, cfg: Any) -> None:
    check_at_least("calibration.collab.examples", c.examples, 2)
    check_at_least("calibration.collab.units", c.units, 2)
    check_at_least("calibration.collab.steps", c.steps, 1)
    check_at_least("calibration.collab.k", c.k, 1)
    check_at_least("calibration.collab.ids_per_step", c.ids_per_step, 1)
    check_at_least("calibration.collab.engine.n_examples", c.engine.n_examples, 2)
    check_at_least("calibration.collab.engine.max_new_tokens", c.engine.max_new_tokens, 1)
    check_at_least("calibration.collab.engine.trials", c.engine.trials, 1)


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
    from attacks.calibration import Trial

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
    from attacks.calibration import Entry
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


def entry(cfg: Any, model: Any) -> Entry:
    from attacks.calibration import Published, planning_of

    c, controls_ = cfg.calibration.collab, cfg.collab.controls
    verdict = dict(margin_pp=float(controls_.gate_margin_pp), positive_margin_pp=float(controls_.positive_margin_pp),
                   per_item_bound_pp=float(controls_.per_item_bound_pp), step_matching=str(controls_.step_matching))
    data = collab_data(model, int(c.examples), int(c.steps), int(c.k))
    entry = collab_entry(data, units=int(c.units), ids_per_step=int(c.ids_per_step), k=int(c.k),
                         doses_pp=list(c.doses_pp), gate_dose_pp=float(c.gate_dose_pp), planning=planning_of(c), **verdict)
    e = c.engine
    engine = collab_engine_data(model, int(e.n_examples), int(e.max_new_tokens), int(c.k), float(cfg.collab.alpha))
    nulls, dosed = collab_engine_trials(engine, ids_per_step=int(c.ids_per_step),
                                        renyi_order=float(cfg.collab.renyi_order), **verdict)
    entry.published = Published(int(e.n_examples), "calibration.collab.engine.n_examples (the committed n30 runs: "
                                "30 examples, 48 tokens, K = 100; docs/results/collab/n30)",
                                f"examples (the built-in ones in turn, {int(e.max_new_tokens)} steps, K = {int(c.k)}, "
                                "through the engine)", nulls, dosed, int(e.trials))
    return entry
