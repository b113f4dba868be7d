"""The benchmark report's shape (ops/bench): every entry has the same fields under a
stable key, and the markdown renders from report.json alone."""

from __future__ import annotations

from bench.common import entry
from bench.render import markdown
from bench.run import FULL, QUICK

KEYS = ["enqueue", "enqueue_async", "api_enqueue", "lateness_due_now", "fire_throughput", "async_handlers",
        "recurring", "storage_steady_state", "poll_cost_backlog", "poller_rss_backlog", "lateness",
        "fleet_scaling", "handover", "peer_postgres", "http_targets"]


def side(name: str) -> dict[str, object]:
    return {"system": name, "fired": 10, "expected": 10, "fire_jobs_per_s": 5, "lateness_p50_ms": 1.0,
            "lateness_p99_ms": 2.0, "lateness_max_ms": 3.0, "empty_poll_ms": 0.5}


def test_entry_fields_and_ratio():
    e = entry(8.0, "jobs/s", 10.0, "bare loop", "ratio >= 0.8", True, {})
    assert set(e) == {"value", "unit", "baseline", "baseline_is", "ratio", "goal", "met", "details"}
    assert e["ratio"] == 0.8
    assert entry(1.0, "s", None, "-", "reported", None, {})["ratio"] is None


def test_markdown_renders_every_key_and_the_peer_table():
    peer = {"near_jobs": 10, "far_jobs": 100, "window_s": 2.0, "offered_jobs_per_s": 5,
            **{k: side(k) for k in ("scheduler", "postgres", "scheduler_drain", "postgres_drain")}}
    results = {k: entry(1.0, "u", 2.0, "base", "goal", k != "handover", peer if k == "peer_postgres" else {})
               for k in KEYS}
    report = {"quick": True, "date": "2026-11-30T00:00:00+00:00", "command": "ops/bench --quick",
              "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 24, "platform": "linux"},
              "versions": {"cassandra": "5.0.8"}, "sizes": QUICK.__dict__, "seconds": 1.0,
              "results": results, "plots": ["lateness.png"]}
    text = markdown(report)
    for key in KEYS:
        assert f"`{key}`" in text
    assert "all due at once" in text and "| **no** |" in text


def test_quick_sizes_are_smaller_than_full():
    assert all(q <= f for q, f in zip(QUICK.__dict__.values(), FULL.__dict__.values(), strict=True))


def test_markdown_explains_the_paired_fire_ratio():
    details = {"rounds": 3, "ratio_vs_fast_bind_loop": 0.7,
               "per_round": [{"poller": 9, "bare": 10, "ratio": r} for r in (0.9, 1.1, 1.0)]}
    report = {"quick": True, "date": "2026-11-30T00:00:00+00:00", "command": "ops/bench --quick",
              "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 24, "platform": "linux"},
              "versions": {}, "sizes": QUICK.__dict__, "seconds": 1.0, "plots": [],
              "results": {"fire_throughput": entry(9.0, "jobs/s", 10.0, "bare", "goal", True, details,
                                                   ratio=1.0)}}
    text = markdown(report)
    assert "median of the rounds' ratios (0.9, 1.1, 1)" in text and "per-row binding" in text
    # The table shows the median ratio (not value / baseline, 0.9) and the rounds' spread.
    assert "| 1 (rounds 0.9 to 1.1, 3) |" in text


def test_markdown_renders_the_paired_process_drains_and_their_spread():
    rounds = [{"scheduler": side("ours"), "postgres": side("peer"), "ratio": r} for r in (1.1, 1.4, 1.3)]
    peer = {"near_jobs": 10, "far_jobs": 100, "window_s": 2.0, "offered_jobs_per_s": 5,
            "one_process_ratio": 0.7,
            **{k: side(k) for k in ("scheduler", "postgres", "scheduler_drain", "postgres_drain")},
            "processes": {"processes": 2, "rounds": 3, "ratio": 1.3, "per_round": rounds}}
    results = {"peer_postgres": entry(1.0, "u", 2.0, "base", "goal", True, peer, ratio=1.3)}
    report = {"quick": True, "date": "2026-11-30T00:00:00+00:00", "command": "ops/bench --quick",
              "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 24, "platform": "linux"},
              "versions": {}, "sizes": QUICK.__dict__, "seconds": 1.0, "results": results, "plots": []}
    text = markdown(report)
    assert "round 3" in text and "--processes 2" in text
    assert "rounds 1.1 to 1.4, 3" in text
