"""Windows in which this process saw nodes of another DC down (pure).

While the link between two DCs is cut (a partition, or the other DC's nodes stopped),
each DC keeps accepting LOCAL_QUORUM writes the other does not see. A shard fired in
one DC can then have rows written in the other placed in buckets its owner drains
before they arrive (by hinted hand-off, after the link heals). The window this module
reports is what the owner reads again once the link is back (``runtime/catchup.py``).

The window starts ``lookback_ms`` before the first observation of a node down: the
driver learns of it only when Cassandra's failure detector convicts the node (seconds
after the cut), and writes acknowledged just before the cut may not have crossed it.
"""

from __future__ import annotations

# Cassandra's failure detector convicts a silent node after about 10-20 s; this covers
# that and the writes in flight when the link went.
DEFAULT_LOOKBACK_MS = 60_000


class PeerLinks:
    """Feed it how many nodes of other DCs are down, as often as you like; it answers
    the window ``(from_ms, to_ms)`` once, when the count returns to 0."""

    def __init__(self, lookback_ms: int = DEFAULT_LOOKBACK_MS) -> None:
        self.lookback_ms = lookback_ms
        self._since: int | None = None

    @property
    def open(self) -> bool:
        return self._since is not None

    def observe(self, down: int, now_ms: int) -> tuple[int, int] | None:
        if down > 0:
            if self._since is None:
                self._since = now_ms
            return None
        if self._since is None:
            return None
        start, self._since = self._since, None
        return start - self.lookback_ms, now_ms
