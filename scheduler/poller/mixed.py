"""Where each kind runs: the app's handlers, and the built-in kind ``http``.

Any poller runs ``http`` jobs unless its app has an ``http`` handler of its own. The
built-in handler is a coroutine, so it needs an event loop:

- an app of coroutines (or one with no handler at all) gets it as one more route on its
  loop (``AsyncWorkers``): ``concurrency`` handlers at once, ``http`` ones included;
- an app of plain functions keeps its worker threads, and ``http`` jobs go to an event
  loop of their own beside them (``MixedWorkers``). Both count against the poller's one
  in-flight cap (``concurrency`` plus ``queue_ahead``): a slow target holds a socket and
  a slot of that cap, never a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ..domain.dispatch import App, Outcome
from ..domain.httptarget import HTTP_KIND
from ..domain.model import Job
from .aio import AsyncWorkers
from .dispatcher import due_jobs
from .httptargets import HttpTargets
from .shared import Core
from .workers import ThreadWorkers


class MixedWorkers(ThreadWorkers):
    """Worker threads for the app's plain handlers (this class is their ``ThreadWorkers``),
    and an event loop (``on_loop``) for the ``http`` jobs, made when the poller starts or
    first fires one (a poller built and never started opens no loop)."""

    def __init__(self, core: Core, app: App, make_loop: Callable[[], AsyncWorkers]) -> None:
        super().__init__(core, app)
        self._make_loop = make_loop
        self._loop: AsyncWorkers | None = None

    @property
    def on_loop(self) -> AsyncWorkers:
        if self._loop is None:
            self._loop = self._make_loop()
        return self._loop

    def submit(self, jobs: list[Job]) -> None:
        http = [j for j in jobs if j.kind == HTTP_KIND]
        if http:
            self.on_loop.submit(http)
            if len(http) == len(jobs):
                return
            jobs = [j for j in jobs if j.kind != HTTP_KIND]
        super().submit(jobs)

    def fire_inline(self, jobs: list[Job]) -> list[Outcome]:
        """Run handlers in the caller's thread; the outcomes in the order of ``jobs``."""
        http = [j for j in jobs if j.kind == HTTP_KIND]
        rest = [j for j in jobs if j.kind != HTTP_KIND]
        done = [*(self.on_loop.fire_inline(http) if http else []),
                *(super().fire_inline(rest) if rest else [])]
        by_id = {o.job.job_id: o for o in done}
        return [by_id[j.job_id] for j in jobs]

    def start(self) -> None:
        super().start()
        self.on_loop.start()
        self.threads += self.on_loop.threads  # the poller joins them all at its stop

    def stop(self) -> None:
        super().stop()
        if self._loop is not None:
            self._loop.stop()


def make_workers(core: Core, app: App, http: HttpTargets) -> ThreadWorkers | AsyncWorkers | MixedWorkers:
    """The workers for ``app`` (see the module); ``http`` is the built-in handler. Raises
    ``ConfigError`` for an app that mixes coroutine and plain handlers."""
    is_async = app.is_async()
    take = partial(due_jobs, core)
    route = app.http_route(http)
    if route is None:
        return AsyncWorkers(core, app, take=take) if is_async else ThreadWorkers(core, app)
    if is_async or not app.has_handlers():
        workers = AsyncWorkers(core, app.extended({HTTP_KIND: route}), take=take, on_close=http.aclose)
        http.loop = workers.loop
        return workers
    def make_loop() -> AsyncWorkers:
        loop = AsyncWorkers(core, app.extended({HTTP_KIND: route}, alone=True), sets_cap=False,
                            on_close=http.aclose)
        http.loop = loop.loop
        return loop

    return MixedWorkers(core, app, make_loop)
