"""The flow-control benchmarks' arithmetic (bench/flow.py) and their lines in the report."""

from __future__ import annotations

from bench.common import entry
from bench.flow import max_in_window, rate_figures
from bench.render import markdown
from bench.run import QUICK


def test_max_in_window_is_half_open():
    assert max_in_window([]) == 0
    assert max_in_window([0, 999]) == 2
    assert max_in_window([0, 1000]) == 1  # 1,000 ms apart: never in one 1 s window
    assert max_in_window([0, 500, 1000, 1400, 1499, 2600]) == 4  # 500..1499


def test_rate_figures_at_the_limit_with_a_burst():
    # 20 at once (the burst), then 200/s for 10 s: 2,020 starts over 10 s.
    starts = [0] * 20 + [5 * i for i in range(1, 2001)]
    r = rate_figures(starts, 200.0, 20.0)
    assert r["starts"] == 2020 and r["span_s"] == 10.0
    assert r["ratio"] == 1.01 and r["observed_per_s"] == 202.0
    assert r["max_in_1s"] == 20 + 199  # the burst and the next 999 ms
    assert r["per_second"][:2] == [219, 200] and sum(r["per_second"]) == 2020


def test_markdown_shows_the_window_peak_and_the_rounds():
    rate = {"max_in_1s": 302, "limit_plus_burst": 220.0, "per_second": [302, 217, 199]}
    pairs = ((0.8, 1.1), (0.75, 0.7), (0.9, 1.2))
    over = {"per_round": [{"cpu_ratio": r, "wall_ratio": w} for r, w in pairs],
            "wall_clock_ratio": 1.1}
    report = {"quick": True, "date": "2026-12-04T00:00:00+00:00", "command": "ops/bench --quick",
              "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 24, "platform": "linux"},
              "versions": {}, "sizes": QUICK.__dict__, "seconds": 1.0, "plots": [],
              "results": {"rate_limit_accuracy": entry(199.0, "starts/s", 200.0, "limit", "g", False, rate),
                          "flow_control_overhead": entry(8.0, "jobs/s", 10.0, "none", "g", False, over,
                                                         ratio=0.8),
                          "key_fairness": entry(7.0, "ms", 2.0, "alone", "g", True, {})}}
    text = markdown(report)
    assert "at most 302 starts in any 1 s (limit + burst: 220)" in text
    assert "302, 217, 199" in text and "ratios of jobs per CPU-second (0.8, 0.75, 0.9)" in text
    assert "of wall-clock jobs/s, 1.1 (rounds 1.1, 0.7, 1.2)" in text
    assert "`key_fairness`" in text and "| 3.5 |" in text


def test_markdown_shows_the_tracing_pairs():
    d = {"pairs": 158, "measured": "the firing path in one thread", "ratio_quartiles": [0.913, 1.121]}
    report = {"quick": True, "date": "2026-12-04T00:00:00+00:00", "command": "ops/bench --quick",
              "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 24, "platform": "linux"},
              "versions": {}, "sizes": QUICK.__dict__, "seconds": 1.0, "plots": [],
              "results": {"tracing_off_overhead": entry(9.0, "jobs/s", 10.0, "disabled", ">= 0.97", True, d,
                                                        ratio=0.999)}}
    text = markdown(report)
    assert "`tracing_off_overhead`: the median of 158 paired ratios (the firing path in one thread)" in text
    assert "quartiles 0.913 and 1.121" in text and "| 0.999 |" in text
