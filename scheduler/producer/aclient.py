"""``AsyncClient``: the producer client library for asyncio applications (FastAPI,
aiohttp, Starlette).

The same operations, errors and guarantees as ``Client``, from the same rules
(``scheduler.producer.producer``); only the I/O differs. On Cassandra every statement is sent
with the driver's ``execute_async`` and awaited, so no call blocks the event loop and
no thread is started per call; retries wait with ``asyncio.sleep``. On the embedded
store each call is a local SQLite transaction, run inline.

Opening the client connects to the store (a blocking step, done once, at start-up:
for example in a FastAPI lifespan); everything after that is awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from ..domain.effects import Steps, run_async
from ..domain.flow import DEFAULT_PRIORITY
from ..domain.jobspec import JobSpec
from ..domain.layout import Layout, Layouts
from ..domain.model import Job
from ..errors import InvalidInput
from ..observe.tracing import producer_span
from ..recurring.schedule import Schedule
from ..store.base import DeadLetter
from .client import ClientBase
from .jobview import JobView, describe
from .producer import Placeable
from .recurring import RecurringOps
from .replay import replay_dead

T = TypeVar("T")
# The most schedule() calls one group write holds (a schedule_many chunk).
GROUP_MAX = 5_000


class _Call(NamedTuple):
    """A schedule() call waiting for its group write: its job checked, its caller's
    future, and the traceparent its job stores (its own span's: calls of one group come
    from different traces)."""

    checked: Placeable
    fut: asyncio.Future[Job]
    traceparent: str | None


class AsyncClient(ClientBase):
    """Schedule, cancel, reschedule and look up jobs from async code; see ``Client`` for
    each operation's contract. Safe to share between the tasks of one event loop."""

    def _setup(self) -> None:
        # schedule() calls waiting for the group write in flight to finish.
        self._waiting: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, steps: Steps[T]) -> T:
        """Perform an operation of ``Producer`` (or of the recurring API) on the store."""
        return await run_async(self.store.acall, steps)

    async def layouts(self, fresh: bool = False) -> Layouts:
        return await self.run(self.producer.layouts(fresh))

    async def resize(self, count: int, at: datetime) -> Layout:
        """See ``Client.resize``."""
        return await self.run(self.producer.resize(count, at))

    async def schedule(self, job_id: str, due_at: datetime, kind: str, payload: Any = None, *,
                       jitter_s: float = 0.0, priority: int = DEFAULT_PRIORITY,
                       key: str | None = None) -> Job:
        """See ``Client.schedule``. Calls made while a write is in flight are written
        together (a group commit, see ``_flush``): each returns once its own job is
        acknowledged, with its own result or error."""
        with producer_span("scheduler.schedule", job_id, kind) as traceparent:
            try:
                checked = self.producer.check(JobSpec(job_id, due_at, kind, payload, jitter_s, priority, key))
            except InvalidInput as exc:
                raise InvalidInput(f"job #1 ({job_id!r}): {exc}") from None
            fut: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
            # Queued before any await: groups keep the order of the calls.
            self._waiting.append(_Call(checked, fut, traceparent))
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush())
            return await fut

    async def _flush(self) -> None:
        """Place and write the waiting jobs, up to ``GROUP_MAX`` at a time, until none
        wait. A job that cannot be placed fails its own call; a store error fails every
        call of its group (each may retry: the writes are idempotent), and the next group
        is still written. Two calls for one id go in different groups, in call order."""
        while self._waiting:
            # One turn of the loop first: the callers just answered (and any other ready
            # task) get to make their next call, so it joins this group.
            await asyncio.sleep(0)
            group: list[_Call] = []
            ids: set[str] = set()
            rest = []
            for item in self._waiting:
                if len(group) < GROUP_MAX and item.checked[0] not in ids:
                    group.append(item)
                    ids.add(item.checked[0])
                else:
                    rest.append(item)
            self._waiting = rest
            try:
                await self._write_group(group)
            except BaseException:  # this task was cancelled (the loop is closing): nobody
                for call in [*group, *self._waiting]:  # writes the rest; say so to each
                    call.fut.cancel()
                self._waiting = []
                raise

    async def _write_group(self, group: list[_Call]) -> None:
        try:
            placed = await self.run(self._place_all(group))
            jobs = [(j, call.fut) for j, call in zip(placed, group, strict=True) if isinstance(j, Job)]
            for j, call in zip(placed, group, strict=True):
                if isinstance(j, InvalidInput) and not call.fut.done():
                    call.fut.set_exception(InvalidInput(f"job #1 ({call.checked[0]!r}): {j}"))
            written = await self.run(self.producer.write_jobs([j for j, _ in jobs])) if jobs else []
        except Exception as exc:
            for call in group:
                if not call.fut.done():
                    call.fut.set_exception(exc)
            return
        for (_, fut), job in zip(jobs, written, strict=True):
            if not fut.done():
                fut.set_result(job)

    def _place_all(self, calls: list[_Call]) -> Steps[list[Job | InvalidInput]]:
        out: list[Job | InvalidInput] = []
        for c in calls:
            try:
                out.append((yield from self.producer.place(*c.checked, None, traceparent=c.traceparent)))
            except InvalidInput as exc:  # beyond the retention's reach: that call only
                out.append(exc)
        return out

    async def schedule_many(self, specs: Iterable[JobSpec | dict[str, Any]],
                            progress: Callable[[int], None] | None = None) -> list[Job]:
        """See ``Client.schedule_many``."""
        with producer_span("scheduler.schedule_many") as traceparent:
            return await self.run(self.producer.schedule_many(specs, progress, traceparent))

    async def reschedule(self, job_id: str, due_at: datetime, *, jitter_s: float = 0.0) -> Job:
        """See ``Client.reschedule``."""
        with producer_span("scheduler.reschedule", job_id) as traceparent:
            return await self.run(self.producer.reschedule(job_id, due_at, jitter_s, traceparent))

    async def cancel(self, job_id: str) -> bool:
        """See ``Client.cancel``."""
        with producer_span("scheduler.cancel", job_id):
            return await self.run(self.producer.cancel(job_id))

    async def get(self, job_id: str) -> Job:
        """See ``Client.get``."""
        return await self.run(self.producer.get(job_id))

    async def describe(self, job_id: str) -> JobView:
        """See ``Client.describe``."""
        return await self.run(describe(self.producer, job_id))

    async def dead_letters(self) -> list[DeadLetter]:
        """See ``Client.dead_letters``."""
        return sorted(await self.store.acall("dead_letters"), key=lambda d: d.died_ms)

    async def replay_dead(self, job_ids: Sequence[str] | None = None,
                          at: datetime | None = None) -> list[Job]:
        """See ``Client.replay_dead``."""
        return await self.run(replay_dead(self.producer, job_ids, at))

    @property
    def recurring(self) -> AsyncRecurring:
        """Recurring schedules, as ``Client.recurring`` (each call awaited)."""
        return AsyncRecurring(self)

    async def close(self) -> None:
        self._close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncRecurring:
    """``AsyncClient.recurring``: see ``scheduler.producer.recurring.Recurring`` for each
    operation's contract."""

    def __init__(self, client: AsyncClient) -> None:
        self.ops = RecurringOps(client.producer)
        self._run = client.run

    async def create(self, schedule_id: str, **options: Any) -> Schedule:
        return await self._run(self.ops.create(schedule_id, **options))

    async def update(self, schedule_id: str, **changes: Any) -> Schedule:
        return await self._run(self.ops.update(schedule_id, **changes))

    async def pause(self, schedule_id: str) -> Schedule:
        return await self._run(self.ops.pause(schedule_id))

    async def resume(self, schedule_id: str) -> Schedule:
        return await self._run(self.ops.resume(schedule_id))

    async def delete(self, schedule_id: str) -> None:
        await self._run(self.ops.delete(schedule_id))

    async def check(self, repair: bool = False) -> list[Schedule]:
        return await self._run(self.ops.check(repair))

    async def get(self, schedule_id: str) -> Schedule:
        return await self._run(self.ops.get(schedule_id))

    async def list(self) -> list[Schedule]:
        return await self._run(self.ops.list())

    async def view(self, s: Schedule) -> dict[str, Any]:
        return await self._run(self.ops.view(s))
