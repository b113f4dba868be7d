"""HTTP targets through a real poller against a local receiver (``bench.receiver``, on
127.0.0.1): signed requests, every outcome (2xx, 5xx and 429 retried, 4xx and 3xx
dead-lettered, timeouts), the SSRF guard when the job runs (loopback refused, a name that
resolves to it included, TLS still checked against the name), and the built-in handler
beside an app's own. The outcomes run on both stores; the rest on the embedded one."""

from __future__ import annotations

import collections
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from bench.receiver import Receiver, Reply, Request
from scheduler import App, Client, Job, JobSpec, Status
from scheduler.domain.clock import SystemClock
from scheduler.domain.httptarget import verify
from scheduler.domain.keys import from_ms
from scheduler.domain.netguard import Address, AllowList, parse_allow
from scheduler.errors import InvalidInput
from scheduler.poller import Poller, PollerConfig
from scheduler.poller.httppool import system_resolve
from scheduler.settings import Settings
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store, require_tool, sqlite_dump

SECRET = b"a-test-signing-secret-of-32-chars"
# A short late margin: a retry is placed at least that far ahead.
OPTIONS = SchemaOptions(shard_count=4, late_margin_ms=1000, max_skew_ms=200)
now_ms = SystemClock().now_ms


@pytest.fixture
def live_store(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    st = make_store(store_kind, request, tmp_path, OPTIONS)
    yield st
    st.close()


@pytest.fixture
def sqlite_store(request: Any, tmp_path: Any) -> Iterator[Store]:
    st = make_store("sqlite", request, tmp_path, OPTIONS)
    yield st
    st.close()


def wait_for(cond: Any, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def settled(client: Client, ids: list[str]) -> bool:
    return all(client.get(i).status in (Status.FIRED, Status.DEAD) for i in ids)


def run(store: Store, app: App, jobs: list[JobSpec], *, producer_allow: AllowList, poller_allow: AllowList,
        secret: bytes | None = SECRET, seconds: float = 30, setup: Any = None) -> tuple[Client, Poller]:
    """Schedule ``jobs`` (due about 1.5 s ahead), run a poller until each is fired or
    dead, stop it."""
    client = Client(store, settings=Settings(http_allow=producer_allow))
    client.schedule_many(jobs)
    poller = Poller(store, app, config=PollerConfig(check_clock=False, http_allow=poller_allow),
                    signing_secret=secret)
    if setup is not None:
        setup(poller)
    poller.start(range(OPTIONS.shard_count), epoch=1)
    try:
        wait_for(lambda: settled(client, [j.job_id for j in jobs]), seconds, "every job fired or dead")
    finally:
        poller.stop()
    return client, poller


def due() -> Any:
    return from_ms(now_ms() + 1500)


def test_signed_deliveries_and_every_outcome(live_store):
    calls: collections.Counter[str] = collections.Counter()

    def respond(req: Request) -> Reply:
        path = req.target
        calls[path] += 1
        first = calls[path] == 1
        return {"/flaky": Reply(503 if first else 200, b"busy"),
                "/gone": Reply(404, b"no such hook\r\n" + b"x" * 500),
                "/busy": Reply(429 if first else 200, b"", {"Retry-After": "3"}),
                "/slow": Reply(200, delay_s=3),
                "/moved": Reply(302, b"", {"Location": "http://169.254.169.254/"})}.get(path, Reply(200))

    seen: list[str] = []
    app = App()
    app.http_targets(max_attempts=3, backoff_base_s=0.1, timeout_s=0.5)

    @app.handler("plain")  # a plain function: http jobs run on a loop beside its threads
    def plain(job: Job) -> None:
        seen.append(job.job_id)

    with Receiver(respond) as rx:
        base = f"http://127.0.0.1:{rx.port}"
        allow = parse_allow(f"127.0.0.1:{rx.port}")
        at = due()
        hook = {"url": base + "/ok", "body": {"n": 1}, "headers": {"X-Hook": "1"}}
        jobs = [JobSpec("ok", at, "http", hook),
                JobSpec("get", at, "http", {"url": base + "/get?q=1", "method": "GET"}),
                JobSpec("text", at, "http", {"url": base + "/text", "method": "PUT", "body": "hé"}),
                *(JobSpec(p, at, "http", {"url": f"{base}/{p}"}) for p in ("flaky", "gone", "busy", "slow",
                                                                              "moved")),
                JobSpec("p1", at, "plain")]
        client, poller = run(live_store, app, jobs, producer_allow=allow, poller_allow=allow, seconds=60)
    by_path = collections.defaultdict(list)
    for req in rx.requests:
        by_path[req.target].append(req)
        assert verify(SECRET, req.headers["scheduler-signature"], req.body, time.time()), req.target
        assert req.headers["host"] == f"127.0.0.1:{rx.port}"
    ok = by_path["/ok"][0]
    assert (ok.method, ok.body, ok.headers["content-type"], ok.headers["x-hook"]) == \
        ("POST", b'{"n":1}', "application/json", "1")
    assert (ok.headers["scheduler-job-id"], ok.headers["scheduler-attempt"]) == ("ok", "1")
    get = by_path["/get?q=1"][0]
    assert (get.method, get.body) == ("GET", b"")
    assert by_path["/text"][0].body == "hé".encode()
    for job_id in ("ok", "get", "text", "flaky", "busy"):
        assert client.get(job_id).status is Status.FIRED, job_id
    assert [r.headers["scheduler-attempt"] for r in by_path["/flaky"]] == ["1", "2"]
    gone = client.get("gone")
    assert gone.status is Status.DEAD and gone.attempts == 1 and len(by_path["/gone"]) == 1
    assert gone.last_error == f"HTTP 404 from 127.0.0.1:{rx.port}: no such hook\\r\\n" + "x" * 186
    first, second = by_path["/busy"]
    assert second.arrival_ms - first.arrival_ms >= 3000, "retried before its Retry-After"
    slow = client.get("slow")
    assert slow.status is Status.DEAD and slow.attempts == 3 and len(by_path["/slow"]) == 3
    assert slow.last_error in ("timed out after 0.5 s", f"no answer from 127.0.0.1:{rx.port} within 0.5 s")
    moved = client.get("moved")
    assert moved.status is Status.DEAD and "HTTP 302" in (moved.last_error or "")
    assert len(by_path["/moved"]) == 1
    assert seen == ["p1"]
    requests = poller.metrics.http_requests
    counts = {c: requests.labels(c)._value.get() for c in ("2xx", "3xx", "4xx", "5xx", "error")}
    assert counts == {"2xx": 5, "3xx": 1, "4xx": 2, "5xx": 1, "error": 3}
    assert poller.http._pool is None, "the shared pool was not closed at the poller's stop"


def test_the_guard_refuses_loopback_when_the_job_runs_a_name_that_resolves_to_it_included(sqlite_store):
    with Receiver() as rx:
        # The producer's allow list lets them be scheduled; the poller's does not.
        producer_allow = parse_allow(f"localhost,127.0.0.1:{rx.port},rebound.example")
        jobs = [JobSpec("name", due(), "http", {"url": f"http://localhost:{rx.port}/"}),
                JobSpec("literal", due(), "http", {"url": f"http://127.0.0.1:{rx.port}/"}),
                JobSpec("rebound", due(), "http", {"url": f"http://rebound.example:{rx.port}/"}),
                JobSpec("mixed", due(), "http", {"url": f"http://mixed.example:{rx.port}/"})]

        async def resolve(host: str, port: int) -> list[Address]:
            # A name that resolved to a public address when it was scheduled now leads to
            # the loopback (DNS rebinding); another to a public address and a private one.
            fake = {"rebound.example": [ip_address("127.0.0.1")],
                    "mixed.example": [ip_address("93.184.215.14"), ip_address("10.0.0.7")]}
            return fake[host] if host in fake else await system_resolve(host, port)

        def setup(poller: Poller) -> None:
            poller.http.connector.resolve = resolve

        client, _ = run(sqlite_store, App(), jobs, producer_allow=producer_allow,
                        poller_allow=parse_allow("192.168.0.0/16"), setup=setup)
    assert rx.requests == []
    for job_id, why in (("name", f"localhost:{rx.port} refused: 127.0.0.1 (loopback) is refused"),
                        ("literal", "127.0.0.1 (loopback) is refused"),
                        ("rebound", f"rebound.example:{rx.port} refused: 127.0.0.1 (loopback)"),
                        ("mixed", "10.0.0.7 (private) is refused")):
        job = client.get(job_id)
        assert job.status is Status.DEAD and job.attempts == 1, job_id
        error = job.last_error or ""
        assert why in error and "SCHEDULER_HTTP_ALLOW" in error, error


def test_an_allowed_name_reaches_the_receiver_through_the_system_resolver(sqlite_store):
    with Receiver() as rx:
        allow = parse_allow(f"localhost:{rx.port}")
        jobs = [JobSpec("n", due(), "http", {"url": f"http://localhost:{rx.port}/hook"})]
        client, _ = run(sqlite_store, App(), jobs, producer_allow=allow, poller_allow=allow)
    assert client.get("n").status is Status.FIRED
    [req] = rx.requests
    assert req.headers["host"] == f"localhost:{rx.port}" and req.target == "/hook"


def test_an_idn_target_is_resolved_allowed_and_called_by_its_xn_name(sqlite_store):
    """The producer takes an IDN in its xn-- form; the poller resolves, checks (the allow
    list names it so) and calls that same name, never httpx's Unicode rendering of it."""
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[Address]:
        asked.append(host)
        return [ip_address("127.0.0.1")]

    def setup(poller: Poller) -> None:
        poller.http.connector.resolve = resolve

    with Receiver() as rx:
        jobs = [JobSpec("idn", due(), "http", {"url": f"http://xn--bcher-kva.example:{rx.port}/hook"})]
        client, _ = run(sqlite_store, App(), jobs, producer_allow=AllowList(),
                        poller_allow=parse_allow("xn--bcher-kva.example"), setup=setup)
    job = client.get("idn")
    assert job.status is Status.FIRED, job.last_error
    [req] = rx.requests
    assert req.headers["host"] == f"xn--bcher-kva.example:{rx.port}" and asked == ["xn--bcher-kva.example"]


def test_a_refused_target_is_refused_when_scheduled_and_nothing_is_written(sqlite_store, tmp_path):
    client = Client(sqlite_store, settings=Settings())
    before = sqlite_dump(sqlite_store.url)
    for url in ("http://127.0.0.1/", "http://[::ffff:10.0.0.1]/", "http://169.254.169.254/latest/meta-data",
                "http://localhost:8080/", "gopher://x.example/", "http://user:pw@x.example/"):
        with pytest.raises(InvalidInput) as err:
            client.schedule_many([JobSpec("a", due(), "noop"), JobSpec("b", due(), "http", {"url": url})])
        assert "job #2 ('b')" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(InvalidInput, match="refused"):
        client.recurring.create("every-minute", kind="http", every="60s", payload={"url": "http://10.1.1.1/"})
    assert sqlite_dump(sqlite_store.url) == before


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = require_tool("openssl", "openssl")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "hook.crt", tmp / "hook.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=hook.test", "-addext", "subjectAltName=DNS:hook.test",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=30)
    return cert, key


def test_tls_is_checked_against_the_name_while_the_checked_address_is_connected_to(sqlite_store, tls_files):
    cert, key = tls_files
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(str(cert), str(key))
    trust = ssl.create_default_context(cafile=str(cert))
    app = App()
    app.http_targets(max_attempts=1)

    async def resolve(host: str, port: int) -> list[Address]:
        return [ip_address("127.0.0.1")]  # both names lead to the receiver; its certificate names one

    def setup(poller: Poller) -> None:
        poller.http.connector.resolve = resolve
        poller.http.tls = trust

    with Receiver(tls=server) as rx:
        allow = parse_allow("127.0.0.0/8")
        jobs = [JobSpec("right", due(), "http", {"url": f"https://hook.test:{rx.port}/"}),
                JobSpec("wrong", due(), "http", {"url": f"https://other.test:{rx.port}/"})]
        client, _ = run(sqlite_store, app, jobs, producer_allow=allow, poller_allow=allow, setup=setup)
    assert client.get("right").status is Status.FIRED
    [req] = rx.requests
    assert req.server_name == "hook.test" and req.headers["host"] == f"hook.test:{rx.port}"
    wrong = client.get("wrong")
    assert wrong.status is Status.DEAD and "CERTIFICATE_VERIFY_FAILED" in (wrong.last_error or "")


def test_without_a_signing_secret_nothing_is_sent_and_the_error_says_how_to_set_one(sqlite_store):
    app = App()
    app.http_targets(max_attempts=1)
    with Receiver() as rx:
        allow = parse_allow(f"127.0.0.1:{rx.port}")
        jobs = [JobSpec("s", due(), "http", {"url": f"http://127.0.0.1:{rx.port}/"})]
        client, _ = run(sqlite_store, app, jobs, producer_allow=allow, poller_allow=allow, secret=None)
    assert rx.requests == []
    assert "SCHEDULER_HTTP_SIGNING_SECRET_FILE" in (client.get("s").last_error or "")


def test_an_app_with_its_own_http_handler_replaces_the_built_in_one(sqlite_store):
    seen: list[Any] = []
    app = App()

    @app.handler("http")
    async def mine(job: Job) -> None:
        seen.append(job.payload["url"])

    with Receiver() as rx:
        allow = parse_allow(f"127.0.0.1:{rx.port}")
        url = f"http://127.0.0.1:{rx.port}/"
        client, _ = run(sqlite_store, app, [JobSpec("m", due(), "http", {"url": url})],
                        producer_allow=allow, poller_allow=allow)
    assert seen == [url] and rx.requests == [] and client.get("m").status is Status.FIRED


def test_slow_endpoints_beside_plain_handlers_hold_sockets_not_threads(sqlite_store):
    """200 endpoints answering in 2 s, beside an app of plain functions on 4 threads: they
    are all called at once, and no thread is started for them."""
    app = App()

    @app.handler("plain")
    def plain(job: Job) -> None: ...

    most_threads = [threading.active_count()]
    with Receiver(lambda req: Reply(delay_s=2)) as rx:
        allow = parse_allow(f"127.0.0.1:{rx.port}")
        client = Client(sqlite_store, settings=Settings(http_allow=allow))
        at = due()
        client.schedule_many([JobSpec(f"s{i}", at, "http", {"url": f"http://127.0.0.1:{rx.port}/{i}"})
                              for i in range(200)])
        poller = Poller(sqlite_store, app, config=PollerConfig(check_clock=False, concurrency=4,
                                                               http_allow=allow), signing_secret=SECRET)
        poller.start(range(OPTIONS.shard_count), epoch=1)
        before = threading.active_count()
        try:
            def all_called() -> bool:
                most_threads[0] = max(most_threads[0], threading.active_count())
                return len(rx.requests) == 200
            wait_for(all_called, 30, "200 requests")
            wait_for(lambda: poller.stats.fired == 200, 30, "200 fired")
        finally:
            poller.stop()
    assert rx.most_in_flight >= 150, rx.most_in_flight
    # The resolver's executor is never used for literal addresses: no thread per request.
    assert most_threads[0] - before <= 8, (before, most_threads[0])


def test_the_request_carries_the_traceparent_stored_with_the_job(sqlite_store):
    # Tracing off: the traceparent a producer stored (here from an incoming request's
    # header) is the one the target receives, so its spans join the producer's trace.
    from scheduler.observe import tracing

    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Receiver() as rx:
        allow = parse_allow(f"127.0.0.1:{rx.port}")
        jobs = [JobSpec("t", due(), "http", {"url": f"http://127.0.0.1:{rx.port}/hook"})]
        with tracing.incoming(tp):
            client, _ = run(sqlite_store, App(), jobs, producer_allow=allow, poller_allow=allow)
    assert client.get("t").traceparent == tp
    [req] = rx.requests
    assert req.headers["traceparent"] == tp
