"""DecodeLeak benchmarks built from public data (paper 003 §3.1): (public query, private context, evidence).

The paper's MedPriv and CommPriv were built with a hosted LLM and are not available, so the instances come
from public sets with a documented automatic evidence rule instead (docs/collab.md):

- `pubmedqa` (PubMedQA labelled set): the question is public, the abstract private, the answer
  yes/no/maybe; the evidence rule's support text is the LONG_ANSWER (the authors' conclusion).
- `dolly` (Dolly 15k closed_qa and information_extraction): the instruction public, the context private,
  the reference response both the utility target and the rule's support text.
- `builtin` (harness/data/collab_builtin.jsonl): a small set written for this repository (CI, smoke runs),
  with hand-annotated evidence spans and a support text, so the rule's agreement can be measured.

Evidence rule (`evidence_spans`): a context word is evidence when it is a content word (not a stopword, at
least two characters or a digit), its lower-case form occurs among the support text's words, and it does
not occur in the public query; the spans are the maximal runs of consecutive evidence words of the context,
as written there, de-duplicated case-insensitively in order of appearance.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UserError
from metrics.words import WORD, is_content_word, stopwords, words

BUILTIN_PATH = Path(__file__).resolve().parents[1] / "data" / "collab_builtin.jsonl"
PUBMEDQA_OPTIONS = ("yes", "no", "maybe")
DOLLY_CATEGORIES = ("closed_qa", "information_extraction")
HUB_IDS = {"pubmedqa": ("qiaojin/PubMedQA", "pqa_labeled"), "dolly": ("databricks/databricks-dolly-15k", None)}


@dataclass(frozen=True)
class Example:
    """One DecodeLeak instance (x_pub, x_priv, E_priv) with its utility target."""

    id: str
    query: str                        # x_pub
    context: str                      # x_priv (edge only)
    evidence: tuple[str, ...]         # E_priv = {P_1..P_M}
    options: tuple[str, ...] | None = None   # option benchmarks: answer ∈ options
    answer: str | None = None
    reference: str | None = None      # reference response (ROUGE-L utility)
    support: str = ""                 # the text the evidence rule reads
    hand_evidence: tuple[str, ...] | None = None   # builtin: the hand annotation


@dataclass
class Benchmark:
    name: str
    examples: list[Example]
    source: str
    filter: dict[str, Any] = field(default_factory=dict)

    @property
    def has_options(self) -> bool:
        return all(e.options for e in self.examples)


def evidence_spans(context: str, support: str, query: str) -> tuple[str, ...]:
    """The automatic evidence rule (module docstring): maximal runs of context content words that the
    support text uses and the public query does not."""
    stop = stopwords()
    support_words = {w.lower() for w in words(support)}
    query_words = {w.lower() for w in words(query)}
    spans: list[str] = []
    run: list[re.Match] = []

    def close() -> None:
        if run:
            spans.append(context[run[0].start():run[-1].end()])
            run.clear()

    for m in WORD.finditer(context):
        w = m.group(0)
        if is_content_word(w, stop) and w.lower() in support_words and w.lower() not in query_words:
            # A run continues only across whitespace: punctuation ends the span, as a phrase boundary.
            if run and context[run[-1].end():m.start()].strip():
                close()
            run.append(m)
        else:
            close()
    close()
    seen: set[str] = set()
    out = []
    for s in spans:
        if s.lower() not in seen:
            seen.add(s.lower())
            out.append(s)
    return tuple(out)


def span_agreement(rule: Sequence[str], hand: Sequence[str]) -> dict[str, float]:
    """Word-level agreement of the rule's spans with a hand annotation: precision, recall and F1 (%) of
    the content-word sets, lower-cased."""
    stop = stopwords()
    r = {w.lower() for s in rule for w in words(s) if is_content_word(w, stop)}
    h = {w.lower() for s in hand for w in words(s) if is_content_word(w, stop)}
    both = len(r & h)
    p = 100.0 * both / len(r) if r else 0.0
    rec = 100.0 * both / len(h) if h else 0.0
    return {"precision": p, "recall": rec, "f1": 2 * p * rec / (p + rec) if p + rec else 0.0}


def judged_agreement(rows: Sequence[tuple[int, int, int]], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Span-level agreement of the rule with a person's judgement, pooled over examples: rows of
    (rule spans judged evidence, rule spans, evidence the rule missed) per example. Precision = judged
    evidence / rule spans, recall = judged evidence / (judged evidence + missed), in %, each with a 95%
    percentile bootstrap interval resampling examples (spans of one example are not independent)."""
    import numpy as np

    from metrics.intervals import bootstrap_ci

    a = np.asarray(rows, dtype=float)

    def precision(x):
        return 100.0 * x[:, 0].sum() / x[:, 1].sum() if x[:, 1].sum() else 0.0

    def recall(x):
        found = x[:, 0].sum() + x[:, 2].sum()
        return 100.0 * x[:, 0].sum() / found if found else 0.0

    return {"precision": bootstrap_ci(a, precision, n_boot=n_boot, seed=seed),
            "recall": bootstrap_ci(a, recall, n_boot=n_boot, seed=seed), "n_examples": len(rows),
            "n_rule_spans": int(a[:, 1].sum()), "n_judged_evidence": int(a[:, 0].sum()), "n_missed": int(a[:, 2].sum())}


