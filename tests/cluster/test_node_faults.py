"""Faults on the 3-node cluster with RF 3 and LOCAL_QUORUM (issue 12, faults 1 and 6):
a node killed with -9 while producers schedule and pollers fire, then restarted; a
second kill after it rejoined; a bulk load across a kill."""

from __future__ import annotations

import time

import pytest

from scheduler import Client
from scheduler.clock import SystemClock
from scheduler.store import SchemaOptions, open_store
from tests.cluster.conftest import cluster_ops, wait_all_up
from tests.conftest import ZOOKEEPER_HOSTS
from tests.faultload import Pollers, Producer, measure, now_ms, preload, wait_fired

pytestmark = [pytest.mark.cluster3, pytest.mark.fault]
DOWN_S = 20


def test_a_node_killed_and_restarted_twice_under_load(cluster, cluster_keyspace, zookeeper_available,
                                                     tmp_path):
    url = f"cassandra://{cluster}/{cluster_keyspace}"
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=8, bucket_width_s=10, replication="simple:3"),
                       SystemClock().now_ms())
    client = Client(store)
    out = tmp_path / "fired.log"
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}/cluster-fault-{time.time_ns()}"
    pollers = Pollers(url, out, "--coordinator", zk, "--session-timeout", "6")
    producer = Producer(client)
    events: list[tuple[str, int]] = []
    rejoin_s: list[float] = []
    try:
        due = preload(client, 1500, 150, lead_s=4)
        pollers.start(2)
        producer.start()
        time.sleep(8)
        for node in ("3", "2"):
            events.append((f"kill node{node}", now_ms()))
            cluster_ops("kill", "--node", node)
            end = time.monotonic() + DOWN_S
            while time.monotonic() < end:
                pollers.supervise()
                time.sleep(0.5)
            events.append((f"start node{node}", now_ms()))
            cluster_ops("start")
            rejoin_s.append(round(wait_all_up(), 1))
            events.append((f"node{node} up", now_ms()))
            time.sleep(5)
        producer.stop()
        due.update(producer.acked)
        records = wait_fired(out, due, 90, supervise=pollers)
    finally:
        producer.stop()
        codes = pollers.stop()
        client.close()
        store.close()
        cluster_ops("start")  # whatever happened, leave three nodes running

    first_kill = events[0][1]
    window = (first_kill - 3000, min(max(due.values()), events[-1][1]))
    report = measure("cassandra node of 3 killed -9 and restarted, twice", records, due, window=window)
    report.notes = {"producer_errors": len(producer.errors),
                    "producer_error_samples": [m for _, _, m in producer.errors[:3]],
                    "rejoin_s": rejoin_s, "exit_codes": codes, "restarts": pollers.restarts,
                    "crashes": len(pollers.crashes)}
    report.save()
    assert report.lost == 0 and report.early == 0, report
    assert report.duplicates == 0, report  # no poller crashed
    assert report.longest_pause_s <= 5, report
    assert not producer.errors, report
    assert not pollers.crashes and pollers.restarts == 0, report
