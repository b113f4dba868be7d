"""Console fixes from an attacker's review, on the embedded store through Starlette's
test client: re-fire windows that end in the future, integer parameters out of range,
a fleet sampler that survives any error, and the Host header on a loopback console."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from starlette.testclient import TestClient

from scheduler import Client
from scheduler.console.app import build
from scheduler.console.guard import COOKIE, Guard
from scheduler.console.pages import Fleet
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store

TOKEN = "t0ken-for-the-console-review-tests"


@pytest.fixture
def client(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Client]:
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    store: Store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=2),
                              now_ms=now_ms - 3 * 3_600_000)
    c = Client(store)
    yield c
    c.close()
    store.close()


def console(client: Client) -> TestClient:
    fleet = Fleet(client, lambda: None, step_s=1)
    fleet.sample()
    return TestClient(build(client, fleet, Guard(TOKEN, True)))


def sign_in(http: TestClient) -> str:
    r = http.post("/login", data={"who": "alice", "token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303 and COOKIE in r.cookies
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', http.get("/dead").text)
    assert found
    return found.group(1)


def test_refire_refuses_a_window_that_ends_in_the_future(client: Client):
    http = console(client)
    csrf = sign_in(http)
    now = datetime.now(UTC)
    form = {"csrf": csrf, "from": (now - timedelta(minutes=30)).isoformat(),
            "to": (now + timedelta(minutes=29)).isoformat()}
    r = http.post("/refire", data=form, follow_redirects=False)
    assert r.status_code == 400 and "is in the future" in r.text, r.text[-500:]
    # A window that has ended is still accepted.
    form["to"] = (now - timedelta(minutes=1)).isoformat()
    ok = http.post("/refire", data=form, follow_redirects=False)
    assert ok.status_code == 303, ok.text[-500:]
