"""One collaborative-decoding run end to end, as library calls the runner composes (paper 003): the two
parties, the benchmark, every decoding the audit reads (the run under its defence, the cloud alone, the
undefended positive control, the null signals: the edge without x_priv), the answer's utility, and the W&B
step history of its examples (`decode_rates`, `example_history`). The DecodeLeak audit of these decodings is
attacks/collab/suite.py; the runner (runners/collab.py) writes both into results.json."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from harness import configurations
from harness.adversary_view import view_meta
from harness.collab import batching, benchmarks, edge_baselines, engine, prompts, protocol
from harness.collab.defences import make_defence
from harness.errors import UserError
from harness.models import load_model
from metrics.answers import constant_answer_floor, option_correct, scored_correct
from metrics.intervals import Estimate, mean_ci
from metrics.proportions import proportion_ci
from metrics.text import rouge_l

# The nulls' own seeds, offsets from the run's: the verdict's null (issue 51 item 2: never the signal's seed)
# and the negative control's second null.
NULL_SEED_OFFSET = 2
NEGATIVE_CONTROL_SEED_OFFSET = 1


@dataclass
class Parties:
    """The edge model (it holds x_priv), the cloud model, their shared vocabulary and the decoding pair."""

    edge: Any
    cloud: Any
    vocab: int
    pair: protocol.Pair


@dataclass
class Decodings:
    """What the audit reads: the run's signals and the controls' (protocol.Signals each)."""

    signals: protocol.Signals
    floor: Any                       # the cloud alone from x_pub: its texts and its own top-K sets
    undefended: Any | None           # the positive control (None: the run is itself undefended)
    no_context: Any                  # the undefended edge without x_priv (the positive control's null)
    null: Any                        # the verdict's null signal: this defence without x_priv, seed + 2
    null_again: Any                  # the negative control: the null signal, seed + 1
    defence: Any
    key: dict[str, Any]              # the cache key of this run's examples and models
    decodes: Any = None              # the Decodes that made them: .record (computed, reused, shared), .memo


@dataclass
class Utility:
    metric: str                      # accuracy | rouge_l
    per: list[float]                 # per example
    cloud_per: list[float]
    value: Estimate
    cloud_only: Estimate
    accuracy_floor: float | None     # the constant answer's accuracy (accuracy only)
    option_scores: list[Any] | None  # per-option log-likelihoods (collab.option_scoring=likelihood)


def load_parties(cfg: DictConfig, special_ids: Callable[[Any], tuple[int, int | None]]) -> Parties:
    """The edge and cloud models where collab.placement puts them (one model for both parties only where both
    are placed alike), refused in one line when their vocabularies differ; `special_ids` gives (pad, eos)."""
    c = cfg.collab
    edge = load_model(cfg.model, cache_dir=cfg.paths.cache_dir, placement=c.placement.edge)
    # One model for both parties only where both are placed alike; else each party loads its own copy.
    cloud = (edge if c.cloud is None and c.placement.cloud == c.placement.edge else
             load_model(c.cloud if c.cloud is not None else cfg.model, cache_dir=cfg.paths.cache_dir,
                        placement=c.placement.cloud))
    try:
        vocab = engine.shared_vocab(edge.tokenizer, cloud.tokenizer)
    except ValueError:
        raise UserError(f"the edge model {edge.name} and the cloud model {cloud.name} have different tokenizers; "
                        "collaborative decoding fuses distributions over one shared vocabulary") from None
    _, eos = special_ids(edge.tokenizer)
    batch = protocol.AUTO_BATCH if c.batch_size is None else int(c.batch_size)
    return Parties(edge, cloud, vocab, protocol.Pair(edge.model, cloud.model, edge.tokenizer, vocab, eos,
                                                     batch_size=batch, rng=str(c.rng),
                                                     prompt_cache=batching.PromptCache()))


def load_examples(cfg: DictConfig, pair: protocol.Pair) -> Any:
    """The benchmark (collab.benchmark), kept to its answer-critical examples where asked."""
    c = cfg.collab
    critical = bool(c.benchmark.answer_critical)
    bench = benchmarks.load_benchmark(c.benchmark, n_examples=None if critical else c.benchmark.n_examples)
    if critical:
        if not bench.has_options:
            raise UserError(f"collab.benchmark.answer_critical=true needs an option benchmark; {bench.name} has references")
        bench.examples = protocol.answer_critical(pair, bench.examples, n=c.benchmark.n_examples)
        bench.filter["answer_critical"] = True
        if len(bench.examples) < 2:
            raise UserError(f"collab.benchmark.answer_critical=true kept {len(bench.examples)} example(s); the paired "
                            "intervals need at least 2")
    return bench


class Decodes:
    """Exact de-duplication of one run's collaborative decodes: each is keyed by what determines its computation
    (both models' sources, both parties' prompt ids and the example ids, the defence and its parameters
    (`Defence.identity`), the fusion mode, max_new_tokens and view_top, and the seed and rng mode only where
    the defence draws in that mode), and a decode whose key was already computed is that decode, not a rerun:
    so a deterministic defence's second null (seed + 1) is its null, and the undefended point's null is the
    undefended edge without x_priv. `record` says, per decode, whether it was computed, read from the disk
    cache (protocol.cached) or reused, and whether its two parties' forwards were one (a null decode with one
    model for both parties: engine.collaborate_batch)."""

    def __init__(self, cfg: DictConfig, parties: Parties, examples: list[Any]):
        c = cfg.collab
        self.cfg, self.parties, self.examples = cfg, parties, examples
        self.common = dict(mode=c.fusion, max_new_tokens=int(c.max_new_tokens), view_top=int(c.view_top))
        self.memo: dict[str, tuple[str, protocol.Signals]] = {}
        self.record: dict[str, dict[str, Any]] = {}

    def key(self, defence: Any, *, private: bool, seed: int) -> str:
        import hashlib
        import json

        pair, mode = self.parties.pair, self.common["mode"]
        ids = [[prompts.encode(pair.tokenizer, prompts.party_text(e, private=p)) for p in (private, False)]
               for e in self.examples]
        blob = dict(edge=self.parties.edge.source, cloud=self.parties.cloud.source,
                    one_model=pair.edge is pair.cloud, examples=[e.id for e in self.examples], prompt_ids=ids,
                    defence=defence.identity(), **self.common,
                    **({"seed": int(seed), "rng": pair.rng} if mode in defence.random_modes else {}))
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()

    def run(self, label: str, defence: Any, *, private: bool, seed: int, desc: str,
            meta: dict[str, Any] | None = None, disk: dict[str, Any] | None = None) -> protocol.Signals:
        """Decode `label` (a name for results.json), or reuse the decode of the same key; `disk`: also keep it in
        the on-disk cache under that key (the reference runs, shared by every run of a sweep)."""
        key = self.key(defence, private=private, seed=seed)
        if key in self.memo:
            first, sig = self.memo[key]
            self.record[label] = {"computed": False, "from_disk_cache": False, "reused": first,
                                  "shared_forward": sig.shared_forward}
            return sig

        def compute() -> protocol.Signals:
            return protocol.collaborate_all(self.parties.pair, self.examples, defence, private=private, seed=seed,
                                            meta=meta, desc=desc, **self.common)

        on_disk = disk is not None and protocol.cache_path(self.cfg.paths.cache_dir, disk).is_file()
        sig = protocol.cached(self.cfg.paths.cache_dir, disk, compute) if disk is not None else compute()
        self.memo[key] = (label, sig)
        self.record[label] = {"computed": not on_disk, "from_disk_cache": on_disk, "reused": None,
                              "shared_forward": sig.shared_forward}
        return sig


def decode(cfg: DictConfig, parties: Parties, bench: Any, name: str, lam: float | None, top: int) -> Decodings:
    """Every decoding of the run, the deterministic controls cached on disk (protocol.cached): the cloud alone,
    the undefended run and its null; then the run under its defence, its null signal (seed + 2) and the null at seed + 1,
    each decode of the same computation done once (`Decodes`)."""
    c = cfg.collab
    edge, cloud, pair, examples = parties.edge, parties.cloud, parties.pair, bench.examples
    settings = dict(alpha=float(c.alpha), candidates=int(c.candidates), dp_delta=float(c.dp_delta),
                    renyi_order=float(c.renyi_order),
                    baselines=edge_baselines.options_of(c, name, edge.model, edge.tokenizer))
    defence = make_defence(name, lam, **settings)
    seed = int(cfg.seed)
    meta = view_meta(cfg, system=configurations.COLLAB, workload=bench.name, epsilon=lam if lam is not None else cfg.epsilon)
    meta.update(fusion=c.fusion, alpha=float(c.alpha), cloud_model=cloud.name, edge_model=edge.name)

    # The disk cache's key: a shared-rng run decodes one row a forward (the engine before batching), whose last
    # bits differ from the batched engine's, so the two never share an entry.
    key = dict(edge=edge.source, cloud=cloud.source, examples=[dataclasses.asdict(e) for e in examples],
               max_new_tokens=int(c.max_new_tokens), top=top,
               engine="one row" if pair.rng == "shared" else f"rows >= {batching.MIN_ROWS}")
    floor_key = {**key, "run": "cloud_alone"}
    floor_on_disk = protocol.cache_path(cfg.paths.cache_dir, floor_key).is_file()
    floor = protocol.cached(cfg.paths.cache_dir, floor_key, lambda: protocol.cloud_alone(
        pair, examples, max_new_tokens=int(c.max_new_tokens), top=top))
    key.update(mode=c.fusion, max_new_tokens=int(c.max_new_tokens), seed=seed, view_top=int(c.view_top),
               alpha=float(c.alpha))
    runs = Decodes(cfg, parties, examples)
    runs.record["cloud_alone"] = {"computed": not floor_on_disk, "from_disk_cache": floor_on_disk, "reused": None,
                                  "shared_forward": False}
    undefended_defence = make_defence("collab_none", None, **settings)
    undefended = runs.run("undefended", undefended_defence, private=True, seed=seed,
                          desc="positive control (undefended)", disk={**key, "run": "undefended"})
    signals = runs.run("signals", defence, private=True, seed=seed, meta=meta, desc=f"{name} ({c.fusion}-side)")
    if name == "collab_none":  # the undefended point is its own positive control (the same decode)
        undefended = None
        signals.view.meta = meta
    no_context = runs.run("no_context", undefended_defence, private=False, seed=seed,
                          desc="null of the undefended run (edge without x_priv)", disk={**key, "run": "no_context"})
    # The verdict's null signal: this defence and parameter with an edge that does not hold x_priv, drawn at its
    # own seed (seed + 2; seed + 1 is the negative control's). On the signal's seed a mechanism that ignores
    # x_priv would reproduce the null bit for bit and read exactly 0 (issue 51 item 2); on its own seed it shows
    # its own noise. A deterministic defence's key has no seed, so its null is one decode whatever the seed.
    null = runs.run("null", make_defence(name, lam, **settings), private=False, seed=seed + NULL_SEED_OFFSET,
                    desc=f"null signal: {name} without x_priv, seed + 2")
    # The negative control's second null: the same, another seed (for a deterministic defence, the null itself).
    null_again = runs.run("null_again", make_defence(name, lam, **settings), private=False,
                          seed=seed + NEGATIVE_CONTROL_SEED_OFFSET,
                          desc="negative control: null signal, seed + 1")
    return Decodings(signals, floor, undefended, no_context, null, null_again, defence, key, runs)


def utility(cfg: DictConfig, parties: Parties, bench: Any, runs: Decodings) -> Utility:
    """The answer's utility and the cloud alone's: option accuracy (the stated option, or the likeliest with
    collab.option_scoring=likelihood) or ROUGE-L to the reference, with the constant answer's accuracy."""
    c, examples, pair = cfg.collab, bench.examples, parties.pair
    option_scores = None
    if bench.has_options and c.option_scoring == "likelihood":
        metric = "accuracy"
        option_scores = protocol.option_loglik(pair, examples, runs.defence, mode=c.fusion, seed=int(cfg.seed))
        cloud_scores = protocol.cached(cfg.paths.cache_dir, {"edge": parties.edge.source, "cloud": parties.cloud.source,
                                                             "examples": runs.key["examples"],
                                                             "run": "cloud_option_loglik"},
                                       lambda: protocol.option_loglik(pair, examples, None, mode=c.fusion, seed=0))
        per = [scored_correct(sc, e.answer) for sc, e in zip(option_scores, examples)]
        cloud_per = [scored_correct(sc, e.answer) for sc, e in zip(cloud_scores, examples)]
    elif bench.has_options:
        metric = "accuracy"
        per = [option_correct(t, e.options, e.answer) for t, e in zip(runs.signals.texts, examples)]
        cloud_per = [option_correct(t, e.options, e.answer) for t, e in zip(runs.floor.texts, examples)]
    else:
        metric = "rouge_l"
        per = [rouge_l(e.reference, t) for t, e in zip(runs.signals.texts, examples)]
        cloud_per = [rouge_l(e.reference, t) for t, e in zip(runs.floor.texts, examples)]
    # Accuracy that does not clear the constant answer's (always the most frequent gold option) shows no skill:
    # a defence cannot lower it measurably, so the benchmark says nothing about that defence's cost.
    floor = constant_answer_floor([e.answer for e in examples]) if metric == "accuracy" else None
    # Accuracy is a proportion of examples (each 0 or 100): Wilson's interval, never zero-width at 0 or 100 %;
    # ROUGE-L a mean of scores in [0, 100] (bootstrap over examples), widened to what n earns so that every
    # example at 100 never reads a zero-width [100, 100] (metrics/intervals.earned_range).
    def interval(values: list[float]) -> Estimate:
        return proportion_ci(values) if metric == "accuracy" else mean_ci(values, metric_range=(0.0, 100.0))

    return Utility(metric, per, cloud_per, interval(per), interval(cloud_per), floor, option_scores)


