"""Fault: a DC's only Cassandra node stopped for 60 s under load, on the two-DC cluster.

Two pollers of dc1 and one of dc2 form one fleet under the home rule dc1=1,dc2=1 (a
keyspace replicated dc1:2,dc2:1), with a producer in each DC. dc2's one node (127.0.0.3)
is killed with -9 and started again 60 s later. The dc2 poller's store fails, so after
``--store-failure-release`` it steps out; dc1's pollers take dc2's shards after the
fail-over delay and fire them. When the node is back, the dc2 poller rejoins, takes its
shards back after the delay, and catches up the take-over windows. Every acknowledged
job fires: none lost, none early, duplicates within the bound of
docs/two-data-centres.md.
"""

from __future__ import annotations

from collections import Counter

import pytest

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.domain.home import homes
from scheduler.domain.keys import shard_of
from scheduler.fleet.view import write_home_rule
from scheduler.store import SchemaOptions, open_store
from tests.cluster.conftest import cluster_ops, wait_all_up
from tests.cluster.test_dc_failover import CONCURRENCY, FAILOVER_S, SESSION_S, SHARDS, WEIGHTS, outages
from tests.conftest import ZOOKEEPER_HOSTS
from tests.faultload import Pollers, Producer, measure, now_ms, preload, wait_fired
from tests.handlers import read_records
from tests.procs import wait_until

pytestmark = [pytest.mark.cluster3, pytest.mark.dcs2, pytest.mark.fault]
DOWN_S = 60
RELEASE_S = 5  # --store-failure-release: the dc2 poller steps out this long after the kill


@pytest.mark.timeout(420)
def test_the_dc2_node_stopped_for_60_s_dc1_fires_its_shards_and_dc2_takes_them_back(
        cluster_2dc, cluster_2dc_keyspace, zk_root, tmp_path):
    url = f"cassandra://{cluster_2dc}/{cluster_2dc_keyspace}"
    admin = open_store(url)
    admin.apply_schema(SchemaOptions(shard_count=SHARDS, bucket_width_s=10, replication="dc1:2,dc2:1"),
                       SystemClock().now_ms())
    home = homes(range(SHARDS), WEIGHTS)
    dc2_shards = {s for s, dc in home.items() if dc == "dc2"}
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    write_home_rule(zk, WEIGHTS)

    out = tmp_path / "fired.log"
    pollers = Pollers(url, out, "--coordinator", zk, "--session-timeout", str(SESSION_S),
                      "--dc-failover-delay", f"{FAILOVER_S}s", "--concurrency", str(CONCURRENCY),
                      "--store-failure-release", f"{RELEASE_S}s")
    client1, client2 = Client(url, dc="dc1"), Client(url, dc="dc2")
    producers = [Producer(client1, prefix="live1-"), Producer(client2, prefix="live2-")]
    due: dict[str, int] = {}
    started = False
    try:
        a1, a2 = (pollers.start(extra=("--dc", "dc1", "--name", n))[0] for n in ("a1", "a2"))
        b1 = pollers.start(extra=("--dc", "dc2", "--name", "b1"))[0]

        def owners() -> dict[int, str | None]:
            assert pollers.running(), "a poller exited"
            return {c.shard: c.owner for c in admin.checkpoints()}

        def split_by_home() -> bool:
            now = owners()
            return len(now) == SHARDS and all((now[s] == "b1") == (s in dc2_shards) for s in range(SHARDS))

        wait_until(split_by_home, 90, "each shard owned by a poller of its home DC")
        due.update(preload(client1, 300, DOWN_S + 40, lead_s=2, prefix="pre1-"))
        due.update(preload(client2, 150, 20, lead_s=2, prefix="pre2-"))
        for p in producers:
            p.start()
        wait_until(lambda: Counter(r.pid for r in read_records(str(out)))[b1.pid] >= 10, 60,
                   "the dc2 poller firing")

        killed_ms = now_ms()
        cluster_ops("kill", "--node", "3", dcs=2)
        wait_until(lambda: all(owners()[s] in ("a1", "a2") for s in dc2_shards), 60,
                   "dc1's pollers owning dc2's shards")

        def dc1_fired_dc2_shard() -> bool:
            return any(r.pid in (a1.pid, a2.pid) and shard_of(r.job_id, SHARDS) in dc2_shards
                       and r.fired_ms > killed_ms for r in read_records(str(out)))

        wait_until(dc1_fired_dc2_shard, 30, "a dc1 poller firing a job of dc2's shards")
        wait_until(lambda: now_ms() >= killed_ms + DOWN_S * 1000, DOWN_S + 5, "the node down for 60 s")
        back_ms = now_ms()
        cluster_ops("start", dcs=2)
        started = True
        wait_all_up(dcs=2)
        wait_until(split_by_home, 120, "dc2's shards back with the dc2 poller")
        wait_until(lambda: all("caught_up_ms" in r for r in outages(zk_root)), 60,
                   "every take-over window caught up")
        for p in producers:
            p.stop()
            due.update(p.acked)
        records = wait_fired(out, due, 120, supervise=pollers)
    finally:
        for p in producers:
            p.stop()
        if not started:
            cluster_ops("start", dcs=2)  # whatever happened, leave three nodes running
        codes = pollers.stop()
        client1.close()
        client2.close()
        admin.close()

    taken = outages(zk_root)
    report = measure("two DCs: dc2's node stopped 60 s, dc1 fires its shards, dc2 takes them back",
                     records, due, window=(killed_ms - 3000, max(due.values())))
    # The bound of docs/two-data-centres.md: what the dc2 poller fired after the kill and
    # could not record (at most its running handlers and what it had queued), and what a
    # catch-up moved that dc1 had fired while its outcome had not reached node 3 yet.
    b1_after = sum(1 for r in records if r.pid == b1.pid and killed_ms <= r.fired_ms <= back_ms)
    moved = sum(int(r.get("moved", 0)) for r in taken)
    bound = CONCURRENCY + b1_after + moved
    counts = Counter(r.job_id for r in records)
    report.notes = {"down_s": DOWN_S, "store_failure_release_s": RELEASE_S, "failover_delay_s": FAILOVER_S,
                    "taken_over": len(taken), "caught_up_moved": moved, "duplicate_bound": bound,
                    "exit_codes": codes, "crashes": len(pollers.crashes),
                    "producer_errors": sum(len(p.errors) for p in producers)}
    report.save()
    assert report.lost == 0 and report.early == 0, report
    assert report.duplicates <= bound and max(counts.values()) <= 2, (report, counts.most_common(3))
    assert {r["shard"] for r in taken} == dc2_shards, taken
    assert all(r["home_dc"] == "dc2" and r["dc"] == "dc1" and r["at_ms"] >= killed_ms + FAILOVER_S * 1000
               and "ended_ms" in r for r in taken), taken
    assert not pollers.crashes and codes == [0, 0, 0], report