# --- loading ------------------------------------------------------------------------------------------


_CONFIGURED = object()


def load_benchmark(bench: Any, n_examples: Any = _CONFIGURED) -> Benchmark:
    """The examples of `collab.benchmark` (fields of CollabBenchmarkConfig), filtered: non-empty evidence,
    private context of at most max_context_words words, the first n_examples (`n_examples` overrides the
    configured number; None keeps all, for a filter that runs afterwards)."""
    n_examples = bench.n_examples if n_examples is _CONFIGURED else n_examples
    name = bench.name
    if name == "builtin":
        path = Path(bench.path).expanduser() if bench.path else BUILTIN_PATH
        raw, source = _read_jsonl(path, "collab.benchmark.path"), f"builtin:{path.name}"
        examples = [_record(name, i, _builtin, r, i) for i, r in enumerate(raw)]
    elif name == "pubmedqa":
        records, source = _pubmedqa_records(bench)
        examples = [_record(name, pid, _pubmedqa, pid, r) for pid, r in records]
    elif name == "dolly":
        records, source = _dolly_records(bench)
        examples = [_record(name, i, _dolly, r, i) for i, r in enumerate(records)
                    if str(r.get("topic", r.get("category", ""))) in DOLLY_CATEGORIES]
    else:
        raise UserError(f"collab.benchmark.name={name!r} is not one of builtin, pubmedqa, dolly")
    kept = [e for e in examples if e.evidence
            and (bench.max_context_words is None or len(e.context.split()) <= bench.max_context_words)]
    if n_examples is not None:
        kept = kept[:n_examples]
    if len(kept) < 2:
        raise UserError(f"collab.benchmark {name}: {len(kept)} usable example(s) (evidence found, context within "
                        f"max_context_words={bench.max_context_words}); the paired intervals need at least 2")
    return Benchmark(name, kept, source, {"n_examples": n_examples, "max_context_words": bench.max_context_words,
                                          "n_available": len(examples)})


def _read_jsonl(path: Path, key: str) -> list[dict[str, Any]]:
    from harness.workloads import read_jsonl_rows  # the one JSONL reader (BOM, not UTF-8, bad lines: one line)

    return [row for _, row in read_jsonl_rows(path, key)[0]]


def _record(name: str, label: Any, make: Any, *args: Any) -> Example:
    """make(*args), with a record that lacks a field (a KeyError) or holds one of the wrong kind (not text
    where text is needed) reported as one line naming the record, not as a traceback."""
    try:
        example = make(*args)
    except KeyError as e:
        keys = e.args[0] if isinstance(e.args[0], tuple) else (e.args[0],)
        raise UserError(f"collab.benchmark {name}: record {label} has no {' or '.join(map(repr, keys))} field") from None
    except (TypeError, AttributeError) as e:
        raise UserError(f"collab.benchmark {name}: record {label} has a field of the wrong kind ({e})") from None
    for key in ("query", "context"):
        if not isinstance(getattr(example, key), str):
            raise UserError(f"collab.benchmark {name}: record {label}: its {key} is not text")
    return example


