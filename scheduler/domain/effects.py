"""One implementation of the producer's rules for a synchronous and an asyncio caller.

The client library's operations (placement, late writes, retries, recurring changes)
are written once, as generators that *yield* the I/O they need (``Call``: a store
method; ``Sleep``: a pause) and receive its result, or its exception, back. Two small
drivers perform those effects: ``run_sync`` calls the store and ``time.sleep``;
``run_async`` awaits the store's ``acall`` (the driver's futures, for Cassandra) and
``asyncio.sleep``. This is the "sans-I/O" shape (h11, the hyper stack): no twin of
every method, as procrastinate has (``../shared/STYLE.md``).

Store errors are thrown back into the generator at its ``yield``, so ``try``/``except``
around a yield works as it would around a direct call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """Call ``store.<method>(*args)``."""

    method: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Effect = Call | Sleep
Steps = Generator[Effect, Any, T]


def call(method: str, *args: Any) -> Generator[Effect, Any, Any]:
    """``result = yield from call("get_many", ids)``: one store call, typed loosely."""
    return (yield Call(method, args))


def run_sync(store: Any, steps: Steps[T]) -> T:
    """Drive ``steps`` with blocking calls on ``store``; returns its result or raises
    what it raises (an exception it did not catch)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            if isinstance(effect, Sleep):
                time.sleep(effect.seconds)
            else:
                value = getattr(store, effect.method)(*effect.args)
        except Exception as exc:  # handed to the generator, which may handle it
            error = exc


async def run_async(acall: Callable[..., Awaitable[Any]], steps: Steps[T]) -> T:
    """Drive ``steps`` on the running event loop: ``await acall(method, *args)`` for a
    store call, ``asyncio.sleep`` for a pause. Cancelling the task cancels the await in
    progress; the generator is closed (a write in flight may or may not land, exactly
    as when a synchronous call is interrupted)."""
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                effect = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                if isinstance(effect, Sleep):
                    await asyncio.sleep(effect.seconds)
                else:
                    value = await acall(effect.method, *effect.args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = exc
    finally:
        steps.close()
