"""Properties of the parsers of HTTP targets over any input (hypothesis): each raises
only its documented error, no textual form of a refused address gets past the guard, and
what the URL parser accepts is what httpx will connect to.

Bounded by the profile in tests/conftest.py; ``ops/test --fuzz`` runs the long one.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address
from urllib.parse import unquote

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from scheduler.domain import netguard
from scheduler.domain.httpoutcome import ERROR_BODY_BYTES, MAX_RETRY_AFTER_S, body_excerpt, parse_retry_after
from scheduler.domain.httptarget import (
    check_headers,
    check_schedulable,
    job_id_header,
    parse_target,
    parse_url,
    sign,
    verify,
)
from scheduler.domain.netguard import AllowList, parse_allow, refusal
from scheduler.errors import InvalidInput

pytestmark = pytest.mark.fuzz

V4_REFUSED = [net for net, _ in netguard._V4]
# ::/8 holds the mapped and NAT64 ranges, which are judged by the IPv4 address inside.
V6_REFUSED = [net for net, _ in netguard._V6 if net.prefixlen > 8]


@st.composite
def refused_v4(draw: st.DrawFn) -> IPv4Address:
    net = draw(st.sampled_from(V4_REFUSED))
    return net[draw(st.integers(0, net.num_addresses - 1))]


@st.composite
def refused_v6(draw: st.DrawFn) -> IPv6Address:
    net = draw(st.sampled_from(V6_REFUSED))
    return net[draw(st.integers(0, net.num_addresses - 1))]


def v6_forms(addr: IPv6Address) -> list[str]:
    return [addr.compressed, addr.exploded, addr.exploded.upper(), addr.compressed.upper()]


def v4_forms(v4: IPv4Address) -> list[str]:
    """Every IPv6 spelling that leads to ``v4``, besides its own."""
    n = int(v4)
    forms = [f"::ffff:{v4}", f"::FFFF:{n >> 16:x}:{n & 0xFFFF:x}", f"0:0:0:0:0:ffff:{v4}",
             f"64:ff9b::{v4}", f"2002:{n >> 16:x}:{n & 0xFFFF:x}::1"]
    for text in list(forms):
        forms += v6_forms(IPv6Address(text))
    return forms


def numeric_spellings(v4: IPv4Address) -> list[str]:
    """What resolvers (inet_aton) read as ``v4``, besides the dotted quad."""
    a, b, c, d = v4.packed
    n = int(v4)
    return [str(n), hex(n), f"{a}.{(b << 16) | (c << 8) | d}", f"{a}.{b}.{(c << 8) | d}",
            f"0{a:o}.{b}.{c}.{d}", f"0x{a:x}.{b}.{c}.{d}", f"{v4}."]


@given(refused_v4())
@example(IPv4Address("127.0.0.1"))
@example(IPv4Address("169.254.169.254"))
def test_a_refused_ipv4_address_is_refused_in_every_form(v4):
    assert refusal(v4) is not None
    for text in v4_forms(v4):
        assert refusal(ip_address(text)) is not None, text
    for host in [str(v4), *(f"[{f}]" for f in v4_forms(v4)), *numeric_spellings(v4)]:
        with pytest.raises(InvalidInput):
            check_schedulable({"url": f"http://{host}:8080/x"}, AllowList())


@given(refused_v6())
def test_a_refused_ipv6_address_is_refused_in_every_form(v6):
    for text in v6_forms(v6):
        assert refusal(ip_address(text)) is not None
        with pytest.raises(InvalidInput):
            check_schedulable({"url": f"https://[{text}]/"}, AllowList())


@given(st.integers(0, 2**32 - 1))
def test_an_ipv4_address_is_judged_alike_in_all_its_ipv6_forms(n):
    v4 = IPv4Address(n)
    verdict = refusal(v4) is None
    for text in v4_forms(v4):
        if not text.startswith(("2002", "64")) or verdict:
            assert (refusal(ip_address(text)) is None) == verdict, text


@given(st.from_type(IPv6Address) | st.from_type(IPv4Address))
def test_the_allow_list_of_one_address_allows_it_and_only_it(addr):
    allow = parse_allow(str(addr))
    plain = netguard.plain(addr)
    assert allow.allows("x.example", 1, addr)
    other = plain.__class__((int(plain) + 1) % (2 ** plain.max_prefixlen))
    assert not allow.allows("x.example", 1, other)


ALLOW_BITS = st.sampled_from(["localhost", "a.example", ",", " ", ":", "80", "0", "99999", "[", "]", "::1",
                              "10.0.0.0", "/", "8", "33", "*", ".", "-", "%", "\n", "é", "127.1", "fe80::1"])
URL_BITS = st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "h.example", "a", "-", ".", ":",
                            "443", "0", "99999", "[", "]", "::1", "::ffff:127.0.0.1", "127.0.0.1", "@", "u:p",
                            "/", "?q=1", "#", "%", "%2e", " ", "\\", "\r\n", "é", "localhost", "0x7f",
                            "2130706433"])


def joined(bits: st.SearchStrategy[str], most: int = 10) -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=40), st.lists(bits, max_size=most).map("".join))


@given(joined(ALLOW_BITS))
def test_parse_allow_raises_only_invalid_input(text):
    try:
        allow = parse_allow(text)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(allow, AllowList)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4), max_leaves=12)


@given(st.fixed_dictionaries({"url": joined(URL_BITS)},
                             optional={"method": st.sampled_from(["GET", "post", "TRACE", "", 5]),
                                       "headers": st.dictionaries(st.text(max_size=12), st.text(max_size=20),
                                                                  max_size=4) | JSON,
                                       "body": JSON}) | JSON)
def test_parse_target_raises_only_invalid_input(payload):
    try:
        target = parse_target(payload)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    for name, value in target.headers:
        assert "\r" not in value and "\n" not in value and name.lower() not in ("host", "content-length")


@given(joined(URL_BITS, 14))
@example("http://h.example:443/")
@example("HTTPS://[::ffff:7f00:1]:8443/a?b#")
def test_what_the_url_parser_accepts_httpx_reads_alike(url):
    try:
        scheme, host, port, literal = parse_url(url)
    except InvalidInput:
        return
    parsed = httpx.URL(url)
    assert parsed.scheme == scheme
    assert parsed.host.rstrip(".") == host or (literal is not None and ip_address(parsed.host) == literal)
    assert (parsed.port or (443 if scheme == "https" else 80)) == port


@given(st.text(max_size=80))
@example("Wed, 21 Oct 2015 07:28:00 GMT")
@example("Sun Nov  6 08:49:37 1994")
@example("99999999999999999999")
def test_retry_after_never_raises_and_stays_within_bounds(text):
    delay = parse_retry_after(text, 1_800_000_000)
    assert delay is None or 0 <= delay <= MAX_RETRY_AFTER_S


@given(st.binary(max_size=600))
def test_an_error_excerpt_is_one_printable_line_of_at_most_200_bytes_of_body(body):
    text = body_excerpt(body)
    assert text.isprintable()
    assert len(text) <= ERROR_BODY_BYTES * 4


@given(st.binary(min_size=16, max_size=64), st.integers(0, 10**12 - 1), st.binary(max_size=200),
       st.text(max_size=120))
def test_signatures_verify_and_verify_never_raises(secret, t, body, noise):
    assert verify(secret, sign(secret, t, body), body, t)
    verify(secret, noise, body, t)


@given(st.text(min_size=1, max_size=64).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
def test_a_job_id_header_is_printable_ascii_and_reads_back(job_id):
    value = job_id_header(job_id)
    assert all(0x21 <= ord(c) <= 0x7E for c in value)
    assert unquote(value) == job_id


@given(st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=6))
def test_check_headers_raises_only_invalid_input(headers):
    try:
        out = check_headers(headers)
    except InvalidInput:
        return
    assert all(v.isascii() and "\n" not in v and "\r" not in v for _, v in out)
