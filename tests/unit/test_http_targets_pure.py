"""The pure parts of HTTP targets, by example: the address guard and its allow list, the
payload and URL rules, the signature, the request's headers, what a response means, and
the settings that feed them. (Properties over any input: test_http_targets_fuzz.py.)"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from ipaddress import ip_address
from urllib.parse import unquote

import pytest

from scheduler.domain.dispatch import App, RetryPolicy, Route, failure
from scheduler.domain.httpoutcome import (
    MAX_RETRY_AFTER_S,
    body_excerpt,
    classify,
    code_class,
    parse_retry_after,
)
from scheduler.domain.httptarget import (
    check_schedulable,
    job_id_header,
    parse_target,
    request_headers,
    sign,
    verify,
)
from scheduler.domain.model import Job
from scheduler.domain.netguard import AllowList, guard, host_port, parse_allow, refusal
from scheduler.errors import ConfigError, GiveUp, InvalidInput, RetryLater
from scheduler.settings import Settings, http_allow, http_signing_secret

REFUSED = {
    "127.0.0.1": "loopback", "127.255.0.9": "loopback", "::1": "loopback",
    "10.1.2.3": "private", "172.16.0.1": "private", "192.168.1.1": "private",
    "100.64.0.1": "shared (carrier-grade NAT)", "169.254.1.1": "link-local", "fe80::1": "link-local",
    "fc00::1": "unique-local", "fd12:3456::1": "unique-local",
    "169.254.169.254": "cloud metadata", "fd00:ec2::254": "cloud metadata",
    "100.100.100.200": "cloud metadata",
    "0.0.0.0": "unspecified", "::": "unspecified", "224.0.0.1": "multicast", "ff02::1": "multicast",
    "255.255.255.255": "reserved", "192.0.2.1": "documentation", "2001:db8::1": "documentation",
    "198.18.0.1": "benchmarking",
    # An IPv4 address wrapped in IPv6 is judged by the one inside.
    "::ffff:127.0.0.1": "loopback", "::ffff:7f00:1": "loopback", "::ffff:169.254.169.254": "cloud metadata",
    "64:ff9b::a00:1": "private (IPv4 10.0.0.1 inside IPv6)",
    "2002:7f00:1::": "loopback (IPv4 127.0.0.1 inside IPv6)",
    "::127.0.0.1": "reserved", "2001::1": "IETF protocol assignment",
}


@pytest.mark.parametrize("text,why", sorted(REFUSED.items()))
def test_addresses_off_the_public_internet_are_refused_with_their_reason(text, why):
    assert refusal(ip_address(text)) == why


@pytest.mark.parametrize("text", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
                                  "64:ff9b::808:808", "2002:808:808::1", "100.128.0.1", "172.32.0.1"])
def test_public_addresses_pass(text):
    assert refusal(ip_address(text)) is None


def test_the_allow_list_excepts_hosts_ports_and_networks_but_metadata_only_by_name():
    allow = parse_allow(" localhost , 10.0.0.0/8, 127.0.0.1:8080,[::1]:9000, 169.254.0.0/16,"
                        "hooks.internal., ")
    loop = ip_address("127.0.0.1")
    assert guard("localhost", 1, loop, allow) is None
    assert guard("127.0.0.1", 8080, loop, allow) is None
    assert guard("127.0.0.1", 8081, loop, allow) == "127.0.0.1 (loopback) is refused"
    assert guard("::1", 9000, ip_address("::1"), allow) is None
    assert guard("x.example", 80, ip_address("10.9.9.9"), allow) is None
    assert guard("x.example", 80, ip_address("::ffff:10.9.9.9"), allow) is None  # mapped: the IPv4 one
    assert guard("hooks.internal", 443, ip_address("192.168.1.1"), allow) is None
    assert guard("x.example", 80, ip_address("169.254.1.1"), allow) is None
    assert guard("x.example", 80, ip_address("169.254.169.254"), allow) == \
        "169.254.169.254 (cloud metadata) is refused"
    assert guard("x.example", 80, ip_address("169.254.169.254"), parse_allow("169.254.169.254")) is None
    assert guard("x.example", 80, ip_address("8.8.8.8"), AllowList()) is None
    assert not AllowList() and allow


@pytest.mark.parametrize("text,says", [
    ("10.0.0.1/8", "host bits set"), ("*.example.com", "wildcards"), ("host:0", "1 to 65535"),
    ("host:99999", "1 to 65535"), ("host:", "1 to 65535"), ("[::1", "brackets"), ("[x]:1", "brackets hold"),
    ("bad host", "not a host name"), ("127.1", "is a number"), ("a..b", "not a host name"),
    ("fe80::1%eth0", "zone"), ("1.2.3.4/33", "not a network")])
def test_a_bad_allow_entry_is_named_in_one_line(text, says):
    with pytest.raises(InvalidInput, match=says) as err:
        parse_allow(f"ok.example, {text}")
    assert "\n" not in str(err.value) and "entry" in str(err.value)


def test_settings_read_the_allow_list_and_name_the_variable_when_it_is_bad(tmp_path):
    assert Settings.from_env({"SCHEDULER_HTTP_ALLOW": "localhost"}).http_allow.hosts == {"localhost"}
    assert not Settings.from_env({}).http_allow
    with pytest.raises(ConfigError, match=r"^SCHEDULER_HTTP_ALLOW: entry '10\.0\.0\.1/8'"):
        http_allow({"SCHEDULER_HTTP_ALLOW": "10.0.0.1/8"})


def test_the_signing_secret_comes_from_its_file_and_is_never_shown(tmp_path):
    path = tmp_path / "secret"
    path.write_text("  s3cret-value-of-32-characters!!\n")
    assert http_signing_secret(str(path)) == b"s3cret-value-of-32-characters!!"
    path.write_text("short-secret")
    with pytest.raises(ConfigError, match="too short") as err:
        http_signing_secret(str(path))
    assert "short-secret" not in str(err.value)
    with pytest.raises(ConfigError, match="cannot read SCHEDULER_HTTP_SIGNING_SECRET_FILE"):
        http_signing_secret(str(tmp_path / "missing"))
    path.write_bytes(b"\xff" * 40)
    with pytest.raises(ConfigError, match="not UTF-8"):
        http_signing_secret(str(path))


GOOD = {"url": "https://Hooks.Example.com:8443/a/b?c=d", "method": "put",
        "headers": {"Authorization": "Bearer x", "X-Trace": "1"}, "body": {"n": 1, "s": "é"}}


def test_a_payload_becomes_a_target():
    t = parse_target(GOOD)
    assert (t.scheme, t.host, t.port, t.literal, t.method) == \
        ("https", "hooks.example.com", 8443, None, "PUT")
    assert t.headers == (("Authorization", "Bearer x"), ("X-Trace", "1"))
    assert t.body == '{"n":1,"s":"é"}'.encode() and t.json_body
    assert parse_target({"url": "http://h.example"}).port == 80
    text = parse_target({"url": "http://[::1]:81/", "body": "plain"})
    assert (text.host, text.port, str(text.literal), text.body, text.json_body) == \
        ("::1", 81, "::1", b"plain", False)
    assert parse_target({"url": "http://h.example", "body": None}).body == b""


@pytest.mark.parametrize("payload,says", [
    ("http://x", "an object with a url"), ({}, "needs a url"),
    ({"url": "http://x.example", "x": 1}, "unknown"),
    ({"url": "ftp://x.example/"}, "not an http"), ({"url": "http://u:p@x.example/"}, "user or password"),
    ({"url": "http://x.example/#frag"}, "fragment"), ({"url": "http://x.example/a b"}, "space"),
    ({"url": "http://x.example\\@evil/"}, "backslash"), ({"url": "http://x.example:0/"}, "1 to 65535"),
    ({"url": "http://:80/"}, "no host"), ({"url": "http://::1/"}, "brackets"),
    ({"url": "http://2130706433/"}, "a number"), ({"url": "http://0x7f.1/"}, "a number"),
    ({"url": "http://127.1/"}, "a number"), ({"url": "http://0177.0.0.1/"}, "a number"),
    ({"url": "http://[fe80::1%25eth0]/"}, "zone"), ({"url": "http://ex\u00e4mple.com/"}, "non-ASCII"),
    ({"url": "http://x.example/", "method": "TRACE"}, "not one of"),
    ({"url": "http://x.example/", "method": 1}, "not one of"),
    ({"url": "http://x.example/", "headers": {"X-A": "a\r\nX-Injected: 1"}}, "printable ASCII"),
    ({"url": "http://x.example/", "headers": {"X-A": " lead"}}, "no space or tab at either end"),
    ({"url": "http://x.example/", "headers": {"X-A": "trail\t"}}, "no space or tab at either end"),
    ({"url": "http://x.example/", "headers": {"X-A": " "}}, "no space or tab at either end"),
    # A regex's $ matches before a final newline: every check must end at the very end.
    ({"url": "http://x.example/", "headers": {"X-A": "v\n"}}, "printable ASCII"),
    ({"url": "http://x.example/", "headers": {"X-A\n": "v"}}, "HTTP token"),
    ({"url": "http://localhost\n"}, "control"),
    ({"url": "http://x.example/", "headers": {"Bad Name": "v"}}, "HTTP token"),
    ({"url": "http://x.example/", "headers": {"Host": "evil"}}, "set by the scheduler"),
    ({"url": "http://x.example/", "headers": {"Content-Length": "0"}}, "set by the scheduler"),
    ({"url": "http://x.example/", "headers": {"scheduler-signature": "t=1,v1=0"}}, "set by the scheduler"),
    ({"url": "http://x.example/", "headers": {"X-A": "1", "x-a": "2"}}, "twice"),
    ({"url": "http://x.example/", "headers": {"X-A": 1}}, "must be text"),
    ({"url": "http://x.example/", "headers": ["X-A"]}, "an object"),
    ({"url": "http://x.example/", "body": float("nan")}, "cannot be sent as JSON"),
    ({"url": "http://x.example/" + "a" * 2048}, "characters"),
])
def test_a_bad_payload_is_refused_in_one_line_saying_what_is_wrong(payload, says):
    with pytest.raises(InvalidInput, match=says) as err:
        parse_target(payload)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["", "v", "a b", "a\tb", "Bearer sk_1", "~!"])
def test_header_values_h11_writes_are_accepted(value):
    import h11

    target = parse_target({"url": "http://x.example/", "headers": {"X-A": value}})
    # What the poller's connection pool hands to h11: it must write it, not raise.
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x.example"), *target.headers,
                                                              ("Content-Length", "0")]))


def test_literal_and_localhost_targets_are_refused_when_scheduled_unless_allowed():
    for url in ("http://127.0.0.1:8080/", "http://[::ffff:127.0.0.1]/", "http://169.254.169.254/latest",
                "http://localhost/", "http://api.localhost./", "http://10.0.0.1/", "http://[::1]/"):
        with pytest.raises(InvalidInput, match=r"refused: .* SCHEDULER_HTTP_ALLOW"):
            check_schedulable({"url": url}, AllowList())
    check_schedulable({"url": "http://127.0.0.1:8080/"}, parse_allow("127.0.0.1:8080"))
    check_schedulable({"url": "http://localhost/"}, parse_allow("localhost"))
    check_schedulable({"url": "http://localhost:8080/"}, parse_allow("127.0.0.1:8080,[::1]:8080"))
    # A dual-stack host resolves localhost to ::1 too, which the check at run time would
    # refuse: refused when scheduled instead of dead-lettered later.
    for allow in ("127.0.0.1:8080", "127.0.0.0/8"):
        with pytest.raises(InvalidInput, match=r"::1 \(loopback\) is refused"):
            check_schedulable({"url": "http://localhost:8080/"}, parse_allow(allow))
    check_schedulable({"url": "http://8.8.8.8/"}, AllowList())
    check_schedulable({"url": "http://internal.example/"}, AllowList())  # a name: checked when it runs



def test_an_ipv6_target_is_named_in_brackets_in_its_refusal():
    with pytest.raises(InvalidInput) as err:
        check_schedulable({"url": "http://[::1]:8080/"}, AllowList())
    assert "http target [::1]:8080 refused: ::1 (loopback) is refused" in str(err.value)
    with pytest.raises(InvalidInput, match=r"http target 127\.0\.0\.1:80 refused"):
        check_schedulable({"url": "http://127.0.0.1/"}, AllowList())
    assert host_port("::1", 80) == "[::1]:80" and host_port("a.example", 443) == "a.example:443"


def test_the_signature_is_hmac_sha256_of_t_dot_body_and_verifies_within_its_window():
    secret, body = b"k" * 32, b'{"a":1}'
    value = sign(secret, 1_800_000_000, body)
    expected = hmac.new(secret, b"1800000000." + body, hashlib.sha256).hexdigest()
    assert value == f"t=1800000000,v1={expected}"
    assert verify(secret, value, body, 1_800_000_100)
    assert not verify(secret, value, body + b" ", 1_800_000_100)
    assert not verify(b"j" * 32, value, body, 1_800_000_100)
    assert not verify(secret, value, body, 1_800_000_301)  # older than 5 minutes
    assert verify(secret, f"v1=00,{value}", body, 1_800_000_000)  # any v1 of several may match
    assert not verify(secret, "t=x,v1=00", body, 0) and not verify(secret, "", body, 0)


def test_job_ids_go_in_a_header_as_printable_ascii():
    assert job_id_header("order-42/a:b") == "order-42/a:b"
    for job_id in ("é 1", "a%20b", "x\ny"):
        value = job_id_header(job_id)
        assert all(0x21 <= ord(c) <= 0x7E for c in value) and unquote(value) == job_id


def test_the_scheduler_headers_come_last_and_cannot_be_replaced():
    t = parse_target({"url": "http://x.example/", "headers": {"traceparent": "old", "User-Agent": "me"},
                      "body": [1]})
    headers = request_headers(t, "j1", 3, "t=1,v1=ab", extra=(("traceparent", "new"),))
    assert headers[-3:] == [("Scheduler-Job-Id", "j1"), ("Scheduler-Attempt", "3"),
                            ("Scheduler-Signature", "t=1,v1=ab")]
    names = dict(headers)
    assert names["traceparent"] == "new" and names["User-Agent"] == "me"
    assert names["Content-Type"] == "application/json" and names["Accept-Encoding"] == "identity"
    with pytest.raises(InvalidInput):
        request_headers(t, "j1", 1, "s", extra=(("Scheduler-Attempt", "9"),))


@pytest.mark.parametrize("status,fired,dead,retry_after", [
    (200, True, False, None), (204, True, False, None), (299, True, False, None),
    (500, False, False, None), (503, False, False, None), (408, False, False, None), (429, False, False, "7"),
    (400, False, True, None), (404, False, True, None), (410, False, True, None), (301, False, True, None),
    (302, False, True, None), (101, False, False, None), (600, False, False, None)])
def test_what_a_status_means(status, fired, dead, retry_after):
    v = classify(status, retry_after, b"why\r\nnot", 0, "h.example:443")
    assert (v.fired, v.dead) == (fired, dead)
    if not fired:
        assert v.error is not None and v.error.startswith(f"HTTP {status} from h.example:443: why\\r\\nnot")
    if status == 429:
        assert v.not_before_s == 7 and "Retry-After: 7 s" in (v.error or "")
    if 300 <= status < 400:
        assert "not followed" in (v.error or "")


def test_the_error_holds_the_first_200_bytes_of_the_body_as_one_printable_line():
    body = ("é" * 150).encode() + b"tail"
    text = body_excerpt(body)
    assert text == "é" * 100 and "tail" not in text
    assert body_excerpt(b"a\x1b[31mred\nb\x00") == "a\\x1b[31mred\\nb\\x00"
    assert body_excerpt(b"\xff\xfe") == "\ufffd\ufffd"


def test_retry_after_as_seconds_or_a_date_clamped():
    now = datetime(2027, 1, 1, tzinfo=UTC)
    assert parse_retry_after("120", now.timestamp()) == 120
    assert parse_retry_after(" 0 ", now.timestamp()) == 0
    assert parse_retry_after("9" * 40, now.timestamp()) == MAX_RETRY_AFTER_S
    date = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(date, now.timestamp()) == 90
    assert parse_retry_after("Fri, 01 Jan 2027 00:01:30 -0000", now.timestamp()) == 90
    assert parse_retry_after(format_datetime(now - timedelta(days=1), usegmt=True), now.timestamp()) == 0
    assert parse_retry_after("Fri, 01 Jan 9999 00:00:00 GMT", now.timestamp()) == MAX_RETRY_AFTER_S
    for bad in (None, "", "-5", "1.5", "soon", "\u0663", "Fri, 99 Foo 2027"):
        assert parse_retry_after(bad, now.timestamp()) is None


def test_code_classes():
    assert [code_class(s) for s in (None, 99, 100, 204, 302, 404, 503, 600)] == \
        ["error", "error", "1xx", "2xx", "3xx", "4xx", "5xx", "error"]


def test_give_up_is_dead_at_once_and_retry_later_waits_at_least_its_delay():
    route = Route(lambda j: None, RetryPolicy(max_attempts=5, base_s=1.0))
    job = Job("j", "http", b"{}", True, 0, 0, 0, 0)
    dead = failure(route, job, GiveUp("HTTP 404 from h:80"), 0, 1000, lambda: 0.0)
    assert dead.dead and dead.error == "HTTP 404 from h:80" and dead.retry_at_ms is None
    later = failure(route, job, RetryLater("HTTP 429", delay_s=60), 0, 1000, lambda: 0.0)
    assert not later.dead and later.retry_at_ms == 1000 + 60_000 and later.error == "HTTP 429"
    soon = failure(route, job, RetryLater("HTTP 503"), 0, 1000, lambda: 0.0)
    assert soon.retry_at_ms == 1000 + 500  # the backoff: 1 s with the lowest jitter
    hostile = failure(route, job, RetryLater("x", delay_s=float("nan")), 0, 1000, lambda: 0.0)
    assert hostile.retry_at_ms == 1500
    last = failure(route, job._replace(attempts=4), RetryLater("x", delay_s=5), 0, 1000, lambda: 0.0)
    assert last.dead


def test_the_app_settings_of_the_built_in_kind():
    app = App()
    app.http_targets(max_attempts=9, backoff_base_s=2, timeout_s=5)
    route = app.http_route(lambda j: None)
    assert route is not None and route.policy.max_attempts == 9 and route.timeout_s == 5
    assert App().http_route(lambda j: None).timeout_s == 30  # type: ignore[union-attr]
    with pytest.raises(ConfigError):
        app.http_targets(timeout_s=0)
    with pytest.raises(InvalidInput):
        app.http_targets(max_attempts=0)

    @app.handler("http")
    def mine(job: Job) -> None: ...
    assert app.http_route(lambda j: None) is None  # the app's own handler wins
    assert app.extended({"x": route}).routes["http"].handler is mine

