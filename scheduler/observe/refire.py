"""Window re-fire: schedule again every job whose firing was recorded in a time window
(the downstream system lost what was sent between 10:02 and 10:17).

Each job found gets a new job: the same kind and payload, the id
``refire:<from ms>-<to ms>:<old id>`` (``refire_id``), due at the window's end, which is
in the past, so it fires at once (now + late margin, or sooner with the due-now fast
path). Idempotent: the same window derives the same ids and due time, and ``schedule``
with an existing id and due time changes nothing, so running the command twice fires
each job once. ``get`` shows where a re-fired job came from (``refired_from``).

Which firings: bucket rows whose ``fired_at`` is in the window and whose lookup row says
fired (a cancel or a move also marks a row, and those are not firings). Jobs fire at or
after their bucket, so the scan reads the window's buckets and ``lookback_s`` before it
(default 1 h): a job that fired in the window more than that late is not found.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mmh3

from ..domain.jobspec import JobSpec
from ..domain.keys import bucket_of_ms, from_ms
from ..domain.model import MAX_JOB_ID_BYTES, Job, refired_from
from ..errors import InvalidInput
from ..store.roles import RowReads
from .audit import PARTS_AT_ONCE, classify, lookup_rows, read_partitions

PREFIX = "refire:"
DEFAULT_LOOKBACK_S = 3600
__all__ = ["Found", "check_window", "counts_by_kind", "fired_in_window", "refire_id", "refired_from", "specs"]


def refire_id(window: tuple[int, int], job_id: str) -> str:
    """The re-fired job's id; an old id too long to fit is replaced by its hash."""
    head = f"{PREFIX}{window[0]}-{window[1]}:"
    new = head + job_id
    if len(new.encode()) <= MAX_JOB_ID_BYTES:
        return new
    return head + "#" + format(mmh3.hash128(job_id.encode(), signed=False), "032x")


@dataclass(frozen=True)
class Found:
    job: Job
    fired_ms: int


def check_window(start_ms: int, end_ms: int, now_ms: int) -> None:
    """``InvalidInput`` unless ``[start_ms, end_ms]`` is a window of the past: the
    re-fired jobs are due at its end, so an end in the future would fire them then, not
    at once (and firings after now cannot have been recorded yet)."""
    if end_ms < start_ms:
        raise InvalidInput("--to is before --from; give a window forwards in time")
    if end_ms > now_ms:
        raise InvalidInput(f"--to {from_ms(end_ms).isoformat()} is in the future: the jobs would fire "
                           f"then, not at once; give a window that has ended (--to now or earlier, "
                           f"now is {from_ms(now_ms).isoformat()})")


def fired_in_window(store: RowReads, start_ms: int, end_ms: int, kind: str | None = None,
                    lookback_s: int = DEFAULT_LOOKBACK_S,
                    progress: Callable[[int, int], None] | None = None) -> list[Found]:
    """Jobs whose firing was recorded in ``[start_ms, end_ms]``, oldest firing first.
    Read-only; raises the store's errors."""
    width = store.meta().bucket_width_s
    layouts = store.layouts()
    first = bucket_of_ms(start_ms - lookback_s * 1000, width)
    last = bucket_of_ms(end_ms, width)
    parts = [(b, s) for b in range(first, last + 1, width) for s in range(layouts.read_count(b))]
    found: list[Found] = []
    for i in range(0, len(parts), PARTS_AT_ONCE):
        chunk = parts[i:i + PARTS_AT_ONCE]
        hits = [r for rows in read_partitions(store, chunk) for r in rows
                if r.fired_ms is not None and start_ms <= r.fired_ms <= end_ms
                and r.kind and (kind is None or r.kind == kind)]
        # The lookup rows as stored, a chunk at once: the bucket rows in hand already say
        # they fired (get_many would read them again to derive that).
        lookups = lookup_rows(store, [r.job_id for r in hits])
        for r in hits:
            now = lookups.get(r.job_id)
            # Fired here, not retired by a cancel, a dead letter or a move elsewhere.
            if now is not None and classify(r, now) == "fired":
                found.append(Found(r, r.fired_ms or 0))
        if progress is not None:
            progress(min(i + PARTS_AT_ONCE, len(parts)), len(parts))
    found.sort(key=lambda f: (f.fired_ms, f.job.job_id))
    return found


def specs(found: list[Found], window: tuple[int, int]) -> list[JobSpec]:
    """The jobs to schedule: same kind, payload, priority and key, due at the window's end."""
    due = from_ms(window[1])
    out = []
    for f in found:
        payload: Any = json.loads(f.job.data) if f.job.data_json else f.job.data
        out.append(JobSpec(refire_id(window, f.job.job_id), due, f.job.kind, payload,
                           priority=f.job.priority, key=f.job.key))
    return out


def counts_by_kind(found: list[Found]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in found:
        out[f.job.kind] = out.get(f.job.kind, 0) + 1
    return dict(sorted(out.items()))
