"""The W3C ``traceparent`` parser: a stored value is taken only in the exact form this code
writes, an incoming header by the specification's forward-compatible rules, and neither
raises for any input. A stored value that is not one leaves the job runnable (no poison
row, no crash), on its read path and the poller's."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from scheduler.domain.traceparent import (
    TraceParent,
    format_traceparent,
    parse_stored,
    parse_traceparent,
    stored_traceparent,
)
from scheduler.store.rows import (
    bucket_params,
    job_from_bucket_row,
    job_from_row,
    job_params,
    jobs_from_bucket_rows,
)
from tests.conftest import bucket_job

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FIRE = 1_800_000_005_000
BITS = st.sampled_from(["00", "01", "ff", "cc", "-", "0" * 32, "0" * 16, "4bf92f3577b34da6a3ce929d0e0e4736",
                        "00f067aa0ba902b7", "4BF92F3577B34DA6A3CE929D0E0E4736", "a", " ", "\t", "\n", "é",
                        "-what-ever", "\x00", "g" * 16])


def test_the_specification_example_reads_back_as_written():
    tp = parse_traceparent(VALID)
    assert tp == TraceParent(0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, 1)
    assert tp.sampled and tp.text() == VALID
    assert stored_traceparent(VALID) == VALID and parse_stored(VALID) == tp


@pytest.mark.parametrize("bad", [
    None, 42, b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", "00",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # uppercase
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    VALID + "-extra",  # version 00 has four fields
    VALID[:-1], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
])
def test_invalid_values_are_none_never_an_error(bad):
    assert parse_traceparent(bad) is None
    assert stored_traceparent(bad) is None and (not isinstance(bad, str) or parse_stored(bad) is None)


def test_a_later_version_keeps_its_ids_and_only_the_sampled_flag():
    tp = parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff-what-ever")
    assert tp is not None and tp.flags == 1
    assert tp.text() == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x") is None
    # Stored values are only ever written by this code, in version 00.
    assert stored_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") is None


def test_blanks_around_a_header_are_dropped_but_not_inside_a_store():
    assert parse_traceparent(f" {VALID}\t") == parse_traceparent(VALID)
    assert stored_traceparent(f" {VALID}") is None and stored_traceparent(VALID + "\n") is None


def test_format_refuses_an_invalid_span_context():
    with pytest.raises(ValueError):
        format_traceparent(0, 1, 1)
    with pytest.raises(ValueError):
        format_traceparent(1, 1 << 64, 1)


@pytest.mark.fuzz
@given(st.one_of(st.text(max_size=80), st.lists(BITS, max_size=10).map("".join),
                 st.binary(max_size=60), st.integers()))
@example(VALID)
@example("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n")
def test_any_input_gives_a_traceparent_or_none(value):
    incoming = parse_traceparent(value)
    if incoming is not None:
        # What an incoming header gives is a value a store keeps, and the same ids.
        assert stored_traceparent(incoming.text()) == incoming.text()
        assert parse_stored(incoming.text()) == incoming
    stored = stored_traceparent(value)
    if stored is not None:
        assert parse_traceparent(stored) == parse_stored(stored)
        assert parse_stored(stored).text() == stored  # type: ignore[union-attr]


@pytest.mark.fuzz
@given(st.integers(1, (1 << 128) - 1), st.integers(1, (1 << 64) - 1), st.integers(0, 255))
def test_every_span_context_round_trips(trace_id, span_id, flags):
    text = format_traceparent(trace_id, span_id, flags)
    assert stored_traceparent(text) == text
    assert parse_traceparent(text) == parse_stored(text) == TraceParent(trace_id, span_id, flags)


def bucket_row(traceparent: object) -> tuple[object, ...]:
    # select_bucket_rows' order: bucket_params without the write-only tail, fired_at,
    # priority, key, traceparent.
    return (*bucket_params(bucket_job("j", FIRE))[:9], None, 5, None, traceparent)


@pytest.mark.parametrize("hostile", ["not-a-traceparent", b"\x00" * 55, 55, 1.5, VALID.upper(), VALID + " "])
def test_a_hostile_stored_traceparent_is_ignored_and_the_row_still_runs(hostile):
    [job] = jobs_from_bucket_rows([bucket_row(hostile)])
    assert job.kind == "k" and job.traceparent is None
    job = bucket_job("j", FIRE)
    assert job_from_row((*job_params(job)[:14], hostile)).traceparent is None


def test_params_and_rows_carry_the_traceparent():
    job = bucket_job("j", FIRE)._replace(traceparent=VALID)
    assert bucket_params(job)[-1] == VALID and job_params(job)[-1] == VALID
    assert job_from_bucket_row(bucket_row(VALID)) == job
    assert job_from_row(job_params(job)) == job
    # No traceparent: the store's stand-in for "no cell" (Cassandra's unset value).
    marker = object()
    plain = bucket_job("j", FIRE)
    assert bucket_params(plain, absent=marker)[-1] is marker
    assert job_params(plain, absent=marker)[-1] is marker
