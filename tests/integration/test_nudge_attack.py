"""A poller sent thousands of random and crafted datagrams keeps firing on time.

A real poller (its threads, its nudge listener on 127.0.0.1) on the embedded store, and
an attacker thread that sends datagrams to the listener for as long as the test runs:
random bytes, deep JSON nesting, huge integers, bools, floats, lone surrogates, too many
entries, valid-looking nudges for jobs that do not exist or are due in an hour, and
replays of the real jobs' keys before they are due. Meanwhile jobs come due over a few
seconds and a producer schedules jobs due now (nudged by the client, as in production).
Every job fires once, none before its due time, all while the attack goes on (the
poller did not stall), the listener is still running and the rejected datagrams were
counted. "On time" here is an ordering, not a latency bound: ``ops/bench`` measures
lateness."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from scheduler import Client, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.domain.dispatch import App
from scheduler.domain.keys import bucket_of_ms
from scheduler.domain.model import Job
from scheduler.poller import Poller, PollerConfig
from scheduler.store import SchemaOptions, open_store
from tests.datagrams import Sender
from tests.procs import wait_until

SHARDS = 4
PER_PACE = 50  # datagrams between two short pauses: a flood, without starving the poller of CPU


def nudge(*entries: object, v: object = 1) -> bytes:
    return json.dumps({"v": v, "j": list(entries)}).encode()


def crafted(rng: random.Random, real: list[Job], future: Job) -> Callable[[], bytes]:
    """A maker of one hostile datagram of a random sort."""
    clock = SystemClock()

    def near() -> tuple[int, int]:
        fire = clock.now_ms() + rng.randrange(-2_000, 4_000)
        return bucket_of_ms(fire, 60), fire

    def ghost() -> bytes:  # valid-looking, for rows that do not exist: costs reads, fires nothing
        bucket, fire = near()
        return nudge(*[[rng.randrange(SHARDS), bucket, fire, f"ghost{rng.random()}"] for _ in range(20)])

    def replay() -> bytes:  # the real jobs' keys, before they are due
        jobs = rng.sample(real, min(10, len(real)))
        return nudge(*[[j.shard, j.bucket, j.fire_ms, j.job_id] for j in jobs])

    sorts: list[Callable[[], bytes]] = [
        lambda: rng.randbytes(rng.randrange(0, 1500)),
        lambda: b"[" * rng.choice([2_000, 2_400, 60_000]),
        lambda: b'{"v":1,"j":' + b"[" * 1_500,
        lambda: nudge([0, 2**rng.randrange(63, 200), 0, "a"]),
        lambda: nudge([rng.randrange(SHARDS), *near(), str(2**64)], [2**70, 0, 0, "b"]),
        lambda: nudge([True, *near(), "a"]),
        lambda: nudge([0, float(near()[0]), near()[1], "a"]),
        lambda: b'{"v":1,"j":[[0,NaN,Infinity,"a"]]}',
        lambda: nudge([0, *near(), "a"], v=rng.choice([True, 2, 1.0, "1", None])),
        lambda: nudge([0, *near(), "x" * rng.randrange(200, 2_000)]),
        lambda: nudge([0, *near(), "\ud800"]),
        lambda: nudge(*[[0, 0, 0, "a"]] * 300).replace(b" ", b""),
        lambda: nudge([0, *near(), "a", "extra"], [[[[0]]]], {"a": 1}),
        lambda: nudge([future.shard, future.bucket, future.fire_ms, future.job_id]),
        ghost, ghost, replay, replay,
    ]
    return lambda: rng.choice(sorts)()


def test_a_poller_under_a_datagram_attack_keeps_firing_on_time(tmp_path):
    clock = SystemClock()
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    store.apply_schema(SchemaOptions(shard_count=SHARDS), clock.now_ms())
    lock = threading.Lock()
    fired: list[tuple[str, int]] = []  # job id, handler called at

    def handler(job) -> None:
        with lock:
            fired.append((job.job_id, clock.now_ms()))

    poller = Poller(store, App.for_function(handler), name="victim",
                    config=PollerConfig(poll_interval_s=0.2, check_clock=False, notify_address="127.0.0.1:0"))
    poller.start(range(SHARDS))
    client = Client(store)
    halt = threading.Event()
    sent = 0
    attacker: threading.Thread | None = None
    try:
        assert poller.nudges.address is not None
        address = poller.nudges.address
        wait_until(lambda: poller.name in store.notify_endpoints(clock.now_ms()), 30,
                   "the poller's nudge address recorded (the client nudges due-now jobs)")
        now = datetime.now(UTC)
        future = client.schedule("in-an-hour", now + timedelta(hours=1), "k")
        soon = client.schedule_many([JobSpec(f"soon{i}", now + timedelta(seconds=4 + i / 10), "k")
                                     for i in range(40)])
        make = crafted(random.Random(27), soon, future)

        def attack() -> None:
            nonlocal sent
            with Sender(address) as s:
                while not halt.is_set():
                    for _ in range(PER_PACE):
                        s.send(make())
                        sent += 1
                    halt.wait(0.01)

        attacker = threading.Thread(target=attack, name="attacker", daemon=True)
        attacker.start()
        wait_until(lambda: sent >= 1_000, 30, "the attack under way")
        due_now = []
        for i in range(20):  # due now: placed 3 s out, and nudged by the client through the flood
            due_now.append(client.schedule(f"now{i}", datetime.now(UTC), "k"))
            halt.wait(0.1)
        due = {j.job_id: j.due_ms for j in [*soon, *due_now]}
        wait_until(lambda: set(due) <= {f[0] for f in fired}, 60, "every job fired")
        assert attacker.is_alive(), "the attack lasted until every job had fired"
    finally:
        halt.set()
        if attacker is not None:
            attacker.join(timeout=10)
        alive = any(t.name == "victim-nudge" and t.is_alive() for t in threading.enumerate())
        failure = poller.failure
        nudged = poller.stats.nudged
        poller.stop()
        client.close()
        store.close()
    assert sent >= 2_000, f"only {sent} datagrams sent"
    assert failure is None and alive, "the poller and its listener survived"
    rejected = poller.metrics.registry.get_sample_value("scheduler_nudges_rejected_total") or 0
    assert rejected > 0 and poller.nudges.bad == rejected
    # The listener kept applying nudges through the flood (not only the polls firing).
    assert nudged > 0, "no nudge was applied during the attack"
    counts = Counter(f[0] for f in fired)
    assert set(counts) == set(due), "nothing fired that was not due (ghosts, the hour-out job)"
    assert max(counts.values()) == 1
    early = [(job_id, at, due[job_id]) for job_id, at in fired if at < due[job_id]]
    assert not early, early[:3]
