"""The cross-system privacy–utility chart (runners/report/tradeoff.py) over results.json `tradeoff` blocks."""
from __future__ import annotations

from pathlib import Path

import pytest

from runners.common import tradeoff
from runners.report import tradeoff as section
from runners.report.plotting import Figures, label_offsets
from runners.report.runs import Run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(rel: str, configuration: str, epsilon: float | None, block: dict, *, experiment: str = "fidelity",
         model: str = "smollm2-135m", tags: tuple[str, ...] = (), state: str = "ok") -> Run:
    return Run(Path(rel), rel, state, {"experiment": experiment, "configuration": configuration, "epsilon": epsilon,
                                       "model": model, "tags": list(tags), "tradeoff": block})


def _utility(value: float, lo: float, hi: float) -> dict:
    return tradeoff(utility_metric="semantic_similarity", utility=value, utility_ci=(lo, hi), reference="cpu")


def _leakage(value: float, floor: float = 5.0) -> dict:
    return tradeoff(leakage_metric="token_f1", leakage=value, leakage_ci=(value - 1, value + 1),
                    attacker="learned inverter", leakage_floor=floor)


def test_halves_join_per_configuration_and_parameter_with_the_worst_of_each():
    runs = [
        _run("f/ep1/1", "ep1", 1.0, _utility(80.0, 78.0, 82.0)),
        _run("f/ep1/1b", "ep1", 1.0, _utility(70.0, 68.0, 72.0)),        # a second fidelity run: lower utility wins
        _run("a/ep1/1/qkv", "ep1", 1.0, _leakage(20.0), experiment="attack"),
        _run("a/ep1/1/o", "ep1", 1.0, _leakage(35.0), experiment="attack"),   # the stronger attacker wins
        _run("f/ep1/5", "ep1", 5.0, _utility(95.0, 94.0, 96.0)),              # another ε: another point, no leakage
        _run("f/t3", "t3", None, _utility(100.0, 100.0, 100.0)),
        _run("a/t3", "t3", None, _leakage(90.0), experiment="attack"),
        _run("f/failed", "t3", None, _utility(1.0, 0.0, 2.0), state="failed"),   # unfinished runs never count
        _run("s/smoke", "t3", None, _utility(3.0, 2.0, 4.0), tags=("smoke",)),   # another chart
    ]
    charts = section.groups(runs)
    assert [(c.tags, c.model, c.metric) for c in charts] == [((), "smollm2-135m", "semantic_similarity"),
                                                            (("smoke",), "smollm2-135m", "semantic_similarity")]
    chart = charts[0]
    points = {p.label: p for p in chart.points}
    assert set(points) == {"ep1 ε=1", "ep1 ε=5", "t3"}
    assert chart.utility(points["ep1 ε=1"])["value"] == 70.0 and points["ep1 ε=1"].leakage["value"] == 35.0
    assert chart.complete(points["ep1 ε=1"]) and chart.complete(points["t3"]) and not chart.complete(points["ep1 ε=5"])
    assert chart.utility(points["t3"])["value"] == 100.0 and points["ep1 ε=1"].system == "splitee"


def test_one_chart_per_utility_metric_and_points_told_apart_by_their_label():
    accuracy = tradeoff(utility_metric="accuracy", utility=60.0, utility_ci=(50.0, 70.0), reference="gold",
                        leakage_metric="token_f1", leakage=30.0, leakage_ci=(25.0, 35.0), attacker="Pr@5",
                        leakage_floor=10.0, point="L=5 σ=1.25")
    runs = [
        _run("s/l5", "stencil", None, accuracy, experiment="sanitize"),
        _run("s/l4", "stencil", None, {**accuracy, "point": "L=4 σ=1.25"}, experiment="sanitize"),
        _run("f/l5", "stencil", None, {**_utility(90.0, 89.0, 91.0), "point": "L=5 σ=1.25"}),
        _run("a/only", "t3", None, _leakage(80.0), experiment="attack"),
    ]
    charts = {c.metric: c for c in section.groups(runs)}
    assert set(charts) == {"accuracy", "semantic_similarity", ""}
    assert [p.label for p in charts["accuracy"].points] == ["stencil L=4 σ=1.25", "stencil L=5 σ=1.25"]
    (sim,) = charts["semantic_similarity"].points        # the L=5 point: its fidelity run and its attack
    assert sim.label == "stencil L=5 σ=1.25" and sim.system == "sanitize" and charts["semantic_similarity"].complete(sim)
    assert [p.label for p in charts[""].points] == ["t3"]   # leakage without any utility: listed only


