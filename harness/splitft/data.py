"""The fine-tuning data of split FL: fixed-length token blocks, cut from one text stream, dealt out to
N clients non-i.i.d., plus a held-out set (utility) and D_align (public blocks for PrivPair's bursts).

Sources (`splitft.data.source`): `builtin` (attacks/data/builtin_corpus.txt, shipped: tests and smoke),
`text` (a local UTF-8 file, e.g. WikiText-2 raw `wiki.test.raw`), `jsonl` (one JSON record a line, the text
in `text_field`, e.g. Dolly's responses: `output` in dolly_valid_500.jsonl) and `hub` (a `datasets` id, for
users with network; offline it fails in one line). The paragraphs (harness.text_corpus.paragraphs: headings
and comments dropped) are tokenised without special tokens and joined into one stream, cut into
consecutive blocks of `seq_len` tokens. The blocks are split in stream order: training | held-out | align,
so the held-out and public blocks are never trained on.

Non-i.i.d. split (`partition=dirichlet`): the training blocks, still in stream order, form `n_topics`
contiguous slices (neighbouring text is about the same thing: WikiText articles, Dolly categories), and
each slice's blocks go to the clients in proportions drawn from Dirichlet(alpha) (Hsu et al. 2019's
label-skew recipe with topics for labels); small alpha gives each client a few topics. Every client gets
at least one block. `iid`: a seeded shuffle dealt round robin.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import UserError


@dataclass
class SplitData:
    clients: list[list[list[int]]]     # per client, its blocks (each seq_len token ids)
    heldout: list[list[int]]
    align: list[list[int]]
    source: str                        # provenance: file + sha256, or hub id

    def record(self) -> dict[str, Any]:
        return {"source": self.source, "client_blocks": [len(c) for c in self.clients],
                "n_heldout": len(self.heldout), "n_align": len(self.align)}


def load_text(cfg: Any) -> tuple[list[str], str]:
    """The paragraphs of the configured source and their provenance."""
    from harness.text_corpus import BUILTIN_CORPUS, hub_text, paragraphs
    from harness.workloads import read_jsonl_rows, read_text

    source = cfg.source
    if source == "builtin":
        text, raw = read_text(BUILTIN_CORPUS, "builtin corpus")
        return paragraphs(text), f"builtin:attacks/data/builtin_corpus.txt sha256={hashlib.sha256(raw).hexdigest()}"
    if source in ("text", "jsonl"):
        path = Path(str(cfg.path)).expanduser()
        if source == "text":
            text, raw = read_text(path, "splitft.data.path")
            texts = paragraphs(text)
        else:
            rows, raw = read_jsonl_rows(path, "splitft.data.path")
            texts = _jsonl_texts(rows, cfg.text_field, path)
        return texts, f"file:{path.resolve()} sha256={hashlib.sha256(raw).hexdigest()}"
    if source == "hub":
        text, provenance = hub_text(cfg.hub_id, cfg.hub_config, cfg.split, cfg.text_field, key="splitft.data",
                                    local_hint="pass a local file: splitft.data.source=text "
                                    "splitft.data.path=/path/to/wiki.test.raw")
        return paragraphs(text), provenance
    raise UserError(f"splitft.data.source={source!r} is not one of builtin, text, jsonl, hub")


def _jsonl_texts(rows: list[tuple[int, dict[str, Any]]], field: str, path: Path) -> list[str]:
    """The `field` text of every record (harness.workloads.read_jsonl_rows), empty ones dropped."""
    out = []
    for lineno, row in rows:
        value = row.get(field)
        if not isinstance(value, str):
            raise UserError(f"splitft.data.path={path}: line {lineno} has no text field {field!r} "
                            "(set splitft.data.text_field)")
        if value.strip():
            out.append(value.strip())
    return out


def blocks(stream: list[int], seq_len: int) -> list[list[int]]:
    """Consecutive blocks of `seq_len` tokens (a short tail is dropped)."""
    return [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def dirichlet_split(n_items: int, n_clients: int, n_topics: int, alpha: float, seed: int) -> list[list[int]]:
    """Item indices per client: `n_topics` contiguous slices of range(n_items), each dealt out by
    Dirichlet(alpha) proportions; then every empty client takes one item from the largest."""
    rng = np.random.default_rng(seed)
    topics = np.array_split(np.arange(n_items), max(1, min(n_topics, n_items)))
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for topic in topics:
        shares = rng.dirichlet([alpha] * n_clients)
        cuts = (np.cumsum(shares)[:-1] * len(topic)).round().astype(int)
        for client, piece in enumerate(np.split(topic, cuts)):
            parts[client].extend(int(i) for i in piece)
    for client in range(n_clients):
        if not parts[client]:
            donor = max(range(n_clients), key=lambda c: len(parts[c]))
            parts[client].append(parts[donor].pop())
    return [sorted(p) for p in parts]


def iid_split(n_items: int, n_clients: int, seed: int) -> list[list[int]]:
    order = np.random.default_rng(seed).permutation(n_items)
    return [sorted(int(i) for i in order[c::n_clients]) for c in range(n_clients)]


def load_split_data(cfg: Any, tokenizer: Any, n_clients: int, seed: int) -> SplitData:
    """The clients' blocks, the held-out blocks and D_align of `cfg` (the `splitft.data` node)."""
    texts, provenance = load_text(cfg)
    if not texts:
        raise UserError(f"splitft data {provenance.split(' ')[0]} holds no text")
    stream = [t for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] for t in ids]
    cut = blocks(stream, int(cfg.seq_len))
    need = cfg.n_train + cfg.n_heldout + cfg.n_align
    if len(cut) < need:
        raise UserError(f"splitft data {provenance.split(' ')[0]} gives {len(cut)} blocks of {cfg.seq_len} tokens, "
                        f"fewer than n_train + n_heldout + n_align = {need}; lower them or splitft.data.seq_len")
    train = cut[:cfg.n_train]
    heldout = cut[cfg.n_train:cfg.n_train + cfg.n_heldout]
    align = cut[cfg.n_train + cfg.n_heldout:need]
    if cfg.partition == "iid":
        parts = iid_split(len(train), n_clients, seed)
    else:
        parts = dirichlet_split(len(train), n_clients, int(cfg.n_topics), float(cfg.dirichlet_alpha), seed)
    return SplitData([[train[i] for i in p] for p in parts], heldout, align, provenance)
