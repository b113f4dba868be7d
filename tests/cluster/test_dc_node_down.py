"""Fault: a DC's only Cassandra node stopped for 60 s under load, on the two-DC cluster.

Two pollers of dc1 and one of dc2 form one fleet under the home rule dc1=1,dc2=1 (a
keyspace replicated dc1:2,dc2:1), with a producer in each DC (``dcfleet.py``). dc2's one
node (127.0.0.3) is killed with -9 and started again 60 s later. The dc2 poller's store
fails, so after ``--store-failure-release`` it steps out; dc1's pollers take dc2's
shards after the fail-over delay and fire them. When the node is back, the dc2 poller
rejoins, takes its shards back after the delay, and catches up the take-over windows.
Every acknowledged job fires: none lost, none early, duplicates within the bound of
docs/two-data-centres.md.
"""

from __future__ import annotations

from collections import Counter

import pytest

from scheduler.domain.keys import shard_of
from tests.cluster.conftest import cluster_ops, wait_all_up
from tests.cluster.dcfleet import CONCURRENCY, FAILOVER_S, SHARDS, DcFleet, outages
from tests.faultload import measure, now_ms, wait_fired
from tests.handlers import read_records
from tests.procs import wait_until

pytestmark = [pytest.mark.cluster3, pytest.mark.dcs2, pytest.mark.fault]
DOWN_S = 60
RELEASE_S = 5  # --store-failure-release: the dc2 poller steps out this long after the kill


@pytest.mark.timeout(420)
def test_the_dc2_node_stopped_for_60_s_dc1_fires_its_shards_and_dc2_takes_them_back(
        cluster_2dc, cluster_2dc_keyspace, zk_root, tmp_path):
    fleet = DcFleet(cluster_2dc, cluster_2dc_keyspace, zk_root, tmp_path,
                    "--store-failure-release", f"{RELEASE_S}s")
    dc2_shards = fleet.shards["dc2"]
    started = False
    try:
        fleet.start(preload_s=DOWN_S + 40)
        a_pids = {fleet.pids["a1"], fleet.pids["a2"]}
        killed_ms = now_ms()
        cluster_ops("kill", "--node", "3", dcs=2)
        wait_until(lambda: all(fleet.owners()[s] in ("a1", "a2") for s in dc2_shards), 60,
                   "dc1's pollers owning dc2's shards")

        def dc1_fired_dc2_shard() -> bool:
            return any(r.pid in a_pids and shard_of(r.job_id, SHARDS) in dc2_shards
                       and r.fired_ms > killed_ms for r in read_records(str(fleet.out)))

        wait_until(dc1_fired_dc2_shard, 30, "a dc1 poller firing a job of dc2's shards")
        wait_until(lambda: now_ms() >= killed_ms + DOWN_S * 1000, DOWN_S + 5, "the node down for 60 s")
        back_ms = now_ms()
        cluster_ops("start", dcs=2)
        started = True
        wait_all_up(dcs=2)
        wait_until(fleet.split_by_home, 120, "dc2's shards back with the dc2 poller")
        wait_until(lambda: all("caught_up_ms" in r for r in outages(zk_root)), 60,
                   "every take-over window caught up")
        fleet.stop_producers()
        records = wait_fired(fleet.out, fleet.due, 120, supervise=fleet.pollers)
    finally:
        if not started:
            cluster_ops("start", dcs=2)  # whatever happened, leave three nodes running
        codes = fleet.close()

    taken = outages(zk_root)
    report = measure("two DCs: dc2's node stopped 60 s, dc1 fires its shards, dc2 takes them back",
                     records, fleet.due, window=(killed_ms - 3000, max(fleet.due.values())))
    # The bound of docs/two-data-centres.md: what the dc2 poller fired after the kill and
    # could not record (at most its running handlers and what it had queued), and what a
    # catch-up moved that dc1 had fired while its outcome had not reached node 3 yet.
    b1_after = sum(1 for r in records if r.pid == fleet.pids["b1"] and killed_ms <= r.fired_ms <= back_ms)
    moved = sum(int(r.get("moved", 0)) for r in taken)
    bound = CONCURRENCY + b1_after + moved
    counts = Counter(r.job_id for r in records)
    report.notes = {"down_s": DOWN_S, "store_failure_release_s": RELEASE_S, "failover_delay_s": FAILOVER_S,
                    "taken_over": len(taken), "caught_up_moved": moved, "duplicate_bound": bound,
                    "exit_codes": codes, "crashes": len(fleet.pollers.crashes),
                    "producer_errors": fleet.producer_errors()}
    report.save()
    assert report.lost == 0 and report.early == 0, report
    assert report.duplicates <= bound and max(counts.values()) <= 2, (report, counts.most_common(3))
    assert {r["shard"] for r in taken} == dc2_shards, taken
    assert all(r["home_dc"] == "dc2" and r["dc"] == "dc1" and r["at_ms"] >= killed_ms + FAILOVER_S * 1000
               and "ended_ms" in r for r in taken), taken
    assert not fleet.pollers.crashes and codes == [0, 0, 0], report
