"""The one exception root and its typed children.

Every error the library raises on purpose derives from :class:`SchedulerError`, and
its message is one line saying what was wrong and what to do about it. The CLI prints
that line and exits non-zero.
"""

from __future__ import annotations


class SchedulerError(Exception):
    """The scheduler failed; the message says why and what to do."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidInput(SchedulerError, ValueError):
    """An argument is invalid; nothing was written."""


class ConfigError(SchedulerError):
    """The configuration is invalid; fix the setting named in the message."""


class AuthenticationError(ConfigError):
    """The server refused the login; fix the user or password setting named in the message."""


class TlsError(ConfigError):
    """A TLS connection could not be set up; the message names the cause and the setting."""


class PermissionDenied(SchedulerError):
    """The role lacks a permission; the message names it and the role to use."""


class StoreUnavailable(SchedulerError):
    """The store cannot be reached; check that it is running and the URL is right."""


class SchemaError(SchedulerError):
    """The store's schema is missing or incompatible; run `scheduler schema apply`."""


class JobNotFound(SchedulerError, LookupError):
    """No job has that id."""


class ScheduleNotFound(SchedulerError, LookupError):
    """No recurring schedule has that id (or it was deleted)."""


class ScheduleConflict(SchedulerError):
    """A schedule with that id exists with another definition, or changed meanwhile."""


class ResizeRefused(SchedulerError):
    """A shard-count change was refused; the message names the earliest allowed cutover."""


class WriteTimeout(SchedulerError):
    """A write timed out and may or may not have been applied.

    ``maybe_applied`` is True when the store may have kept the write; scheduling is
    idempotent by job id, so retrying the same call is safe.
    """

    def __init__(self, message: str | None = None, *, maybe_applied: bool = True) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


class GiveUp(SchedulerError):
    """A handler's attempt failed in a way no retry can mend: the job is dead-lettered at
    once, with this message as its error, whatever attempts its kind has left."""


class RetryLater(SchedulerError):
    """A handler's attempt failed: retried with its kind's backoff, and no sooner than
    ``delay_s`` seconds from now (a receiver's ``Retry-After``). The message is the error."""

    def __init__(self, message: str | None = None, *, delay_s: float = 0.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class OwnershipLost(SchedulerError):
    """This poller no longer owns the shard; a fenced write was refused. A refused claim
    carries what the fencing read found: ``holder`` (None: released) and ``held_epoch``."""

    def __init__(self, message: str, *, holder: str | None = None, held_epoch: int | None = None) -> None:
        super().__init__(message)
        self.holder, self.held_epoch = holder, held_epoch


def shown_url(url: str) -> str:
    """``url`` as an error message may show it: quoted, with anything before an ``@`` in
    its authority (a user and maybe a password) replaced by ``***``, even when the URL
    does not parse. Error messages quote URLs only through this."""
    scheme, sep, rest = url.partition("://")
    if sep:
        authority, slash, tail = rest.partition("/")
        if "@" in authority:
            rest = "***@" + authority.rpartition("@")[2] + slash + tail
        url = scheme + sep + rest
    elif "@" in url:
        url = "***@" + url.rpartition("@")[2]
    return repr(url)
