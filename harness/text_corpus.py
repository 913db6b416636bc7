"""Plain text that trainers and attackers read as a corpus: its paragraphs, and the text column of a
Hugging Face dataset for users with network access.

One place for both, below every system: the attack corpus (attacks/corpus.py), split fine-tuning's data
(harness/splitft/data.py), the audited trainer's text (harness/grad_audit/data.py) and the config check
that refuses an empty corpus before any model loads (harness/schema.py) all read text the same way.
The built-in corpus those sources default to is BUILTIN_CORPUS, named here so that harness/ never imports
attacks/ for it.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.hub import offline_reason, unreachable_note

# The file stays under attacks/data/ (it installs as the attacks package's data), so every run's provenance
# string "builtin:attacks/data/builtin_corpus.txt sha256=..." and its config hash are unchanged.
BUILTIN_CORPUS = Path(__file__).parent.parent / "attacks" / "data" / "builtin_corpus.txt"

_HEADING = re.compile(r"^\s*(=+)\s.*\s\1\s*$")


def paragraphs(text: str) -> list[str]:
    """Non-empty paragraphs of `text`, without comment lines and WikiText headings (`= A =`, `= = B = =`)."""
    out = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        s = line.strip()
        if not s or s.startswith("#") or _HEADING.match(s):
            continue
        out.append(s)
    return out


def load_hub_dataset(hub_id: str, hub_config: str | None, split: str, *, local_hint: str) -> Any:
    """`datasets.load_dataset(hub_id, hub_config, split=split)`. Offline, an unknown id or split, or no
    `datasets` package is a UserError of one line that ends in `local_hint` (how to pass a local file
    instead, e.g. "pass a local file: attack.corpus.source=text attack.corpus.path=/path/to/text.txt")."""
    return load_hub(hub_id, hub_config, split, local_hint=local_hint)[0]


def load_hub(hub_id: str, hub_config: str | None, split: str, *, local_hint: str) -> tuple[Any, str]:
    """`load_hub_dataset`, and the provenance of what it loaded: `hub:id/config/split@REVISION fingerprint=F`.
    REVISION is the hub commit the builder resolved (datasets' DatasetModule hash), and the load is pinned to
    it, so a commit landing between the two calls cannot make the record lie; `fingerprint` is datasets' hash
    of the loaded table. A builder hash that is not a commit (a local folder) is recorded but not pinned."""
    where = f"{hub_id} ({f'config {hub_config}, ' if hub_config else ''}split {split})"
    # Before `datasets` is imported (it reads HF_HUB_OFFLINE then): an unreachable hub means the local cache
    # only, and an error at once rather than after a minute of retries (harness/hub.py).
    offline_reason()
    try:
        import datasets  # slow import, and optional for users who only read local files
    except ImportError:
        raise UserError(f"cannot load {where} from the Hugging Face hub: the datasets package is not installed; "
                        f"{local_hint}") from None
    try:
        revision = getattr(datasets.load_dataset_builder(hub_id, hub_config), "hash", None)
        pinned = revision if isinstance(revision, str) and _COMMIT.fullmatch(revision) else None
        ds = datasets.load_dataset(hub_id, hub_config, split=split, revision=pinned)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:
        # Offline: ConnectionError (an OSError) or DatasetNotFoundError; a bad split or config: ValueError.
        switched = unreachable_note()   # the user's own HF_HUB_OFFLINE needs no saying
        raise UserError(f"cannot load {where} from the Hugging Face hub ({type(e).__name__}"
                        f"{f'; {switched}' if switched else ''}); offline, {local_hint}") from e
    provenance = f"hub:{hub_id}/{hub_config or '-'}/{split}@{revision or 'unknown'}"
    fingerprint = getattr(ds, "_fingerprint", None)
    return ds, provenance + (f" fingerprint={fingerprint}" if fingerprint else "")


_COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_text(hub_id: str, hub_config: str | None, split: str, text_field: str, *, key: str,
             local_hint: str) -> tuple[str, str]:
    """The `text_field` column of a hub dataset, one row a line, and its provenance (`load_hub`:
    `hub:id/config/split@revision fingerprint=...`). `key` is the config node the options came from (a missing
    column names `{key}.text_field`)."""
    ds, provenance = load_hub(hub_id, hub_config, split, local_hint=local_hint)
    if text_field not in ds.column_names:
        raise UserError(f"{hub_id} has no column {text_field!r} (columns: {', '.join(ds.column_names)}); "
                        f"set {key}.text_field")
    return "\n".join(str(t) for t in ds[text_field]), provenance
