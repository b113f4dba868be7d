"""Home DCs with a real ZooKeeper and Cassandra: two members of "dc1" and one of "dc2"
under the rule dc1=1,dc2=1 split the shards by home DC; when both dc1 members die, dc2
takes their shards after the fail-over delay and not before, recording the outage
window; a dc1 member that comes back gets them back after the same delay, and catches
up the window: a row that reached the store only behind dc2's checkpoint (as one
acknowledged in dc1 alone and replicated late) fires, once.

The DC names live only in ZooKeeper's membership data here (the single-node Cassandra
is one DC, ``datacenter1``): they are labels for the assignment."""

from __future__ import annotations

import time
from typing import cast

import pytest

from scheduler.domain.clock import SystemClock
from scheduler.domain.dispatch import App
from scheduler.domain.home import home_of
from scheduler.domain.keys import shard_of
from scheduler.domain.model import Job
from scheduler.fleet import dcs as dcrec
from scheduler.fleet.coord import ZooKeeperCoordinator
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller import Poller, PollerConfig
from scheduler.runtime.member import Fleet
from scheduler.store import SchemaOptions, open_store
from tests.conftest import ZOOKEEPER_HOSTS, cassandra_url
from tests.procs import wait_until

SHARDS = 8
WEIGHTS = {"dc1": 1, "dc2": 1}
FAILOVER_S = 3.0


@pytest.fixture
def env(cassandra_keyspace, zk_root):
    store = open_store(cassandra_url(cassandra_keyspace))
    store.apply_schema(SchemaOptions(shard_count=SHARDS, bucket_width_s=10), SystemClock().now_ms())
    members: list[Fleet] = []
    fired: list[tuple[str, str]] = []  # (member, job id)

    def member(name: str, dc: str) -> Fleet:
        coord = ZooKeeperCoordinator(ZOOKEEPER_HOSTS, zk_root, session_timeout_s=4.0, dc=dc)
        app = App.for_function(lambda job: fired.append((name, job.job_id)))
        fleet = Fleet(Poller(store, app, name=name, metrics=PollerMetrics(),
                             config=PollerConfig(poll_interval_s=0.5)),
                      coord, tick_s=0.2, debounce_s=0.3, failover_s=FAILOVER_S)
        fleet.start()
        members.append(fleet)
        return fleet

    yield store, zk_root, member, fired
    for fleet in members:
        fleet.stop()
    store.close()


def kill(fleet: Fleet) -> None:
    """As a crash that closes the session: the fleet loop stops, the member's node and
    its locks go with the session at once, and its lease is gone (nothing fires)."""
    fleet._stop.set()
    if fleet._thread is not None:
        fleet._thread.join(timeout=12)
    cast(ZooKeeperCoordinator, fleet.coord).zk.stop()


def zk(fleet: Fleet):
    return cast(ZooKeeperCoordinator, fleet.coord).zk


def homes() -> dict[str, set[int]]:
    out: dict[str, set[int]] = {"dc1": set(), "dc2": set()}
    for shard in range(SHARDS):
        out[home_of(shard, WEIGHTS) or ""].add(shard)
    return out


def test_home_dcs_fail_over_after_the_delay_and_back(env):
    store, root, member, fired = env
    home = homes()
    assert home["dc1"] and home["dc2"], "the rule splits 8 shards between both DCs"
    a1, a2, b1 = member("a1", "dc1"), member("a2", "dc1"), member("b1", "dc2")
    dcrec.write_home(zk(a1), root, WEIGHTS, None)

    def split_by_home() -> bool:
        return (a1.poller.shards | a2.poller.shards == home["dc1"] and b1.poller.shards == home["dc2"]
                and not a1.poller.shards & a2.poller.shards)

    wait_until(split_by_home, 60, "each shard owned by a member of its home DC")
    assert a1.poller.shards and a2.poller.shards  # both dc1 members share dc1's shards

    kill(a1)
    kill(a2)
    killed = time.monotonic()
    # Not before the delay: dc2 keeps to its own shards for the whole of it.
    while time.monotonic() - killed < FAILOVER_S - 0.3:
        assert b1.poller.shards <= home["dc2"], "dc2 took dc1's shards before the fail-over delay"
        time.sleep(0.1)
    wait_until(lambda: b1.poller.shards == set(range(SHARDS)), 60, "dc2 serving every shard")
    assert time.monotonic() - killed >= FAILOVER_S
    # The gauge is counted at the end of the tick that claimed the last shard.
    gauge = b1.poller.metrics.foreign_shards.labels(dc="dc2", home_dc="dc1")
    wait_until(lambda: gauge._value.get() == len(home["dc1"]), 5, "the foreign shards counted")

    records = dcrec.read_outages(zk(b1), root)
    taken = {r["shard"] for r in records}
    assert taken == home["dc1"]
    assert all(r["home_dc"] == "dc1" and r["dc"] == "dc2" and r["member"] == "b1"
               and isinstance(r["from_bucket"], int) and "ended_ms" not in r for r in records)

    # A row of a dc1 shard that reaches the store behind dc2's checkpoint.
    shard = min(home["dc1"])
    wait_until(lambda: drained(store, shard) > records[0]["from_bucket"], 30, "dc2 draining dc1's shard")
    late = next(f"late-{i}" for i in range(10_000) if shard_of(f"late-{i}", SHARDS) == shard)
    at_ms = drained(store, shard) * 1000 + 1
    store.insert_many([Job(late, "k", b"{}", True, at_ms, at_ms, at_ms // 10_000 * 10, shard)])

    back = time.monotonic()
    a3 = member("a3", "dc1")
    wait_until(lambda: a3.poller.shards == home["dc1"] and b1.poller.shards == home["dc2"], 60,
               "dc1's shards back with the returning dc1 member")
    assert time.monotonic() - back >= FAILOVER_S
    wait_until(lambda: all("ended_ms" in r for r in dcrec.read_outages(zk(b1), root)), 10,
               "the outage records closed by the fail-back")
    wait_until(lambda: gauge._value.get() == 0, 5, "no foreign shard counted after the fail-back")
    checkpoints = {c.shard: c.owner for c in store.checkpoints()}
    assert all(checkpoints[s] == "a3" for s in home["dc1"])

    # The catch-up: the late row fires once, from its home DC, and every window is marked.
    wait_until(lambda: any(j == late for _, j in fired), 60, "the late row fired by the catch-up")
    wait_until(lambda: all("caught_up_ms" in r for r in dcrec.read_outages(zk(b1), root)), 10,
               "every take-over window caught up")
    assert sum(r["moved"] for r in dcrec.read_outages(zk(b1), root)) == 1
    assert a3.catch_ups.moved == 1 and a3.poller.metrics.caught_up._value.get() == 1
    assert [j for _, j in fired].count(late) == 1


def drained(store, shard: int) -> int:
    return int(next(c.drained for c in store.checkpoints() if c.shard == shard))
