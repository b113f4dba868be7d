"""A poller claiming with a coordinator's token a shard whose stored epoch another
coordinator set (a run without ZooKeeper counts its tokens from the clock, far above
ZooKeeper's transaction ids): taken when released and above the coordinator's ceiling,
refused otherwise. Embedded store."""

from __future__ import annotations

import logging

import pytest

from scheduler.domain.clock import SystemClock
from scheduler.domain.dispatch import App
from scheduler.errors import OwnershipLost
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller import Poller
from scheduler.store import SchemaOptions, Store, open_store

CLOCK_TOKEN = 1_796_465_640_485_238_045
ZXID = 4_294_967_297


def setup(tmp_path) -> tuple[Store, Poller]:
    now = SystemClock().now_ms()
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    store.apply_schema(SchemaOptions(shard_count=3), now)
    for shard in (0, 1, 2):
        store.claim_shard(shard, "solo", CLOCK_TOKEN, now // 1000 - 60, now)
    for shard in (0, 2):
        store.release_shard(shard, CLOCK_TOKEN, now)  # shard 1 stays held (killed, or still running)
    return store, Poller(store, App.for_function(lambda job: None), name="zk-member", metrics=PollerMetrics())


def test_a_released_shard_above_the_ceiling_is_taken_at_the_lower_token(tmp_path, caplog):
    store, poller = setup(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler"):
            poller.claim(0, ZXID, ceiling=lambda: ZXID + 10)
        assert [r.__dict__.get("action") for r in caplog.records] == ["shard_epoch_lowered"]
        assert caplog.records[0].__dict__["stored_epoch"] == CLOCK_TOKEN
        rows = {c.shard: c for c in store.checkpoints()}
        assert (rows[0].owner, rows[0].owner_epoch) == ("zk-member", ZXID) and poller.shards == {0}
        with pytest.raises(OwnershipLost, match=f"held by solo with epoch {CLOCK_TOKEN}"):
            poller.claim(1, ZXID + 1, ceiling=lambda: ZXID + 10)  # an owner: never taken
        assert {c.shard: c.owner for c in store.checkpoints()}[1] == "solo"
    finally:
        poller.stop()
        store.close()


@pytest.mark.parametrize("ceiling", [None, lambda: CLOCK_TOKEN, lambda: None],
                         ids=["no coordinator", "within the ceiling: a newer holder's", "ceiling unknown"])
def test_a_released_shard_is_refused_without_proof_its_epoch_is_foreign(tmp_path, ceiling):
    store, poller = setup(tmp_path)
    try:
        with pytest.raises(OwnershipLost, match=f"held by None with epoch {CLOCK_TOKEN}"):
            poller.claim(2, ZXID, ceiling=ceiling)
        assert {c.shard: c.owner_epoch for c in store.checkpoints()}[2] == CLOCK_TOKEN
    finally:
        poller.stop()
        store.close()
