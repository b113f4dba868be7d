"""The built-in kind ``http``: a job that calls a URL when it is due. Pure: what its
payload may hold, the request made from it, and the request's signature.

The payload is a JSON object::

    {"url": "https://example.com/hook", "method": "POST",
     "headers": {"Authorization": "Bearer ..."}, "body": {"any": "JSON"}}

``url``: ``http`` or ``https``, printable ASCII (percent-encode the rest), no user or
password, no fragment, at most ``MAX_URL_CHARS``. ``method``: one of ``METHODS``
(default POST). ``headers``: names that are HTTP tokens, values of printable ASCII, none
of the names the scheduler sets (``Scheduler-*``) or the connection owns (``Host``,
``Content-Length``...). ``body``: a string is sent as its UTF-8 bytes; any other JSON value
as compact JSON with ``Content-Type: application/json`` (unless a header sets one);
absent or null, nothing.

Every request is signed: ``Scheduler-Signature: t=<unix seconds>,v1=<hex
HMAC-SHA256(secret, "<t>.<body>")>`` over the exact bytes of the body (``sign``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from urllib.parse import quote

from ..errors import InvalidInput
from .netguard import Address, AllowList, guard, host_port, parse_host, parse_port

HTTP_KIND = "http"
# How long one request may take unless ``App.http_targets(timeout_s=...)`` says otherwise.
HTTP_TIMEOUT_S = 30.0
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MAX_URL_CHARS = 2048
MAX_HEADERS = 64
MAX_HEADER_NAME_CHARS = 128
MAX_HEADER_VALUE_CHARS = 8192
MAX_HEADERS_CHARS = 32 * 1024
# Names a payload may not set: the scheduler's own, and those of the connection and the
# framing, which the client writes (a payload's Content-Length could smuggle a request).
RESERVED_PREFIX = "scheduler-"
RESERVED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
                      "trailer", "upgrade", "proxy-connection"})
USER_AGENT = "scheduler-http-target"
SIGNATURE_HEADER = "Scheduler-Signature"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# RFC 9110's field-value: visible ASCII, with spaces and tabs only inside (a value that
# starts or ends with one is refused by the HTTP library when the request is written).
_VALUE = re.compile(r"^(?:[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?)?\Z")
_URL_CHARS = re.compile(r"^[\x21-\x7e]+\Z")
# A job id goes in a header as it is when it is printable ASCII; the rest (and '%')
# percent-encoded as UTF-8, as in a URL.
_ID_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


@dataclass(frozen=True)
class Target:
    """A validated ``http`` payload. ``host`` is as it is compared (a lowercase name, or an
    address's canonical text); ``literal`` is its address when the URL gives one."""

    url: str
    scheme: str
    host: str
    port: int
    literal: Address | None
    method: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    json_body: bool


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def parse_url(url: object) -> tuple[str, str, int, Address | None]:
    """``(scheme, host, port, literal address or None)`` of a target URL; ``InvalidInput``
    saying what is wrong for anything ``Target`` does not allow (see the module)."""
    if not isinstance(url, str):
        raise InvalidInput(f"url must be text, not {type(url).__name__}")
    if not 0 < len(url) <= MAX_URL_CHARS:
        raise InvalidInput(f"url is {len(url)} characters; give 1-{MAX_URL_CHARS}")
    if not _URL_CHARS.match(url) or "\\" in url:
        raise InvalidInput("url holds a space, a backslash, a control or a non-ASCII character: "
                           "percent-encode them")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise InvalidInput(f"url {_show(url)} is not an http:// or https:// URL")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "#" in tail:
        raise InvalidInput("url has a fragment (#...), which is never sent: remove it")
    if "@" in authority:
        raise InvalidInput("url holds a user or password (user@host): send credentials in a header "
                           "such as Authorization")
    if authority.startswith("["):
        inside, bracket, after = authority[1:].partition("]")
        if not bracket or (after and not after.startswith(":")) or ":" not in inside:
            raise InvalidInput(f"url host {_show(authority)} is not [IPv6 address] or [IPv6 address]:port")
        host, port_text = inside, (after[1:] if after else None)
    else:
        host, colon, port_text_ = authority.partition(":")
        port_text = port_text_ if colon else None
        if ":" in port_text_:
            raise InvalidInput(f"url host {_show(authority)}: write an IPv6 address in brackets")
    if not host:
        raise InvalidInput(f"url {_show(url)} has no host")
    name, literal = parse_host(host)
    port = (443 if scheme == "https" else 80) if port_text is None else parse_port(port_text)
    return scheme, name, port, literal


def check_headers(raw: object) -> tuple[tuple[str, str], ...]:
    """The payload's ``headers`` (an object of text values) as name-value pairs;
    ``InvalidInput`` for a name that is not an HTTP token or is reserved (``RESERVED``,
    ``Scheduler-*``), a value that is not printable ASCII (no CR or LF: no header
    injection), a name given twice in different cases, or too many or too long."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise InvalidInput(f"headers must be an object of name: value, not {type(raw).__name__}")
    if len(raw) > MAX_HEADERS:
        raise InvalidInput(f"{len(raw)} headers; at most {MAX_HEADERS}")
    seen: set[str] = set()
    out = []
    size = 0
    for name, value in raw.items():
        if not _TOKEN.match(name) or len(name) > MAX_HEADER_NAME_CHARS:
            raise InvalidInput(f"header name {_show(name)} is not an HTTP token of 1-{MAX_HEADER_NAME_CHARS} "
                               "letters, digits and !#$%&'*+-.^_`|~")
        lower = name.lower()
        if lower in RESERVED or lower.startswith(RESERVED_PREFIX):
            raise InvalidInput(f"header {name} is set by the scheduler or the connection; remove it")
        if lower in seen:
            raise InvalidInput(f"header {name} is given twice (names are case-insensitive)")
        seen.add(lower)
        if not isinstance(value, str):
            raise InvalidInput(f"header {name}: the value must be text, not {type(value).__name__}")
        if len(value) > MAX_HEADER_VALUE_CHARS or not _VALUE.match(value):
            raise InvalidInput(f"header {name}: the value must be printable ASCII (no CR, LF or other "
                               "control character, no space or tab at either end), at most "
                               f"{MAX_HEADER_VALUE_CHARS} characters")
        size += len(name) + len(value)
        out.append((name, value))
    if size > MAX_HEADERS_CHARS:
        raise InvalidInput(f"headers are {size} characters together; at most {MAX_HEADERS_CHARS}")
    return tuple(out)


def encode_body(raw: object) -> tuple[bytes, bool]:
    """The body's bytes, and whether they are JSON (see the module)."""
    if raw is None:
        return b"", False
    if isinstance(raw, str):
        try:
            return raw.encode("utf-8"), False
        except UnicodeEncodeError:
            raise InvalidInput("body is not valid UTF-8 text (it holds a lone surrogate)") from None
    try:
        return json.dumps(raw, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(), True
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
        raise InvalidInput(f"body cannot be sent as JSON ({exc})") from None


def parse_target(payload: object) -> Target:
    """The target of an ``http`` job's payload (see the module); ``InvalidInput`` saying
    which field is wrong and how. Raises nothing else, whatever the payload."""
    if not isinstance(payload, dict):
        raise InvalidInput(f"the payload of an {HTTP_KIND} job is an object with a url, not "
                           f"{type(payload).__name__}")
    unknown = set(payload) - {"url", "method", "headers", "body"}
    if unknown:
        shown = ", ".join(sorted(_show(k) for k in unknown))
        raise InvalidInput(f"unknown field(s) {shown[:200]} in the payload of an {HTTP_KIND} job "
                           "(url, method, headers, body)")
    if "url" not in payload:
        raise InvalidInput(f"the payload of an {HTTP_KIND} job needs a url")
    method = payload.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise InvalidInput(f"method {_show(method)} is not one of {', '.join(METHODS)}")
    scheme, host, port, literal = parse_url(payload["url"])
    body, is_json = encode_body(payload.get("body"))
    return Target(payload["url"], scheme, host, port, literal, method.upper(),
                  check_headers(payload.get("headers")), body, is_json)


def schedule_refusal(target: Target, allow: AllowList) -> str | None:
    """Why the guard refuses ``target`` before any name is resolved, or None: its host is
    a literal address the guard refuses, or a name under ``localhost``, which always means
    the loopback (RFC 6761): judged as both 127.0.0.1 and ::1. Other names are checked once
    resolved, when the job runs."""
    if target.literal is not None:
        addrs: tuple[Address, ...] = (target.literal,)
    elif target.host == "localhost" or target.host.endswith(".localhost"):
        # Both loopbacks: a dual-stack host resolves the name to ::1 as well, and the
        # check when the job runs refuses a target if any of its addresses is refused.
        addrs = (IPv4Address("127.0.0.1"), IPv6Address("::1"))
    else:
        return None
    why = next((w for a in addrs if (w := guard(target.host, target.port, a, allow)) is not None), None)
    if why is None:
        return None
    return (f"http target {host_port(target.host, target.port)} refused: {why} (an address off the public "
            "Internet; list it in SCHEDULER_HTTP_ALLOW if the target is meant)")


def check_schedulable(payload: object, allow: AllowList) -> Target:
    """The target of a job of the kind ``http`` about to be scheduled: ``InvalidInput``
    (one line) unless ``payload`` is a valid one (``parse_target``) whose host the guard
    allows when it is a literal address or a ``localhost`` name (``schedule_refusal``).
    Names are checked again, once resolved, each time the job runs."""
    target = parse_target(payload)
    why = schedule_refusal(target, allow)
    if why is not None:
        raise InvalidInput(why)
    return target


def sign(secret: bytes, t: int, body: bytes) -> str:
    """The ``Scheduler-Signature`` value: ``t=<t>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``."""
    mac = hmac.new(secret, str(t).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(secret: bytes, header: str, body: bytes, now_s: float, tolerance_s: float = 300) -> bool:
    """Whether ``header`` is a valid signature of ``body`` made within ``tolerance_s`` of
    ``now_s``: what a receiver checks (constant-time compare; any ``v1`` may match, so a
    receiver may be sent several during a rotation). Never raises."""
    t_text, macs = None, []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            t_text = value
        elif key == "v1":
            macs.append(value)
    if t_text is None or not (t_text.isascii() and t_text.isdigit()) or len(t_text) > 12:
        return False
    if abs(now_s - int(t_text)) > tolerance_s:
        return False
    expected = sign(secret, int(t_text), body).rpartition("=")[2]
    return any(hmac.compare_digest(expected.encode(), m.encode("ascii", "replace")) for m in macs)


def job_id_header(job_id: str) -> str:
    """A job id as the ``Scheduler-Job-Id`` value: as it is when it is printable ASCII
    without ``%``; otherwise percent-encoded UTF-8 (``urllib.parse.unquote`` reads it back)."""
    return quote(job_id, safe=_ID_SAFE)


def request_headers(target: Target, job_id: str, attempt: int, signature: str,
                    extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    """The headers of a request: the payload's, then ``extra`` (checked as the payload's
    are; one of the same name replaces the payload's: a trace's ``traceparent``), the
    defaults the payload does not set (``Content-Type`` of a JSON body, ``User-Agent``,
    ``Accept-Encoding: identity``: a body is read raw, never inflated), then the
    scheduler's, which nothing replaces."""
    extra = check_headers(dict(extra)) if extra else ()
    replaced = {name.lower() for name, _ in extra}
    out = [(n, v) for n, v in target.headers if n.lower() not in replaced] + list(extra)
    have = {name.lower() for name, _ in out}
    if target.json_body and "content-type" not in have:
        out.append(("Content-Type", "application/json"))
    if "user-agent" not in have:
        out.append(("User-Agent", USER_AGENT))
    if "accept-encoding" not in have:
        out.append(("Accept-Encoding", "identity"))
    out += [("Scheduler-Job-Id", job_id_header(job_id)), ("Scheduler-Attempt", str(attempt)),
            (SIGNATURE_HEADER, signature)]
    return out
