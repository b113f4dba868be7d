"""Window re-fire on both stores: which firings a window finds, and the jobs it derives."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.domain.model import refired_from
from scheduler.observe.refire import counts_by_kind, fired_in_window, refire_id, specs
from scheduler.store import SchemaOptions, Store
from tests.conftest import bucket_job, make_store

T0_MS = 1_800_000_000_000
S = 2


@pytest.fixture
def st(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    s = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=S), now_ms=T0_MS)
    yield s
    s.close()


job = functools.partial(bucket_job, kind="email", data=b'{"n":1}')


def test_finds_the_firings_recorded_in_the_window_only(st: Store):
    early, inside, late_fire, other_kind, cancelled, moved, pending = (
        job("early", T0_MS + 1000), job("inside", T0_MS + 2000), job("late", T0_MS - 600_000, shard=1),
        job("sms", T0_MS + 3000, kind="sms"), job("cancelled", T0_MS + 4000), job("moved", T0_MS + 5000),
        job("pending", T0_MS + 6000))
    st.insert_many([early, inside, late_fire, other_kind, cancelled, moved, pending])
    st.record_fired([early], T0_MS + 1000)                     # before the window
    st.record_fired([inside, other_kind], T0_MS + 70_000)      # in it
    st.record_fired([late_fire], T0_MS + 80_000)               # in it, 11 minutes late
    st.cancel(cancelled)                                       # marked, but not a firing
    st.move(moved, job("moved", T0_MS + 900_000))              # likewise
    window = (T0_MS + 60_000, T0_MS + 120_000)
    found = fired_in_window(st, *window)
    assert [f.job.job_id for f in found] == ["inside", "sms", "late"]
    assert [f.job.job_id for f in fired_in_window(st, *window, kind="sms")] == ["sms"]
    assert [f.job.job_id for f in fired_in_window(st, *window, lookback_s=60)] == ["inside", "sms"]
    assert counts_by_kind(found) == {"email": 2, "sms": 1}
    out = specs(found, window)
    assert [s.job_id for s in out] == [refire_id(window, j) for j in ("inside", "sms", "late")]
    assert out[0].payload == {"n": 1} and out[1].kind == "sms"
    assert {s.due_at for s in out} == {out[0].due_at} and int(out[0].due_at.timestamp() * 1000) == window[1]


def test_refire_ids_name_their_origin_and_fit():
    window = (1, 2)
    assert refired_from(refire_id(window, "a:b")) == "a:b"
    long_id = "x" * 256
    hashed = refire_id(window, long_id)
    assert len(hashed.encode()) <= 256 and (refired_from(hashed) or "").startswith("#")
    assert refired_from("plain") is None
