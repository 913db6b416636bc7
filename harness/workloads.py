"""Prompt workloads: the built-in prompt set, Dolly (hub or local JSONL), filtered by token count.

A workload turns instruction/context records into `Prompt`s for one tokenizer. SpliTEE (§7.1, §7.3, §7.4)
evaluates Dolly prompts of 100-250 tokens, counted over instruction + context; the length filter uses the
model's own tokenizer on exactly the text the model is given (without the chat template), then a seeded
sample picks `n_prompts`, so two runs with the same model, config and seed see the same prompts.

A local file is JSON Lines in UTF-8 (a leading byte-order mark is accepted). Whatever makes it unusable
(missing, a directory, not UTF-8, empty, a line that is not a JSON object, a record without an
instruction) is a one-line UserError that `check_workload` finds before any model is loaded
(harness.schema.validate calls it).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import UserError
from harness.group_schemas import WorkloadConfig

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


@dataclass(frozen=True)
class _Options:
    name: str
    source: str
    path: Path | None
    n: int | None
    min_tokens: int | None
    max_tokens: int | None
    require_context: bool
    use_chat_template: bool


def check_workload(cfg: Any) -> None:
    """Raise UserError (one line) for everything `load_workload` would refuse without a tokenizer: the
    options and, with `path`, the file (missing, a directory, not UTF-8, empty, a line that is not a
    JSON object, a record without an instruction). harness.schema.validate calls it, so a bad workload
    fails before any model is loaded and leaves no files."""
    opts = _options(cfg)
    if opts.path is not None:
        _read_jsonl(opts.path)


def load_workload(cfg: Any, tokenizer: PreTrainedTokenizerBase, seed: int) -> Workload:
    """Load, length-filter and sample the prompts that `cfg` (a conf/workload entry, typed by
    harness.group_schemas.WorkloadConfig, or a plain mapping) describes. A plain mapping may leave out the
    optional keys: no path, every prompt, 100-250 tokens (SpliTEE §7), context optional, chat template on."""
    opts = _options(cfg)
    name, source, n = opts.name, opts.source, opts.n
    min_tokens, max_tokens, require_context = opts.min_tokens, opts.max_tokens, opts.require_context
    use_chat_template = opts.use_chat_template

    if opts.path is not None:
        records, provenance = _read_jsonl(opts.path)
    elif source == "builtin":
        records, _ = _read_jsonl(BUILTIN_PATH)
        provenance = f"builtin:{BUILTIN_RELPATH} sha256={_sha256(BUILTIN_PATH)}"
    else:
        records, provenance = _load_dolly_hub()

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


def _options(cfg: Any) -> _Options:
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

    if name in (None, "???") or source in (None, "???"):
        raise UserError("workload.name and workload.source must be set")
    if source not in SOURCES:
        raise UserError(f"workload.source={source!r} is not one of {', '.join(SOURCES)}")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise UserError(f"workload.n_prompts={n!r} must be a positive integer or null (all)")
    for key, value in (("min_tokens", min_tokens), ("max_tokens", max_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise UserError(f"workload.{key}={value!r} must be a non-negative integer or null")
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise UserError(f"workload.min_tokens={min_tokens} is larger than workload.max_tokens={max_tokens}")
    if path is not None and not str(path).strip():
        raise UserError("workload.path is empty; give a JSONL file, or null for the workload's own source")
    return _Options(name=str(name), source=str(source), path=None if path is None else Path(str(path)).expanduser(),
                    n=n, min_tokens=min_tokens, max_tokens=max_tokens,
                    require_context=bool(_opt(cfg, "require_context", False)),
                    use_chat_template=bool(_opt(cfg, "use_chat_template", True)))


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


def read_text(path: Path, key: str) -> tuple[str, bytes]:
    """The text of a file the user names (`key`=path), decoded as UTF-8 with a leading byte-order mark
    dropped (editors on Windows write one), and the raw bytes (for provenance hashes). Every way the
    file can be unusable is a UserError of one line: missing, a directory, unreadable, not UTF-8 (with
    the first offending byte and its offset)."""
    if path.is_dir():
        raise UserError(f"{key}={path} is a directory, not a file")
    if not path.exists():
        raise UserError(f"{key}={path} does not exist")
    if not path.is_file():
        raise UserError(f"{key}={path} is not a regular file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{key}={path} cannot be read ({e.strerror or type(e).__name__})") from e
    skip = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        offset = skip + e.start
        raise UserError(f"{key}={path} is not UTF-8 text (byte 0x{raw[offset]:02x} at offset {offset})") from None
    return text, raw


def read_jsonl_rows(path: Path, key: str) -> tuple[list[tuple[int, dict[str, Any]]], bytes]:
    """The records of a JSON Lines file the user names (`key`=path): each line's JSON object with its line
    number (blank lines skipped), and the file's raw bytes (for provenance hashes). Besides read_text's
    errors, a line that is not JSON or not a JSON object is a one-line UserError naming the line. Whether
    no records at all is an error, and which fields a record needs, is the caller's."""
    where = f"{key}={path}"
    text, raw = read_text(path, key)
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: line {lineno} is not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{where}: line {lineno} is not a JSON object (got a JSON {_json_kind(row)})")
        try:  # valid UTF-8 on disk can still spell a lone surrogate as an escape ("\ud800"): not text
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            bad = e.object[e.start:e.end].encode("unicode_escape").decode("ascii")
            raise UserError(f"{where}: line {lineno} holds a lone surrogate escape ({bad}), which is not text") from None
        rows.append((lineno, row))
    return rows, raw


