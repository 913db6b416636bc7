"""The training text of the audited trainer: one flattened token stream cut into fixed-width blocks
(paper 004: "WikiText-2, sliced into fixed-width blocks, not documents").

A block is one row of a frame: `block_tokens` consecutive tokens. The last `heldout_blocks` blocks of the
stream are held out for the utility gate (block hold-out inside one stream, as the paper's); the rest
train. Training blocks alternate between two halves (even and odd block index) so that the frames the
probe trains on and the frames it is scored on never share a block of text.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.errors import UserError


@dataclass
class Blocks:
    train: torch.Tensor       # (n_train, block_tokens) token ids
    heldout: torch.Tensor     # (heldout_blocks, block_tokens)
    source: str               # provenance: file + sha256, or hub id
    n_stream_tokens: int

    def half(self, parity: int) -> torch.Tensor:
        """The training blocks of one half (0: even index, 1: odd index)."""
        return self.train[parity::2]


def load_text(corpus: Any) -> tuple[str, str]:
    """The corpus text and its provenance (the `grad_audit.corpus` node)."""
    from harness.text_corpus import BUILTIN_CORPUS
    from harness.workloads import read_text

    if corpus.source == "builtin":
        text, raw = read_text(BUILTIN_CORPUS, "grad_audit.corpus (builtin)")
        return text, f"builtin:attacks/data/builtin_corpus.txt sha256={hashlib.sha256(raw).hexdigest()}"
    if corpus.source == "text":
        path = Path(str(corpus.path)).expanduser()
        text, raw = read_text(path, "grad_audit.corpus.path")
        return text, f"file:{path.resolve()} sha256={hashlib.sha256(raw).hexdigest()}"
    from harness.text_corpus import hub_text

    return hub_text(corpus.hub_id, corpus.hub_config, corpus.split, corpus.text_field, key="grad_audit.corpus",
                    local_hint="pass a local file: grad_audit.corpus.source=text "
                    "grad_audit.corpus.path=/path/to/wiki.train.raw")


def make_blocks(text: str, source: str, tokenizer: Any, *, block_tokens: int, heldout_blocks: int,
                min_train_blocks: int) -> Blocks:
    """Tokenise the paragraphs of `text` (harness.text_corpus.paragraphs: headings and comments dropped) into
    one stream and cut it into blocks; the last `heldout_blocks` are held out."""
    from harness.text_corpus import paragraphs

    paras = paragraphs(text)
    stream = [t for ids in tokenizer(paras, add_special_tokens=False)["input_ids"] for t in ids] if paras else []
    n_blocks = len(stream) // block_tokens
    if n_blocks < heldout_blocks + min_train_blocks:
        raise UserError(f"grad_audit corpus {source.split(' ')[0]} gives {n_blocks} blocks of {block_tokens} tokens, "
                        f"fewer than heldout_blocks + {min_train_blocks} training blocks = "
                        f"{heldout_blocks + min_train_blocks}; use a larger corpus or lower grad_audit.block_tokens "
                        "or grad_audit.train.heldout_blocks")
    blocks = torch.tensor(stream[:n_blocks * block_tokens], dtype=torch.long).view(n_blocks, block_tokens)
    return Blocks(train=blocks[:n_blocks - heldout_blocks], heldout=blocks[n_blocks - heldout_blocks:],
                  source=source, n_stream_tokens=len(stream))
