"""The fired-through rule, pure: which bucket rows with no fired_at read as fired."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.model import Job, Status
from scheduler.store.rows import derive_fired


def row(fire: int, job_id: str, fired: int | None = None) -> Job:
    return Job(job_id, "k", b"", True, fire, fire, 0, 0,
               Status.PENDING if fired is None else Status.FIRED, 0, fired)


def test_a_row_at_or_before_a_mark_fired_at_the_first_mark_after_it():
    rows = [row(1, "a"), row(2, "b", fired=7), row(3, "c"), row(5, "d"), row(9, "e")]
    out = derive_fired(rows, [(1, "a", 100), (3, "c", 200), (6, "", 300)])
    assert [(j.job_id, j.status, j.fired_ms) for j in out] == [
        ("a", Status.FIRED, 100), ("b", Status.FIRED, 7), ("c", Status.FIRED, 200),
        ("d", Status.FIRED, 300), ("e", Status.PENDING, None)]
    assert derive_fired(rows, []) is rows


keys = st.tuples(st.integers(0, 50), st.sampled_from("abc"))


@given(st.lists(keys, unique=True),
       st.lists(st.tuples(keys, st.integers(0, 10**6)), unique_by=lambda m: m[0]))
def test_derived_as_one_row_at_a_time(row_keys, marks):
    rows = [row(f, j) for f, j in sorted(row_keys)]
    ms = sorted((f, j, at) for (f, j), at in marks)
    out = derive_fired(rows, ms)
    assert [j.job_id for j in out] == [j.job_id for j in rows] and len(out) == len(rows)
    for r, o in zip(rows, out, strict=True):
        covering = [at for f, j, at in ms if (f, j) >= (r.fire_ms, r.job_id)]
        assert o.fired_ms == (covering[0] if covering else None)
