"""The console against hostile input, on the embedded store through Starlette's test client.

Ids, names and texts an attacker controls (a job or schedule id, a payload, a dead
letter's error, a poller's name, a query parameter) are rendered on every page; each
page is parsed as a browser would and must hold no element, attribute or script the
console did not write: no inline script, no ``on*=`` handler, no ``javascript:`` URL, and
the hostile text only as escaped text. Every response carries the security headers. And
the other hardening: the caller's rights are checked before a form is read, forms are
parsed with small limits, secrets of any characters compare without a 500, banners come
from fixed codes, signing out ends the session, and the audit is gated.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
from markupsafe import escape
from starlette.testclient import TestClient

from scheduler import Client, Status
from scheduler.console.app import build
from scheduler.console.guard import COOKIE, Guard
from scheduler.console.pages import Fleet
from scheduler.console.protect import MAX_BODY_BYTES, MAX_FIELDS
from scheduler.domain.progress import Checkpoint
from scheduler.fleet.view import FleetSnapshot
from scheduler.observe.audit import last_closed_hour
from scheduler.store import SchemaOptions, Store
from tests.conftest import bucket_job, make_store

TOKEN = "t0ken-for-the-hostile-console-tests"
# Each sets window.__pwned (or shows an alert) if it ever runs as script.
HOSTILE = [
    "'+alert(document.domain)+'",
    "'+(window.__pwned='quote')+'",
    '"><script>window.__pwned="tag"</script>',
    "</script><script>window.__pwned='close'</script>",
    "<img src=x onerror=window.__pwned='img'>",
    "\\';window.__pwned='backslash';//\\\"",
    "javascript:window.__pwned='href'//<i>",
    "ünï\u202ecode \u2028 ☃ <b>bold</b> &amp; \"q\" 'q'",
]
KINDS = "email"


class Page(HTMLParser):
    """What a browser would build from a page: its tags, attributes and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.script_bodies: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.script_bodies if self._in_script else self.text).append(data)


def inert(html: str) -> Page:
    """Parse ``html`` and assert that it holds nothing that runs script but the console's
    own static files."""
    page = Page()
    page.feed(html)
    page.close()
    for tag, attrs in page.tags:
        handlers = [a for a in attrs if a.startswith("on")]
        assert not handlers, f"inline handler {handlers} on <{tag}>"
        if tag == "script":
            assert (attrs.get("src") or "").startswith("/static/"), f"a script not from /static: {attrs}"
        assert tag not in ("iframe", "object", "embed", "base", "img"), f"<{tag}>: the console writes none"
        for name in ("href", "action", "src", "formaction"):
            value = (attrs.get(name) or "").strip().lower()
            assert not value.startswith(("javascript:", "data:", "//")), f"<{tag} {name}={value!r}>"
    assert not any(body.strip() for body in page.script_bodies), "an inline script"
    return page


def shows(html: str, text: str) -> bool:
    """Whether ``text`` is on the page as escaped text (and never raw, when it has
    characters HTML escapes)."""
    if re.search(r"[<>&\"']", text):
        assert text not in html, f"unescaped on the page: {text!r}"
    return str(escape(text)) in html


def check_headers(response: Any) -> None:
    csp = response.headers.get("content-security-policy", "")
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    assert directives.get("script-src") == ["'self'"], csp
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    for name, want in [("frame-ancestors", ["'none'"]), ("object-src", ["'none'"]),
                       ("base-uri", ["'none'"]), ("form-action", ["'self'"])]:
        assert directives.get(name) == want, (name, csp)
    assert response.headers.get("x-content-type-options") == "nosniff"
    assert response.headers.get("x-frame-options") == "DENY"
    assert response.headers.get("referrer-policy") == "no-referrer"


