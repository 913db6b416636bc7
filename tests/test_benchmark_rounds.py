"""benchmarks/rounds.py: the rotated rounds every benchmark times its arms in (never a timed assertion), and
benchmarks/exact_product.py's report, benchmarks/splitft_grad_norms.py's line."""
from __future__ import annotations

import pytest

from benchmarks.rounds import median_range, round_ratios, run_rounds
from harness.splitee.rotation import rotated


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


def test_exact_product_benchmark_reports_every_row_count_and_that_both_kernels_agree(tmp_path, monkeypatch, capsys):
    """benchmarks/exact_product.py on the tiny model: a row per row count, the kernels' integers equal
    (the timing columns are only printed, never asserted)."""
    import sys

    from benchmarks import exact_product

    out = tmp_path / "exact.md"
    monkeypatch.setattr(sys, "argv", ["exact_product", "--model", "tiny-llama-4l", "--rows", "1,3", "--rounds", "1",
                                      "--threads", "1", "--out", str(out)])
    exact_product.main()
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| 1 |", "| 3 |"))]
    assert len(rows) == 2 and all(line.endswith("| yes |") for line in rows)
    assert "INT8_MAX_ROWS" in text and "--model tiny-llama-4l" in text


def test_grad_norms_benchmark_leaves_out_the_last_position_and_orders_its_quantiles(monkeypatch, capsys):
    """benchmarks/splitft_grad_norms.py on the tiny model: every row it reports has a non-zero norm (the
    last position's row, which no label reads, is exactly 0 and left out) and the quantiles are ordered."""
    import re
    import sys

    from benchmarks import splitft_grad_norms

    monkeypatch.setattr(sys, "argv", ["splitft_grad_norms", "--model", "tiny-llama-4l", "--batch", "2", "--tokens", "8"])
    splitft_grad_norms.main()
    line = capsys.readouterr().out.strip()
    assert line.startswith("tiny-llama-4l k=1 m=2 batch 2x8: rows of dL/ds'_B"), line
    values = [float(v) for v in re.findall(r"(?:min|10%|median|90%|max) ([0-9.e+-]+)", line)]
    assert len(values) == 5 and 0 < values[0] and values == sorted(values), line


def test_bisr_guard_benchmark_prints_a_row_per_setting_and_reads_the_clipped_gradient(monkeypatch, capsys):
    """benchmarks/splitft_bisr.py --guard on the tiny model: one table row per f:z; with the clip alone
    BiSR(b) (both losses: they differ only under noise) reads the labels the decoding does not."""
    import sys

    from benchmarks import splitft_bisr

    monkeypatch.setattr(sys, "argv", ["splitft_bisr", "--model", "tiny-llama-4l", "--tokens", "24", "--cuts=",
                                      "--backward=", "--guard", "0.15:0,0.15:1"])
    splitft_bisr.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.15 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["0", "1"]
    start, map_f1, plain_f1 = (float(cell.split()[0]) for cell in rows[0].split("|")[3:6])
    assert map_f1 == plain_f1 > 90.0 > start + 30.0


def test_a_benchmark_given_an_unknown_model_exits_with_one_line_and_code_2(capsys):
    from benchmarks.models import load_named_model

    with pytest.raises(SystemExit) as stopped:
        load_named_model("no-such-model")
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("benchmarks: error: unknown model 'no-such-model'")
    assert "smollm2-135m" in err[0] and "tiny-llama" in err[0]    # the names conf/model has


def test_verdict_against_an_upper_target():
    from benchmarks.rounds import verdict

    assert verdict(0.99, 1.02, 1.03) == "met"
    assert verdict(0.99, 1.03, 1.03) == "met"            # the bound itself is within the target
    assert verdict(1.031, 1.2, 1.03) == "not met"
    assert verdict(1.03, 1.2, 1.03) == "cannot tell"     # lower bound on the target: not above it
    assert verdict(1.01, 1.05, 1.03) == "cannot tell"
    with pytest.raises(ValueError):
        verdict(1.1, 1.0, 1.03)


def test_paired_log_ratio_cancels_what_slows_both_arms():
    """A machine that slows both arms of a round alike (factors 1..8) leaves the paired ratio exact, where the
    ratio of the arms' mean times would not be; the interval is Student t on the log-ratios."""
    import math

    from scipy import stats

    from benchmarks.rounds import paired_log_ratio

    load = [1, 3, 8, 2, 5]
    a, b = [1.1 * f for f in load], [1.0 * f for f in load]
    exact = paired_log_ratio(a, b)
    assert math.isclose(exact.ratio, 1.1) and math.isclose(exact.lo, 1.1) and math.isclose(exact.hi, 1.1)
    logs = [0.0, 0.1, -0.05, 0.2]
    r = paired_log_ratio([math.exp(x) for x in logs], [1.0] * 4)
    m, s = sum(logs) / 4, (sum((x - sum(logs) / 4) ** 2 for x in logs) / 3) ** 0.5
    half = stats.t.ppf(0.975, 3) * s / 2
    assert math.isclose(r.ratio, math.exp(m)) and math.isclose(r.lo, math.exp(m - half))
    assert math.isclose(r.hi, math.exp(m + half)) and r.n == 4
    with pytest.raises(ValueError):
        paired_log_ratio([1.0], [])


def test_ceiling_counts_a_prompts_matmul_flops_by_hand_and_runs_on_a_tiny_model():
    """benchmarks/ceiling.py (issue 50): the prefill FLOP count against the tiny Llama's layers written out, and
    each ceiling returns a rate (no timing is asserted)."""
    import torch

    from benchmarks.ceiling import decode_tokens_per_second, matmul_gflops, prefill_flops, prefill_gflops
    from harness.models import load_model, model_entry

    model = load_model(model_entry("tiny-llama")).model    # hidden 64, 2 layers, 4 heads of 16, 2 kv heads, MLP 128
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128            # q, k and v, o, gate, up and down
    tokens = 10
    expected = 2 * 2 * per_layer * tokens + 2 * 49152 * 64 + 2 * 2 * tokens * tokens * 4 * 16
    assert prefill_flops(model, tokens) == expected
    assert matmul_gflops(size=64, repeats=1) > 0
    before = torch.get_num_threads()
    assert matmul_gflops(size=64, repeats=1, threads=1) > 0 and torch.get_num_threads() == before
    assert decode_tokens_per_second(model, 2, prompt_tokens=4, new_tokens=2, repeats=1) > 0
    assert prefill_gflops(model, tokens=8, repeats=1) > 0
