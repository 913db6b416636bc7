"""Charts a reader can trust (issue 54): proportions on fixed 0–100 axes without offset notation, axis labels
from the one table of metric names (metrics/names.py), interval ends clipped to the metric's range, and no
point hidden under another."""
from __future__ import annotations

from pathlib import Path

import pytest

from metrics import names
from runners.common import tradeoff
from runners.report import format as fmt
from runners.report import tradeoff as tradeoff_section
from runners.report.plotting import COUNT_LEGEND, coincident, pyplot
from runners.report.runs import Run, scan
from runners.report.splitee import fidelity

from .test_report import fidelity as fidelity_results
from .test_report import write_run


def _captured(monkeypatch, module) -> list:
    """The figures `module` saves, kept open instead of written."""
    figures: list = []
    monkeypatch.setattr(module, "save", lambda fig, path: figures.append(fig))
    return figures


def test_a_flat_100_percent_series_is_drawn_at_100_on_a_0_to_100_axis_without_offset(tmp_path, monkeypatch):
    """Every run at 100 % on every metric (plus one run below, so that ε has two values): the y axis used to
    read `1e-6+9.999999e1` with ticks 4…10."""
    write_run(tmp_path, "f/ep1/1", fidelity_results("ep1", 1.0, 100.0, 100.0, 100.0))
    write_run(tmp_path, "f/ep1/5", fidelity_results("ep1", 5.0, 100.0, 100.0, 100.0))
    write_run(tmp_path, "f/t3", fidelity_results("t3", None, 100.0, 100.0, 100.0))
    (group,) = fidelity.groups(scan(tmp_path))
    figures = _captured(monkeypatch, fidelity)
    fidelity.plot(group, tmp_path / "x.png")
    (fig,) = figures
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["Exact match (%)", "Token match (%)", "BLEU", "ROUGE-L F1 (%)",
                                                 "Semantic similarity (%)"]
    for ax in panels:
        assert ax.get_ylim() == (0.0, 100.0), ax.get_title()
        assert ax.yaxis.get_offset_text().get_text() == "", ax.get_title()
        assert [t.get_text() for t in ax.get_yticklabels()][-1] == "100"
    pyplot().close(fig)


def test_crowded_epsilon_tick_labels_are_thinned(tmp_path, monkeypatch):
    """ε = 100 and 150 one beside the other on a log axis printed as "100150"."""
    for eps in (1.0, 100.0, 150.0, 1000.0):
        write_run(tmp_path, f"f/ep1/{eps:g}", fidelity_results("ep1", eps, 90.0, 80.0, 95.0))
    (group,) = fidelity.groups(scan(tmp_path))
    figures = _captured(monkeypatch, fidelity)
    fidelity.plot(group, tmp_path / "x.png")
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "100", "", "1000"]
    pyplot().close(figures[0])


def test_axis_labels_come_from_one_table_of_metric_names():
    assert names.label("exact_match") == "Exact match (%)"
    assert names.label("bleu") == "BLEU" and names.axis("bleu") == (0.0, 100.0)
    assert names.label("token_er_at_5") == "Token-ER@5 (%)"
    assert names.label("accuracy_sst2") == "Accuracy on sst2 (%)"
    assert names.label("probe_effect_pp") == "Probe effect (pp)" and names.bounds("probe_effect_pp") == (-100, 100)
    # a key the table does not know is shown under its own name, unbounded
    assert names.label("some_new_metric") == "some new metric" and names.axis("some_new_metric") is None
    # a ratio that can pass 100 gets no fixed axis and no upper clip
    assert names.axis("heldout_perplexity_ratio_pct") is None and names.clip("heldout_perplexity_ratio_pct", 90, 104) == (90, 104)


def test_interval_ends_are_clipped_to_the_metrics_range_in_tables():
    metrics = {"exact_match": 98.5, "exact_match_ci_lo": 96.23, "exact_match_ci_hi": 100.77,
               "semantic_similarity": -99.0, "semantic_similarity_ci_lo": -101.5, "semantic_similarity_ci_hi": -96.5,
               "mean_true_error": 1e-6, "mean_true_error_ci_lo": -1e-7, "mean_true_error_ci_hi": 2e-6}
    assert fmt.ci(metrics, "exact_match") == (98.5, 96.23, 100.0)
    assert fmt.fmt_ci(*fmt.ci(metrics, "exact_match")) == "98.50 [96.23, 100.00]"
    assert fmt.ci(metrics, "semantic_similarity") == (-99.0, -100.0, -96.5)      # cosine × 100 reaches −100
    assert fmt.ci(metrics, "mean_true_error") == (1e-6, -1e-7, 2e-6)             # unbounded: left as it is


