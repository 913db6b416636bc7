"""Run the collaboration over a benchmark: the defended run, the reference runs its verdict needs (the
undefended run, the edge without x_priv, the cloud alone) and the inversion prompts.

Examples are decoded `Pair.batch_size` at a time (harness/collab/engine.py collaborate_batch, greedy_batch),
and each example's numbers are the same at every batch size, to the last bit (harness/collab/batching.py).
Randomness (`Pair.rng`):

- `per_example` (the default): example i draws from its own generator, seeded from (seed, its id)
  (`example_generator`), so its stream does not depend on the batch, on the other examples or on their order;
- `shared`: one generator seeded with `seed` serves every example in sequence, as before batching; this
  cannot be batched, so every decode of the run is then the engine before batching (batch 1, one row per
  forward), which reproduces the runs committed before batching bit for bit.

A deterministic defence never draws, so its outputs are the same under both.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.adversary_view import AdversaryView
from harness.collab import batching, config, engine, prompts
from harness.collab.benchmarks import Example
from harness.collab.defences import Defence
from harness.progress import progress

RNG_MODES = config.RNG_MODES
# collab.batch_size: null. Decode speed of SmolLM2-135M on the 2-core machine, one thread: the model alone 18
# tokens/s at batch 1, 92 at 16, 112 at 32 (issue 50); this engine's decode step (batching.Rows, ~190-token
# prompts) 130 row-forwards/s at 16 and 145 at 32 (2026-12-07, load 3): 32 rows gain 12 % for twice the
# cache, and a batch's tail (rows still decoding after the others stopped) grows with it.
AUTO_BATCH = 16


@dataclass
class Pair:
    """The two parties: models, the shared tokenizer and vocabulary size; how many examples decode together
    and where their randomness comes from (module docstring)."""

    edge: Any
    cloud: Any
    tokenizer: Any
    vocab: int
    eos: int | None
    batch_size: int = AUTO_BATCH
    rng: str = "per_example"
    prompt_cache: Any = None         # batching.PromptCache: each prompt forwarded once per run (None: no memo)

    def batches(self, n: int) -> tuple[list[range], int]:
        """The examples' index ranges decoded together and the engine's row floor (batching.MIN_ROWS; 1 with
        rng=shared: the engine before batching)."""
        size, floor = (1, 1) if self.rng == "shared" else (max(1, int(self.batch_size)), batching.MIN_ROWS)
        return [range(i, min(i + size, n)) for i in range(0, n, size)], floor


def example_generator(seed: int, example_id: str) -> torch.Generator:
    """Example `example_id`'s own generator under `seed` (rng=per_example): seeded from a hash of both, so
    it is the same whatever else the run decodes and at every batch size."""
    digest = hashlib.sha256(f"{int(seed)}/{example_id}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2 ** 63 - 1))


@dataclass
class Signals:
    """One protocol run over the benchmark: generations, its adversary view, per-step timings;
    `shared_forward`: the two parties' forwards were one (the edge is the cloud's model with its prompt)."""

    output_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    view: AdversaryView = field(default_factory=AdversaryView)
    step_seconds: list[float] = field(default_factory=list)
    defence_seconds: float = 0.0
    shared_forward: bool = False


def collaborate_all(pair: Pair, examples: Sequence[Example], defence: Defence, *, mode: str, max_new_tokens: int,
                    seed: int, view_top: int, private: bool = True, meta: dict[str, Any] | None = None,
                    desc: str = "collab") -> Signals:
    """Every example through engine.collaborate_batch, `pair.batch_size` at a time; `private=False` gives the
    edge the cloud's prompt (the negative control: the same protocol without x_priv)."""
    shared_rng = torch.Generator().manual_seed(int(seed))
    out = Signals(view=AdversaryView(meta=dict(meta or {})))
    chunks, floor = pair.batches(len(examples))
    # Each forward of a null decode (the edge without x_priv) is the cloud's: engine.collaborate_batch does it once.
    out.shared_forward = pair.edge is pair.cloud and not private
    bar = progress(total=len(examples), desc=desc, unit="example")
    for chunk in chunks:
        batch = [examples[i] for i in chunk]
        edge_ids = [prompts.encode(pair.tokenizer, prompts.party_text(ex, private=private)) for ex in batch]
        cloud_ids = [prompts.encode(pair.tokenizer, prompts.party_text(ex, private=False)) for ex in batch]
        rngs = ([shared_rng] * len(batch) if pair.rng == "shared" else
                [example_generator(seed, ex.id) for ex in batch])
        decoded = engine.collaborate_batch(pair.edge, pair.cloud, edge_ids, cloud_ids, defence, mode=mode,
                                           max_new_tokens=max_new_tokens, vocab=pair.vocab, eos=pair.eos, rngs=rngs,
                                           example_ids=[ex.id for ex in batch], view_top=view_top, min_rows=floor,
                                           prompt_cache=pair.prompt_cache)
        for d in decoded:
            out.output_ids.append(d.output_ids)
            out.texts.append(pair.tokenizer.decode(d.output_ids, skip_special_tokens=True))
            out.view.exposures.extend(d.exposures)
            out.step_seconds.extend(d.step_seconds)
            out.defence_seconds += d.defence_seconds
        bar.update(len(batch))
    bar.close()
    return out


