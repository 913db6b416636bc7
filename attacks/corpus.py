"""The attacker's auxiliary corpus: public text it runs through its own copy of the model to train on.

The paper (§7.4.1) trains on 2,000 Pile prompts, 1,800 for training and 200 for validation. Sources
(`attack.corpus.source`):
- `builtin`: attacks/data/builtin_corpus.txt, a small original text shipped with splitbench (tests, smoke).
- `text`: a local UTF-8 text file (`path`), e.g. WikiText-2 raw (`wiki.test.raw`, CRLF line endings).
- `hub`: a Hugging Face dataset through `datasets` (`hub_id`, `hub_config`, `split`, `text_field`), for
  users with network access; e.g. wikitext / wikitext-2-raw-v1 / test, the same text as the local file.
- `random`: token ids drawn uniformly from the tokenizer's vocabulary (special tokens excluded). Not text
  at all: an attacker who owns the model can feed it anything, and for position-wise exposures near the
  input (layer-0 QKV) uniform tokens teach the exposure → token map for every token at once, where a
  small natural corpus covers a few thousand and invites the decoder to memorise it.

Text → prompts: line endings are normalised, empty lines, comment lines (`#`) and WikiText section
headings (`= Title =`) dropped, the remaining paragraphs tokenised without special tokens and joined into
one token stream, which is cut into consecutive pieces whose lengths are drawn uniformly from
[min_tokens, max_tokens] with a seeded generator. The pieces are shuffled with the same seed; the first
n_train are the training prompts and the next n_val the validation prompts, so the two never overlap.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.text_corpus import BUILTIN_CORPUS, hub_text, paragraphs  # BUILTIN_CORPUS: re-exported for attacks/

SOURCES = ("builtin", "text", "hub", "random")


@dataclass
class Corpus:
    train: list[list[int]]
    val: list[list[int]]
    source: str          # provenance: file path + sha256, or hub id
    n_stream_tokens: int


def chunk(stream: list[int], min_tokens: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Consecutive pieces of `stream` with lengths uniform in [min_tokens, max_tokens] (a short tail is dropped)."""
    rng = random.Random(seed)
    pieces, pos = [], 0
    while True:
        length = rng.randint(min_tokens, max_tokens)
        if pos + length > len(stream):
            return pieces
        pieces.append(stream[pos:pos + length])
        pos += length


def load_corpus(cfg: Any, tokenizer: Any, seed: int) -> Corpus:
    """Train/validation prompts (token ids) of the attack corpus `cfg` (the `attack.corpus` node)."""
    source = _get(cfg, "source", "builtin")
    n_train, n_val = int(_get(cfg, "n_train", 1800)), int(_get(cfg, "n_val", 200))
    lo, hi = int(_get(cfg, "min_tokens", 64)), int(_get(cfg, "max_tokens", 192))
    if source not in SOURCES:
        raise UserError(f"attack.corpus.source={source!r} is not one of {', '.join(SOURCES)}")
    if n_train < 1 or n_val < 1:
        raise UserError(f"attack.corpus.n_train and n_val must be >= 1, got {n_train} and {n_val}")
    if not 1 <= lo <= hi:
        raise UserError(f"attack.corpus needs 1 <= min_tokens <= max_tokens, got {lo} and {hi}")
    if source == "random":
        return _random_corpus(tokenizer, n_train, n_val, lo, hi, seed)
    if source == "builtin":
        text, provenance = _read(BUILTIN_CORPUS, "builtin:attacks/data/builtin_corpus.txt")
    elif source == "text":
        path = _get(cfg, "path")
        if not path:
            raise UserError("attack.corpus.source=text needs attack.corpus.path=/path/to/file.txt")
        text, provenance = _read(Path(str(path)).expanduser(), None)
    else:
        text, provenance = _hub_text(cfg)
    paras = paragraphs(text)
    if not paras:
        raise UserError(f"attack corpus {provenance} holds no text")
    stream = [t for ids in tokenizer(paras, add_special_tokens=False)["input_ids"] for t in ids]
    pieces = chunk(stream, lo, hi, seed)
    random.Random(seed).shuffle(pieces)
    if len(pieces) < n_train + n_val:
        raise UserError(
            f"attack corpus {provenance.split(' ')[0]} gives only {len(pieces)} prompts of {lo}-{hi} tokens "
            f"({len(stream)} tokens) but n_train + n_val = {n_train + n_val}; lower attack.corpus.n_train/n_val "
            "or attack.corpus.max_tokens, or use a larger corpus")
    return Corpus(train=pieces[:n_train], val=pieces[n_train:n_train + n_val], source=provenance,
                  n_stream_tokens=len(stream))


def _random_corpus(tokenizer: Any, n_train: int, n_val: int, lo: int, hi: int, seed: int) -> Corpus:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = [t for t in range(len(tokenizer)) if t not in special]
    rng = random.Random(seed)
    pieces = [[vocab[rng.randrange(len(vocab))] for _ in range(rng.randint(lo, hi))] for _ in range(n_train + n_val)]
    return Corpus(train=pieces[:n_train], val=pieces[n_train:], source=f"random:uniform over {len(vocab)} token ids",
                  n_stream_tokens=sum(map(len, pieces)))


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, dict) or hasattr(cfg, "get"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


def _read(path: Path, label: str | None) -> tuple[str, str]:
    from harness.workloads import read_text  # the one reader of user-named files (BOM, UTF-8, one-line errors)

    text, raw = read_text(path, "attack.corpus.path")
    return text, f"{label or f'file:{path.resolve()}'} sha256={hashlib.sha256(raw).hexdigest()}"


def _hub_text(cfg: Any) -> tuple[str, str]:
    hub_id = _get(cfg, "hub_id")
    if not hub_id:
        raise UserError("attack.corpus.source=hub needs attack.corpus.hub_id (e.g. wikitext)")
    return hub_text(hub_id, _get(cfg, "hub_config"), _get(cfg, "split", "train"), _get(cfg, "text_field", "text"),
                    key="attack.corpus", local_hint="pass a local text file: attack.corpus.source=text "
                    "attack.corpus.path=/path/to/text.txt")
