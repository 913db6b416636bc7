"""The shared readers of user-named text: a hub dataset's text column (harness/text_corpus.py), offline or
without `datasets` one UserError line; and JSON Lines records (harness.workloads.read_jsonl_rows), which
the workload, split fine-tuning's data, the sanitisers' tasks and the collab benchmarks all read through.
A fake `datasets` module stands in for the hub: nothing here touches the network or imports `datasets`."""
from __future__ import annotations

import codecs
import sys
import types

import pytest
from omegaconf import OmegaConf

from harness.errors import UserError
from harness.text_corpus import hub_text, paragraphs
from harness.workloads import read_jsonl_rows

HINT = "pass a local file: attack.corpus.source=text attack.corpus.path=/path/to/text.txt"


class _Table:
    def __init__(self, columns: dict[str, list], fingerprint: str | None = "f00d") -> None:
        self.columns = columns
        self.column_names = list(columns)
        if fingerprint is not None:
            self._fingerprint = fingerprint     # datasets' hash of the loaded table

    def __getitem__(self, key: str) -> list:
        return self.columns[key]


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fake_datasets(monkeypatch, load, revision: str | None = COMMIT) -> list:
    """`load_dataset_builder` resolves `revision` (the builder's hash: a hub commit); `load_dataset` records its
    arguments, the revision it was pinned to among them."""
    calls = []
    errors = types.SimpleNamespace(DatasetsError=type("DatasetsError", (Exception,), {}))

    def load_dataset_builder(hub_id, config):
        return types.SimpleNamespace(hash=revision)

    def load_dataset(hub_id, config, split, revision=None):
        calls.append((hub_id, config, split, revision))
        return load(errors)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(
        load_dataset=load_dataset, load_dataset_builder=load_dataset_builder, exceptions=errors))
    return calls


def test_hub_text_joins_the_column_and_names_its_source(monkeypatch):
    calls = _fake_datasets(monkeypatch, lambda errors: _Table({"text": [" = T = ", "one", 2], "label": [0, 1, 2]}))
    text, source = hub_text("wikitext", "wikitext-2-raw-v1", "test", "text", key="attack.corpus", local_hint=HINT)
    assert calls == [("wikitext", "wikitext-2-raw-v1", "test", COMMIT)]    # pinned to the resolved commit
    assert text == " = T = \none\n2" and paragraphs(text) == ["one", "2"]
    assert source == f"hub:wikitext/wikitext-2-raw-v1/test@{COMMIT} fingerprint=f00d"
    with pytest.raises(UserError, match=r"^wikitext has no column 'body' \(columns: text, label\); "
                                         r"set splitft\.data\.text_field$"):
        hub_text("wikitext", None, "test", "body", key="splitft.data", local_hint=HINT)


def test_a_builder_hash_that_is_no_commit_is_recorded_not_pinned(monkeypatch):
    """A local folder's builder hash is no hub commit: the load is not pinned to it, the record keeps it; a table
    without a fingerprint records none."""
    calls = _fake_datasets(monkeypatch, lambda errors: _Table({"text": ["a"]}, fingerprint=None), revision="9f1c2e")
    _, source = hub_text("/data/wiki", None, "train", "text", key="attack.corpus", local_hint=HINT)
    assert calls == [("/data/wiki", None, "train", None)]
    assert source == "hub:/data/wiki/-/train@9f1c2e"


@pytest.mark.parametrize("error, kind", [(ConnectionError("no network\nretrying"), "ConnectionError"),
                                         (ValueError("Unknown split 'tset'"), "ValueError"),
                                         (None, "DatasetsError")])
def test_hub_text_offline_is_one_line(monkeypatch, error, kind):
    def fail(errors):
        raise error if error is not None else errors.DatasetsError("DatasetNotFoundError: not on the hub")

    _fake_datasets(monkeypatch, fail)
    with pytest.raises(UserError) as info:
        hub_text("wikitext", None, "tset", "text", key="attack.corpus", local_hint=HINT)
    assert str(info.value) == (f"cannot load wikitext (split tset) from the Hugging Face hub ({kind}); offline, {HINT}")


def test_hub_text_without_the_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)   # `import datasets` raises ImportError
    with pytest.raises(UserError, match=r"^cannot load wikitext \(config c, split train\) from the Hugging Face "
                                         r"hub: the datasets package is not installed; pass a local file"):
        hub_text("wikitext", "c", "train", "text", key="attack.corpus", local_hint=HINT)


def test_read_jsonl_rows_lines_bom_and_errors(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + b'{"a": 1}\n\n  \n{"a": "two"}\n')
    rows, raw = read_jsonl_rows(path, "splitft.data.path")
    assert rows == [(1, {"a": 1}), (4, {"a": "two"})] and raw == path.read_bytes()
    for body, message in ((b'{"a": 1}\n{a: 2}\n', f"splitft.data.path={path}: line 2 is not valid JSON"),
                          (b'\n["a"]\n', f"splitft.data.path={path}: line 2 is not a JSON object (got a JSON array)"),
                          (b'{"a": "caf\xe9"}\n', f"splitft.data.path={path} is not UTF-8 text (byte 0xe9 at offset 10)")):
        path.write_bytes(body)
        with pytest.raises(UserError) as info:
            read_jsonl_rows(path, "splitft.data.path")
        assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_splitft_jsonl_source_reads_through_the_shared_reader(tmp_path):
    from harness.splitft.data import load_text

    path = tmp_path / "dolly.jsonl"
    path.write_text('{"output": " First answer. "}\n{"output": ""}\n{"output": "Second."}\n', encoding="utf-8")
    cfg = OmegaConf.create({"source": "jsonl", "path": str(path), "text_field": "output"})
    texts, source = load_text(cfg)
    assert texts == ["First answer.", "Second."] and source.startswith(f"file:{path.resolve()} sha256=")
    path.write_text('{"output": "ok"}\n{"response": "no output field"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r": line 2 has no text field 'output' \(set splitft\.data\.text_field\)$"):
        load_text(cfg)


def test_the_builtin_corpus_is_harness_s_and_keeps_its_provenance():
    """harness/ names the built-in corpus itself (no harness module imports attacks/); the file and the
    provenance string every system records for it are the ones runs were hashed with."""
    import ast
    import hashlib
    from pathlib import Path

    import attacks.corpus
    from harness import text_corpus
    from harness.grad_audit.data import load_text as grad_audit_text
    from harness.splitft.data import load_text as splitft_text

    root = Path(text_corpus.__file__).resolve().parents[1]
    importers = []
    for path in sorted((root / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "attacks" or n.startswith("attacks.") for n in names):
                importers.append(path.relative_to(root).as_posix())
    assert importers == []
    assert attacks.corpus.BUILTIN_CORPUS is text_corpus.BUILTIN_CORPUS
    assert text_corpus.BUILTIN_CORPUS.resolve() == root / "attacks" / "data" / "builtin_corpus.txt"
    raw = text_corpus.BUILTIN_CORPUS.read_bytes()
    expected = f"builtin:attacks/data/builtin_corpus.txt sha256={hashlib.sha256(raw).hexdigest()}"
    texts, source = splitft_text(OmegaConf.create({"source": "builtin"}))
    assert source == expected and texts == paragraphs(raw.decode("utf-8"))
    assert grad_audit_text(OmegaConf.create({"source": "builtin"}))[1] == expected