@dataclass
class Floor:
    """The cloud alone: its generations (the cloud-only answers) and its own top-K at every step."""

    output_ids: list[list[int]]
    texts: list[str]
    sets: list[list[list[int]]]


def cloud_alone(pair: Pair, examples: Sequence[Example], *, max_new_tokens: int, top: int) -> Floor:
    ids, texts, sets = [], [], []
    chunks, floor = pair.batches(len(examples))
    stop = set() if pair.eos is None else {pair.eos}
    for chunk in progress(chunks, desc="cloud alone (floor)", unit="batch"):
        cloud_ids = [prompts.encode(pair.tokenizer, prompts.party_text(examples[i], private=False)) for i in chunk]
        for gen, s in engine.greedy_batch(pair.cloud, cloud_ids, max_new_tokens=max_new_tokens, vocab=pair.vocab,
                                          stop=stop, top=top, min_rows=floor, prompt_cache=pair.prompt_cache):
            ids.append(gen)
            texts.append(pair.tokenizer.decode(gen, skip_special_tokens=True))
            sets.append(s)
    return Floor(ids, texts, sets)


def cache_path(cache_dir: Any, key: dict[str, Any]) -> Any:
    """Where `cached` keeps the value of `key`: <cache root>/collab/<sha256 of key and the code digest>.pt."""
    import json

    from harness.models import cache_root
    from harness.provenance import source_digest

    blob = json.dumps({**key, "code": source_digest()}, sort_keys=True, default=str).encode()
    return cache_root(cache_dir) / "collab" / f"{hashlib.sha256(blob).hexdigest()}.pt"


def cached(cache_dir: Any, key: dict[str, Any], compute: Any) -> Any:
    """`compute()` memoised on disk under `cache_path`: the reference runs (the cloud alone, the undefended
    run, the edge without x_priv) do not depend on the defence or its parameter, so a sweep computes them
    once. The key holds everything that changes them (the caller's) and the code digest of harness/ and
    metrics/ (harness.provenance.source_digest)."""
    from harness.results import atomic_torch_save

    path = cache_path(cache_dir, key)
    if path.is_file():
        try:
            return torch.load(path, weights_only=False)
        except Exception:  # a truncated or foreign file: recompute and overwrite
            pass
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(value, path)
    return value