def _read_jsonl(path: Path) -> tuple[list[_Record], str]:
    where = f"workload.path={path}"
    rows, raw = read_jsonl_rows(path, "workload.path")
    if not rows:
        raise UserError(f"{where} holds no records (one JSON object per line, with an 'instruction' field)")
    records = _to_records(((f"line {n}", row) for n, row in rows), where=where, id_prefix=f"{path.stem}-")
    return records, f"file:{path.resolve()} sha256={hashlib.sha256(raw).hexdigest()}"


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _to_records(rows: Iterable[tuple[str, Mapping[str, Any]]], where: str, id_prefix: str) -> list[_Record]:
    """Records of (label, row) pairs; the label ("line 3", "record 3") names a bad row in the error."""
    records, seen = [], set()
    for i, (label, row) in enumerate(rows):
        instruction = row.get("instruction")
        if not isinstance(instruction, str) or not instruction.strip():
            raise UserError(f"{where}: {label} has no 'instruction' text")
        # `input` is the context field in the MiniLLM/Alpaca layout of Dolly.
        context = row.get("context", row.get("input")) or ""
        if not isinstance(context, str):
            raise UserError(f"{where}: {label} has a 'context' that is not text (a JSON {_json_kind(context)})")
        rid = row.get("id")
        if rid is not None and (not isinstance(rid, (str, int)) or isinstance(rid, bool)):
            raise UserError(f"{where}: {label} has an 'id' that is neither text nor an integer")
        rid = str(rid) if rid is not None else f"{id_prefix}{i}"
        if rid in seen:
            raise UserError(f"{where}: {label}: duplicate prompt id {rid!r}")
        seen.add(rid)
        records.append(_Record(id=rid, instruction=instruction, context=context))
    return records


def _load_dolly_hub() -> tuple[list[_Record], str]:
    """Dolly's records from the hub and their provenance (the resolved commit: harness.text_corpus.load_hub)."""
    from harness.text_corpus import load_hub  # `datasets` is a slow import; only the hub path needs it

    ds, provenance = load_hub(DOLLY_HUB_ID, None, "train", local_hint="pass a local JSONL with instruction/context "
                              "fields as workload.path=/path/to/dolly.jsonl")
    # Hub rows carry no id; `dolly-<row index>` matches the ids of the Dolly JSONL in ../shared/data.
    return _to_records(((f"record {i}", row) for i, row in enumerate(ds)), where=f"hub:{DOLLY_HUB_ID}",
                       id_prefix="dolly-"), provenance
