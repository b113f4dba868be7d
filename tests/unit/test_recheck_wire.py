"""Re-check entries (``"r"``: bucket rows a producer just retired) on the nudge wire, and
``DueQueue.discard`` that drops such a row from a poller's due queue. Pure: no store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.clock import FakeClock
from scheduler.domain.model import Job
from scheduler.poller.duequeue import DueQueue
from scheduler.producer.wire import (
    DATAGRAM_BYTES,
    MAX_DATAGRAM_BYTES,
    MAX_ENTRIES,
    Entry,
    decode,
    decode_message,
    encode,
)
from tests.unit.test_nudgewire import ENTRY, JSON, VALID_ENTRIES, assert_valid

T0_MS = 1_800_000_000_000


def message(j: Any = None, r: Any = None, v: Any = 1) -> bytes:
    msg: dict[str, Any] = {"v": v}
    if j is not None:
        msg["j"] = j
    if r is not None:
        msg["r"] = r
    return json.dumps(msg).encode()


# --- the wire -------------------------------------------------------------------------


def test_recheck_entries_round_trip_beside_due_now_ones():
    due = [(0, 1_800_000_000, T0_MS, "due")]
    gone = [(1, 1_800_000_000, T0_MS + 5, "gone"), (2, 1_800_000_060, T0_MS + 60_000, "é")]
    [both] = encode(due, recheck=gone)
    assert decode_message(both) == (due, gone)
    [only] = encode([], recheck=gone)
    assert decode_message(only) == ([], gone)
    assert encode([]) == encode([], recheck=[]) == []


def test_encode_without_recheck_writes_what_it_wrote_before():
    """Existing callers, and pollers that predate re-checks, see the same bytes."""
    assert encode([(0, 1, 2, "a"), (3, 4, 5, "b")]) == [b'{"v":1,"j":[[0,1,2,"a"],[3,4,5,"b"]]}']


def test_a_poller_that_predates_recheck_reads_a_recheck_datagram_as_an_empty_nudge():
    # The decoder as it was before "r": "j" must be a list of valid entries.
    [data] = encode([], recheck=[(0, 1, 2, "gone")])
    old = json.loads(data)
    assert old["v"] == 1 and old["j"] == []
    assert decode(data) == []  # decode still returns the due-now entries only


@pytest.mark.parametrize("data", [
    message(r=[[0, 0, 0, ""]]),  # one bad re-check entry rejects the datagram
    message(j=[[0, 0, 0, "a"]], r=[[0, 0, 0, "a"], [True, 0, 0, "a"]]),
    message(j=[[0, 0, 0, "a"]], r=[[0, 2**70, 0, "a"]]),
    message(j=[[0, 0, 0, "a"]], r=[[0, 0, 0, "recurring:s:1:2"]]),
    b'{"v":1,"j":[],"r":null}',  # "r" present, not a list
    message(j=[[0, 0, 0, "a"]], r={"0": [0, 0, 0, "a"]}),
    message(r=[[0, 0, 0, "a"]], v=2),
    b'{"v":1}',  # neither list
])
def test_a_bad_recheck_list_or_entry_rejects_the_whole_datagram(data: bytes):
    with pytest.raises(ValueError):
        decode_message(data)
    with pytest.raises(ValueError):
        decode(data)  # the due-now entries of a rejected datagram are not used either


def test_the_entry_bound_counts_both_lists():
    half = [[0, 0, 0, "a"]] * (MAX_ENTRIES // 2)
    decode_message(message(j=half, r=half).replace(b" ", b""))
    with pytest.raises(ValueError, match="entries"):
        decode_message(message(j=half, r=[*half, [0, 0, 0, "a"]]).replace(b" ", b""))


def test_encode_bounds_entries_and_bytes_over_both_lists():
    many = [(0, 0, 0, "a")] * (2 * MAX_ENTRIES)
    datagrams = encode(many, recheck=many)
    for d in datagrams:
        j, r = decode_message(d)
        assert 0 < len(j) + len(r) <= MAX_ENTRIES and len(d) <= DATAGRAM_BYTES
    assert [e for d in datagrams for e in decode_message(d)[0]] == many
    assert [e for d in datagrams for e in decode_message(d)[1]] == many
    # Long ids fill datagrams by size: an entry is 260 bytes, so four fit in 1,200 and a
    # fifth would not (14 + 4 x 260 + 3 commas = 1,057 bytes with "j"; 1,064 with "r").
    wide = [(0, 0, 0, "x" * 250)] * 20
    sizes = [len(d) for d in encode(wide, recheck=wide)]
    assert sizes == [1_057] * 5 + [1_064] * 5


def test_an_entry_too_big_for_a_datagram_of_its_own_is_left_out():
    huge = (0, 0, 0, "\x00" * 256)  # 256 bytes of id, 1,536 characters of JSON
    assert encode([], recheck=[huge]) == []
    assert decode_message(encode([], recheck=[huge, (0, 0, 0, "a")])[0]) == ([], [(0, 0, 0, "a")])


@pytest.mark.fuzz
@given(VALID_ENTRIES, VALID_ENTRIES)
def test_valid_entries_and_rechecks_round_trip_in_small_datagrams(entries: list[Entry], recheck: list[Entry]):
    datagrams = encode(entries, recheck=recheck)
    decoded = [decode_message(d) for d in datagrams]
    assert all(len(d) <= DATAGRAM_BYTES for d in datagrams)
    assert all(0 < len(j) + len(r) <= MAX_ENTRIES for j, r in decoded)

    def fits(e: Entry, frame: int) -> bool:
        return len(json.dumps(list(e), separators=(",", ":"))) + frame <= DATAGRAM_BYTES

    # ``{"v":1,"j":[]}`` frames a due-now entry, ``{"v":1,"j":[],"r":[]}`` a retired one.
    assert [e for j, _ in decoded for e in j] == [e for e in entries if fits(e, 14)]
    assert [e for _, r in decoded for e in r] == [e for e in recheck if fits(e, 21)]


NEAR_VALID_RECHECK = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, True, 1.0, 2, None]),
     "r": st.lists(ENTRY, max_size=12) | JSON},
    optional={"j": st.lists(ENTRY, max_size=12) | JSON, "x": JSON})


def decode_message_or_reject(data: bytes) -> None:
    """The property: ``ValueError`` (and nothing else), or entries all within range."""
    try:
        j, r = decode_message(data)
    except ValueError:
        return
    assert len(j) + len(r) <= MAX_ENTRIES
    assert_valid(j)
    assert_valid(r)


@pytest.mark.fuzz
@given(st.binary(max_size=MAX_DATAGRAM_BYTES + 100))
def test_decode_message_of_any_bytes_raises_only_value_error(data: bytes):
    decode_message_or_reject(data)


@pytest.mark.fuzz
@given(NEAR_VALID_RECHECK, st.booleans())
def test_decode_message_of_near_valid_json_raises_only_value_error(msg: dict[str, Any], ascii_only: bool):
    decode_message_or_reject(json.dumps(msg, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


# --- DueQueue.discard --------------------------------------------------------------------


def job(job_id: str, fire_ms: int, shard: int = 0, due_ms: int | None = None) -> Job:
    return Job(job_id=job_id, kind="k", data=b"", data_json=False,
               due_ms=fire_ms if due_ms is None else due_ms, fire_ms=fire_ms, bucket=0, shard=shard)


def test_discard_removes_one_queued_job_and_keeps_the_order_of_the_rest():
    q = DueQueue()
    for i, t in enumerate([500, 100, 300, 200, 400]):
        q.push(job(f"j{i}", t))
    assert q.discard("j3", 200) == job("j3", 200)
    assert q.discard("j3", 200) is None, "gone already"
    assert q.discard("j2", 999) is None, "the key is (fire_ms, job_id): another fire time is another row"
    assert len(q) == 4
    assert [j.job_id for j in q.pop_ready(1_000, 10)] == ["j1", "j2", "j4", "j0"]


def test_discard_finds_a_job_taken_early_by_its_fire_time_not_its_heap_time():
    q = DueQueue()
    early = job("now", 4_000, due_ms=1_000)
    q.push(early, at_ms=early.due_ms)  # leaves at 1,000: the heap's time is not the key
    q.push(job("later", 2_000))
    assert q.discard("now", 1_000) is None
    assert q.discard("now", 4_000) == early
    assert [j.job_id for j in q.pop_ready(5_000, 10)] == ["later"]


def test_discard_finds_a_job_parked_behind_its_shard_rate():
    clock = FakeClock()
    q = DueQueue(shard_rate=1, monotonic=clock.monotonic)
    for i in range(5):
        q.push(job(f"p{i}", 100 + i, shard=3))
    assert [j.job_id for j in q.pop_ready(1_000, 10)] == ["p0"]  # the rest is parked
    assert not q._heap and len(q._parked[3]) == 4
    assert q.discard("p2", 102) == job("p2", 102, shard=3)
    assert q.find([(101, "p1"), (102, "p2")]) == {(101, "p1"): job("p1", 101, shard=3)}
    assert len(q) == 3
    dispatched: list[str] = []
    while len(q):
        clock.advance(1)
        dispatched += [j.job_id for j in q.pop_ready(1_000, 10)]
    assert dispatched == ["p1", "p3", "p4"]


def test_discard_many_removes_from_heap_and_parked_in_one_pass():
    clock = FakeClock()
    q = DueQueue(shard_rate=1, monotonic=clock.monotonic)
    for i in range(3):
        q.push(job(f"a{i}", 100 + i, shard=0))
    q.pop_ready(1_000, 10)  # a0 leaves, a1 and a2 are parked
    q.push(job("b", 5_000, shard=1))
    dropped = q.discard_many({(101, "a1"), (102, "a2"), (5_000, "b"), (7, "unknown")})
    assert sorted(j.job_id for j in dropped) == ["a1", "a2", "b"]
    assert len(q) == 0 and q.next_wake_s(0) == 3600.0
