"""A stored priority and key as the readers see them: a row from before schema v007 has
the defaults, a priority outside 0-9 written outside the client's checks is clamped, and a
priority that is not a whole number or a key that is not text makes a poison row
(dead-lettered, not a crash)."""

from __future__ import annotations

import pytest

from scheduler.domain.model import POISON_KIND
from scheduler.store.rows import (
    bucket_params,
    job_from_bucket_row,
    job_from_row,
    job_params,
    jobs_from_bucket_rows,
)
from tests.conftest import bucket_job

FIRE = 1_800_000_005_000


def bucket_row(priority: object, key: object) -> tuple[object, ...]:
    # select_bucket_rows' order: bucket_params without the write-only tail, fired_at, then
    # priority, key and traceparent.
    job = bucket_job("j", FIRE)
    return (*bucket_params(job)[:9], None, priority, key, None)


@pytest.mark.parametrize(("stored", "read"), [(None, 5), (0, 0), (9, 9), (7, 7), (12, 9), (-3, 0)])
def test_a_stored_priority_reads_as_0_to_9(stored, read):
    assert job_from_bucket_row(bucket_row(stored, None)).priority == read
    job = bucket_job("j", FIRE)
    assert job_from_row((*job_params(job)[:12], stored, "k", None)).priority == read


def test_a_row_before_v007_has_no_key():
    job = job_from_bucket_row(bucket_row(None, None))
    assert (job.priority, job.key) == (5, None)
    assert job_from_bucket_row(bucket_row(3, "acct")).key == "acct"


@pytest.mark.parametrize("bad", ["high", 2.5, b"9"])
def test_a_priority_that_is_not_a_whole_number_is_a_poison_row(bad):
    [job] = jobs_from_bucket_rows([bucket_row(bad, None)])
    assert job.kind == POISON_KIND and "priority" in (job.last_error or "")


def test_params_and_rows_agree():
    job = bucket_job("j", FIRE)._replace(priority=2, key="c-1")
    assert bucket_params(job)[-3:-1] == (2, "c-1") and job_params(job)[-3:-1] == (2, "c-1")
    assert job_from_bucket_row((*bucket_params(job)[:9], None, *bucket_params(job)[-3:])) == job
    assert job_from_row(job_params(job)) == job


@pytest.mark.parametrize("bad", [b"cust", 42, 1.5])
def test_a_key_that_is_not_text_is_a_poison_row(bad):
    # SQLite keeps whatever a hand-written row holds: a blob key once crashed the recorder
    # (hashing it to place the job later), now the row is dead-lettered as poison.
    [job] = jobs_from_bucket_rows([bucket_row(5, bad)])
    assert job.kind == POISON_KIND and "key" in (job.last_error or "")
