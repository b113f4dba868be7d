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
from tests.unit.test_console_hostile import TOKEN, console, sign_in


@pytest.fixture
def client(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Client]:
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    store: Store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=2),
                              now_ms=now_ms - 3 * 3_600_000)
    c = Client(store)
    yield c
    c.close()
    store.close()


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


def test_the_sampler_survives_any_error_shows_it_and_logs_it_once(client: Client,
                                                                   caplog: pytest.LogCaptureFixture):
    from scheduler.fleet.view import FleetSnapshot

    calls: list[int] = []

    def read_fleet() -> FleetSnapshot | None:
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("a bug in a library")
        return None

    fleet = Fleet(client, read_fleet, step_s=1)
    fleet.sample()
    good = fleet.snapshot()
    assert good.error is None and good.at_ms
    with caplog.at_level("WARNING", logger="scheduler.console"):
        fleet.sample()
        fleet.sample()  # raises nothing, the thread would live on
    view = fleet.snapshot()
    assert view.error == "unexpected ValueError: a bug in a library"
    assert view.at_ms == good.at_ms  # the last good sample stays
    assert len([r for r in caplog.records if "a bug in a library" in r.getMessage()]) == 1
    page = TestClient(build(client, fleet, Guard(TOKEN, False))).get("/fleet").text
    assert "cannot read the fleet: unexpected ValueError: a bug in a library" in page


def test_the_sampler_thread_lives_on_after_an_unexpected_error(client: Client):
    from tests.procs import wait_until

    calls: list[int] = []

    def read_fleet() -> None:
        calls.append(1)
        raise ValueError("boom")

    fleet = Fleet(client, read_fleet, step_s=0.01)
    fleet.start()
    try:
        wait_until(lambda: len(calls) >= 3, 30, "three samples")
        assert fleet._thread is not None and fleet._thread.is_alive()
    finally:
        fleet.stop()


@pytest.mark.parametrize("query", [
    "at=2026-01-01T00:00:00Z&shard=0&after=9223372036854775808:x",
    "at=2026-01-01T00:00:00Z&shard=0&after=-1:x",
    "at=2026-01-01T00:00:00Z&shard=0&after=99999999999999999999999999999:x",
    "at=600000000000000000000&shard=0",
    "at=-600000000000000000000&shard=0",
    "at=9223372036854775800&shard=0",
    "at=2026-01-01T00:00:00Z&shard=99999999999999999999999999",
    "at=2026-01-01T00:00:00Z&shard=" + "9" * 5000,
])
def test_integer_parameters_out_of_range_are_a_400_with_one_line(client: Client, query: str):
    http = TestClient(console(client).app, raise_server_exceptions=True)
    r = http.get(f"/buckets?{query}")
    assert r.status_code == 400, (query, r.text[-300:])
    error = re.search(r'id="error">([^<]*)<', r.text)
    assert error and "\n" not in error.group(1).strip() and len(error.group(1)) < 300, r.text[-500:]


def test_the_largest_page_key_the_store_holds_still_reads(client: Client):
    http = console(client)
    ok = http.get(f"/buckets?at=2026-01-01T00:00:00Z&shard=0&after={2**63 - 1}:x")
    assert ok.status_code == 200


@pytest.mark.parametrize(("host", "ok"), [
    ("localhost", True), ("localhost:9470", True), ("LOCALHOST:1", True), ("127.0.0.1", True),
    ("127.0.0.1:9470", True), ("127.5.6.7:80", True), ("[::1]", True), ("[::1]:9470", True),
    ("evil.example", False), ("evil.example:9470", False), ("localhost.evil.example", False),
    ("127.0.0.1.evil.example", False), ("[::1]evil", False), ("[::2]:9470", False), ("::1", False),
    ("10.0.0.1:9470", False), ("localhost:port", False), ("localhost:", True), ("", False),
    ("127.1", False), ("[::ffff:10.0.0.1]", False), ("testserver", False)])
def test_loopback_host_names(host: str, ok: bool):
    from scheduler.console.protect import local_host

    assert local_host(host) is ok


def test_a_console_on_loopback_answers_only_loopback_host_names(client: Client):
    fleet = Fleet(client, lambda: None, step_s=1)
    fleet.sample()
    app = build(client, fleet, Guard(TOKEN, True), loopback_hosts=True)
    http = TestClient(app, base_url="http://127.0.0.1:9470")
    assert http.get("/fleet").status_code == 200
    for host in ("localhost:9470", "[::1]:9470", "127.0.0.1"):
        assert http.get("/fleet", headers={"host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:9470", "attacker.127.0.0.1.nip.io:9470"):
        r = http.get("/fleet", headers={"host": host})
        assert r.status_code == 400 and "bad Host header" in r.text, host
        assert r.headers.get("x-frame-options") == "DENY"  # the security headers on the refusal too
        posted = http.post("/login", data={"who": "a", "token": TOKEN}, headers={"host": host},
                           follow_redirects=False)
        assert posted.status_code == 400 and COOKIE not in posted.cookies
    # Not bound to loopback: any Host (the operator's proxy decides), as before.
    assert console(client).get("/fleet", headers={"host": "evil.example"}).status_code == 200
