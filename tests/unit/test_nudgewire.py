"""The nudge wire format and listener against hostile datagrams: ``decode`` raises only
``ValueError`` and returns only entries within range; the listener survives anything a
datagram holds, counts it in ``scheduler_nudges_rejected_total``, logs the first and
summarises the rest; ``apply`` never reads for an entry that cannot name a row it could
take. The poller tests run on the embedded store."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import Client
from scheduler.domain.clock import FakeClock
from scheduler.domain.dispatch import App
from scheduler.domain.keys import from_ms
from scheduler.domain.layout import MAX_SHARD_COUNT
from scheduler.domain.model import MAX_JOB_ID_BYTES, check_job_id
from scheduler.errors import InvalidInput
from scheduler.poller import Poller, PollerConfig
from scheduler.poller.nudge import MAX_BATCH, REJECTED_SUMMARY_S
from scheduler.producer.wire import (
    DATAGRAM_BYTES,
    INT64_MAX,
    MAX_DATAGRAM_BYTES,
    MAX_ENTRIES,
    Entry,
    decode,
    encode,
)
from scheduler.store import SchemaOptions, Store, open_store
from tests.datagrams import send as send_datagrams
from tests.procs import wait_until

T0_MS = 1_800_000_000_000


def nudge(*entries: list[Any], v: Any = 1) -> bytes:
    return json.dumps({"v": v, "j": list(entries)}).encode()


def assert_valid(entries: list[Entry]) -> None:
    assert len(entries) <= MAX_ENTRIES
    for shard, bucket, fire_ms, job_id in entries:
        assert type(shard) is int and 0 <= shard < MAX_SHARD_COUNT
        assert type(bucket) is int and 0 <= bucket <= INT64_MAX
        assert type(fire_ms) is int and 0 <= fire_ms <= INT64_MAX
        assert check_job_id(job_id) == job_id


def decode_or_reject(data: bytes) -> None:
    """The property: ``ValueError`` (and nothing else), or entries all within range."""
    try:
        entries = decode(data)
    except ValueError:
        return
    assert_valid(entries)


# --- one test per finding: each fails without its fix ---------------------------------


@pytest.mark.parametrize("data", [b"[" * 60_000, b"[" * 2_000, b'{"v":1,"j":' + b"[" * 1_500,
                                  b'{"v":1,"j":[' + b'{"a":' * 400 + b"1" + b"}" * 400 + b"]}"])
def test_deep_nesting_is_a_value_error_not_a_recursion_error(data: bytes):
    with pytest.raises(ValueError):
        decode(data)


@pytest.mark.parametrize("entry", [[2**64, 0, 0, "a"], [0, 2**63, 0, "a"], [0, 0, 2**70, "a"],
                                   [0, 0, -1, "a"], [-1, 0, 0, "a"], [MAX_SHARD_COUNT, 0, 0, "a"],
                                   [0, 10**300, 0, "a"]])
def test_integers_out_of_range_are_refused(entry: list[Any]):
    with pytest.raises(ValueError, match="bad entry"):
        decode(nudge(entry))


@pytest.mark.parametrize("data", [nudge([True, 0, 0, "a"]), nudge([0, False, 0, "a"]),
                                  nudge([0, 0, True, "a"]), nudge([0, 0, 0, "a"], v=True),
                                  nudge([0, 0, 0, "a"], v=1.0), nudge([0.0, 0, 0, "a"])])
def test_bools_and_floats_are_not_integers(data: bytes):
    with pytest.raises(ValueError):
        decode(data)


@pytest.mark.parametrize("job_id", ["", "\ud800", "x" * (MAX_JOB_ID_BYTES + 1), "é" * 129,
                                    "recurring:s:1:2", 7, None, ["a"]])
def test_job_ids_a_producer_could_not_write_are_refused(job_id: Any):
    with pytest.raises(ValueError, match="bad entry"):
        decode(nudge([0, 0, 0, job_id]))


def test_size_and_entry_count_are_bounded_before_parsing():
    with pytest.raises(ValueError, match="bytes"):
        decode(b" " * (MAX_DATAGRAM_BYTES + 1))
    decode(b" " * (MAX_DATAGRAM_BYTES - 40) + nudge([0, 0, 0, "a"]))  # padding is fine
    with pytest.raises(ValueError, match="entries"):
        decode(nudge(*[[0, 0, 0, "a"]] * (MAX_ENTRIES + 1)).replace(b" ", b""))


def test_valid_nudges_still_decode():
    entries = [(0, 1_800_000_000, T0_MS, "job-1"), (MAX_SHARD_COUNT - 1, INT64_MAX, 0, "\x00é")]
    assert decode(nudge(*map(list, entries))) == entries


# --- properties -------------------------------------------------------------------------

JSON_SCALARS = (st.none() | st.booleans() | st.floats() | st.text(max_size=20)
                | st.integers(min_value=-(2**80), max_value=2**80)
                | st.sampled_from([0, 1, -1, INT64_MAX, INT64_MAX + 1, MAX_SHARD_COUNT, 2**63, 10**30]))
JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=5)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=5), max_leaves=20)
IDS = (st.text(max_size=300)
       | st.integers(0xD800, 0xDFFF).map(chr)  # a lone surrogate, as "\udxxx" in JSON
       | st.sampled_from(["", "a", "\x00", "recurring:x:1:2", "x" * 257, "é" * 128, "é" * 129]))
INTS = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.booleans(), st.floats(),
                 st.sampled_from([0, INT64_MAX, INT64_MAX + 1, -1, MAX_SHARD_COUNT - 1, MAX_SHARD_COUNT]))
ENTRY = st.one_of(st.tuples(INTS, INTS, INTS, IDS).map(list), st.lists(JSON, max_size=6), JSON)
NEAR_VALID = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, True, 1.0, 2, "1", None, 0]), "j": st.lists(ENTRY, max_size=12) | JSON},
    optional={"x": JSON})


@pytest.mark.fuzz
@given(st.binary(max_size=MAX_DATAGRAM_BYTES + 100))
def test_decode_of_any_bytes_raises_only_value_error(data: bytes):
    decode_or_reject(data)


@pytest.mark.fuzz
@given(NEAR_VALID, st.booleans())
def test_decode_of_near_valid_json_raises_only_value_error_or_returns_entries_in_range(
        msg: dict[str, Any], ascii_only: bool):
    text = json.dumps(msg, ensure_ascii=ascii_only)
    decode_or_reject(text.encode("utf-8", "surrogatepass"))


@pytest.mark.fuzz
@given(JSON)
def test_decode_of_any_json_raises_only_value_error(value: Any):
    decode_or_reject(json.dumps(value).encode())


def valid_id(s: str) -> bool:
    try:
        check_job_id(s)
    except InvalidInput:
        return False
    return True


VALID_IDS = st.text(min_size=1, max_size=80).filter(valid_id)
VALID_ENTRIES = st.lists(st.tuples(st.integers(0, MAX_SHARD_COUNT - 1), st.integers(0, INT64_MAX),
                                   st.integers(0, INT64_MAX), VALID_IDS), max_size=300)


@pytest.mark.fuzz
@given(VALID_ENTRIES)
def test_valid_entries_round_trip_in_small_datagrams(entries: list[Entry]):
    datagrams = encode(entries)
    assert all(len(d) <= DATAGRAM_BYTES for d in datagrams)
    decoded = [decode(d) for d in datagrams]
    assert all(len(d) <= MAX_ENTRIES for d in decoded)
    # Only an entry too big for a datagram of its own is left out (its job takes the usual path).
    kept = [e for e in entries if len(json.dumps(list(e), separators=(",", ":"))) + 16 <= DATAGRAM_BYTES]
    assert [e for d in decoded for e in d] == kept


def test_encode_never_puts_more_than_max_entries_in_a_datagram():
    entries = [(0, 0, 0, "a")] * (3 * MAX_ENTRIES)
    datagrams = encode(entries)
    assert [e for d in datagrams for e in decode(d)] == entries


# --- the poller side, on the embedded store -----------------------------------------------


@pytest.fixture
def store(tmp_path: Any) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/store.db")
    s.apply_schema(SchemaOptions(shard_count=4), T0_MS - 60_000)
    yield s
    s.close()


def stepped_poller(store: Store, clock: FakeClock) -> Poller:
    poller = Poller(store, App.for_function(lambda job: None), clock=clock,
                    config=PollerConfig(checkpoint_interval_s=0, check_clock=False, layout_refresh_s=0))
    for s in range(4):
        poller.claim(s, 1)
    return poller


def test_huge_integers_never_reach_the_store(store: Store):
    clock = FakeClock(T0_MS)
    poller = stepped_poller(store, clock)
    job = Client(store, clock=clock).schedule("now", from_ms(T0_MS), "k")
    # The embedded store raised OverflowError for these (Cassandra's driver a struct.error).
    assert poller.nudge([(job.shard, 2**70, job.fire_ms, "now"), (job.shard, job.bucket, 2**64, "now"),
                         (2**64, job.bucket, job.fire_ms, "now")]) == 0


def test_apply_skips_without_a_read_what_it_could_never_take(store: Store, monkeypatch: pytest.MonkeyPatch):
    clock = FakeClock(T0_MS)
    poller = stepped_poller(store, clock)
    job = Client(store, clock=clock).schedule("now", from_ms(T0_MS), "k")
    reads: list[Any] = []
    real = store.read_buckets

    def read_buckets(parts: Any, limit: int) -> Any:
        reads.append(parts)
        return real(parts, limit)

    monkeypatch.setattr(store, "read_buckets", read_buckets)
    width_ms = store.meta().bucket_width_s * 1000
    far = (INT64_MAX // width_ms) * width_ms
    never: list[Any] = [
        (0, 2**70, job.fire_ms, "x"),  # the store would raise OverflowError
        (job.shard, far // 1000, far, "x"),  # within int64, ages beyond any due-now job
        (job.shard, job.bucket + 60, job.fire_ms, "x"),  # a bucket that cannot hold the fire time
        (job.shard, job.bucket - 120, job.fire_ms - 2 * width_ms, "x"),  # closed by the cursor
        (job.shard, job.bucket, job.fire_ms + 3_600_000, "x"),  # placed an hour out: not due now
        (MAX_SHARD_COUNT + 5, job.bucket, job.fire_ms, "x"), (True, job.bucket, job.fire_ms, "now"),
        (job.shard, job.bucket, job.fire_ms, "recurring:s:1:2"), "garbage", (1, 2),
    ]
    assert poller.nudge(never) == 0
    assert reads == []
    assert poller.nudge([*never, (job.shard, job.bucket, job.fire_ms, job.job_id)]) == 1
    assert len(reads) == 1 and len(reads[0]) == 1


def test_rejections_are_logged_once_then_summarised(store: Store, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, "scheduler.poller")
    clock = FakeClock(T0_MS)
    nudges = stepped_poller(store, clock).nudges
    for _ in range(5):
        nudges._reject(("10.0.0.9", 5000), "not JSON")
    clock.advance(REJECTED_SUMMARY_S)
    nudges._reject(("10.0.0.9", 5000), "not JSON")
    lines = [r for r in caplog.records if getattr(r, "action", None) == "nudge_rejected"]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    assert "10.0.0.9:5000" in lines[0].getMessage()
    assert "4 more like it" in lines[1].getMessage()
    metrics = nudges.core.metrics.registry
    assert metrics.get_sample_value("scheduler_nudges_rejected_total") == 6


def test_a_flood_is_drained_in_bounded_batches(store: Store):
    nudges = stepped_poller(store, FakeClock(T0_MS)).nudges
    address = nudges.bind("127.0.0.1:0")
    try:
        send_datagrams(address, *[nudge([0, 0, 0, "a"])] * (MAX_BATCH + 10))
        assert nudges.sock is not None
        first = nudges.sock.recvfrom(65535)
        assert len(nudges._drain(*first)) == MAX_BATCH, "the rest waits for the next batch"
        assert len(nudges._drain(*nudges.sock.recvfrom(65535))) == 10
    finally:
        nudges.close()


@pytest.fixture
def running(store: Store) -> Iterator[Poller]:
    """A poller with its threads and its nudge listener on 127.0.0.1, owning every shard."""
    poller = Poller(store, App.for_function(lambda job: None),
                    config=PollerConfig(poll_interval_s=0.2, check_clock=False, notify_address="127.0.0.1:0"))
    poller.start(range(4))
    yield poller
    poller.stop()


def listener_alive(poller: Poller) -> bool:
    return any(t.name == f"{poller.name}-nudge" and t.is_alive() for t in threading.enumerate())


def send(poller: Poller, *datagrams: bytes) -> None:
    assert poller.nudges.address is not None
    send_datagrams(poller.nudges.address, *datagrams)


def rejected(poller: Poller) -> float:
    return poller.metrics.registry.get_sample_value("scheduler_nudges_rejected_total") or 0.0


def test_the_listener_survives_every_hostile_datagram(running: Poller):
    hostile = [b"[" * 60_000, b"[" * 2_000, nudge([0, 2**70, 2**70, "a"]), nudge([True, 0, 0, "a"]),
               nudge([0, 0, 0, "\ud800"]), b"\xff\xfe", b"", b"{}", nudge([0, 0, 0, "a"], v=2)]
    send(running, *hostile)
    wait_until(lambda: rejected(running) >= len(hostile), 30, "every hostile datagram rejected")
    assert running.failure is None and listener_alive(running)


def test_the_listener_survives_an_exception_from_apply(running: Poller, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture):
    calls: list[list[Entry]] = []
    real = running.nudges.apply

    def buggy(entries: Any) -> int:
        calls.append(list(entries))
        if len(calls) <= 2:  # the batch, then the datagram alone
            raise RuntimeError("a bug in apply")
        return real(entries)

    monkeypatch.setattr(running.nudges, "apply", buggy)
    send(running, nudge([0, 0, 0, "a"]))
    wait_until(lambda: rejected(running) == 1, 30, "the datagram that raised rejected")
    assert running.failure is None and listener_alive(running)
    send(running, nudge([1, 0, 0, "b"]))
    wait_until(lambda: len(calls) == 3, 30, "the next datagram applied")
    assert calls[2] == [(1, 0, 0, "b")] and rejected(running) == 1
    failed = [r for r in caplog.records if getattr(r, "action", None) == "nudge_failed"]
    assert len(failed) == 1 and failed[0].exc_info is not None, "the traceback, once"
