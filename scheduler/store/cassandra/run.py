"""The Cassandra store's I/O as effects, so one body serves a blocking call and an
``await`` (``AsyncClient``).

A store method decorated with ``dual`` is a generator that yields CQL effects (``Run``,
``Many``, ``Batch``, ``Lwt``) and receives their rows. Called normally, it is driven by
the blocking primitives (``run``, ``_concurrent``, ``_batch``, ``_lwt``), exactly as
before. ``acall`` drives the same generator on the running event loop: each statement
is sent with ``session.execute_async`` and its ``ResponseFuture`` resolves an asyncio
future through ``call_soon_threadsafe`` (no thread per call; the driver's own I/O
thread does the work). Errors are translated the same way on both paths.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .conf import translate

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Run:
    """One prepared statement by name; receives its rows."""

    name: str
    params: Sequence[Any] = ()
    what: str | None = None


@dataclass(frozen=True, slots=True)
class Many:
    """Bound statements run concurrently (``(statement, params)`` pairs); receives one row
    list per statement, in order. The first error raises."""

    items: list[tuple[Any, Any]]
    what: str


@dataclass(frozen=True, slots=True)
class Batch:
    """A logged batch of upserts and deletes by statement name; receives None."""

    what: str
    items: list[tuple[str, tuple[Any, ...]]]


@dataclass(frozen=True, slots=True)
class Lwt:
    """A lightweight transaction; receives whether it was applied (the current values of
    a refused one are read by the blocking ``_lwt`` only: no effect caller needs them)."""

    name: str
    params: Sequence[Any]
    what: str


Cql = Run | Many | Batch | Lwt
CqlSteps = Generator[Cql, Any, T]


class RunStatement(Protocol):
    """``CassandraStore.run``, the blocking form of ``Run``, for the mixins that call it."""

    def __call__(self, name: str, params: Sequence[Any] = ..., what: str | None = ...) -> list[Any]: ...


def dual(fn: Callable[..., CqlSteps[T]]) -> Callable[..., T]:
    """Make a CQL-effect generator method an ordinary blocking method; ``acall`` finds the
    generator under ``.steps``."""

    @functools.wraps(fn)
    def blocking(self: Any, *args: Any, **kwargs: Any) -> T:
        return self._drive(fn(self, *args, **kwargs))  # type: ignore[no-any-return]

    blocking.steps = fn  # type: ignore[attr-defined]
    return blocking


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if not fut.done():  # cancelled meanwhile: nobody waits for it
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)


class CassandraAsync:
    """Drivers of CQL effects (a mixin of ``CassandraStore``)."""

    session: Any
    concurrency: int
    prepared: Any
    run: Any
    _concurrent: Any
    _batch: Any
    _lwt: Any
    _batch_statement: Any

    def _drive(self, steps: CqlSteps[T]) -> T:
        value: Any = None
        while True:
            try:
                eff = steps.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(eff, Run):
                value = self.run(eff.name, eff.params, eff.what)
            elif isinstance(eff, Many):
                value = self._concurrent(eff.items, eff.what)
            elif isinstance(eff, Batch):
                value = self._batch(eff.what, eff.items)
            else:
                value = self._lwt(eff.name, eff.params, eff.what)[0]

    async def acall(self, method: str, *args: Any) -> Any:
        """``method(*args)`` without blocking the event loop. Raises ``TypeError`` for a
        method with no effect form (the async client never calls one)."""
        steps = getattr(getattr(type(self), method, None), "steps", None)
        if steps is None:
            raise TypeError(f"CassandraStore.{method} has no asynchronous form")
        gen = steps(self, *args)
        value: Any = None
        while True:
            try:
                eff = gen.send(value)
            except StopIteration as stop:
                return stop.value
            if isinstance(eff, Run):
                value = await self._execute(self.prepared(eff.name), eff.params, eff.what or eff.name)
            elif isinstance(eff, Many):
                value = await self._amany(eff.items, eff.what)
            elif isinstance(eff, Batch):
                await self._execute(self._batch_statement(eff.items), None, eff.what)
                value = None
            else:
                rows = await self._execute(self.prepared(eff.name), eff.params, eff.what)
                value = bool(rows[0][0])

    async def _execute(self, stmt: Any, params: Any, what: str) -> list[Any]:
        """One statement's rows, every page of them; a driver error as the typed error."""
        return (await self._amany([(stmt, params)], what))[0]

    async def _amany(self, items: list[tuple[Any, Any]], what: str) -> list[list[Any]]:
        """Every statement's rows, in order, with up to ``concurrency`` in flight. The
        fan-out runs on the driver's I/O thread (each completion sends the next
        statement) and wakes the event loop once, when all are done or one failed:
        one wake-up per group instead of one per statement."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[list[Any]]] = loop.create_future()
        _Fanout(self.session, items, self.concurrency, loop, fut).start()
        try:
            return await fut
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise translate(exc, what) from exc


class _Fanout:
    """``execute_concurrent`` that completes an asyncio future instead of blocking a
    thread (the driver's ``execute_concurrent_async`` still waits for the results)."""

    def __init__(self, session: Any, items: list[tuple[Any, Any]], concurrency: int,
                 loop: asyncio.AbstractEventLoop, fut: asyncio.Future[list[list[Any]]]) -> None:
        self.session, self.items, self.loop, self.fut = session, items, loop, fut
        self.concurrency = concurrency
        self.results: list[list[Any]] = [[] for _ in items]
        self.lock = threading.Lock()
        self.next = 0
        self.left = len(items)
        self.failed = False

    def start(self) -> None:
        for _ in range(min(self.concurrency, len(self.items))):
            self._send()

    def _send(self) -> None:
        with self.lock:
            if self.failed or self.next >= len(self.items):
                return
            idx = self.next
            self.next += 1
        stmt, params = self.items[idx]
        try:
            rf = self.session.execute_async(stmt, params)
        except Exception as exc:
            self._fail(exc)
            return
        rf.add_callbacks(self._on_page, self._fail, callback_args=(rf, idx))

    def _on_page(self, page: Any, rf: Any, idx: int) -> None:
        self.results[idx].extend(page or ())
        if rf.has_more_pages:
            rf.start_fetching_next_page()
            return
        with self.lock:
            self.left -= 1
            done = self.left == 0 and not self.failed
        if done:
            self.loop.call_soon_threadsafe(_settle, self.fut, self.results, None)
        else:
            self._send()

    def _fail(self, exc: BaseException) -> None:
        with self.lock:
            first = not self.failed
            self.failed = True
        if first:  # statements in flight finish on their own; nobody waits for them
            self.loop.call_soon_threadsafe(_settle, self.fut, None, exc)
