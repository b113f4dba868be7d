"""Driver policies for riding out a lost or restarted Cassandra node.

Measured here (issue 12): with the driver's default reconnection policy (exponential,
1 s doubling to 10 minutes) a poller whose only node was down for 30 s waited 25-110 s
more after the node was back, because the next reconnection attempt was that far
away; the session answered "no host" all along. A connection attempt to a down
loopback or LAN host costs one refused SYN, so we retry every 0.5 s, then every second.

Retries: our statements are idempotent upserts and deletes except the lightweight
transactions (marked so in ``CassandraStore.prepared``). An idempotent statement whose
coordinator timed out, was unavailable, or whose connection broke (a node killed with
-9) is retried on the next host (once, twice for a write), so a producer does not see an error while a
quorum of replicas is up. A lightweight transaction is never retried blindly: its
outcome is unknown, and callers re-read it at SERIAL.
"""

from __future__ import annotations

from typing import Any

from cassandra.policies import ExponentialReconnectionPolicy, RetryPolicy, WriteType

RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 1.0


def reconnection_policy() -> ExponentialReconnectionPolicy:
    return ExponentialReconnectionPolicy(base_delay=RECONNECT_FIRST_S, max_delay=RECONNECT_MAX_S,
                                         max_attempts=None)


_RETRIED_WRITES = {WriteType.SIMPLE, WriteType.BATCH, WriteType.UNLOGGED_BATCH, WriteType.BATCH_LOG}


class IdempotentRetryPolicy(RetryPolicy):  # type: ignore[misc]
    """Retry idempotent statements once on the next host; never a lightweight transaction."""

    def on_read_timeout(self, query: Any, consistency: Any, required_responses: int,
                        received_responses: int, data_retrieved: bool,
                        retry_num: int) -> tuple[int, Any]:
        if retry_num == 0 and getattr(query, "is_idempotent", False):
            return self.RETRY_NEXT_HOST, None
        return self.RETHROW, None

    def on_write_timeout(self, query: Any, consistency: Any, write_type: Any,
                         required_responses: int, received_responses: int,
                         retry_num: int) -> tuple[int, Any]:
        # Twice: until the failure detector convicts a killed node (several seconds), a
        # coordinator may pick it again for the batch log (measured: a logged batch
        # timed out on two coordinators in a row right after a kill -9).
        if retry_num < 2 and write_type in _RETRIED_WRITES and getattr(query, "is_idempotent", False):
            return self.RETRY_NEXT_HOST, None
        return self.RETHROW, None

    def on_unavailable(self, query: Any, consistency: Any, required_replicas: int,
                       alive_replicas: int, retry_num: int) -> tuple[int, Any]:
        # The coordinator's view of the ring may be stale (a node just back): another
        # coordinator may see enough replicas. Nothing was written, so this is always safe.
        return (self.RETRY_NEXT_HOST, None) if retry_num == 0 else (self.RETHROW, None)

    def on_request_error(self, query: Any, consistency: Any, error: Exception,
                         retry_num: int) -> tuple[int, Any]:
        # A broken connection or an overloaded node: the statement may have been applied.
        if retry_num < 2 and getattr(query, "is_idempotent", False):
            return self.RETRY_NEXT_HOST, None
        return self.RETHROW, None
