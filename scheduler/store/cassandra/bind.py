"""The Cassandra store's row parameters and single-partition batches of bucket rows."""

from __future__ import annotations

from functools import partial
from typing import Any

from cassandra.query import UNSET_VALUE, BatchStatement, BatchType

from .. import rows
from ..rows import partition_chunks

# A job's rows as Cassandra writes them: a job without a traceparent (every job of an
# untraced producer) binds the driver's unset value, which writes no cell, where a null
# would write a cell tombstone into each such row of the table every poll reads.
bucket_params = partial(rows.bucket_params, absent=UNSET_VALUE)
done_bucket_params = partial(rows.done_bucket_params, absent=UNSET_VALUE)
job_params = partial(rows.job_params, absent=UNSET_VALUE)


def bucket_writes(stmt: Any, rows: list[tuple[Any, tuple[Any, ...]]], max_bytes: int,
                  max_rows: int) -> list[tuple[Any, Any]]:
    """Bucket rows (a job and its parameters) grouped into single-partition unlogged
    batches, each one atomic mutation; a lone row is a plain statement."""
    writes: list[tuple[Any, Any]] = []
    for chunk in partition_chunks(rows, max_bytes, max_rows):
        if len(chunk) == 1:
            writes.append((stmt, chunk[0][1]))
        else:
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            batch.is_idempotent = True
            for _, params in chunk:
                batch.add(stmt, params)
            writes.append((batch, None))
    return writes
