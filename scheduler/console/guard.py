"""Who may act: the token, the session cookie and CSRF tokens. Pure, no I/O.

A person unlocks actions by entering the token (``SCHEDULER_CONSOLE_TOKEN``) and a name
on the login form. The console then sets a session cookie ``name|expiry|mac`` (HttpOnly,
SameSite=Strict), signed with a key made at start-up, so restarting the console ends
every session. Each action form carries a CSRF token bound to that session; an action
needs both. Scripts send the token as ``Authorization: Bearer`` instead. The token
itself is never stored in the cookie or written to a log.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

COOKIE = "scheduler_console"
SESSION_S = 8 * 3600
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class Guard:
    def __init__(self, token: str | None, allow_actions: bool) -> None:
        self.token = token
        self.allow_actions = allow_actions and token is not None
        self._key = secrets.token_bytes(32)

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def valid_name(name: str) -> bool:
        return bool(_NAME.match(name))

    def login(self, token: str, name: str, now_s: float) -> str | None:
        """The session cookie's value for a correct token and a valid name, else None."""
        if not self.allow_actions or self.token is None or not self.valid_name(name):
            return None
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return None
        body = f"{name}|{int(now_s) + SESSION_S}"
        return f"{body}|{self._mac(body)}"

    def who(self, cookie: str | None, now_s: float) -> str | None:
        """The name of a live session, or None (no cookie, forged, expired, or actions off)."""
        if not self.allow_actions or not cookie or cookie.count("|") != 2:
            return None
        name, expiry, mac = cookie.split("|")
        if not hmac.compare_digest(mac, self._mac(f"{name}|{expiry}")):
            return None
        return name if expiry.isdigit() and int(expiry) > now_s else None

    def csrf(self, cookie: str) -> str:
        """The CSRF token of the session ``cookie`` (forms carry it in a hidden field)."""
        return self._mac("csrf|" + cookie)

    def bearer(self, authorization: str | None, user: str | None) -> str | None:
        """A script's actor: ``Authorization: Bearer <token>`` (a browser never sends that
        header by itself, so no CSRF token is needed) named by ``X-Scheduler-User``
        (``api`` when absent or not a valid name). None when the token does not match."""
        if not self.allow_actions or self.token is None or not authorization:
            return None
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return None
        return user if user and self.valid_name(user) else "api"

    def check(self, cookie: str | None, csrf: str | None, now_s: float) -> str | None:
        """The actor's name when the session is live and ``csrf`` belongs to it, else None."""
        name = self.who(cookie, now_s)
        if name is None or cookie is None or not csrf:
            return None
        return name if hmac.compare_digest(csrf, self.csrf(cookie)) else None