@pytest.fixture
def hostile(request: Any, tmp_path: Any) -> Iterator[tuple[Client, Store]]:
    """A store with every hostile text in a pending job (id and payload), a dead letter (id
    and error), a recurring schedule, a checkpoint's owner and an audit violation."""
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=2),
                       now_ms=now_ms - 3 * 3_600_000)
    client = Client(store)
    soon = datetime.now(UTC) + timedelta(hours=1)
    first, _ = last_closed_hour(now_ms)
    for i, text in enumerate(HOSTILE):
        client.schedule(f"job{text}", soon, KINDS, {"note": text})
        client.schedule(f"dead{text}", soon, KINDS)
        store.record_dead(client.get(f"dead{text}"), f"error {text}", now_ms)
        client.recurring.create(f"s{text}", kind="report", every="5m")
        store.insert_many([bucket_job(f"lost{text}", first + 1000 * (i + 1), shard=0)])
    # Shard 0 drained past the last closed hour: the rows written there are lost jobs.
    store.claim_shard(0, f"owner{HOSTILE[2]}", 5, first // 1000 - 60, now_ms)  # shown without ZooKeeper
    store.save_checkpoint(0, 5, Checkpoint(first // 1000 + 3540), now_ms)
    yield client, store
    client.close()
    store.close()


def console(client: Client, members: list[str] | None = None, allow_actions: bool = True) -> TestClient:
    snapshot = FleetSnapshot(members or [], {0: members[0], 1: members[1]} if members else {})
    fleet = Fleet(client, lambda: snapshot if members else None, step_s=1)
    fleet.sample()
    return TestClient(build(client, fleet, Guard(TOKEN, allow_actions)))


def sign_in(http: TestClient) -> str:
    r = http.post("/login", data={"who": "alice", "token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303 and COOKIE in r.cookies
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', http.get("/dead").text)
    assert found
    return found.group(1)


def hostile_pages(client: Client) -> list[tuple[str, list[str]]]:
    """(path, the hostile texts it must show, escaped) for every page."""
    pages: list[tuple[str, list[str]]] = [
        ("/fleet", [f"member{h}" for h in HOSTILE]),
        ("/fleet/live", [f"member{h}" for h in HOSTILE]),
        ("/schedules", [f"s{h}" for h in HOSTILE]),
        ("/dead", [f"dead{h}" for h in HOSTILE] + [f"error {h}" for h in HOSTILE]),
        ("/audit?run=1", [f"lost{h}" for h in HOSTILE]),
        ("/login", []),
    ]
    for h in HOSTILE:
        job = client.get(f"job{h}")
        pages.append((f"/jobs?{_q(id=job.job_id)}", [job.job_id, h]))
        pages.append((f"/buckets?{_q(at=str(job.bucket), shard=str(job.shard))}", [job.job_id]))
        # Reflected: what the caller typed comes back in the form, or quoted in the
        # one-line error (as the library's message quotes it: checked never raw).
        pages.append((f"/dead?{_q(kind=h, error=h)}", [h]))
        pages.append((f"/jobs?{_q(id='nope' + h)}", []))
        pages.append((f"/buckets?{_q(at=h, shard='0')}", []))
        pages.append((f"/audit?{_q(**{'from': h, 'to': h})}", []))
        pages.append((f"/fleet?{_q(done=h, n=h)}", []))
    return pages


def _q(**params: str) -> str:
    from urllib.parse import urlencode

    return urlencode(params)


def _q_pairs(pairs: list[tuple[str, str]]) -> str:
    from urllib.parse import urlencode

    return urlencode(pairs)


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "signed-in"])
def test_hostile_ids_render_as_text_on_every_page(hostile: tuple[Client, Store], signed_in: bool):
    client, _ = hostile
    http = console(client, members=[f"member{h}" for h in HOSTILE])
    if signed_in:
        sign_in(http)
    for path, expected in hostile_pages(client):
        r = http.get(path)
        assert r.status_code in (200, 400, 404), (path, r.status_code)
        check_headers(r)
        assert r.headers.get("cache-control") == "no-store", path
        inert(r.text)
        for text in expected:
            assert shows(r.text, text), (path, text)
        for text in HOSTILE:
            shows(r.text, text)  # never raw, wherever it appears
    if signed_in:  # the action forms carry the hostile ids in data-confirm and hidden fields
        dead, schedules = http.get("/dead").text, http.get("/schedules").text
        job = http.get(f"/jobs?{_q(id='job' + HOSTILE[0])}").text
        assert shows(job, f"Cancel job job{HOSTILE[0]}? It will not fire.")
        assert f'data-confirm="Cancel job job{escape(HOSTILE[0])}' in job
        assert 'data-confirm="Replay the ticked' in dead
        for h in HOSTILE:
            assert f'data-confirm="Pause schedule s{escape(h)}?"' in schedules


def test_the_static_script_and_the_headers_on_static_files(hostile: tuple[Client, Store]):
    http = console(hostile[0])
    js = http.get("/static/console.js")
    assert js.status_code == 200 and "data-confirm" in js.text and "confirm(" in js.text
    assert js.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    check_headers(js)
    # htmx is told not to inject its indicator <style> (the CSP allows no inline style).
    assert '"includeIndicatorStyles": false' in http.get("/fleet").text


def test_the_rights_are_checked_before_the_form_is_read(hostile: tuple[Client, Store]):
    """An action without a session or token answers 403 without reading the body: the
    receive channel is never called."""
    import asyncio

    client, _ = hostile
    fleet = Fleet(client, lambda: None, step_s=1)
    app = build(client, fleet, Guard(TOKEN, True))
    reads: list[int] = []
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        return {"type": "http.request", "body": b"job_id=x&" * 100_000, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    for path in ("/jobs/cancel", "/dead/replay", "/schedules/pause", "/refire"):
        scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "scheme": "http", "server": ("test", 80),
                 "client": ("127.0.0.1", 1), "http_version": "1.1", "asgi": {"version": "3.0"},
                 "headers": [(b"content-type", b"application/x-www-form-urlencoded"),
                             (b"content-length", b"900000"),
                             (b"cookie", f"{COOKIE}=forged-session".encode())]}
        sent.clear()
        asyncio.run(app(scope, receive, send))
        assert sent[0]["status"] == 403, path
    assert reads == [], "the body was read before the rights were checked"


def test_forms_are_parsed_with_small_limits(hostile: tuple[Client, Store]):
    client, _ = hostile
    http = console(client)
    csrf = sign_in(http)
    target = f"job{HOSTILE[0]}"
    big = {"job_id": target, "csrf": csrf, "pad": "x" * MAX_BODY_BYTES}
    assert http.post("/jobs/cancel", data=big).status_code == 413  # by its Content-Length

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield f"csrf={csrf}&job_id=x&pad=".encode()
        for _ in range(100):
            yield b"y" * 4096

    form = {"content-type": "application/x-www-form-urlencoded"}
    assert http.post("/jobs/cancel", content=chunks(), headers=form).status_code == 413
    many = [("job_id", f"j{i}") for i in range(MAX_FIELDS + 1)] + [("csrf", csrf)]
    # Refused by the parser's limits (the message says so), not later by the action.
    too_many = http.post("/dead/replay", content=_q_pairs(many), headers=form)
    assert too_many.status_code == 400 and "does not parse" in too_many.text, too_many.text[:300]
    long_field = http.post("/jobs/cancel", data={"job_id": "z" * 5000, "csrf": csrf})
    assert long_field.status_code == 400 and "does not parse" in long_field.text, long_field.text[:300]
    upload = http.post("/jobs/cancel", data={"csrf": csrf, "job_id": target},
                       files={"f": ("a.txt", b"data", "text/plain")})
    assert upload.status_code == 400  # no files, ever
    assert http.post("/login", data={"who": "a", "token": "x" * MAX_BODY_BYTES}).status_code == 413
    assert client.get(target).status is Status.PENDING
    # Within the limits, the same action works.
    ok = http.post("/jobs/cancel", data={"csrf": csrf, "job_id": target}, follow_redirects=False)
    assert ok.status_code == 303 and client.get(target).status is Status.CANCELLED


@pytest.mark.parametrize("value", ["é", "☃|1|☃", "\u00ff" * 64, "a|9999999999|é"])
def test_non_ascii_cookies_csrf_and_tokens_are_refused_not_a_500(hostile: tuple[Client, Store], value: str):
    client, _ = hostile
    http = console(client)
    csrf = sign_in(http)
    target = f"job{HOSTILE[1]}"
    r = http.post("/jobs/cancel", data={"job_id": target, "csrf": value})
    assert r.status_code == 403
    raw = value.encode("utf-8")  # a header carries bytes; Starlette reads them as latin-1
    anon = console(client)
    for headers in ({b"cookie": f"{COOKIE}=".encode() + raw}, {b"authorization": b"Bearer " + raw}):
        r = anon.post("/jobs/cancel", data={"job_id": target, "csrf": csrf}, headers=headers)
        assert r.status_code == 403, headers
        assert anon.get("/fleet", headers=headers).status_code == 200
    assert anon.post("/login", data={"who": "alice", "token": value}).status_code == 403
    assert client.get(target).status is Status.PENDING


def test_banners_come_only_from_fixed_codes(hostile: tuple[Client, Store]):
    http = console(hostile[0])
    for crafted in ("Your session expired: sign in at https://evil.example", "<b>x</b>", "replayed "):
        page = http.get(f"/fleet?{_q(done=crafted)}").text
        assert 'id="done"' not in page and str(escape(crafted)).strip() not in page
    page = http.get("/fleet?done=refired&n=3").text
    assert re.search(r'id="done">Re-fired 3 jobs\.<', page)


def test_signing_out_kills_the_session_even_for_a_copied_cookie(hostile: tuple[Client, Store]):
    client, _ = hostile
    http = console(client)
    csrf = sign_in(http)
    stolen = http.cookies[COOKIE]
    out = http.post("/logout", follow_redirects=False)
    assert out.status_code == 303 and "signed-out" in out.headers["location"]
    target = f"job{HOSTILE[3]}"
    replayed = TestClient(http.app, cookies={COOKIE: stolen})
    r = replayed.post("/jobs/cancel", data={"job_id": target, "csrf": csrf})
    assert r.status_code == 403 and "sign in" in r.text
    assert 'id="who"' in replayed.get("/fleet").text and "signed in as" not in replayed.get("/fleet").text
    assert client.get(target).status is Status.PENDING


def test_running_the_audit_is_gated_and_its_last_result_stays_visible(
        hostile: tuple[Client, Store], monkeypatch: pytest.MonkeyPatch):
    import scheduler.console.app as app_module
    from scheduler.observe.audit import audit as real

    calls: list[tuple[int, int]] = []

    def counted(store: Store, first: int, last: int) -> Any:
        calls.append((first, last))
        return real(store, first, last)

    monkeypatch.setattr(app_module, "audit", counted)
    http = console(hostile[0])
    assert 'id="violations"' in http.get("/audit?run=1").text and len(calls) == 1
    again = http.get("/audit?run=1").text  # anonymous, within the minute: not run again
    assert len(calls) == 1 and "at most one audit a minute" in again
    assert 'id="violations"' in again and "run by anonymous" in again  # the last result, to read
    assert 'id="violations"' in http.get("/audit").text and len(calls) == 1
    sign_in(http)
    assert "run by alice" in http.get("/audit?run=1").text and len(calls) == 2
    bearer = TestClient(http.app, headers={"Authorization": f"Bearer {TOKEN}", "X-Scheduler-User": "cron"})
    assert "run by cron" in bearer.get("/audit?run=1").text and len(calls) == 3


def test_a_replayed_job_shows_no_lateness_from_its_earlier_life(hostile: tuple[Client, Store]):
    client, store = hostile
    now_ms = client.clock.now_ms()
    http = console(client)
    job = client.schedule("again", datetime.now(UTC) + timedelta(minutes=5), KINDS)
    # Pending again, still holding the fired time of its earlier life (as a replay kept it).
    store.insert_many([job._replace(fired_ms=now_ms - 2_535_042_510)])
    assert client.get("again").fired_ms == now_ms - 2_535_042_510
    lateness = re.search(r'id="lateness">([^<]*)<', http.get("/jobs?id=again").text)
    assert lateness is not None and lateness.group(1).strip() == ""
    # Past due and not fired since: how overdue it is, never fired minus due.
    past = client.schedule("overdue", datetime.now(UTC) + timedelta(seconds=3), KINDS)
    store.insert_many([past._replace(due_ms=now_ms - 60_000, fired_ms=now_ms - 2_535_042_510)])
    shown = re.search(r'id="lateness">([^<]*)<', http.get("/jobs?id=overdue").text)
    assert shown is not None
    assert re.fullmatch(r"\d+ ms overdue", shown.group(1).strip()), shown.group(1)
