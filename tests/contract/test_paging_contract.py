"""The bounded pages the console reads, on both stores: dead letters and recurring
schedules, each page at most ``limit`` rows, the pages together every row exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler import Client
from scheduler.domain.clock import FakeClock
from scheduler.domain.keys import bucket_of_ms
from scheduler.domain.model import Job
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store

T0_MS = 1_800_000_000_000


@pytest.fixture
def st(store_kind: str, request: Any, tmp_path: Any):
    s = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=2), now_ms=T0_MS)
    yield s
    s.close()


def test_dead_letters_page_through_every_part_once(st: Store):
    client = Client(st, clock=FakeClock(T0_MS))
    for i in range(23):
        job = Job(job_id=f"d{i:02}", kind="k", data=b"{}", data_json=True, due_ms=T0_MS + i,
                  fire_ms=T0_MS + i, bucket=bucket_of_ms(T0_MS, 60), shard=0)
        st.insert_many([job])
        st.record_dead(job, "boom", T0_MS + 1000)
    seen: list[str] = []
    after = None
    while True:
        page = client.dead_letter_page(after, 5)
        assert len(page) <= 5
        if not page:
            break
        seen += [d.job_id for d in page]
        after = page[-1].job_id
    assert sorted(seen) == [f"d{i:02}" for i in range(23)] and len(set(seen)) == 23


def test_schedules_page_in_the_stores_order_without_the_deleted(st: Store):
    client = Client(st, clock=FakeClock(T0_MS))
    for i in range(12):
        client.recurring.create(f"s{i:02}", kind="k", every="1h")
    client.recurring.delete("s05")
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        page, after = client.recurring.page(after, 5)
        pages += 1
        seen += [s.schedule_id for s in page]
        if after is None:
            break
    assert sorted(seen) == [f"s{i:02}" for i in range(12) if i != 5] and len(set(seen)) == 11
    assert pages == 3
