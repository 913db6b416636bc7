"""benchmarks/rounds.py: the rotated rounds every benchmark times its arms in (never a timed assertion)."""
from __future__ import annotations

import pytest

from benchmarks.rounds import median_range, round_ratios, rotated, run_rounds


def test_rounds_rotate_the_order_and_pair_times_by_round():
    assert [rotated(["a", "b", "c"], r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                               ["a", "b", "c"]]
    calls, clock = [], iter([1.0, 2.0, 3.0, 6.0])   # round 0: a, b; round 1: b, a

    def arm(name):
        return lambda: calls.append(name) or next(clock)

    logged = []
    times = run_rounds({"a": arm("a"), "b": arm("b")}, 2, log=lambda r, n, s: logged.append((r, n, s)))
    assert calls == ["a", "b", "b", "a"]
    assert times == {"a": [1.0, 6.0], "b": [2.0, 3.0]} and logged[2] == (1, "b", 3.0)
    assert round_ratios(times, "a", "b") == [0.5, 2.0]
    assert median_range([0.5, 2.0, 1.0]) == (1.0, 0.5, 2.0)
    with pytest.raises(ValueError):
        round_ratios({"a": [1.0], "b": []}, "a", "b")   # unequal rounds are a bug, not a shorter zip


def test_emit_prints_the_report_and_writes_it_as_is(tmp_path, capsys):
    from benchmarks.rounds import emit

    out = tmp_path / "docs" / "benchmarks" / "report.md"   # parents do not exist yet
    emit("| a | b |\n", out)
    assert capsys.readouterr().out == "| a | b |\n\n"
    assert out.read_bytes() == b"| a | b |\n"
    assert [p.name for p in out.parent.iterdir()] == ["report.md"]   # no temp file left beside it
    emit("only printed", None)
    assert capsys.readouterr().out == "only printed\n"