def test_markdown_draws_complete_points_and_lists_the_rest(tmp_path):
    runs = [_run("f", "ep1", 1.0, _utility(80.0, 78.0, 82.0)), _run("a", "ep1", 1.0, _leakage(20.0), experiment="attack"),
            _run("f5", "ep1", 5.0, _utility(95.0, 94.0, 96.0))]
    figures = Figures(tmp_path)
    md = "\n".join(section.markdown(section.groups(runs), figures))
    assert ("| splitee | ep1 ε=1 | 20.0 [19.0, 21.0] | token_f1 · learned inverter | 5.0 | +15.0 | 80.0 [78.0, 82.0] | "
            "semantic_similarity vs cpu |") in md
    assert "Not drawn (one half not measured yet): ep1 ε=5." in md
    assert len(figures.written) == 1 and figures.written[0].read_bytes()[:8] == PNG_MAGIC
    assert section.summary(section.groups(runs)) == ["privacy–utility: 1 point(s) with both halves across 1 chart(s)"]


def test_point_labels_that_would_overlap_are_stacked_and_the_rest_stay_put():
    """ep1 at ε = 100 and 1000 sit one point apart on the chart: their labels printed over each other."""
    anchors = [(100.0, 50.0), (102.0, 51.0), (300.0, 50.0)]
    sizes = [(40.0, 8.0)] * 3
    dy = label_offsets(anchors, sizes)
    assert dy[1] == 0.0 and dy[2] == 0.0                   # the higher one and the far one are not moved
    lower_top = anchors[0][1] + 8.0 + dy[0]
    assert lower_top <= anchors[1][1] - 1.0 + 1e-9         # the other clears the first one's box


def test_a_run_without_a_tradeoff_block_is_not_a_point():
    assert section.groups([Run(Path("x"), "x", "ok", {"experiment": "timing", "model": "m"})]) == []


# ---------------------------------------------------------------------------------------------------
# One benchmark and mode per point (issue 34, item 4)
# ---------------------------------------------------------------------------------------------------


def _collab(root: Path, bench: str, fusion: str, configuration: str, epsilon: float | None, leak: float,
            utility: float, *, alpha: float = 0.3, candidates: int | None = None, legacy: bool = False) -> None:
    """A collab results.json as runners/collab.py writes it (the tradeoff block through the same helpers); with
    `legacy`, as runs from before `tradeoff.setting` wrote it (no setting, no point)."""
    import json

    from harness.collab import config as collab_config

    metric, reference = ("accuracy", "gold answer") if bench == "pubmedqa" else ("rouge_l", "reference response")
    block = tradeoff(leakage_metric="token_er_at_100", leakage=leak, leakage_ci=(leak - 5, leak + 5),
                     attacker="decodeleak", leakage_floor=60.0, utility_metric=metric, utility=utility,
                     utility_ci=(utility - 9, utility + 9), reference=reference,
                     setting=collab_config.tradeoff_setting(bench, fusion, alpha, "smollm2-135m", "smollm2-135m"),
                     point=collab_config.tradeoff_point(configuration, candidates, False))
    if legacy:
        block = {k: v for k, v in block.items() if k != "setting"} | {"point": None}
    run = root / f"collab/{configuration}/{bench}_{fusion}_{alpha:g}_{epsilon}_{'legacy' if legacy else 'new'}"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({
        "experiment": "collab", "status": "ok", "system": "collab", "configuration": configuration, "epsilon": epsilon,
        "model": "smollm2-135m", "cloud_model": "smollm2-135m", "tags": [], "fusion": fusion, "alpha": alpha,
        "candidates": candidates, "benchmark": {"name": bench}, "tradeoff": block}))
    (run / ".done").write_bytes(b"")


