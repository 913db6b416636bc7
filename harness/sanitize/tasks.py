"""Task accuracy of a sanitiser (paper 001 §4.2): lm-evaluation-harness, zero-shot, with lm-eval's own task
templates, over local files whose input fields were sanitised (labels and answer letters untouched); the
model is unchanged and runs on the plain engine through harness/lm_eval_lm.py, the path the `splitbench`
lm-eval model takes (runners/lm_eval_model.py).

Tasks and what is sanitised: sst2 (sentence), qnli (question, sentence), mmlu (question and each choice),
commonsense_qa (question and each choice text; the stand-in for SWAG, which cannot be had offline). Each
field is its own sequence: a Stencil window never crosses from one field into another. The template is
read from the installed lm_eval package (tasks/glue/sst2/default.yaml, ...), and only its dataset is
replaced by the local JSON Lines file. MMLU's per-subject description line is dropped (one task mixes the
subjects).

Sources: `path` a local file in the dataset's public layout (GLUE .tsv, MMLU .csv or a folder of them,
CommonsenseQA .jsonl, or JSON Lines already in the template's fields); for sst2 a null path is the
20-sentence file the repo ships (harness/data/sst2_mini.jsonl, written for splitbench, so CI needs nothing
else); otherwise null loads the hub dataset through `datasets` (fails offline with one line).
"""
from __future__ import annotations

import csv
import hashlib
import json
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.errors import UserError
from metrics.answers import constant_answer_floor

MINI_SST2 = Path(__file__).resolve().parents[1] / "data" / "sst2_mini.jsonl"


@dataclass(frozen=True)
class TaskSpec:
    template: tuple[str, ...]     # yaml files under lm_eval/tasks, merged in order
    fields: tuple[str, ...]       # text fields sanitised (a list field: each item)
    hub: tuple[str, str | None, str]  # datasets id, config, split


SPECS: dict[str, TaskSpec] = {
    "sst2": TaskSpec(("glue/sst2/default.yaml",), ("sentence",), ("nyu-mll/glue", "sst2", "validation")),
    "qnli": TaskSpec(("glue/qnli/default.yaml",), ("question", "sentence"), ("nyu-mll/glue", "qnli", "validation")),
    "mmlu": TaskSpec(("mmlu/default/_default_template_yaml",), ("question", "choices"), ("cais/mmlu", "all", "test")),
    "commonsense_qa": TaskSpec(("commonsense_qa/default.yaml",), ("question", "choices.text"),
                               ("tau/commonsense_qa", None, "validation")),
}
# Keys of lm-eval's template that name its dataset (replaced by the local file).
_DATASET_KEYS = ("dataset_path", "dataset_name", "dataset_kwargs", "training_split", "validation_split", "test_split",
                 "fewshot_split", "fewshot_config", "include", "tag", "task", "description")


def load_docs(name: str, path: str | None, limit: int | None, seed: int) -> list[dict[str, Any]]:
    """The task's examples in the template's field layout; with `limit`, a seeded sample (in file order)."""
    return load_docs_with_source(name, path, limit, seed)[0]


def load_docs_with_source(name: str, path: str | None, limit: int | None, seed: int) -> tuple[list[dict[str, Any]], str]:
    """`load_docs`, and where the examples came from: the bundled mini SST-2's or a local file's (a folder's:
    its files in name order) sha256, or the hub dataset's resolved commit and fingerprint (text_corpus.load_hub)."""
    if path is None and name == "sst2":
        docs, source = _jsonl(MINI_SST2, name), f"builtin:harness/data/{MINI_SST2.name} sha256={_digest(MINI_SST2)}"
    elif path is None:
        docs, source = _hub(name)
    else:
        local = Path(path).expanduser()
        docs = _local(name, local)
        source = f"file:{local.resolve()} sha256={_digest(local)}"
    if not docs:
        raise UserError(f"sanitize.tasks: {name} has no examples")
    if limit is not None and limit < len(docs):
        keep = sorted(random.Random(seed).sample(range(len(docs)), limit))
        docs = [docs[i] for i in keep]
    return docs, source


def _digest(path: Path) -> str:
    """sha256 of a file, or of a folder's files (relative name, then bytes, in name order)."""
    digest = hashlib.sha256()
    if path.is_dir():
        for f in sorted(q for q in path.rglob("*") if q.is_file()):
            digest.update(f.relative_to(path).as_posix().encode("utf-8") + b"\0" + f.read_bytes())
    else:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _jsonl(path: Path, name: str) -> list[dict[str, Any]]:
    from harness.workloads import read_jsonl_rows  # the one JSONL reader (BOM, not UTF-8, bad lines: one line)

    return [row for _, row in read_jsonl_rows(path, f"sanitize.task_paths.{name}")[0]]


