"""Fault: dc1 cut off from dc2 for 30 s under load, then healed, on the two-DC cluster.

The same fleet as the other two-DC fault tests (``dcfleet.py``): a1 and a2 in dc1, b1
in dc2, a producer in each DC. The cut refuses Cassandra's internode port between
dc1's nodes (127.0.0.1-2) and dc2's (127.0.0.3), both ways (``tests/partition.py``);
clients still reach every node and ZooKeeper stays whole, so no shard changes owner.
Each DC keeps taking its producer's LOCAL_QUORUM writes, which the other sees only
after the heal (hinted hand-off): a job written in dc1 into a dc2 shard can land in a
bucket the dc2 poller has drained by then. Every poller saw the other DC's nodes down,
so once they are back it reads its shards' buckets of the window again and moves what
is unfired ahead. Every acknowledged job fires: none lost, none early.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from scheduler.domain.keys import shard_of
from scheduler.store import open_store
from tests.cluster.dcfleet import SHARDS, DcFleet
from tests.faultload import measure, now_ms, wait_fired
from tests.partition import cut
from tests.procs import wait_until

pytestmark = [pytest.mark.cluster3, pytest.mark.dcs2, pytest.mark.fault]
CUT_S = 30
STORAGE_PORT = int(os.environ.get("CASSANDRA_STORAGE_PORT", "7000"))


@pytest.mark.timeout(420)
def test_a_cut_between_the_dcs_then_healed_every_acknowledged_job_fires(
        cluster_2dc, cluster_2dc_keyspace, zk_root, tmp_path):
    fleet = DcFleet(cluster_2dc, cluster_2dc_keyspace, zk_root, tmp_path)
    dc2_view = open_store(fleet.url, dc="dc2")
    try:
        fleet.start(preload_s=CUT_S + 40)
        with cut(["127.0.0.1", "127.0.0.2"], ["127.0.0.3"], STORAGE_PORT):
            cut_ms = now_ms()
            wait_until(lambda: fleet.admin.peers_down() > 0 and dc2_view.peers_down() > 0, 60,
                       "each DC's clients seeing the other DC's nodes down")
            wait_until(lambda: now_ms() >= cut_ms + CUT_S * 1000, CUT_S + 5, f"the cut held {CUT_S} s")
        healed_ms = now_ms()
        wait_until(lambda: not fleet.admin.peers_down() and not dc2_view.peers_down(), 90,
                   "each DC's clients seeing the other DC's nodes back")
        # The producers run on past the heal and the catch-ups (15 s after it).
        wait_until(lambda: now_ms() >= healed_ms + 20_000, 25, "the catch-ups' settle time")
        fleet.stop_producers()
        records = wait_fired(fleet.out, fleet.due, 150, supervise=fleet.pollers)
    finally:
        dc2_view.close()
        codes = fleet.close()

    report = measure(f"two DCs: cut off from each other {CUT_S} s, then healed", records, fleet.due,
                     window=(cut_ms - 3000, max(fleet.due.values())))
    # Written in one DC during the cut, into a shard the other DC fires, due well before
    # the heal, fired only after it: what the catch-up found behind a checkpoint.
    other_dc = {"live1-": fleet.shards["dc2"], "live2-": fleet.shards["dc1"]}
    crossed = [r for r in records
               if shard_of(r.job_id, SHARDS) in other_dc.get(r.job_id[:6], set())
               and cut_ms < fleet.due[r.job_id] < healed_ms - 15_000 and r.fired_ms > healed_ms]
    counts = Counter(r.job_id for r in records)
    report.notes = {"cut_s": CUT_S, "fired_after_heal_by_catch_up": len(crossed),
                    "exit_codes": codes, "crashes": len(fleet.pollers.crashes),
                    "producer_errors": fleet.producer_errors()}
    report.save()
    assert report.lost == 0 and report.early == 0, report
    assert crossed, "no job written across the cut into a drained bucket: the test did not test the catch-up"
    assert max(counts.values()) <= 2, counts.most_common(3)
    assert not fleet.pollers.crashes and codes == [0, 0, 0], report