@pytest.mark.parametrize("legacy", [False, True])
def test_collab_points_never_join_across_benchmarks_modes_or_alpha(tmp_path, legacy):
    """Runs of two benchmarks × two fusion modes (and the edge alone at α = 0) of one defence and parameter:
    every point is one run, its leakage and utility that run's own, labelled with its benchmark and mode;
    Dolly's points only on the ROUGE-L chart, PubMedQA's only on the accuracy chart."""
    from runners.report.runs import scan

    values = {("dolly", "cloud"): (90.0, 28.0), ("dolly", "edge"): (80.0, 25.0),
              ("pubmedqa", "cloud"): (70.0, 33.0), ("pubmedqa", "edge"): (75.0, 40.0)}
    for (bench, fusion), (leak, util) in values.items():
        _collab(tmp_path, bench, fusion, "collab_none", None, leak, util, legacy=legacy)
        _collab(tmp_path, bench, fusion, "coveil", 1.0, leak - 20, util - 5, candidates=100, legacy=legacy)
    _collab(tmp_path, "dolly", "cloud", "collab_none", None, 99.0, 1.0, alpha=0.0, legacy=legacy)   # Table A2's ablation
    charts = {c.metric: c for c in section.groups(scan(tmp_path))}
    assert set(charts) == {"accuracy", "rouge_l"}
    for metric, bench in (("rouge_l", "dolly"), ("accuracy", "pubmedqa")):
        chart = charts[metric]
        assert all(len(p.runs) == 1 and p.setting.startswith(f"{bench} · ") for p in chart.points), metric
        for fusion in ("cloud", "edge"):
            leak, util = values[(bench, fusion)]
            (none,) = [p for p in chart.points if p.configuration == "collab_none"
                       and p.setting == f"{bench} · {fusion}-side · α=0.3"]
            assert (none.leakage["value"], chart.utility(none)["value"]) == (leak, util)
            (coveil,) = [p for p in chart.points if p.configuration == "coveil" and f"{fusion}-side" in p.setting]
            assert (coveil.leakage["value"], chart.utility(coveil)["value"]) == (leak - 20, util - 5)
            assert coveil.label == "coveil λ=1 |C|=100" and coveil.series == f"collab · {bench} · {fusion}-side · α=0.3"
    (alone,) = [p for p in charts["rouge_l"].points if p.setting.endswith("α=0")]
    assert (alone.leakage["value"], charts["rouge_l"].utility(alone)["value"]) == (99.0, 1.0)
    # The table's first column names the benchmark and mode; the chart draws one series per setting.
    md = "\n".join(section.markdown(list(charts.values()), Figures(tmp_path / "report")))
    assert "| collab · dolly · edge-side · α=0.3 | collab_none | 80.0 [75.0, 85.0] |" in md
    assert r"| collab · pubmedqa · cloud-side · α=0.3 | coveil λ=1 \|C\|=100 | 50.0 [45.0, 55.0] |" in md
    accuracy, rouge = md.split("### privacy–utility")[1:]
    assert "utility = accuracy" in accuracy and "dolly" not in accuracy and "pubmedqa" not in rouge


def test_sanitiser_points_split_by_task_set_and_the_fidelity_run_joins_each(tmp_path):
    """Two sanitise runs of one mechanism on two lm-eval task sets are two points; the mechanism's fidelity run
    (no setting: semantic similarity on the workload's prompts) joins both."""
    from harness.sanitize.config import tradeoff_setting

    def sanitize(tasks: list[str], leak: float, acc: float) -> dict:
        return tradeoff(utility_metric="accuracy", utility=acc, utility_ci=(acc - 5, acc + 5), reference="gold",
                        leakage_metric="token_f1", leakage=leak, leakage_ci=(leak - 2, leak + 2), attacker="Pr@5",
                        point="L=5 σ=1.25", setting=tradeoff_setting(tasks))

    runs = [_run("s/sst2", "stencil", None, sanitize(["sst2"], 30.0, 80.0), experiment="sanitize"),
            _run("s/csqa", "stencil", None, sanitize(["commonsense_qa"], 31.0, 20.0), experiment="sanitize"),
            _run("f", "stencil", None, {**_utility(90.0, 89.0, 91.0), "point": "L=5 σ=1.25"})]
    charts = {c.metric: c for c in section.groups(runs)}
    acc = {p.setting: p for p in charts["accuracy"].points}
    assert {s: (p.leakage["value"], p.utilities["accuracy"]["value"]) for s, p in acc.items()} == {
        "tasks sst2": (30.0, 80.0), "tasks commonsense_qa": (31.0, 20.0)}
    sim = charts["semantic_similarity"].points
    assert sorted((p.setting, p.leakage["value"]) for p in sim) == [("tasks commonsense_qa", 31.0), ("tasks sst2", 30.0)]
    assert all(sorted(p.runs) == sorted(["f", f"s/{'sst2' if 'sst2' in p.setting else 'csqa'}"]) for p in sim)


