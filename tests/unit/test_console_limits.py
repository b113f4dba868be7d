"""The console's flow-limits page (``/limits``) on the embedded store, through Starlette's
test client: the table of kinds, the nav link on every page, hostile kinds (written to
the table by hand, past the CLI's checks) shown only as escaped text, and a store before
the flow tables as one line."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler import Client
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store
from tests.unit.test_console_hostile import HOSTILE, check_headers, console, inert, shows, sign_in

NOW_MS = int(datetime.now(UTC).timestamp() * 1000)


@pytest.fixture
def client(request: Any, tmp_path: Any) -> Iterator[Client]:
    store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=2), now_ms=NOW_MS)
    with Client(store) as c:
        yield c
    store.close()


def rows(html: str) -> list[list[str]]:
    """The limits table's rows as the cells' text."""
    table = html.split('<table id="limits">', 1)[1].split("</table>", 1)[0]
    return [[re.sub(r"\s+", " ", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
            for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]]


def test_the_page_lists_each_kind_with_its_limits_and_pause(client: Client):
    store: Store = client.store
    store.set_limits("email", 0.5, 5, 8, 2, NOW_MS)
    store.set_limits("sms", 100.0, None, None, None, NOW_MS)
    store.set_paused("push", True, NOW_MS)
    http = console(client)
    r = http.get("/limits")
    assert r.status_code == 200
    check_headers(r)
    inert(r.text)
    assert rows(r.text) == [["email", "30/m", "5", "8", "2", "no"], ["push", "-", "-", "-", "-", "paused"],
                            ["sms", "100/s", "-", "-", "-", "no"]]
    store.clear_limits("email")
    store.clear_limits("sms")
    store.set_paused("push", False, NOW_MS)
    assert rows(http.get("/limits").text) == [["no kind has a limit or a pause"]]


@pytest.mark.parametrize("path", ["/fleet", "/schedules", "/dead", "/audit", "/limits", "/login"])
def test_every_page_links_to_the_limits(client: Client, path: str):
    assert '<a href="/limits">Limits</a>' in console(client).get(path).text


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "signed-in"])
def test_hostile_kinds_are_left_out_and_the_page_stays_inert(client: Client, tmp_path: Any,
                                                             signed_in: bool):
    # Written past the store's checks, as cqlsh or a hand-edited file could: the store reads
    # a kind it would refuse as no row at all (a poller could never publish for it), so the
    # page lists only the good kind, and nothing in the hostile rows runs.
    db = sqlite3.connect(next(tmp_path.rglob("*.db")))
    with db:
        db.executemany("INSERT INTO flow_limits (kind, rate_per_s, burst, paused) VALUES (?, 2.0, 3, 1)",
                       [(f"k{h}",) for h in HOSTILE] + [("good.kind",)])
    db.close()
    http = console(client)
    if signed_in:
        sign_in(http)
    r = http.get("/limits")
    assert r.status_code == 200
    check_headers(r)
    inert(r.text)
    assert shows(r.text, "good.kind")
    assert [row[0] for row in rows(r.text)] == ["good.kind"]


def test_a_store_before_the_flow_tables_is_one_line_naming_schema_apply(request: Any, tmp_path: Any):
    store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=2, upto=5), now_ms=NOW_MS)
    with Client(store) as c:
        r = console(c).get("/limits")
    store.close()
    assert r.status_code == 503 and "schema apply" in r.text
    inert(r.text)
