"""Who may call the API: the bearer tokens of ``SCHEDULER_API_TOKENS_FILE`` (read by
``settings.api_tokens``), each with a role. Pure, no I/O.

What each role may do:

- ``reader``: read jobs, schedules and dead letters;
- ``producer``: that, and schedule, reschedule and cancel jobs;
- ``admin``: all of that, and replay dead letters and manage recurring schedules.

A presented token is checked against every configured one, all of them every time, by
``hmac.compare_digest`` of SHA-256 digests: the time taken depends neither on which
token matched nor on how much of one did, nor on the tokens' lengths. Only the digests
are kept; a caller is known afterwards by its role and the line of its token in the
file, never by the token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Permission(StrEnum):
    """What a route needs; the value completes "the ROLE role may not ..."."""

    READ = "read"
    WRITE_JOBS = "schedule, move or cancel jobs"
    ADMIN = "manage recurring schedules or replay dead letters"


GRANTS = {
    "reader": frozenset({Permission.READ}),
    "producer": frozenset({Permission.READ, Permission.WRITE_JOBS}),
    "admin": frozenset({Permission.READ, Permission.WRITE_JOBS, Permission.ADMIN}),
}
# The least role that holds each permission, for the message of a 403.
NEEDED = {Permission.READ: "reader", Permission.WRITE_JOBS: "producer", Permission.ADMIN: "admin"}


@dataclass(frozen=True)
class Caller:
    role: str
    line: int  # of its token in the tokens file

    @property
    def name(self) -> str:
        """How logs name the caller: its role and its token's line, never the token."""
        return f"{self.role}@line{self.line}"

    def may(self, permission: Permission) -> bool:
        return permission in GRANTS[self.role]


def _digest(token: str) -> bytes:
    # surrogatepass: a header can carry any byte (Starlette decodes them as Latin-1); no
    # text raises here.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Tokens:
    """The configured tokens, as (digest, caller) pairs."""

    def __init__(self, entries: Iterable[tuple[str, str, int]]) -> None:
        """``entries``: ``(role, token, line)`` as ``settings.api_tokens`` returns them."""
        self._known = [(_digest(token), Caller(role, line)) for role, token, line in entries]
        for _, caller in self._known:
            if caller.role not in GRANTS:
                raise ValueError(f"unknown role {caller.role!r} (line {caller.line})")

    def __len__(self) -> int:
        return len(self._known)

    def caller(self, authorization: str | None) -> Caller | None:
        """The caller an ``Authorization: Bearer TOKEN`` header names; None for a missing
        header, another scheme, or a token that is not configured."""
        if not authorization:
            return None
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        presented = _digest(given.strip())
        found = None
        for digest, caller in self._known:  # no early exit: every token costs the same
            if hmac.compare_digest(presented, digest):
                found = caller
        return found
