"""The embedded store's flow-control rows (a mixin of ``SqliteStore``, which provides
``_tx``, a transaction, and ``_all``, a read). Semantics: ``scheduler.store.flow``; the
same as Cassandra's except that demand rows carry no TTL: readers filter by ``at_ms``
and each publish purges rows older than ``DEMAND_TTL_S``."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...domain.flow import Demand, Limits
from ...domain.model import check_kind
from .. import queries
from ..flow import (
    DEMAND_TTL_S,
    DemandEntry,
    check_age,
    check_demand,
    check_limits,
    check_pause,
    demand_rows,
    limits_rows,
)


def _q(name: str) -> str:
    return queries.named("sqlite/queries.sql")[name]


class SqliteFlow:
    _tx: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _all: Callable[[str, Sequence[Any]], list[Any]]

    def set_limits(self, kind: str, rate_per_s: float | None, burst: int | None,
                   concurrency: int | None, per_key_concurrency: int | None, now_ms: int) -> None:
        given = check_limits(kind, rate_per_s, burst, concurrency, per_key_concurrency, now_ms)
        if not given:
            return
        with self._tx() as db:
            db.execute(_q("set_flow_limits"), (kind, given.get("rate_per_s"), given.get("burst"),
                                               given.get("concurrency"), given.get("per_key_concurrency"),
                                               now_ms))

    def set_paused(self, kind: str, paused: bool, now_ms: int) -> None:
        check_pause(kind, paused, now_ms)
        with self._tx() as db:
            db.execute(_q("set_flow_paused"), (kind, int(paused), now_ms))
            db.execute(_q("delete_empty_flow_limits"), (kind,))

    def clear_limits(self, kind: str) -> None:
        check_kind(kind)
        with self._tx() as db:
            db.execute(_q("clear_flow_limits"), (kind,))
            db.execute(_q("delete_empty_flow_limits"), (kind,))

    def flow_limits(self) -> list[Limits]:
        return limits_rows(self._all(_q("select_flow_limits"), ()))

    def publish_demand(self, poller: str, entries: Sequence[DemandEntry],
                       now_ms: int) -> None:
        rows = [(poller, k, d, r, now_ms, x, n) for k, d, r, x, n in check_demand(poller, entries, now_ms)]
        if not rows:
            return
        with self._tx() as db:
            db.executemany(_q("upsert_flow_demand"), rows)
            db.execute(_q("purge_flow_demand"), (now_ms - DEMAND_TTL_S * 1000,))

    def demands(self, now_ms: int, max_age_ms: int) -> list[Demand]:
        oldest = check_age(now_ms, max_age_ms)
        return demand_rows(self._all(_q("select_flow_demand"), (oldest,)), now_ms, max_age_ms)
