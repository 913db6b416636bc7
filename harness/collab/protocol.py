"""Run the collaboration over a benchmark: the defended run, the reference runs its verdict needs (the
undefended run, the edge without x_priv, the cloud alone) and the inversion prompts, one example at a time
(batch size 1: each party keeps its own KV cache; batching across examples is not done)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.adversary_view import AdversaryView
from harness.collab import engine, prompts
from harness.collab.benchmarks import Example
from harness.collab.defences import Defence
from harness.progress import progress


@dataclass
class Pair:
    """The two parties: models, the shared tokenizer and vocabulary size."""

    edge: Any
    cloud: Any
    tokenizer: Any
    vocab: int
    eos: int | None


@dataclass
class Signals:
    """One protocol run over the benchmark: generations, its adversary view, per-step timings."""

    output_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    view: AdversaryView = field(default_factory=AdversaryView)
    step_seconds: list[float] = field(default_factory=list)
    defence_seconds: float = 0.0


def collaborate_all(pair: Pair, examples: Sequence[Example], defence: Defence, *, mode: str, max_new_tokens: int,
                    seed: int, view_top: int, private: bool = True, meta: dict[str, Any] | None = None,
                    desc: str = "collab") -> Signals:
    """Every example through engine.collaborate; `private=False` gives the edge the cloud's prompt (the
    negative control: the same protocol without x_priv)."""
    rng = torch.Generator().manual_seed(int(seed))
    out = Signals(view=AdversaryView(meta=dict(meta or {})))
    for ex in progress(examples, desc=desc, unit="example"):
        edge_ids = prompts.encode(pair.tokenizer, prompts.party_text(ex, private=private))
        cloud_ids = prompts.encode(pair.tokenizer, prompts.party_text(ex, private=False))
        d = engine.collaborate(pair.edge, pair.cloud, edge_ids, cloud_ids, defence, mode=mode,
                               max_new_tokens=max_new_tokens, vocab=pair.vocab, eos=pair.eos, rng=rng,
                               example_id=ex.id, view_top=view_top)
        out.output_ids.append(d.output_ids)
        out.texts.append(pair.tokenizer.decode(d.output_ids, skip_special_tokens=True))
        out.view.exposures.extend(d.exposures)
        out.step_seconds.extend(d.step_seconds)
        out.defence_seconds += d.defence_seconds
    return out


@dataclass
class Floor:
    """The cloud alone: its generations (the cloud-only answers) and its own top-K at every step."""

    output_ids: list[list[int]]
    texts: list[str]
    sets: list[list[list[int]]]


def cloud_alone(pair: Pair, examples: Sequence[Example], *, max_new_tokens: int, top: int) -> Floor:
    ids, texts, sets = [], [], []
    for ex in progress(examples, desc="cloud alone (floor)", unit="example"):
        cloud_ids = prompts.encode(pair.tokenizer, prompts.party_text(ex, private=False))
        gen, s = engine.cloud_only(pair.cloud, cloud_ids, max_new_tokens=max_new_tokens, vocab=pair.vocab,
                                   eos=pair.eos, top=top)
        ids.append(gen)
        texts.append(pair.tokenizer.decode(gen, skip_special_tokens=True))
        sets.append(s)
    return Floor(ids, texts, sets)


def cached(cache_dir: Any, key: dict[str, Any], compute: Any) -> Any:
    """`compute()` memoised on disk under <cache root>/collab/<sha256 of key>.pt: the reference runs (the
    cloud alone, the undefended run, the edge without x_priv) do not depend on the defence or its
    parameter, so a sweep computes them once. The key holds everything that changes them (the caller's)
    and the code digest of harness/ and metrics/ (harness.provenance.source_digest)."""
    import hashlib
    import json

    from harness.models import cache_root
    from harness.provenance import source_digest
    from harness.results import atomic_torch_save

    blob = json.dumps({**key, "code": source_digest()}, sort_keys=True, default=str).encode()
    path = cache_root(cache_dir) / "collab" / f"{hashlib.sha256(blob).hexdigest()}.pt"
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
    screens with GPT-5.4 and people). Option benchmarks only; the first `n` kept (None: all)."""
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