def generation(cfg: DictConfig) -> dict[str, Any]:
    """results.json `generation`: the collaborative decoding's own settings (greedy, to EOS)."""
    return {"max_new_tokens": int(cfg.collab.max_new_tokens), "greedy": True, "stop_at_eos": True}


def decode_rates(output_ids: list[list[int]], step_seconds: list[float]) -> list[float | None]:
    """Each example's generated tokens per second of its collaborative decoding: engine.collaborate_batch times
    every step that emits a token (a batched step's time split evenly among the examples it decoded), so
    example i's steps are the next len(output_ids[i]) of `step_seconds` (protocol.collaborate_all joins them
    in example order). None where no time was measured."""
    rates, at = [], 0
    for ids in output_ids:
        spent = sum(step_seconds[at:at + len(ids)])
        at += len(ids)
        rates.append(len(ids) / spent if spent > 0 else None)
    return rates


def example_history(samples: list[dict[str, Any]], k_rep: int, metric: str,
                    rates: list[float | None]) -> list[dict[str, Any]]:
    """The W&B step history of a collab run, one step per example (samples.jsonl's order): Token-ER@K at the
    report K and its floor, the inversion's ROUGE-1 recall where it ran, the example's utility (`metric`:
    accuracy 0 or 100, or ROUGE-L) and its decoding's tokens per second, each under `example/`."""
    keys = (f"token_er_at_{k_rep}", f"floor_token_er_at_{k_rep}", "inversion_rouge1_recall")
    history = []
    for i, (row, rate) in enumerate(zip(samples, rates)):
        record = {f"example/{k}": row[k] for k in keys if row.get(k) is not None}
        record[f"example/{metric}"] = row["utility"]
        if rate is not None:
            record["example/tokens_per_second"] = rate
        history.append({"step": i, **record})
    return history
