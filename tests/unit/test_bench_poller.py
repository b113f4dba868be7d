"""The poller benchmarks' arithmetic (bench/poller.py, bench/fire.py) and their lines in the
report: the lateness step's window and wait, its figures with unfired jobs, and the
fire_throughput figures with the read-only loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.common import driver, entry
from bench.fire import fire_figures
from bench.poller import LATENESS_GRACE_S, lateness_figures, lateness_window
from bench.render import markdown
from bench.run import QUICK


@given(now_s=st.floats(min_value=1.7e9, max_value=1.9e9), seconds=st.integers(min_value=1, max_value=120),
       width_s=st.sampled_from([10, 60, 300]))
def test_the_lateness_window_straddles_a_boundary_ahead_of_the_late_margin(now_s, seconds, width_s):
    start, end = lateness_window(now_s, 3.0, width_s, seconds)
    assert end - start == seconds
    boundary = (start + end) / 2
    assert boundary % width_s == 0
    assert start >= now_s + 3.0 + 10  # every job is placed at its due time, not pushed later
    assert end - now_s <= 3.0 + 10 + seconds + width_s  # and the wait for it is bounded


def test_the_window_can_end_later_than_the_old_wait_of_seconds_plus_60():
    # Just after a boundary, the next one is a whole width away: with 10 s of jobs the
    # last is due 82.5 s after scheduling, past the old wait (poller start + 70 s) that
    # left 2,500 of 10,000 jobs unfired. The wait now ends after the last job is due.
    now_s = 1_800_000_000 - 17.5  # a multiple of 60, less 17.5 s
    end = lateness_window(now_s, 3.0, 60, 10)[1]
    assert end - now_s == 82.5 > 10 + 60
    assert 0 < LATENESS_GRACE_S <= 60  # the wait after it stays bounded


def test_unfired_jobs_fail_the_lateness_step_and_are_located():
    fired = {i: 5.0 for i in range(7491)}
    r = lateness_figures(10_000, 1000, fired, 0)
    assert r["fired"] == 7491 and r["unfired"] == 2509 and r["unfired_due_s"] == [7.491, 9.999]
    assert r["p99_ms"] == 5.0 and r["met"] is False


def test_every_job_fired_once_meets_the_step_and_duplicates_do_not():
    fired = {i: float(i % 40) for i in range(1000)}
    r = lateness_figures(1000, 1000, fired, 0)
    assert r["unfired"] == 0 and r["unfired_due_s"] is None
    assert (r["p50_ms"], r["p99_ms"], r["max_ms"]) == (20.0, 39.0, 39.0) and r["met"] is True
    assert lateness_figures(1000, 1000, fired, 1)["met"] is False
    assert lateness_figures(1000, 1000, {i: 60.0 for i in range(1000)}, 0)["met"] is False


def test_nothing_fired_is_reported_not_a_crash():
    r = lateness_figures(100, 10, {}, 0)
    assert r["fired"] == 0 and r["unfired"] == 100 and r["p99_ms"] is None and r["met"] is False


def test_fire_figures_report_the_read_only_floor_as_median_ratios():
    rounds = [{"poller": 10.0, "bare": 20.0, "fast": 25.0, "read_only": 40.0},
              {"poller": 12.0, "bare": 12.0, "fast": 24.0, "read_only": 24.0},
              {"poller": 9.0, "bare": 10.0, "fast": 18.0, "read_only": 30.0}]
    r = fire_figures(100, rounds)
    assert r["read_only_jobs_per_s"] == 30
    assert r["ratio_poller_vs_read_only"] == 0.3  # median of 0.25, 0.5, 0.3
    assert r["ratio_bare_vs_read_only"] == 0.5  # median of 0.5, 0.5, 0.333
    assert r["ratio"] == 0.9 and r["ratio_spread"] == [0.5, 1.0]
    assert r["poller_jobs_per_s_spread"] == [9, 12] and r["read_only_jobs_per_s_spread"] == [24, 40]
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


def test_server_cpu_counts_a_named_process_and_refuses_an_unknown_name():
    from pathlib import Path

    from bench.common import own_cpu_s, server_cpu_s

    sum(i * i for i in range(200_000))  # some CPU of our own to find
    comm = Path("/proc/self/comm").read_text().strip()
    mine = own_cpu_s()
    # Every process of our name, this one included (its children too, none here).
    assert server_cpu_s(comm) >= mine - 0.05
    with pytest.raises(RuntimeError, match="no process named"):
        server_cpu_s(comm, marker="no-such-marker-\x01")
    with pytest.raises(RuntimeError, match="is the server running"):
        server_cpu_s("no-such-process-name")


def test_tree_cpu_counts_a_reaped_child_and_refuses_a_gone_root():
    import os
    import subprocess
    import sys

    from bench.common import own_cpu_s, tree_cpu_s

    before = tree_cpu_s(os.getpid())
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(2_000_000))"], check=True)
    # The child's time is now in our children time: more than our own threads spent.
    assert tree_cpu_s(os.getpid()) - before > 0.05
    assert tree_cpu_s(os.getpid()) >= own_cpu_s() - 0.05
    with pytest.raises(OSError):
        tree_cpu_s(2**22 + 12345)  # beyond any pid_max: no such process


def test_fire_figures_report_each_sides_cpu_per_job_as_medians():
    sides = ("poller", "bare", "read_only")
    cpu = [{f"{side}_{who}_us": v for side in sides for who in ("client", "cassandra")}
           for v in (10.0, 30.0, 20.0)]
    rounds = [{"poller": 10.0, "bare": 20.0, "fast": 25.0, "read_only": 40.0, **c} for c in cpu]
    r = fire_figures(100, rounds)
    assert r["cpu_us_per_job"]["poller"] == {"client": 20.0, "cassandra": 20.0}
    assert set(r["cpu_us_per_job"]) == {"poller", "bare", "read_only"}
    assert "cpu_us_per_job" not in r["per_round"][0]
