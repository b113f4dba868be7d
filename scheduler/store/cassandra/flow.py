"""The Cassandra store's flow-control rows (a mixin of ``CassandraStore``, which provides
``prepared``, ``_batch_statement`` and the effect drivers): limits and pauses per kind in
one partition of ``flow_limits``, and the pollers' demand in one partition of
``flow_demand`` with a TTL. Semantics: ``scheduler.store.flow``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...domain.flow import Demand, Limits
from ...domain.model import check_kind
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
from .run import Batch, CqlSteps, Many, Run, dual

# One statement per limit column: a change writes only the columns it names, so two
# operators' changes to different limits of a kind both stand.
SET_FIELD = {"rate_per_s": "set_flow_rate", "burst": "set_flow_burst",
             "concurrency": "set_flow_concurrency", "per_key_concurrency": "set_flow_per_key_concurrency"}
# Demand rows per batch: one partition, so a batch is one mutation; 8 rows of the
# longest names stay under Cassandra's 5 KiB batch warning.
DEMAND_BATCH = 8


class CassandraFlow:
    _batch_statement: Any

    @dual
    def set_limits(self, kind: str, rate_per_s: float | None, burst: int | None,
                   concurrency: int | None, per_key_concurrency: int | None, now_ms: int) -> CqlSteps[None]:
        """See ``FlowTables.set_limits``: one single-partition batch (one mutation)."""
        given = check_limits(kind, rate_per_s, burst, concurrency, per_key_concurrency, now_ms)
        if given:
            yield Batch(f"setting the limits of kind {kind!r}",
                        [(SET_FIELD[f], (v, now_ms, kind)) for f, v in given.items()])

    @dual
    def set_paused(self, kind: str, paused: bool, now_ms: int) -> CqlSteps[None]:
        check_pause(kind, paused, now_ms)
        yield Run("set_flow_paused", (paused, now_ms, kind),
                  f"{'pausing' if paused else 'resuming'} kind {kind!r}")

    @dual
    def clear_limits(self, kind: str) -> CqlSteps[None]:
        check_kind(kind)
        yield Run("clear_flow_limits", (kind,), f"clearing the limits of kind {kind!r}")

    @dual
    def flow_limits(self) -> CqlSteps[list[Limits]]:
        return limits_rows((yield Run("select_flow_limits", (), "reading the flow limits")))

    @dual
    def publish_demand(self, poller: str, entries: Sequence[DemandEntry],
                       now_ms: int) -> CqlSteps[None]:
        rows = [("upsert_flow_demand", (poller, k, d, r, now_ms, x, n, DEMAND_TTL_S))
                for k, d, r, x, n in check_demand(poller, entries, now_ms)]
        batches = [(self._batch_statement(rows[i:i + DEMAND_BATCH]), None)
                   for i in range(0, len(rows), DEMAND_BATCH)]
        if batches:
            yield Many(batches, f"publishing the demand of poller {poller!r}")

    @dual
    def demands(self, now_ms: int, max_age_ms: int) -> CqlSteps[list[Demand]]:
        check_age(now_ms, max_age_ms)
        rows = yield Run("select_flow_demand", (), "reading the fleet's demand")
        return demand_rows(rows, now_ms, max_age_ms)
