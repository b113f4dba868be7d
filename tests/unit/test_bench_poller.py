"""The poller benchmarks' arithmetic (bench/poller.py, bench/fire.py) and their lines in the
report: the fire_throughput figures with the read-only loop."""

from __future__ import annotations

from bench.common import driver
from bench.fire import fire_figures
from bench.run import QUICK, entry, markdown


def test_fire_figures_report_the_read_only_floor_as_median_ratios():
    rounds = [{"poller": 10.0, "bare": 20.0, "fast": 25.0, "read_only": 40.0},
              {"poller": 12.0, "bare": 12.0, "fast": 24.0, "read_only": 24.0},
              {"poller": 9.0, "bare": 10.0, "fast": 18.0, "read_only": 30.0}]
    r = fire_figures(100, rounds)
    assert r["read_only_jobs_per_s"] == 30
    assert r["ratio_poller_vs_read_only"] == 0.3  # median of 0.25, 0.5, 0.3
    assert r["ratio_bare_vs_read_only"] == 0.5  # median of 0.5, 0.5, 0.333
    assert r["ratio"] == 0.9
    assert r["per_round"][0] == {"poller": 10, "bare": 20, "read_only": 40, "ratio": 0.5}
    assert r["met"] is False  # 10 jobs/s is far from 5,000


def test_the_report_names_the_driver_build_and_the_read_only_loop():
    d = driver()
    assert set(d) == {"version", "compiled_modules", "compiled", "cython_row_parser"}
    details = {"rounds": 1, "ratio_vs_fast_bind_loop": 0.7, "read_only_jobs_per_s": 40_000,
               "ratio_poller_vs_read_only": 0.4, "ratio_bare_vs_read_only": 0.6,
               "per_round": [{"poller": 9, "bare": 10, "read_only": 20, "ratio": 0.9}]}
    report = {"quick": True, "date": "2026-12-04T00:00:00+00:00", "command": "ops/bench --quick",
              "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 24, "platform": "linux",
                          "cassandra_driver": {**d, "cython_row_parser": False}},
              "versions": {}, "sizes": QUICK.__dict__, "seconds": 1.0, "plots": [],
              "results": {"fire_throughput": entry(9.0, "jobs/s", 10.0, "bare", "goal", True, details)}}
    text = markdown(report)
    assert "Cython row parser **off**" in text
    assert "40,000 jobs/s (poller / read-only 0.4, read-and-record / read-only 0.6)" in text
