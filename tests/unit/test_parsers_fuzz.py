"""Property-based tests of the parsers that read outside input on the command line and
in load files: each raises only its documented error for any text, and what it accepts
is usable downstream. ``scheduler load`` runs whole, on the embedded store: a file it
refuses writes nothing.

Bounded by the profile in tests/conftest.py; ``ops/test --fuzz`` runs the long one.
"""

from __future__ import annotations

import contextlib
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from scheduler.domain.durations import MAX_S, format_seconds, seconds, whole_seconds
from scheduler.domain.jobspec import loads, records_from_lines, spec_from_dict
from scheduler.domain.keys import from_ms, to_ms
from scheduler.domain.layout import MAX_SHARD_COUNT, parse_shard_spec
from scheduler.domain.model import parse_time
from scheduler.errors import ConfigError, InvalidInput, SchedulerError
from scheduler.fleet.url import check_coordinator_url
from scheduler.observe.lag import parse_bucket
from scheduler.recurring.rule import Rule, zone
from scheduler.store import check_store_url, open_store
from tests.conftest import sqlite_dump as dump

pytestmark = pytest.mark.fuzz

T0_MS = 1_800_000_000_000
# Text near the formats, so examples reach past the first character check.
ISO_BITS = st.sampled_from(["2027", "-", "03", "01", "T", "09", ":", "00", "Z", "z", "+", "01:00", ".", "5",
                            "9999", "0001", "24", "60", " ", "\x00", "٣", "_", "+23:59", "-23:59", "12"])
DURATION_BITS = st.sampled_from(["1", "0", "90", ".", "5", "s", "m", "h", "d", " ", "-", "e", "9" * 13,
                                 "nan", "inf", "٣", "_", "ms", "S"])
SHARD_BITS = st.sampled_from(["0", "1", "15", "16383", "16384", "-", ",", " ", "9" * 30, "٣", "_", "+", "-1"])
URL_BITS = st.sampled_from(["sqlite:", "cassandra:", "zookeeper:", "local", "//", "/", "h", "127.0.0.1",
                            ":", "9042", "99999", "[", "]", "::1", "@", "u", "p", ",", "?", "local_dc=x",
                            "protocol_version=", "&", "#", "ks", ".", "..", "\x00", " ", "%", "é", "\n"])
CRON_BITS = st.sampled_from(["*", "0", "5", "59", "60", "31", "2", "/", ",", "-", " ", "L", "W", "#", "MON",
                             "jan", "@daily", "@", "?", "7", "1-5", "*/0", "H", "\t"])


def joined(bits: st.SearchStrategy[str], most: int = 12) -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=40), st.lists(bits, max_size=most).map("".join))


@given(joined(ISO_BITS))
@example("0001-01-01T00:00:00+01:00")
@example("9999-12-31T23:59:59-23:59")
def test_parse_time_raises_only_invalid_input(text):
    try:
        dt = parse_time(text)
    except InvalidInput:
        return
    assert dt.tzinfo is not None and dt.utcoffset() is not None
    assert from_ms(to_ms(dt)).year >= 1970  # converts to epoch ms and back


@given(joined(ISO_BITS), st.sampled_from([1, 10, 60, 3600]))
@example("\u00b2", 60)  # isdigit(), yet int() refuses it: once a ValueError
@example("-\u0663", 60)
def test_parse_bucket_raises_only_invalid_input(text, width):
    try:
        bucket = parse_bucket(text, width)
    except InvalidInput:
        return
    assert bucket % width == 0


@given(joined(DURATION_BITS), st.booleans())
@example("9" * 12 + "d", True)
@example("1e3", True)
def test_durations_raise_only_invalid_input(text, fraction):
    try:
        value = seconds(text, "--x") if fraction else whole_seconds(text, "--x")
    except InvalidInput as exc:
        assert "--x" in str(exc)
        return
    assert math.isfinite(value) and 0 <= value <= MAX_S
    if not fraction:
        assert isinstance(value, int)
        assert whole_seconds(format_seconds(value), "--x", allow_zero=True) == value


@given(st.floats(min_value=0, max_value=MAX_S, allow_nan=False))
def test_a_formatted_duration_reads_back(value):
    assert seconds(format_seconds(value), "--x") == pytest.approx(value, rel=1e-9, abs=1e-9)


@given(joined(SHARD_BITS))
def test_shard_specs_raise_only_invalid_input(text):
    try:
        shards = parse_shard_spec(text)
    except InvalidInput:
        return
    assert shards == sorted(set(shards)) and all(0 <= s < MAX_SHARD_COUNT for s in shards)


@given(joined(URL_BITS, 16))
@example("sqlite:/x.db")
@example("cassandra://[::1/ks")
@example("cassandra://h/ks?protocol_version=x")
def test_store_urls_raise_only_config_error(text):
    try:
        check_store_url(text)
    except ConfigError:
        return
    assert text.lower().startswith(("sqlite://", "cassandra://"))


@given(st.lists(URL_BITS, max_size=8).map("".join))
def test_opening_a_missing_embedded_store_creates_nothing(tmp_path_factory, rest):
    assume(".." not in rest)  # stay inside the folder: never open files elsewhere on this machine
    folder = tmp_path_factory.mktemp("stores")
    url = f"sqlite:///{folder}/{rest}"
    with contextlib.suppress(SchedulerError):
        open_store(url, create=False).close()
    assert list(folder.iterdir()) == []


