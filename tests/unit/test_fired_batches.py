"""Batches of firings, pure: which bucket rows with no fired_at read as fired (Cassandra
lists the rows it fired, one row of ``fired_batches`` per partition and batch)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.model import Job, Status
from scheduler.store.rows import derive_fired, fired_keys


def row(fire: int, job_id: str, fired: int | None = None) -> Job:
    return Job(job_id, "k", b"", True, fire, fire, 0, 0,
               Status.PENDING if fired is None else Status.FIRED, 0, fired)


def batch(at: int, *keys: tuple[int, str]) -> tuple[int, int, str, list[int], list[str]]:
    ks = sorted(keys)
    return (at, ks[0][0], ks[0][1], [f for f, _ in ks], [j for _, j in ks])


def test_a_listed_row_fired_at_its_batch_and_a_row_between_listed_ones_did_not():
    rows = [row(1, "a"), row(2, "b", fired=7), row(3, "c"), row(4, "late"), row(5, "d"), row(9, "e")]
    fired = fired_keys([batch(100, (1, "a"), (3, "c")), batch(300, (5, "d"), (3, "c")), batch(200, (5, "d"))])
    out = derive_fired(rows, fired)
    assert [(j.job_id, j.status, j.fired_ms) for j in out] == [
        ("a", Status.FIRED, 100), ("b", Status.FIRED, 7), ("c", Status.FIRED, 300),
        ("late", Status.PENDING, None), ("d", Status.FIRED, 300), ("e", Status.PENDING, None)]
    assert derive_fired(rows, {}) is rows


def test_batches_that_start_after_the_range_are_not_read():
    found = fired_keys([batch(1, (5, "x")), batch(2, (1, "a"), (9, "z"))], upto=(3, ""))
    assert found == {(1, "a"): 2, (9, "z"): 2}


keys = st.tuples(st.integers(0, 50), st.sampled_from("abc"))


@given(st.lists(keys, unique=True), st.lists(st.tuples(st.integers(0, 10**6), st.lists(keys, min_size=1))))
def test_a_row_is_fired_exactly_when_a_batch_lists_it_at_the_latest_time(row_keys, batches):
    rows = [row(f, j) for f, j in sorted(row_keys)]
    out = derive_fired(rows, fired_keys([batch(at, *ks) for at, ks in batches]))
    assert [j.job_id for j in out] == [j.job_id for j in rows]
    for r, o in zip(rows, out, strict=True):
        times = [at for at, ks in batches if (r.fire_ms, r.job_id) in ks]
        assert o.fired_ms == (max(times) if times else None)
        assert o.status is (Status.FIRED if times else Status.PENDING)


def test_a_malformed_batch_row_is_skipped_and_its_rows_read_as_pending():
    good = batch(5, (1, "a"))
    bad = [(7, 1, "b", [2, 3], ["b"]), (None, 1, "c", [4], ["c"]), (7, None, "d", [5], ["d"]),
           (7, 1, "e", None, None), (7, 1)]
    assert fired_keys([good, *bad], upto=(100, "")) == {(1, "a"): 5}