def test_split_ft_points_split_by_data_and_split(tmp_path):
    """Split fine-tuning runs of one configuration on two data sets, and from before `setting` (read from their
    own workload and split), never join."""
    from harness.splitft.config import tradeoff_setting

    split = {"k": 2, "m": 2, "n_clients": 2, "lora": True}

    def block(leak: float, top1: float, workload: str | None) -> dict:
        b = tradeoff(utility_metric="heldout_top1", utility=top1, utility_ci=(top1 - 1, top1 + 1), reference="held-out",
                     leakage_metric="token_f1", leakage=leak, leakage_ci=(leak - 1, leak + 1), attacker="splitft_x",
                     setting=None if workload is None else tradeoff_setting(workload, split))
        return b if workload is not None else {k: v for k, v in b.items() if k != "setting"}

    def run(rel: str, leak: float, top1: float, workload: str, legacy: bool) -> Run:
        r = _run(rel, "privpair", 1.0, block(leak, top1, None if legacy else workload), experiment="splitft")
        r.data.update(system="splitft", workload=workload, split=split)
        return r

    runs = [run("a", 40.0, 30.0, "splitft:text", False), run("b", 60.0, 10.0, "splitft:jsonl", False),
            run("c", 41.0, 31.0, "splitft:text", True)]     # an older run of a's setting: joins a, not b
    (chart,) = section.groups(runs)
    got = {p.setting: (sorted(p.runs), p.leakage["value"], chart.utility(p)["value"]) for p in chart.points}
    assert got == {"splitft:text · k=2 m=2 · 2 clients · LoRA": (["a", "c"], 41.0, 30.0),
                   "splitft:jsonl · k=2 m=2 · 2 clients · LoRA": (["b"], 60.0, 10.0)}


def _attack_block(learned: float, bayes: float) -> dict:
    """An attack run's tradeoff (runners/splitee/attack.py) as its runner writes it from these metrics."""
    from runners.splitee import attack

    m = {"token_f1": learned, "token_f1_ci_lo": learned - 2, "token_f1_ci_hi": learned + 2,
         "chance_floor_token_f1": 24.9, "bayes_token_f1": bayes, "bayes_token_f1_ci_lo": bayes - 1,
         "bayes_token_f1_ci_hi": bayes + 1, "bayes_token_f1_chance": 6.0}
    return attack._tradeoff(m, {"component": "qkv", "layer": 0})


def _sequential_block(map_f1: float, prior_f1: float) -> dict:
    """A sequential_attack run's tradeoff (runners/splitee/sequential_attack.py) as its runner writes it from
    these metrics: MAP judged against the prior alone, the chart script's settings (no null view)."""
    from attacks.splitee import sequential as sq
    from runners.splitee import sequential_attack

    s = sq.Settings(mode="teacher_forced", prior="model", layers=None, ops=sq.OPS, prune=((0, 2048), (1, 256)),
                    prune_prior=None, prune_union_prior=None, positions="text", max_positions=12, null_view=False,
                    map_reference="prior", chunk=512, min_pruning_recall=0.99, pruning_rule="recall")
    m = {"sequential_token_f1": map_f1 / 2, "sequential_token_f1_ci_lo": 0.0, "sequential_token_f1_ci_hi": map_f1,
         "sequential_map_token_f1": map_f1, "sequential_map_token_f1_ci_lo": map_f1 - 3,
         "sequential_map_token_f1_ci_hi": map_f1 + 3, "prior_token_f1": prior_f1,
         "prior_token_f1_ci_lo": prior_f1 - 3, "prior_token_f1_ci_hi": prior_f1 + 3}
    return sequential_attack._tradeoff(m, s, tuple(range(30)), 30)


