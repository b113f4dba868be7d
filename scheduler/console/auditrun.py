"""Who may run the completeness audit from the console, and its last result. Pure: the
audit and the monotonic clock are passed in.

An audit of an hour reads every partition of that hour, so a page view must not start
one for anyone who asks. Signed-in people (and scripts with the token) may run one
whenever no other is under way; anyone else (and everyone on a read-only console, where
nobody signs in) at most once per ``interval_s`` for the whole console. One audit runs at
a time. Everyone may look at the last result, which stays until the next run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..domain.ratelimit import TokenBucket
from ..observe.audit import AuditReport

ANONYMOUS_INTERVAL_S = 60.0


@dataclass(frozen=True)
class LastAudit:
    first_ms: int
    last_ms: int
    report: AuditReport
    took_s: float
    by: str  # a signed-in name, or "anonymous"


class AuditRuns:
    def __init__(self, audit: Callable[[int, int], AuditReport],
                 interval_s: float = ANONYMOUS_INTERVAL_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._audit = audit
        self._mono = monotonic
        self._anonymous = TokenBucket(1.0 / interval_s, burst=1.0, monotonic=monotonic)
        self._busy = threading.Lock()
        self.last: LastAudit | None = None

    def run(self, first_ms: int, last_ms: int, who: str | None) -> str | None:
        """Run the audit of ``[first_ms, last_ms]`` for ``who`` (None: not signed in) and
        keep it as ``last``; or return why it did not run (``last`` unchanged). Raises
        what the audit raises (the store's errors); ``last`` is then unchanged too."""
        if not self._busy.acquire(blocking=False):
            return "another audit is running now; below is the last result, try again when it ends"
        try:
            if who is None and not self._anonymous.try_take():
                wait = max(1, round(self._anonymous.wait_s()))
                return (f"without signing in the console runs at most one audit a minute; try again "
                        f"in {wait} s, or sign in (scheduler audit runs any window from a shell)")
            t0 = self._mono()
            report = self._audit(first_ms, last_ms)
            self.last = LastAudit(first_ms, last_ms, report, self._mono() - t0, who or "anonymous")
            return None
        finally:
            self._busy.release()
