"""Fault: a whole DC's pollers lost under load, on the two-DC cluster.

Two pollers of dc1 and one of dc2 form one fleet under the home rule dc1=1,dc2=1 (a
keyspace replicated dc1:2,dc2:1), while a producer in each DC schedules jobs due within
seconds on top of jobs due all through the test. Both dc1 pollers are killed with -9:
the dc2 poller takes every shard, not before the fail-over delay, and every
acknowledged job fires: none lost, none early, duplicates within the bound of
docs/two-data-centres.md ("Duplicates in a fail-over"). Cassandra's nodes all stay up:
only the pollers go. How long the take-over takes is measured in bench/dc_failover.py.
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
from tests.cluster.dcfleet import CONCURRENCY, FAILOVER_S, SESSION_S, SHARDS, WEIGHTS, outages
from tests.conftest import ZOOKEEPER_HOSTS
from tests.faultload import Pollers, Producer, measure, now_ms, preload, wait_fired
from tests.handlers import read_records
from tests.procs import kill_all, wait_until

pytestmark = [pytest.mark.cluster3, pytest.mark.dcs2, pytest.mark.fault]


@pytest.mark.timeout(300)
def test_the_home_dcs_pollers_killed_under_load(cluster_2dc, cluster_2dc_keyspace, zk_root, tmp_path):
    url = f"cassandra://{cluster_2dc}/{cluster_2dc_keyspace}"
    admin = open_store(url)
    admin.apply_schema(SchemaOptions(shard_count=SHARDS, bucket_width_s=10, replication="dc1:2,dc2:1"),
                       SystemClock().now_ms())
    home = homes(range(SHARDS), WEIGHTS)
    dc1_shards = {s for s, dc in home.items() if dc == "dc1"}
    assert dc1_shards and len(dc1_shards) < SHARDS, "the rule splits the shards between both DCs"
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    write_home_rule(zk, WEIGHTS)

    out = tmp_path / "fired.log"
    pollers = Pollers(url, out, "--coordinator", zk, "--session-timeout", str(SESSION_S),
                      "--dc-failover-delay", f"{FAILOVER_S}s", "--concurrency", str(CONCURRENCY))
    client1, client2 = Client(url, dc="dc1"), Client(url, dc="dc2")
    producers = [Producer(client1, prefix="live1-"), Producer(client2, prefix="live2-")]
    due: dict[str, int] = {}
    try:
        a1, a2 = (pollers.start(extra=("--dc", "dc1", "--name", n))[0] for n in ("a1", "a2"))
        b1 = pollers.start(extra=("--dc", "dc2", "--name", "b1"))[0]

        def owners() -> dict[int, str | None]:
            assert pollers.running(), "a poller exited"
            return {c.shard: c.owner for c in admin.checkpoints()}

        def split_by_home() -> bool:
            now = owners()
            return (len(now) == SHARDS and all(now[s] in ("a1", "a2") for s in dc1_shards)
                    and {now[s] for s in dc1_shards} == {"a1", "a2"}
                    and all(now[s] == "b1" for s in set(home) - dc1_shards))

        wait_until(split_by_home, 90, "each shard owned by a poller of its home DC, both of dc1 holding some")
        # Due from 2 s on, through the kill, the fail-over delay and past the take-over.
        due.update(preload(client1, 200, 18, lead_s=2, prefix="pre1-"))
        due.update(preload(client2, 200, 18, lead_s=2, prefix="pre2-"))
        for p in producers:
            p.start()

        def firing_in_both_dcs() -> bool:
            fired = Counter(r.pid for r in read_records(str(out)))
            return min(fired[a1.pid], fired[a2.pid], fired[b1.pid]) >= 10

        wait_until(firing_in_both_dcs, 60, "all three pollers firing")

        killed_ms = now_ms()
        kill_all([a1, a2])
        pollers.procs.remove(a1)  # killed on purpose: not crashes for the supervisor to count
        pollers.procs.remove(a2)
        wait_until(lambda: set(owners().values()) == {"b1"}, 60, "the dc2 poller owning every shard")

        def dc2_fired_dc1_shard() -> bool:
            return any(r.pid == b1.pid and shard_of(r.job_id, SHARDS) in dc1_shards
                       for r in read_records(str(out)))

        wait_until(dc2_fired_dc1_shard, 30, "the dc2 poller firing a job of dc1's shards")
        for p in producers:
            p.stop()
            due.update(p.acked)
        records = wait_fired(out, due, 90, supervise=pollers)
    finally:
        for p in producers:
            p.stop()
        codes = pollers.stop()
        client1.close()
        client2.close()
        admin.close()

    taken = outages(zk_root)
    report = measure("two DCs: both dc1 pollers killed -9, dc2 takes over", records, due,
                     window=(killed_ms - 3000, max(due.values())))
    by_killed = [r for r in records if r.pid in (a1.pid, a2.pid)]
    foreign = [r for r in records if r.pid == b1.pid and shard_of(r.job_id, SHARDS) in dc1_shards]
    takeover_ms = min(r.fired_ms for r in foreign)
    # The crash bound of docs/guarantees.md, once per killed poller: its running handlers
    # (--concurrency) and the outcomes it had not recorded (gathered ~100 ms, then
    # written): firings of its last half second.
    unrecorded = sum(1 for r in by_killed if r.fired_ms >= killed_ms - 500)
    bound = 2 * CONCURRENCY + unrecorded
    counts = Counter(r.job_id for r in records)
    report.notes = {"takeover_first_firing_s": round((takeover_ms - killed_ms) / 1000, 2),
                    "failover_delay_s": FAILOVER_S, "session_timeout_s": SESSION_S,
                    "duplicate_bound": bound, "exit_codes": codes, "crashes": len(pollers.crashes),
                    "producer_errors": sum(len(p.errors) for p in producers)}
    report.save()
    assert report.lost == 0 and report.early == 0, report
    assert report.duplicates <= bound and max(counts.values()) <= 2, (report, counts.most_common(3))
    # Not before the delay: the dc2 poller fired none of dc1's shards until the dead
    # pollers' sessions had expired and the delay had passed since, and took each of
    # them exactly once, recorded as an outage.
    assert takeover_ms >= killed_ms + FAILOVER_S * 1000, report
    assert {r["shard"] for r in taken} == dc1_shards and len(taken) == len(dc1_shards), taken
    assert all(r["home_dc"] == "dc1" and r["dc"] == "dc2" and r["member"] == "b1"
               and r["at_ms"] >= killed_ms + FAILOVER_S * 1000 for r in taken), taken
    assert not pollers.crashes and codes == [0], report