def test_the_sequential_attacker_competes_with_the_attack_runs_of_its_configuration():
    """A sequential_attack run joins the point of its configuration's attack and fidelity runs (t3 and epn carry
    no ε whatever each runner was given, ep1 joins by ε), and is the point's leakage exactly where its token F1
    is the highest: ep1 ε=1 and epn take the sequential MAP with the prior's floor, t3 and ep1 ε=100 keep the
    attack run's attacker."""
    from harness.configurations import effective_epsilon

    runs = []
    #               configuration, attack run's ε, sequential run's ε, learned, Bayes, MAP, prior
    for conf, eps_a, eps_s, learned, bayes, map_f1, prior in (("t3", 1.0, 15.0, 94.2, 100.0, 99.0, 30.0),
                                                              ("ep1", 1.0, 1.0, 11.7, 6.0, 31.0, 30.0),
                                                              ("ep1", 100.0, 100.0, 21.0, 63.7, 50.0, 30.0),
                                                              ("epn", 1.0, 15.0, 11.5, 6.0, 29.0, 28.0)):
        tag = f"{conf}/{eps_s:g}"
        runs += [_run(f"f/{tag}", conf, effective_epsilon(conf, eps_s), _utility(99.0, 98.0, 100.0)),
                 _run(f"a/{tag}", conf, effective_epsilon(conf, eps_a), _attack_block(learned, bayes),
                      experiment="attack"),
                 _run(f"s/{tag}", conf, effective_epsilon(conf, eps_s), _sequential_block(map_f1, prior),
                      experiment="sequential_attack")]
    (chart,) = section.groups(runs)
    points = {p.label: p for p in chart.points}
    assert set(points) == {"t3", "ep1 ε=1", "ep1 ε=100", "epn"}
    assert all(len(p.runs) == 3 and chart.complete(p) for p in points.values())
    sequential = "sequential MAP (qkv/o/gate_up, every layer; first 12 text tokens)"
    for label, attacker, value, floor in (("t3", "Bayes attacker (qkv layer 0)", 100.0, 6.0),
                                          ("ep1 ε=1", sequential, 31.0, 30.0),
                                          ("ep1 ε=100", "Bayes attacker (qkv layer 0)", 63.7, 6.0),
                                          ("epn", sequential, 29.0, 28.0)):
        leak = points[label].leakage
        assert (leak["attacker"], leak["value"], leak["floor"]) == (attacker, value, floor), label
    assert f"| splitee | epn | 29.0 [26.0, 32.0] | token_f1 · {sequential} | 28.0 | +1.0 |" in section.table_md(chart)


def test_the_strongest_attacker_is_the_largest_excess_over_its_own_floor_not_the_highest_score(tmp_path):
    """The sequential MAP attacker's floor is the victim model's prior, which alone names many tokens: MAP at
    40 over a prior of 39 read 1 point, a Bayes attacker at 30 over its floor of 6 read 24. The point takes the
    Bayes attacker (the highest score would take MAP), and its x is the excess; an attacker without a floor is
    listed, not drawn."""
    runs = [_run("f/ep1", "ep1", 15.0, _utility(99.0, 98.0, 100.0)),
            _run("a/ep1", "ep1", 15.0, _attack_block(11.0, 30.0), experiment="attack"),
            _run("s/ep1", "ep1", 15.0, _sequential_block(40.0, 39.0), experiment="sequential_attack"),
            _run("f/t3", "t3", None, _utility(100.0, 100.0, 100.0)),
            _run("a/t3", "t3", None, tradeoff(leakage_metric="token_f1", leakage=50.0, leakage_ci=(49.0, 51.0),
                                              attacker="floorless"), experiment="attack")]
    (chart,) = section.groups(runs)
    points = {p.label: p for p in chart.points}
    leak = points["ep1 ε=15"].leakage
    assert (leak["attacker"], leak["value"], leak["floor"]) == ("Bayes attacker (qkv layer 0)", 30.0, 6.0)
    assert section.excess(leak) == 24.0 and chart.complete(points["ep1 ε=15"])
    assert not chart.complete(points["t3"])
    figures = Figures(tmp_path)
    md = "\n".join(section.markdown([chart], figures))
    assert "| splitee | ep1 ε=15 | 30.0 [29.0, 31.0] | token_f1 · Bayes attacker (qkv layer 0) | 6.0 | +24.0 |" in md
    assert "Not drawn (the attacker has no no-signal floor, so no excess): t3." in md
    assert len(figures.written) == 1


def test_an_attack_run_offers_the_attacker_with_the_larger_excess_over_its_own_floor():
    """The learned inverter's floor (an unrelated prompt's F1, 24.9 here) is far above the Bayes attacker's
    (6.0): learned 30 (+5.1) against Bayes 20 (+14.0) must offer Bayes, though its raw F1 is lower; with
    Bayes at its floor the learned inverter's +5.1 wins."""
    block = _attack_block(30.0, 20.0)
    assert (block["leakage"]["attacker"], block["leakage"]["value"]) == ("Bayes attacker (qkv layer 0)", 20.0)
    assert block["leakage"]["floor"] == 6.0
    block = _attack_block(30.0, 6.0)
    assert (block["leakage"]["attacker"], block["leakage"]["value"]) == ("learned inverter (qkv layer 0)", 30.0)
