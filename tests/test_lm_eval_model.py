"""splitbench as an lm-eval model (runners/lm_eval_model.py): lm-eval's registry resolves it, and a local task
file runs under a SpliTEE configuration. Under `cpu` (no masks) its scores are HFLM's on the same weights;
under ep1 the scores go through the masked boundary, and differ from cpu's by floating-point error only (the
TEE removes the masks again: SpliTEE's fidelity). Under a sanitiser the contexts the model sees change, and
the identity mechanism scores what the plain engine scores; bad configurations end splitbench-lm-eval in one
line, exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from runners import lm_eval_model  # noqa: E402  (registers "splitbench")

DOCS = [{"text": "The sky is", "choices": [" blue", " green"], "label": 0},
        {"text": "Two plus two is", "choices": [" four", " seven"], "label": 0},
        {"text": "Water is", "choices": [" dry", " wet"], "label": 1},
        {"text": "Fire is", "choices": [" hot", " cold"], "label": 0}]
MODEL = "model=tiny-llama"


def _tasks(tmp_path: Path) -> list[dict]:
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)},
                                                         "cache_dir": str(tmp_path / "datasets")},
              "test_split": "test", "doc_to_text": "{{text}}"}
    choice = {**common, "task": "sb_choice", "output_type": "multiple_choice", "doc_to_choice": "{{choices}}",
              "doc_to_target": "{{label}}", "metric_list": [{"metric": "acc"}]}
    generate = {**common, "task": "sb_generate", "output_type": "generate_until", "doc_to_target": "{{choices[label]}}",
                "generation_kwargs": {"until": ["\n"], "max_gen_toks": 4, "do_sample": False},
                "metric_list": [{"metric": "exact_match"}]}
    return [choice, generate]


def _evaluate(model, tmp_path: Path) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(model=model, tasks=_tasks(tmp_path), num_fewshot=0, log_samples=True, bootstrap_iters=0,
                           task_manager=TaskManager(include_defaults=False))


def _responses(res: dict, task: str) -> list:
    return [r["resps"] for r in sorted(res["samples"][task], key=lambda r: r["doc_id"])]


def test_the_registry_resolves_splitbench() -> None:
    from lm_eval.api.registry import get_model

    assert get_model("splitbench") is lm_eval_model.SplitbenchLM


def test_the_package_declares_the_lm_eval_plugin_entry_point() -> None:
    """pyproject's `lm_eval.models` entry point (lm-eval's plug-in discovery) names the registered class."""
    import tomllib
    from importlib import import_module

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    module, _, name = project["entry-points"]["lm_eval.models"]["splitbench"].partition(":")
    assert getattr(import_module(module), name) is lm_eval_model.SplitbenchLM


def test_a_local_task_under_cpu_matches_hflm_and_ep1_changes_it(tmp_path: Path) -> None:
    from lm_eval.models.huggingface import HFLM

    plain = lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=cpu")
    ours = _evaluate(plain, tmp_path)
    hf = _evaluate(HFLM(pretrained=plain.loaded.model, tokenizer=plain.tokenizer, batch_size=1, device="cpu"),
                   tmp_path)
    assert 0.0 <= ours["results"]["sb_choice"]["acc,none"] <= 1.0
    for task in ("sb_choice", "sb_generate"):
        a, b = _responses(ours, task), _responses(hf, task)
        assert len(a) == len(DOCS)
        if task == "sb_choice":   # [[(logprob, is_greedy)] per choice] per doc
            for x, y in zip(a, b):
                assert [c[0][0] for c in x] == pytest.approx([c[0][0] for c in y], abs=1e-4)
                assert [c[0][1] for c in x] == [c[0][1] for c in y]
        else:
            assert a == b
    assert plain.engine.boundary.counters()["crossings"] == 0
    ep1 = lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=ep1,epsilon=0.01")
    masked = _evaluate(ep1, tmp_path)
    assert ep1.engine.boundary.counters()["crossings"] > 0      # every forward pass crossed, masked
    differ = [abs(x[0][0][0] - y[0][0][0]) for x, y in zip(_responses(masked, "sb_choice"),
                                                             _responses(ours, "sb_choice"))]
    # Masks of σ = Δ/0.01 are subtracted again in the TEE: what is left is rounding, not zero.
    assert 0 < max(differ) < 0.05


def test_a_bad_model_arg_is_one_user_error() -> None:
    from harness.errors import UserError

    with pytest.raises(UserError, match="unknown model_args temperature"):
        lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=cpu,temperature=1")
    with pytest.raises(UserError, match="configuration"):
        lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=nope")


def _contexts(res: dict, task: str) -> list[str]:
    return [r["arguments"][0][0] for r in sorted(res["samples"][task], key=lambda r: r["doc_id"])]


def test_a_sanitiser_changes_what_the_model_sees_and_its_identity_does_not(tmp_path: Path) -> None:
    """dχ-noise at η = 0.01 (near-uniform over the vocabulary) sanitises each context once per text: every
    option of a doc is scored after one sanitised context, and the scores move away from the plain run's. The
    same sanitiser switched to the identity mechanism scores exactly what the plain engine scores."""
    plain = _evaluate(lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=cpu"), tmp_path)
    lm = lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=dx_noise,epsilon=0.01,seed=3")
    assert lm.engine.settings.configuration in ("cpu", "gpu")      # the plain engine: the sanitiser is client-side
    noisy = _evaluate(lm, tmp_path)
    # lm-eval logs the template's context; what the model saw is the view of it, the same for every option.
    seen = {text: lm.view(text) for text in _contexts(noisy, "sb_choice")}
    assert all(seen[t] != t for t in seen)
    assert lm.view.seen == {**lm.view.seen, **seen} and len(lm.view.seen) == len(DOCS)   # one per context text
    scores = [[c[0][0] for c in x] for x in _responses(noisy, "sb_choice")]
    base = [[c[0][0] for c in x] for x in _responses(plain, "sb_choice")]
    assert max(abs(a - b) for x, y in zip(scores, base) for a, b in zip(x, y)) > 1e-3
    # Deterministic per (seed, text): a fresh model with the same seed sanitises the same way.
    again = lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=dx_noise,epsilon=0.01,seed=3")
    assert {t: again.view(t) for t in seen} == seen

    from harness.lm_eval_lm import SanitizedContexts
    from harness.sanitize.mechanisms import IDENTITY

    lm.view = SanitizedContexts(lm.view.sanitize.with_mechanism(IDENTITY), lm.tokenizer, 3)
    same = _evaluate(lm, tmp_path)
    for task in ("sb_choice", "sb_generate"):
        assert _responses(same, task) == _responses(plain, task)


def test_splitbench_lm_eval_refuses_bad_configurations_in_one_line(tmp_path: Path, splitbench_lm_eval) -> None:
    """`splitbench-lm-eval` (its main(), in this process: conftest's splitbench_lm_eval) on each bad configuration."""
    (tmp_path / "task.yaml").write_text(json.dumps(_tasks(tmp_path)[0]))
    for args, message, model, task in (
            (f"{MODEL},configuration=nope", "nope", "splitbench", "sb_choice"),
            (f"{MODEL},configuration=custext_plus", "needs its privacy parameter", "splitbench", "sb_choice"),
            # issue 54: lm-eval's own refusals were its 17-line tracebacks
            (f"{MODEL},configuration=cpu", "Tasks not found: nope_task", "splitbench", "nope_task"),
            (MODEL, "plain `lm_eval --model splitbench` cannot find it: lm-eval does not load plug-in entry points",
             "splitbnech", "sb_choice")):
        proc = splitbench_lm_eval(["splitbench-lm-eval", "--model", model, "--model_args", args, "--include_path",
                                   str(tmp_path), "--tasks", task, "--output_path", str(tmp_path / "out")],
                                  env={"OMP_NUM_THREADS": "1"})
        assert proc.returncode == 2, proc.stderr[-2000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("splitbench: error:")]
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in proc.stderr
        assert not (tmp_path / "out").exists()


def test_batch_size_in_model_args_is_the_batch_size() -> None:
    """Issue 54: lm-eval passes its --batch_size (1 by default) beside model_args, and `batch_size=2` in model_args
    was a TypeError (multiple values for batch_size). model_args says what the user meant."""
    lm = lm_eval_model.SplitbenchLM.create_from_arg_string(f"{MODEL},configuration=cpu,batch_size=2",
                                                           {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"})
    assert lm.batch_size == 2
    lm = lm_eval_model.SplitbenchLM.create_from_arg_obj({"model": "tiny-llama", "configuration": "cpu"},
                                                        {"batch_size": 3})
    assert lm.batch_size == 3


def test_help_says_plain_lm_eval_cannot_find_the_model(monkeypatch, capsys) -> None:
    import sys

    monkeypatch.setattr(sys, "argv", ["splitbench-lm-eval", "--help"])
    with pytest.raises(SystemExit) as exit_:
        lm_eval_model.main()
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Plain `lm_eval --model splitbench` cannot find it: lm-eval 0.4 looks models up in its own registry only " \
           "and does not load plug-in entry points" in text


def test_run_folders_are_named_by_configuration_and_epsilon() -> None:
    folder = lm_eval_model._run_folder
    assert folder("out", {"model": "tiny-llama", "configuration": "ep1", "epsilon": 5}) == \
        "out/tiny-llama/ep1/eps=5/results.json"
    assert folder("out", {"model": "tiny-llama", "configuration": "ep1", "epsilon": 0.5}) == \
        "out/tiny-llama/ep1/eps=0.5/results.json"
    assert folder("out", {"model": "tiny-llama", "configuration": "cpu", "epsilon": 5}) == \
        "out/tiny-llama/cpu/eps=na/results.json"
    assert folder("out", {}) == "out/smollm2-135m/ep1/eps=na/results.json"


def test_a_run_records_its_real_device_commit_and_folder_quietly(tmp_path: Path) -> None:
    """Issue 54: results recorded lm-eval's --device default (cuda:0 on a CPU machine) and git_hash null, every
    configuration of a model shared one folder, epsilon=5 under cpu passed without the main CLI's note,
    `fatal: not a git repository` printed outside a checkout, and bars drew into a pipe. Run from a folder that
    is no git checkout, stderr a pipe."""
    import os
    import re
    import subprocess
    import sys

    from harness.devices import describe_device
    from harness.provenance import git_state

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "task.yaml").write_text(json.dumps(_tasks(tmp_path)[0]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    env.pop("TQDM_DISABLE", None)
    env.pop("SPLITBENCH_PROGRESS", None)
    proc = subprocess.run([sys.executable, "-m", "runners.lm_eval_model", "run", "--model", "splitbench",
                           "--model_args", f"{MODEL},configuration=cpu,epsilon=5,batch_size=2",
                           "--include_path", str(tmp_path), "--tasks", "sb_choice", "--output_path",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "splitbench: note: configuration cpu ignores epsilon, so epsilon=5 is the same run" in proc.stderr
    assert "fatal:" not in proc.stderr and not re.search(r"\d+%\||\d+/\d+ \[", proc.stderr), proc.stderr
    (results,) = (tmp_path / "out" / "tiny-llama" / "cpu" / "eps=na").glob("results_*.json")
    record = json.loads(results.read_text())
    import torch

    assert record["config"]["device"] == describe_device(torch.device("cpu"))
    assert record["config"]["batch_size"] == 2 == record["config"]["splitbench"]["batch_size"]
    assert record["git_hash"] == git_state()["commit"] is not None
    assert record["config"]["splitbench"]["configuration"] == "cpu"
    assert record["config"]["splitbench"]["epsilon"] is None   # cpu ignores it