@given(joined(URL_BITS, 16))
@example("zookeeper://h:99999/x")
@example("zookeeper://[::1/x")
def test_coordinator_urls_raise_only_config_error(text):
    from kazoo.hosts import collect_hosts

    try:
        parsed = check_coordinator_url(text)
    except ConfigError:
        return
    if parsed is not None:
        hosts, _ = collect_hosts(parsed.hosts)  # what the ZooKeeper client will make of it
        assert hosts and parsed.root.startswith("/")


@given(joined(CRON_BITS, 10), st.one_of(st.none(), st.text(max_size=30),
                                       st.sampled_from(["UTC", "Europe/Lisbon", "America/New_York"])))
@example("0 0 29 2 *", "Europe/Lisbon")
@example("* * * * *", "Europe")
def test_cron_rules_and_zones_raise_only_invalid_input(cron, tz):
    try:
        rule = Rule.parse(cron=cron, tz=tz)
    except InvalidInput:
        return
    nxt = rule.after(T0_MS)
    assert nxt > T0_MS
    assert rule.back(nxt) == nxt


@given(st.one_of(st.text(max_size=30), st.sampled_from(["Europe", "posix", "right", "../../etc/passwd",
                                                          "x" * 5000, "UTC\x00"])))
def test_zones_raise_only_invalid_input(name):
    with contextlib.suppress(InvalidInput):
        zone(name)


@given(joined(DURATION_BITS))
def test_intervals_raise_only_invalid_input(every):
    try:
        rule = Rule.parse(every=every, anchor_ms=T0_MS)
    except InvalidInput:
        return
    assert rule.after(T0_MS) == T0_MS + (rule.every_s or 0) * 1000


# --- load lines -----------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10)
GOOD = {"id": "f1", "at": "2030-01-01T00:00:00Z", "kind": "k", "payload": {"a": 1}}
FIELD_VALUES = st.one_of(JSON_VALUES, st.sampled_from(["2030-01-01T00:00:00Z", "2030-01-01T00:00:00", "k",
                                                       "recurring:x", "a" * 300, "", 1e400, -1, 10**400]))
RECORDS = st.dictionaries(st.sampled_from(["id", "job_id", "at", "due_at", "kind", "payload", "jitter",
                                           "jitter_s", "other"]), FIELD_VALUES, max_size=6)


def bad_line() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=60),
        RECORDS.map(lambda r: json.dumps({**GOOD, **r})),
        JSON_VALUES.map(json.dumps),
        st.sampled_from(["[" * 100_000, '{"id": NaN}', "Infinity", "1" * 5000, '{"a": 1', "\ufeff{}",
                         json.dumps({**GOOD, "jitter": True}), json.dumps({**GOOD, "jitter": 10**400})]))


@given(bad_line())
def test_a_load_line_raises_only_invalid_input(line):
    try:
        for i, raw in enumerate(records_from_lines([line], "f")):
            spec_from_dict(raw, i)
    except InvalidInput:
        pass


@given(st.text(max_size=200))
def test_loads_raises_only_invalid_input(text):
    with contextlib.suppress(InvalidInput):
        loads(text, "--payload")


@pytest.fixture(scope="module")
def load_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    from scheduler.domain.clock import SystemClock
    from scheduler.store import SchemaOptions

    url = f"sqlite:///{tmp_path_factory.mktemp('load') / 'load.db'}"
    st_ = open_store(url)
    st_.apply_schema(SchemaOptions(), SystemClock().now_ms())
    st_.close()
    return url


# Each example runs the whole command on a store: a third of the profile's examples.
@settings(max_examples=max(30, settings().max_examples // 3))
@given(st.lists(st.one_of(st.just(json.dumps(GOOD)), bad_line()), min_size=1, max_size=5),
       st.sampled_from(["utf-8", "latin-1", "utf-16"]))
def test_a_load_file_with_a_bad_line_writes_nothing(load_store, tmp_path_factory, lines, encoding):
    """The real command on a file of good and bad lines: exit 0 and every job written, or
    one error line and the store as it was."""
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO

    from typer.main import get_command

    import scheduler.cli.main  # noqa: F401  (registers every command)
    from scheduler.cli.common import app

    text = "\n".join(lines)
    try:
        data = text.encode(encoding)
    except UnicodeEncodeError:
        assume(False)
    path = Path(tmp_path_factory.mktemp("f")) / "jobs.jsonl"
    path.write_bytes(data)
    before = dump(load_store)
    with redirect_stdout(StringIO()) as stdout, redirect_stderr(StringIO()) as stderr:
        code = get_command(app).main(["load", str(path), "--json", "--store", load_store], "scheduler",
                                     standalone_mode=False)
    out, err = stdout.getvalue(), stderr.getvalue()
    assert "Traceback" not in out + err
    if code == 0:
        assert json.loads(out)["loaded"] == sum(1 for line in lines if line.strip())
    else:
        assert code == 1 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
        assert dump(load_store) == before


def test_a_load_file_that_is_valid_is_written(load_store, tmp_path, capsys):
    """The property above can pass by refusing everything: a valid file does load."""
    from typer.main import get_command

    import scheduler.cli.main  # noqa: F401
    from scheduler.cli.common import app

    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps({**GOOD, "id": "valid-1", "at": datetime(2030, 1, 2, tzinfo=UTC).isoformat()})
                    + "\n\n")
    assert get_command(app).main(["load", str(path), "--store", load_store], "scheduler",
                                 standalone_mode=False) == 0
    assert "scheduled 1 job\n" in capsys.readouterr().out
