"""The cross-system privacy–utility chart (runners/report/tradeoff.py) over results.json `tradeoff` blocks."""
from __future__ import annotations

from pathlib import Path

from runners.common import tradeoff
from runners.report import tradeoff as section
from runners.report.plotting import Figures
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
                        point="L=5 σ=1.25")
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
    assert ("| splitee | ep1 ε=1 | 20.0 [19.0, 21.0] | token_f1 · learned inverter | 5.0 | 80.0 [78.0, 82.0] | "
            "semantic_similarity vs cpu |") in md
    assert "Not drawn (one half not measured yet): ep1 ε=5." in md
    assert len(figures.written) == 1 and figures.written[0].read_bytes()[:8] == PNG_MAGIC
    assert section.summary(section.groups(runs)) == ["privacy–utility: 1 point(s) with both halves across 1 chart(s)"]


def test_a_run_without_a_tradeoff_block_is_not_a_point():
    assert section.groups([Run(Path("x"), "x", "ok", {"experiment": "timing", "model": "m"})]) == []
