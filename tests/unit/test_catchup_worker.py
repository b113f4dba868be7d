"""The catch-up worker on the embedded store: a window is caught up after its settle
time, passed over again, and its record marked after the last pass, by the shard's owner
only; a record that holds no window is
skipped with one error line and does not hold up the windows queued behind it."""

from __future__ import annotations

import logging

from scheduler.domain.clock import SystemClock
from scheduler.domain.dispatch import App
from scheduler.domain.keys import shard_of
from scheduler.domain.progress import Checkpoint
from scheduler.fleet.coord import LocalCoordinator
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller import Poller
from scheduler.runtime.catchup import CatchUps
from scheduler.store import SchemaOptions, open_store
from tests.conftest import bucket_job
from tests.procs import wait_until


def test_a_window_is_caught_up_and_marked_and_a_bad_record_is_skipped(tmp_path, caplog):
    now = SystemClock().now_ms()
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    store.apply_schema(SchemaOptions(shard_count=1), now)
    bucket = now // 60_000 * 60 - 120  # two minutes ago
    store.claim_shard(0, "p0", 1, bucket - 60, now)
    store.save_checkpoint(0, 1, Checkpoint(bucket), now)
    assert shard_of("lost", 1) == 0
    store.insert_many([bucket_job("lost", bucket * 1000 + 5_000)])  # behind the checkpoint

    coord = LocalCoordinator(f"catchup-{tmp_path.name}")
    coord.record_outage({"shard": 0, "home_dc": "dc1", "dc": "dc2", "member": "b1", "at_ms": now,
                         "from_bucket": bucket - 60})
    good = coord.close_outages(0, now, bucket)
    assert len(good) == 1 and good[0]["to_bucket"] == bucket
    poller = Poller(store, App.for_function(lambda job: None), name="a1", metrics=PollerMetrics())
    worker = CatchUps(poller, coord, settle_s=0.1, again_s=(0.3,), retry_s=0.1)
    try:
        assert worker.catch_up(good[0]) is None and coord.close_outages(0, now, bucket) == good  # not ours
        poller.claim(0, 2)
        with caplog.at_level(logging.ERROR, logger="scheduler.fleet"):
            bad = [{"shard": 0, "from_bucket": "not a number", "to_bucket": None, "node": "x"},
                   {"shard": 0, "from_bucket": float("inf"), "to_bucket": 0, "node": "y"}]
            worker.add([*bad, *good])
            wait_until(lambda: worker.moved == 1, 10, "the lost row moved")
        assert sum("holds no window" in r.getMessage() for r in caplog.records) == 2
        # Marked caught up after each pass (the second moves nothing more): not handed out again.
        wait_until(lambda: coord.close_outages(0, now, bucket) == [], 10, "the record marked caught up")
        assert worker.moved == 1 and coord._reg["outages"][0]["moved"] == 1
        moved = store.get_many(["lost"])["lost"]
        assert moved.fire_ms >= now and moved.due_ms == bucket * 1000 + 5_000
    finally:
        worker.stop()
        store.close()
