"""Prompt workloads: the built-in prompt set, Dolly (hub or local JSONL), filtered by token count.

A workload turns instruction/context records into `Prompt`s for one tokenizer. SpliTEE (§7.1, §7.3, §7.4)
evaluates Dolly prompts of 100-250 tokens, counted over instruction + context; the length filter uses the
model's own tokenizer on exactly the text the model is given (without the chat template), then a seeded
sample picks `n_prompts`, so two runs with the same model, config and seed see the same prompts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import UserError
from harness.schema import WorkloadConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

BUILTIN_PATH = Path(__file__).parent / "data" / "builtin_prompts.jsonl"
BUILTIN_RELPATH = "harness/data/builtin_prompts.jsonl"
DOLLY_HUB_ID = "databricks/databricks-dolly-15k"
SOURCES = ("builtin", "dolly")


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str  # instruction, blank line, context (if any): what the user typed
    input_ids: tuple[int, ...]  # what the model sees (chat template applied if Workload.chat_template)
    n_text_tokens: int  # tokens of `text` alone, no special tokens; what the length filter counts


@dataclass
class Workload:
    name: str
    prompts: list[Prompt]
    source: str  # provenance, e.g. "builtin:harness/data/builtin_prompts.jsonl sha256=..."
    chat_template: bool  # whether input_ids went through the tokenizer's chat template
    filter: dict  # settings actually used: min_tokens, max_tokens, n, seed, require_context


@dataclass(frozen=True)
class _Record:
    id: str
    instruction: str
    context: str


def format_prompt(instruction: str, context: str | None) -> str:
    """Dolly-style plain text: the instruction, then a blank line and the context passage if there is one."""
    instruction = instruction.strip()
    context = (context or "").strip()
    return f"{instruction}\n\n{context}" if context else instruction


def load_workload(cfg: Any, tokenizer: PreTrainedTokenizerBase, seed: int) -> Workload:
    """Load, length-filter and sample the prompts that `cfg` (a conf/workload entry, typed by
    harness.schema.WorkloadConfig, or a plain mapping) describes. A plain mapping may leave out the
    optional keys: no path, every prompt, 100-250 tokens (SpliTEE §7), context optional, chat template on."""
    if isinstance(cfg, Mapping):
        # A plain mapping has no schema (and `+workload.KEY=...` adds keys past it): refuse misspelt keys here.
        unknown = sorted(set(map(str, cfg.keys())) - {f.name for f in fields(WorkloadConfig)})
        if unknown:
            raise UserError(f"unknown workload option(s) {', '.join(unknown)}; known: "
                            f"{', '.join(f.name for f in fields(WorkloadConfig))}")
    name = _opt(cfg, "name")
    source = _opt(cfg, "source")
    path = _opt(cfg, "path")
    n = _opt(cfg, "n_prompts")
    min_tokens = _opt(cfg, "min_tokens", 100)
    max_tokens = _opt(cfg, "max_tokens", 250)
    require_context = bool(_opt(cfg, "require_context", False))
    use_chat_template = bool(_opt(cfg, "use_chat_template", True))

    if name in (None, "???") or source in (None, "???"):
        raise UserError("workload.name and workload.source must be set")
    name = str(name)
    if source not in SOURCES:
        raise UserError(f"workload.source={source!r} is not one of {', '.join(SOURCES)}")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise UserError(f"workload.n_prompts={n!r} must be a positive integer or null (all)")
    for key, value in (("min_tokens", min_tokens), ("max_tokens", max_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise UserError(f"workload.{key}={value!r} must be a non-negative integer or null")
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise UserError(f"workload.min_tokens={min_tokens} is larger than workload.max_tokens={max_tokens}")

    if path is not None:
        records, provenance = _read_jsonl(Path(str(path)).expanduser())
    elif source == "builtin":
        records, _ = _read_jsonl(BUILTIN_PATH)
        provenance = f"builtin:{BUILTIN_RELPATH} sha256={_sha256(BUILTIN_PATH)}"
    else:
        records, provenance = _load_dolly_hub(), f"hub:{DOLLY_HUB_ID}"

    filt = {"min_tokens": min_tokens, "max_tokens": max_tokens, "n": n, "seed": seed,
            "require_context": require_context}
    candidates = sorted((r for r in records if r.context.strip() or not require_context), key=lambda r: r.id)
    texts = [format_prompt(r.instruction, r.context) for r in candidates]
    counts = _count_tokens(tokenizer, texts)
    passed = [(r, t, c) for r, t, c in zip(candidates, texts, counts)
              if (min_tokens is None or c >= min_tokens) and (max_tokens is None or c <= max_tokens)]

    if len(passed) < (n or 1):
        raise UserError(
            f"workload {name}: only {len(passed)} of {len(records)} prompts pass the filter "
            f"(tokens {min_tokens}-{max_tokens}, require_context={require_context}) but n_prompts={n}; "
            "lower workload.n_prompts or widen workload.min_tokens/max_tokens")
    if n is not None:
        keep = sorted(random.Random(seed).sample(range(len(passed)), n))  # sorted: output in id order
        passed = [passed[i] for i in keep]

    chat = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template and not chat:
        log.info("workload %s: tokenizer has no chat template; using plain tokenization", name)
    prompts = [Prompt(id=r.id, text=t, input_ids=_model_input_ids(tokenizer, t, chat), n_text_tokens=c)
               for r, t, c in passed]
    return Workload(name=name, prompts=prompts, source=provenance, chat_template=chat, filter=filt)


def _opt(cfg: Any, key: str, default: Any = None) -> Any:
    # A mapping (DictConfig, dict) or an object with the fields as attributes; a missing optional key takes
    # its default (load_workload).
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _count_tokens(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[int]:
    if not texts:
        return []
    # No special tokens: the paper's lengths are of the prompt text, not of BOS or template markup.
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _model_input_ids(tokenizer: PreTrainedTokenizerBase, text: str, chat: bool) -> tuple[int, ...]:
    if not chat:
        return tuple(tokenizer(text)["input_ids"])
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    # The rendered template already holds its own BOS/markers; adding special tokens would double them.
    return tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_jsonl(path: Path) -> tuple[list[_Record], str]:
    if not path.is_file():
        raise UserError(f"workload.path={path} does not exist or is not a file")
    raw = path.read_bytes()
    rows = []
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(f"workload.path={path}: line {lineno} is not valid JSON ({e.msg})") from e
        if not isinstance(rows[-1], dict):
            raise UserError(f"workload.path={path}: line {lineno} is not a JSON object")
    records = _to_records(rows, where=f"workload.path={path}", id_prefix=f"{path.stem}-")
    return records, f"file:{path.resolve()} sha256={hashlib.sha256(raw).hexdigest()}"


def _to_records(rows: Iterable[Mapping[str, Any]], where: str, id_prefix: str) -> list[_Record]:
    records, seen = [], set()
    for i, row in enumerate(rows):
        instruction = row.get("instruction")
        if not isinstance(instruction, str) or not instruction.strip():
            raise UserError(f"{where}: record {i} has no 'instruction' text")
        # `input` is the context field in the MiniLLM/Alpaca layout of Dolly.
        context = row.get("context", row.get("input")) or ""
        rid = str(row["id"]) if row.get("id") is not None else f"{id_prefix}{i}"
        if rid in seen:
            raise UserError(f"{where}: duplicate prompt id {rid!r}")
        seen.add(rid)
        records.append(_Record(id=rid, instruction=instruction, context=str(context)))
    return records


def _load_dolly_hub() -> list[_Record]:
    import datasets  # slow import; only the hub path needs it

    try:
        ds = datasets.load_dataset(DOLLY_HUB_ID, split="train")
    except (OSError, datasets.exceptions.DatasetsError) as e:
        raise UserError(
            f"cannot load {DOLLY_HUB_ID} from the Hugging Face hub ({type(e).__name__}); offline, pass a local "
            "JSONL with instruction/context fields as workload.path=/path/to/dolly.jsonl") from e
    # Hub rows carry no id; `dolly-<row index>` matches the ids of the Dolly JSONL in ../shared/data.
    return _to_records(ds, where=f"hub:{DOLLY_HUB_ID}", id_prefix="dolly-")
