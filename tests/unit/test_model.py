from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.domain.model import (
    MAX_JOB_ID_BYTES,
    check_due,
    check_job_id,
    check_kind,
    encode_payload,
    parse_time,
)
from scheduler.errors import InvalidInput


def test_naive_datetime_is_an_error_not_utc():
    with pytest.raises(InvalidInput, match="no timezone"):
        check_due(datetime(2030, 1, 1))
    assert check_due(datetime(2030, 1, 1, tzinfo=UTC)) == 1_893_456_000_000


@pytest.mark.parametrize("bad", ["", None, 5, "x" * (MAX_JOB_ID_BYTES + 1), "\ud800"])
def test_bad_job_ids(bad):
    with pytest.raises(InvalidInput):
        check_job_id(bad)


def test_job_id_limit_counts_utf8_bytes():
    check_job_id("é" * (MAX_JOB_ID_BYTES // 2))
    with pytest.raises(InvalidInput, match="bytes"):
        check_job_id("é" * (MAX_JOB_ID_BYTES // 2 + 1))


@pytest.mark.parametrize("bad", ["", "1abc", "has space", "x" * 65, None, "email\n"])
def test_bad_kinds(bad):
    with pytest.raises(InvalidInput, match="short identifier"):
        check_kind(bad)


def test_payloads():
    assert encode_payload(b"\x00\x01", 10) == (b"\x00\x01", False)
    assert encode_payload({"a": [1, "é"]}, 100) == ('{"a":[1,"é"]}'.encode(), True)
    assert encode_payload(None, 10) == (b"null", True)
    with pytest.raises(InvalidInput, match="limit is 4 bytes"):
        encode_payload(b"12345", 4)
    with pytest.raises(InvalidInput, match="JSON-serialisable"):
        encode_payload({1, 2}, 100)


@pytest.mark.parametrize("text", ["2030-01-01T00:00:00Z", "2030-01-01T01:00:00+01:00",
                                  "2030-01-01 00:00:00z"])
def test_parse_time(text):
    assert parse_time(text) == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("text", ["2030-01-01T00:00:00", "tomorrow", ""])
def test_parse_time_errors(text):
    with pytest.raises(InvalidInput):
        parse_time(text)


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:59",
                                  "1969-12-31T23:59:59Z", "9999-12-31T00:00:01Z"])
def test_parse_time_refuses_instants_that_do_not_convert(text):
    # Accepted before, they raised ValueError or OverflowError later (from_ms, astimezone).
    with pytest.raises(InvalidInput, match="out of range"):
        parse_time(text)


def test_parse_time_quotes_at_most_64_characters():
    with pytest.raises(InvalidInput) as err:
        parse_time("x" * 10_000)
    assert len(str(err.value)) < 200


@pytest.mark.parametrize("line, message", [
    ("[" * 100_000, "nested too deeply"),
    ('{"id": NaN}', "NaN is not JSON"),
    ("Infinity", "Infinity is not JSON"),
    ("1" * 5000, "not valid JSON"),
])
def test_loads_refuses_what_is_not_strict_json(line, message):
    from scheduler.domain.jobspec import loads

    with pytest.raises(InvalidInput, match=message):
        loads(line, "f:1")


@pytest.mark.parametrize("jitter", [True, 10**400, "5", None])
def test_a_load_record_refuses_a_jitter_that_is_not_a_number(jitter):
    from scheduler.domain.jobspec import spec_from_dict

    with pytest.raises(InvalidInput, match="jitter"):
        spec_from_dict({"id": "a", "at": "2030-01-01T00:00:00Z", "kind": "k", "jitter": jitter}, 0)