def _local(name: str, path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        unset = ("the bundled mini SST-2 serves it" if name == "sst2"
                 else "with network the task loads through datasets")
        raise UserError(f"sanitize.tasks: {name} path={path} does not exist: give your copy's path, or leave "
                        f"sanitize.task_paths.{name} unset ({unset})")
    if path.suffix == ".jsonl" and name != "commonsense_qa":
        return _jsonl(path, name)
    if name == "sst2":
        return [{"sentence": r["sentence"].strip(), "label": int(r["label"])} for r in _tsv(path)]
    if name == "qnli":
        return [{"question": r["question"], "sentence": r["sentence"],
                 "label": 0 if r["label"] in ("entailment", "0") else 1}   # lm-eval's choices: yes, no
                for r in _tsv(path)]
    if name == "mmlu":
        files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
        out = []
        for f in files:
            with f.open(encoding="utf-8", newline="") as handle:
                for r in csv.DictReader(handle):
                    answer = r["answer"].strip()
                    out.append({"question": r["question"], "choices": [r[f"choice{i}"] for i in range(4)],
                                "answer": "ABCD".index(answer) if answer in "ABCD" else int(answer),
                                "subject": f.stem.removesuffix("_test")})
        return out
    # commonsense_qa: the dataset's own JSON Lines (question, choices {label, text}, answerKey)
    return [{"question": r["question"], "choices": r["choices"], "answerKey": r["answerKey"]}
            for r in _jsonl(path, name)]


def _tsv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def _hub(name: str) -> tuple[list[dict[str, Any]], str]:
    from harness.text_corpus import load_hub

    hub_id, config, split = SPECS[name].hub
    ds, source = load_hub(hub_id, config, split, local_hint=f"give a local file for sanitize task {name} as "
                          f"sanitize.task_paths.{name}=/path/to/file")
    return [dict(r) for r in ds], source


def sanitize_docs(docs: Sequence[dict[str, Any]], name: str, sanitizer: Any, tokenizer: Any, seed: int
                  ) -> list[dict[str, Any]]:
    """Copies of `docs` with every text field of the task sanitised (all fields of all docs in one batch)."""
    slots, texts = [], []
    for i, doc in enumerate(docs):
        for field in SPECS[name].fields:
            key, _, sub = field.partition(".")
            value = doc[key][sub] if sub else doc[key]
            if isinstance(value, list):
                for j, item in enumerate(value):
                    slots.append((i, key, sub, j))
                    texts.append(item)
            else:
                slots.append((i, key, sub, None))
                texts.append(value)
    ids = [list(tokenizer(str(t), add_special_tokens=False)["input_ids"]) for t in texts]
    clean = [tokenizer.decode(s, skip_special_tokens=False, clean_up_tokenization_spaces=False)
             for s in sanitizer(ids, seed)]
    out = [json.loads(json.dumps(d)) for d in docs]
    for (i, key, sub, j), text in zip(slots, clean):
        target = out[i][key][sub] if sub else out[i][key]
        if j is None:
            if sub:
                out[i][key][sub] = text
            else:
                out[i][key] = text
        else:
            target[j] = text
    return out


def task_config(name: str, data_file: Path, cache_dir: Path) -> dict[str, Any]:
    """lm-eval's own template for `name` with its dataset replaced by `data_file` (split `test`)."""
    import lm_eval

    root = Path(lm_eval.__file__).parent / "tasks"
    config: dict[str, Any] = {}
    for rel in SPECS[name].template:
        config.update(yaml.safe_load((root / rel).read_text(encoding="utf-8")))
    config = {k: v for k, v in config.items() if k not in _DATASET_KEYS}
    return {**config, "task": f"splitbench_{name}", "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data_file)}, "cache_dir": str(cache_dir)},
            "test_split": "test"}


# What is kept of lm-eval's per-example record (its hashes and repeated config are left out).
SAMPLE_KEYS = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "acc")


@dataclass(frozen=True)
class Scored:
    """One task's zero-shot result: lm-eval's per-example `acc` (0 or 100, in doc order), gold targets and
    lm-eval's own per-example records (the requests it built from its template and what the model returned)."""
    acc: list[float]
    targets: list[str]
    samples: list[dict[str, Any]]

    @property
    def constant_floor(self) -> float:
        """The constant-answer floor of this task (metrics.answers.constant_answer_floor), in %."""
        return constant_answer_floor(self.targets)


def accuracy(model: Any, tokenizer: Any, docs_by_task: dict[str, list[dict[str, Any]]], batch_size: int
             ) -> dict[str, Scored]:
    """Per task, lm-eval's per-example `acc` and gold target, zero-shot."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from harness.lm_eval_lm import plain_lm

    # The one path by which splitbench scores lm-eval tasks (the `splitbench` lm-eval model's), on the plain
    # engine where the model lies: the sanitiser changed the docs, not the model.
    lm = plain_lm(model, tokenizer, batch_size)
    with tempfile.TemporaryDirectory(prefix="splitbench-lmeval-") as tmp:
        configs = []
        for name, docs in docs_by_task.items():
            path = Path(tmp) / f"{name}.jsonl"
            path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
            configs.append(task_config(name, path, Path(tmp) / "datasets"))
        # include_defaults=False: the configs are complete dicts, and indexing lm-eval's thousands of task
        # files would take longer than scoring the smoke run's 20 sentences.
        res = simple_evaluate(model=lm, tasks=configs, num_fewshot=0, log_samples=True, bootstrap_iters=0,
                              task_manager=TaskManager(include_defaults=False))
    out = {}
    for name in docs_by_task:
        rows = sorted(res["samples"][f"splitbench_{name}"], key=lambda r: r["doc_id"])
        out[name] = Scored([100.0 * float(r["acc"]) for r in rows], [str(r["target"]) for r in rows],
                           [{k: r[k] for k in SAMPLE_KEYS if k in r} for r in rows])
    return out
