"""What only ``AsyncClient`` has: concurrent calls written together (a group commit),
each with its own result or error, and an event loop that keeps running while the
store works. The rest of its contract is the client contract suite, which runs against
both clients (``make_client``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from scheduler import AsyncClient, InvalidInput, JobNotFound, Status
from scheduler.domain.clock import FakeClock
from scheduler.store import Store
from tests.contract.test_client_contract import T0, T0_MS


def run(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_concurrent_calls_each_get_their_own_result_or_error(store: Store):
    async def main() -> list[object]:
        async with AsyncClient(store, clock=FakeClock(T0_MS)) as client:
            calls = [client.schedule(f"j-{i}", T0 + timedelta(minutes=5, seconds=i), "k", {"i": i})
                     for i in range(300)]
            calls.insert(7, client.schedule("bad", T0, ""))  # an empty kind: refused alone
            # The same id twice at once: written one after the other, the second a reschedule.
            calls += [client.schedule("twice", T0 + timedelta(hours=1), "k"),
                      client.schedule("twice", T0 + timedelta(hours=2), "k")]
            return await asyncio.gather(*calls, return_exceptions=True)

    results = run(main())
    assert isinstance(results[7], InvalidInput) and "kind" in str(results[7])
    jobs = [r for i, r in enumerate(results) if i != 7]
    assert not [r for r in jobs if isinstance(r, BaseException)]
    assert store.get("bad") is None
    assert len(store.get_many([f"j-{i}" for i in range(300)])) == 300
    twice = store.get("twice")
    assert twice is not None and twice.due_at == T0 + timedelta(hours=2) and twice.status is Status.PENDING


def test_the_event_loop_runs_while_the_store_works(store: Store):
    """A ticker keeps ticking while 2,000 calls are written: on Cassandra every statement
    is awaited, so the loop runs other tasks meanwhile. (The embedded store's calls are
    short local transactions run inline: there, only completion is checked.) Counted in
    ticks, not timed: a loop blocked for the whole write would tick about never."""
    from scheduler.domain.keys import from_ms

    async def main() -> int:
        async with AsyncClient(store) as client:
            ticks = 0
            done = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not done.is_set():
                    await asyncio.sleep(0.001)
                    ticks += 1

            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0.01)
            before = ticks
            due = client.clock.now_ms()
            await asyncio.gather(*(client.schedule(f"t-{i}", from_ms(due + 600_000 + i), "k")
                                   for i in range(2_000)))
            during = ticks - before
            done.set()
            await tick
            return during

    during = run(main())
    assert len(store.get_many([f"t-{i}" for i in range(2_000)])) == 2_000
    if "cassandra" in store.url:
        assert during >= 5, f"the loop ticked {during} times while 2,000 calls were written"


def test_errors_are_the_clients_typed_errors(store: Store):
    async def main() -> None:
        async with AsyncClient(store, clock=FakeClock(T0_MS)) as client:
            with pytest.raises(JobNotFound, match="unknown, or expired"):
                await client.get("nope")
            assert await client.cancel("nope") is False
            job = await client.schedule("c", T0 + timedelta(minutes=3), "k")
            assert await client.cancel("c") is True
            assert (await client.get("c")).status is Status.CANCELLED
            moved = await client.reschedule("c", T0 + timedelta(minutes=9))
            assert moved.fire_ms > job.fire_ms and (await client.get("c")).status is Status.PENDING

    run(main())
