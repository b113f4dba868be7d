"""Who may act: the token, server-side sessions and CSRF tokens. Pure, no I/O.

A person unlocks actions by entering the token (``SCHEDULER_CONSOLE_TOKEN``) and a name
on the login form. The console then makes a session: a random id (256 bits) sent as the
cookie (HttpOnly, SameSite=Strict) and kept in this process's memory with the name and
the expiry, under its SHA-256 (a memory dump shows no usable cookie). Signing out
deletes it, so a copied cookie is dead from then on; restarting the console ends every
session. Each action form carries a CSRF token bound to the session (an HMAC under a key
made at start-up); an action needs both. Scripts send the token as
``Authorization: Bearer`` instead. The token itself is never stored in the cookie or
written to a log.

Every comparison of a secret is ``hmac.compare_digest`` on UTF-8 bytes: on ``str`` it
raises ``TypeError`` for non-ASCII text, which a caller controls (cookie, form field,
header).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading

COOKIE = "scheduler_console"
SESSION_S = 8 * 3600
MAX_SESSIONS = 256  # signing in needs the token, so only token holders can fill this
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


def same(given: str, expected: str) -> bool:
    """Constant-time equality of two texts, whatever characters ``given`` holds."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


class Guard:
    def __init__(self, token: str | None, allow_actions: bool, max_sessions: int = MAX_SESSIONS) -> None:
        self.token = token
        self.allow_actions = allow_actions and token is not None
        self._key = secrets.token_bytes(32)
        self._max = max_sessions
        self._sessions: dict[str, tuple[str, float]] = {}  # sha256(id) -> (name, expiry s)
        self._lock = threading.Lock()  # pages render on the event loop, tests call from threads

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    @staticmethod
    def valid_name(name: str) -> bool:
        return bool(_NAME.fullmatch(name))  # match() with $ would let a trailing newline in

    def _token_ok(self, given: str) -> bool:
        return self.token is not None and same(given, self.token)

    def login(self, token: str, name: str, now_s: float) -> str | None:
        """A new session's cookie value for a correct token and a valid name, else None.
        Expired sessions are dropped here; past ``max_sessions`` the oldest goes."""
        if not self.allow_actions or not self.valid_name(name) or not self._token_ok(token):
            return None
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            for key in [k for k, (_, expiry) in self._sessions.items() if expiry <= now_s]:
                del self._sessions[key]
            while len(self._sessions) >= self._max:
                del self._sessions[min(self._sessions, key=lambda k: self._sessions[k][1])]
            self._sessions[_digest(session_id)] = (name, now_s + SESSION_S)
        return session_id

    def who(self, cookie: str | None, now_s: float) -> str | None:
        """The name of a live session, or None (no cookie, unknown, signed out, expired,
        or actions off)."""
        if not self.allow_actions or not cookie:
            return None
        key = _digest(cookie)
        with self._lock:
            entry = self._sessions.get(key)
            if entry is None:
                return None
            if entry[1] <= now_s:
                del self._sessions[key]
                return None
        return entry[0]

    def logout(self, cookie: str | None) -> str | None:
        """End the session of ``cookie`` (its cookie is refused from now on); its name, or
        None when there was no such session."""
        if not cookie:
            return None
        with self._lock:
            entry = self._sessions.pop(_digest(cookie), None)
        return entry[0] if entry else None

    def csrf(self, cookie: str) -> str:
        """The CSRF token of the session ``cookie`` (forms carry it in a hidden field)."""
        return self._mac("csrf|" + cookie)

    def bearer(self, authorization: str | None, user: str | None) -> str | None:
        """A script's actor: ``Authorization: Bearer <token>`` (a browser never sends that
        header by itself, so no CSRF token is needed) named by ``X-Scheduler-User``
        (``api`` when absent or not a valid name). None when the token does not match."""
        if not self.allow_actions or not authorization:
            return None
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not self._token_ok(given.strip()):
            return None
        return user if user and self.valid_name(user) else "api"

    def check(self, cookie: str | None, csrf: str | None, now_s: float) -> str | None:
        """The actor's name when the session is live and ``csrf`` belongs to it, else None."""
        name = self.who(cookie, now_s)
        if name is None or cookie is None or not csrf:
            return None
        return name if same(csrf, self.csrf(cookie)) else None