def _point(rel: str, configuration: str, leak: float, utility: float, hi: float) -> Run:
    block = tradeoff(leakage_metric="token_f1", leakage=leak, leakage_ci=(leak - 2, leak + 2), attacker="Pr@5",
                     leakage_floor=10.0, utility_metric="accuracy", utility=utility, utility_ci=(utility - 5, hi),
                     reference="gold", setting="sst2")
    return Run(Path(rel), rel, "ok", {"experiment": "sanitize", "configuration": configuration, "epsilon": None,
                                      "model": "m", "tags": [], "tradeoff": block})


def test_the_privacy_utility_chart_names_coincident_points_together_and_clips_intervals(tmp_path, monkeypatch):
    """stencil and dx_noise land on the same place: one label names both (neither hides the other), and a
    utility interval reaching 100.77 % is drawn and printed to 100."""
    runs = [_point("a", "stencil", 40.0, 55.0, 60.0), _point("b", "dx_noise", 40.0, 55.0, 60.0),
            _point("c", "custext_plus", 20.0, 97.0, 100.77)]
    (chart,) = tradeoff_section.groups(runs)
    assert "97.0 [92.0, 100.0]" in tradeoff_section.table_md(chart)
    annotations: list = []
    monkeypatch.setattr(tradeoff_section, "save_axes",
                        lambda fig, ax, path, title, labels=(): annotations.append((ax, [lab.text for lab in labels])))
    tradeoff_section.plot(chart, tmp_path / "x.png")
    ((ax, texts),) = annotations
    assert sorted(texts) == ["custext_plus", "stencil, dx_noise"] or sorted(texts) == ["custext_plus", "dx_noise, stencil"]
    assert ax.get_ylim() == (0.0, 100.0) and ax.get_ylabel() == "utility kept: Accuracy (%)"
    caps = [line for line in ax.lines if len(line.get_ydata()) and max(line.get_ydata()) > 99]
    assert caps and max(max(line.get_ydata()) for line in caps) == pytest.approx(100.0)
    pyplot().close(ax.figure)


def test_coincident_points_get_a_count_and_a_legend_entry(tmp_path, monkeypatch):
    from runners.report.plotting import legend_entries, mark_coincident

    assert coincident([(1.0, 2.0), (1.04, 2.0), (3.0, 2.0)]) == [[0, 1], [2]]   # equal as the tables print them
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.errorbar([1.0, 3.0], [2.0, 4.0], yerr=1.0, label="a series")
    labels = mark_coincident(ax, [(1.0, 2.0), (1.0, 2.0), (1.0, 2.0), (3.0, 4.0)])
    assert [(lab.x, lab.y, lab.text) for lab in labels] == [(1.0, 2.0, "×3")]
    assert legend_entries(ax)[1] == ["a series", COUNT_LEGEND]     # the note last, after the series
    plt.close(fig)


def test_point_labels_stay_inside_the_axes_and_clear_of_each_other():
    """Three labels of points on the axes' bottom edge (0 %, as the k-curve's ε = 1 and epn): moving one down
    would put it under the x tick labels, so it goes up instead."""
    from runners.report.plotting import label_offsets

    anchors = [(100.0, 13.0), (102.0, 13.0), (104.0, 13.0)]   # 3 units above the axes' bottom at 10
    sizes = [(20.0, 8.0)] * 3
    dy = label_offsets(anchors, sizes, bounds=(10.0, 200.0))
    boxes = sorted((y + d, y + d + 8.0) for (_, y), d in zip(anchors, dy))
    assert all(lo >= 10.0 for lo, _ in boxes)                                   # none below the axes
    assert all(b[0] >= a[1] for a, b in zip(boxes, boxes[1:]))                  # none over another