def _first(r: dict[str, Any], *keys: str) -> Any:
    """The first of `keys` that `r` has (a dataset's spellings of one field), else a KeyError naming them all."""
    for key in keys:
        if key in r:
            return r[key]
    raise KeyError(keys)


def _builtin(r: dict[str, Any], i: int) -> Example:
    hand = tuple(r["evidence"])
    return Example(id=str(r.get("id", i)), query=r["query"], context=r["context"],
                   evidence=hand, options=tuple(r["options"]), answer=r["answer"], support=r.get("support", ""),
                   hand_evidence=hand)


def _pubmedqa(pid: str, r: dict[str, Any]) -> Example:
    query = _first(r, "QUESTION", "question")
    ctx = r["CONTEXTS"] if "CONTEXTS" in r else _first(r, "CONTEXTS", "context")["contexts"]
    context = " ".join(ctx)
    support = r.get("LONG_ANSWER", r.get("long_answer", ""))
    answer = r.get("final_decision")
    return Example(id=str(pid), query=query, context=context, evidence=evidence_spans(context, support, query),
                   options=PUBMEDQA_OPTIONS, answer=answer, support=support)


def _dolly(r: dict[str, Any], i: int) -> Example:
    context = r.get("input", r.get("context", "")) or ""
    context = re.sub(r"\[\d+\]", "", context)  # citation marks carry no evidence
    reference = r.get("output", r.get("response", ""))
    query = r["instruction"]
    return Example(id=str(r.get("id", f"dolly-{i}")), query=query, context=context,
                   evidence=evidence_spans(context, reference, query), reference=reference, support=reference)


def _pubmedqa_records(bench: Any) -> tuple[list[tuple[str, dict]], str]:
    if bench.path:
        path = Path(bench.path).expanduser()
        if not path.is_file():
            raise UserError(f"collab.benchmark.path={path} is not a file (PubMedQA's ori_pqal.json)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise UserError(f"collab.benchmark.path={path} is not JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise UserError(f"collab.benchmark.path={path}: expected PubMedQA's {{pubid: record}} object")
        return sorted(data.items(), key=lambda kv: kv[0]), f"local:{path}"
    rows, source = _hub_rows(bench, "pubmedqa")
    return [(str(r["pubid"]), r) for r in rows], source


def _dolly_records(bench: Any) -> tuple[list[dict], str]:
    if bench.path:
        path = Path(bench.path).expanduser()
        return _read_jsonl(path, "collab.benchmark.path"), f"local:{path}"
    return _hub_rows(bench, "dolly")


def _hub_rows(bench: Any, name: str) -> tuple[list[dict], str]:
    """The rows and their provenance (the resolved hub commit and fingerprint: harness.text_corpus.load_hub)."""
    hub_id, config = HUB_IDS[name]
    from harness.text_corpus import load_hub  # offline, unknown id, no `datasets`: one line

    ds, source = load_hub(bench.hub_id or hub_id, config, "train",
                          local_hint=f"give a local file for collab.benchmark {name} with collab.benchmark.path")
    return [dict(r) for r in ds], source


def describe(benchmark: Benchmark) -> dict[str, Any]:
    return {"name": benchmark.name, "source": benchmark.source, "filter": benchmark.filter,
            "ids": [e.id for e in benchmark.examples],
            "mean_spans": sum(len(e.evidence) for e in benchmark.examples) / len(benchmark.examples)}


def iter_agreement(examples: Iterable[Example]) -> list[dict[str, float]]:
    """The rule's agreement with the hand annotation of each example that has one."""
    return [span_agreement(evidence_spans(e.context, e.support, e.query), e.hand_evidence)
            for e in examples if e.hand_evidence]