def answer_critical(pair: Pair, examples: Sequence[Example], *, n: int | None, max_new_tokens: int = 8) -> list[Example]:
    """The paper's answer-critical filter (§3.1), automated: keep an example when the edge model alone,
    greedy, states the right option from x_pub plus the evidence spans and not from x_pub alone (the paper
    screens with GPT-5.4 and people). Option benchmarks only; the first `n` kept (None: all). One example at
    a time (it stops at the n-th kept; 8 tokens each, so batching would gain little)."""
    from dataclasses import replace

    from metrics.answers import option_correct

    kept = []
    for ex in progress(examples, desc="answer-critical filter", unit="example"):
        with_evidence = replace(ex, context="; ".join(ex.evidence))
        right = []
        for variant, private in ((ex, False), (with_evidence, True)):
            ids = prompts.encode(pair.tokenizer, prompts.party_text(variant, private=private))
            gen, _ = engine.cloud_only(pair.edge, ids, max_new_tokens=max_new_tokens, vocab=pair.vocab, eos=pair.eos, top=1)
            right.append(option_correct(pair.tokenizer.decode(gen, skip_special_tokens=True), ex.options, ex.answer) > 0)
        if right[1] and not right[0]:
            kept.append(ex)
            if n is not None and len(kept) == n:
                break
    return kept


def option_forms(option: str) -> tuple[str, ...]:
    """The surface forms an answer can open with: the option as written and capitalised ("yes", "Yes")."""
    return tuple(dict.fromkeys((option, option[:1].upper() + option[1:])))


class _Prefix:
    """One party's forward over its prompt, kept so that every option continues from it."""

    @torch.no_grad()
    def __init__(self, model: Any, prompt: list[int], vocab: int):
        out = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=True, logits_to_keep=1)
        self.model, self.vocab, self.cache = model, vocab, out.cache
        self.first = torch.softmax(out.logits[0, -1, :vocab].double(), -1)

    @torch.no_grad()
    def after(self, tokens: list[int]) -> torch.Tensor:
        """(n, V) distributions after each of `tokens` (from a copy of the prompt's cache)."""
        import copy

        out = self.model(input_ids=torch.tensor([tokens], dtype=torch.long), cache=copy.deepcopy(self.cache),
                         use_cache=True, logits_to_keep=len(tokens))
        return torch.softmax(out.logits[0, :, :self.vocab].double(), -1)


@torch.no_grad()
def option_loglik(pair: Pair, examples: Sequence[Example], defence: Defence | None, *, mode: str, seed: int,
                  private: bool = True) -> list[dict[str, float]]:
    """Likelihood option scoring: per example and option, log P(the answer opens with the option) under the
    collaboration's decoding distribution (Defence.distribution: the step's fused or sampling distribution),
    each option token teacher-forced through both parties; the forms of `option_forms` are summed in
    probability. The first step's distribution is one (one draw of a randomised upload), shared by every
    option. `defence=None` scores under the cloud alone's p_L (the cloud-only utility)."""
    rng = torch.Generator().manual_seed(int(seed))
    out = []
    for ex in progress(examples, desc="option likelihoods", unit="example"):
        cloud = _Prefix(pair.cloud, prompts.encode(pair.tokenizer, prompts.party_text(ex, private=False)), pair.vocab)
        edge = None if defence is None else _Prefix(
            pair.edge, prompts.encode(pair.tokenizer, prompts.party_text(ex, private=private)), pair.vocab)

        def decoding(p_S: torch.Tensor | None, p_L: torch.Tensor) -> torch.Tensor:
            return p_L if defence is None else defence.distribution(p_S, p_L, mode, rng)

        first = decoding(None if edge is None else edge.first, cloud.first)
        scores = {}
        for option in ex.options or ():
            per_form = []
            for form in option_forms(option):
                toks = list(pair.tokenizer(form, add_special_tokens=False)["input_ids"])
                dists = [first]
                if len(toks) > 1:
                    p_L = cloud.after(toks[:-1])
                    p_S = None if edge is None else edge.after(toks[:-1])
                    dists += [decoding(None if p_S is None else p_S[t], p_L[t]) for t in range(len(toks) - 1)]
                probs = [float(d[tok]) for d, tok in zip(dists, toks)]
                per_form.append(sum(math.log(x) for x in probs) if min(probs) > 0 else -math.inf)
            scores[option] = float(torch.logsumexp(torch.tensor(per_form, dtype=torch.float64), 0))
        out.append(scores)
    return out
