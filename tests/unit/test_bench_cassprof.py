"""bench.cassprof's summary of a Java Flight Recorder dump (the shape `jfr print --json` gives)."""

from __future__ import annotations

from bench.cassprof import summarise


def sample(thread: str, *types: str) -> dict[str, object]:
    frames = [{"method": {"type": {"name": t}, "name": "run"}} for t in types]
    return {"values": {"sampledThread": {"javaName": thread}, "stackTrace": {"frames": frames}}}


def test_shares_by_pool_and_by_method_counted_once_per_stack():
    cell = "org/apache/cassandra/db/Cell"
    events = [sample("Native-Transport-Requests-3", cell, cell),
              sample("Native-Transport-Requests-12", "java/util/Arrays"),
              sample("MutationStage-1", cell)]
    s = summarise(events, top=5)
    assert s["samples"] == 3
    assert s["thread_pools"] == {"Native-Transport-Requests": 0.667, "MutationStage": 0.333}
    assert s["methods_inclusive"] == {"db.Cell.run": 0.667}  # on 2 of 3 stacks, once each


def test_a_sample_without_a_stack_or_thread_is_counted_not_a_crash():
    s = summarise([{"values": {}}, {}], top=5)
    assert s["samples"] == 2 and s["thread_pools"] == {"?": 1.0} and s["methods_inclusive"] == {}
