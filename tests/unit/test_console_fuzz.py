"""Property-based tests of the console's query parameters and forms (hypothesis), through
Starlette's test client on the embedded store.

The property: whatever the query string of a GET or the body of a POST, the console
answers 2xx, 3xx or 4xx, never 500, and without a valid session and its CSRF token
nothing is written to the store (the database's full dump is the same after).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from scheduler import Client
from scheduler.console.app import build
from scheduler.console.guard import COOKIE, Guard
from scheduler.console.pages import Fleet
from scheduler.store import SchemaOptions, open_store

TOKEN = "t0ken-for-the-console-fuzz-tests"
GETS = ["/", "/fleet", "/fleet/live", "/buckets", "/jobs", "/schedules", "/dead", "/audit", "/limits",
        "/login"]
POSTS = ["/login", "/logout", "/dead/replay", "/jobs/cancel", "/schedules/pause", "/schedules/resume",
         "/refire"]
PARAMS = ["at", "shard", "after", "id", "kind", "error", "from", "to", "run", "done", "n",
          "job_id", "schedule_id", "csrf", "who", "token"]
FORM_TYPES = ["application/x-www-form-urlencoded", "multipart/form-data; boundary=xYz",
              "multipart/form-data", "text/plain", "application/json", ""]

# Text a browser or a script could send: any character but lone surrogates (which no
# client can encode in a URL or a form).
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
numbers = st.integers(min_value=-10**20, max_value=10**20).map(str)
# Around the limits of a signed 64-bit integer (the store's), of a time and of a bucket's
# start (multiples of 60 s), and far past them.
edges = st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, 253402214400, 253402214400000, 10**30])
huge = st.one_of(st.builds(lambda e, d: e + d, edges, st.integers(-2, 2)),
                 st.integers(min_value=2**62, max_value=10**40)).flatmap(
    lambda n: st.sampled_from([str(n), str(-n), str(n - n % 60), str(-(n - n % 60))]))
page_keys = st.builds(lambda n, job: f"{n}:{job}", st.one_of(huge, numbers),
                      st.sampled_from(["x", "soon", "d1"]))
times = st.sampled_from(["2026-12-01T09:00Z", "0", "-1", "9" * 30, "1e9", "now", "2026-13-45T99:99Z",
                         "1800000000", "2026-12-01T09:00+25:00", "\u0661\u0662"])
known_ids = st.sampled_from(["", "1", "recurring:x:1:1", "d1", "soon", "nightly"])
value = st.one_of(text, numbers, huge, page_keys, times, known_ids)
key = st.one_of(st.sampled_from(PARAMS), text)
pairs = st.lists(st.tuples(key, value), max_size=8)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path, Client]]:
    path = tmp_path_factory.mktemp("fuzz") / "store.db"
    store = open_store(f"sqlite:///{path}")
    now = datetime.now(UTC)
    store.apply_schema(SchemaOptions(shard_count=2), int(now.timestamp() * 1000) - 3 * 3_600_000)
    client = Client(store)
    client.schedule("soon", now + timedelta(hours=1), "email", {"to": "a"})
    for i in range(2):
        client.schedule(f"d{i}", now + timedelta(hours=2), "email")
        store.record_dead(client.get(f"d{i}"), f"HTTP 50{i}", client.clock.now_ms())
    client.recurring.create("nightly", kind="report", cron="0 3 * * *", tz="Europe/Lisbon")
    fleet = Fleet(client, lambda: None, step_s=1)
    fleet.sample()
    http = TestClient(build(client, fleet, Guard(TOKEN, allow_actions=True)), raise_server_exceptions=True)
    yield http, path, client
    client.close()
    store.close()


def dump(path: Path) -> str:
    """Everything the store holds, as SQL (a separate read-only connection)."""
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return "\n".join(db.iterdump())
    finally:
        db.close()


def raw_query(items: list[tuple[str, str]], raw: str | None) -> str:
    return quote(raw, safe="=&+%") if raw is not None else urlencode(items)


@pytest.mark.fuzz
@given(route=st.sampled_from(GETS), items=pairs, raw=st.one_of(st.none(), text))
def test_any_query_string_gets_a_page_or_a_4xx_and_writes_nothing(console: Any, route: str,
                                                                  items: list[tuple[str, str]],
                                                                  raw: str | None):
    http, path, _ = console
    before = dump(path)
    r = http.get(f"{route}?{raw_query(items, raw)}", follow_redirects=False)
    assert r.status_code < 500, (route, items, raw, r.text[-500:])
    assert dump(path) == before


FIELDS = ["job_id", "schedule_id", "csrf", "from", "to", "kind", "who", "token"]
# The fields the console reads, each present or not, and a few others.
form = st.tuples(st.fixed_dictionaries({}, optional={k: value for k in FIELDS}),
                 st.lists(st.tuples(key, value), max_size=3))
# Mostly the form type browsers send, where the fields are read.
content_types = st.sampled_from(FORM_TYPES[:1] * 5 + FORM_TYPES)


@pytest.mark.fuzz
@given(route=st.sampled_from(POSTS), fields=form,
       auth=st.sampled_from(["none", "session", "forged", "bearer"]), secret=text,
       content_type=content_types, raw=st.one_of(st.none(), st.none(), st.binary(max_size=600)))
def test_any_form_is_refused_or_answered_and_writes_nothing_without_session_and_csrf(
        console: Any, route: str, fields: tuple[dict[str, str], list[tuple[str, str]]], auth: str,
        secret: str, content_type: str, raw: bytes | None):
    """``secret`` is a forged cookie or bearer token; with a live session, the CSRF token
    is whatever the form holds (never the session's)."""
    http, path, _ = console
    headers: dict[bytes, bytes] = {b"content-type": content_type.encode()} if content_type else {}
    if auth == "session":
        signed = http.post("/login", data={"who": "fuzz", "token": TOKEN}, follow_redirects=False)
        headers[b"cookie"] = f"{COOKIE}={signed.cookies[COOKIE]}".encode()
    elif auth == "forged":
        headers[b"cookie"] = f"{COOKIE}=".encode() + secret.encode()
    elif auth == "bearer":  # a wrong token (the right one may write: that is its purpose)
        headers[b"authorization"] = b"Bearer " + secret.encode()
    known, others = fields
    body = raw if raw is not None else urlencode([*known.items(), *others]).encode()
    before = dump(path)
    r = TestClient(http.app).post(route, content=body, headers=headers, follow_redirects=False)
    assert r.status_code < 500, (route, fields, raw, r.text[-500:])
    if route not in ("/login", "/logout"):
        assert r.status_code in (400, 403, 413), (route, r.status_code)
    assert dump(path) == before


@pytest.mark.fuzz
@given(at=st.one_of(times, huge, numbers), shard=st.one_of(st.just("0"), numbers, huge),
       after=st.one_of(st.none(), page_keys, text))
def test_the_bucket_page_answers_any_numbers_with_a_page_or_a_400(console: Any, at: str, shard: str,
                                                                 after: str | None):
    """The integers of the bucket page reach the store: one it cannot hold is a 400."""
    http, _, _ = console
    query = {"at": at, "shard": shard, **({"after": after} if after is not None else {})}
    r = http.get(f"/buckets?{urlencode(query)}")
    assert r.status_code in (200, 400), (query, r.status_code, r.text[-500:])
