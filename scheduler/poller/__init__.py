"""The poller, as a library: ``Poller`` composes the reader, the dispatcher, the workers
and the recorder (see ``poller.py``); ``scheduler.run_poller`` runs one as a process."""

from .config import PollerConfig, PollerStats, max_prefetch_ms
from .poller import Poller
from .shared import ShardState

__all__ = ["Poller", "PollerConfig", "PollerStats", "ShardState", "max_prefetch_ms"]
