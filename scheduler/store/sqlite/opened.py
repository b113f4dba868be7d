"""Whether the file an embedded store opened is still the file at its path.

An open SQLite connection keeps working on its file after the file is moved away or
deleted: every later write would land in a file that no other process opens (a poller
started after the delete reads a new, empty one), and nothing would say so. The store
checks before each call instead (one ``stat``): while the opened file is not at its path
every call is ``StoreUnavailable``, and once it is back (moved back, its volume mounted
again) the store goes on. Another file at the path (a restored backup) is not opened in
its place: the old file's ``-wal`` and ``-shm`` files, still open in this process and
maybe in others, would be taken for the new file's; the message says to restart.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import StoreUnavailable


def identity(path: str) -> tuple[int, int]:
    """The (device, inode) of ``path``; ``OSError`` when there is no file."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


class OpenedFile:
    """The file a connection was opened on, known by identity rather than by name."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)  # a str: stat is called before every store call
        self.identity = identity(self.path)

    def check(self, url: str) -> None:
        """Return while ``path`` is the opened file; raise ``StoreUnavailable`` when there
        is no file there, it cannot be looked at, or it is another file."""
        try:
            now = identity(self.path)
        except OSError as exc:
            raise StoreUnavailable(
                f"store {url} is unavailable: {self.path} is gone ({exc.strerror or exc}); put the file "
                "back (this process goes on with it as soon as it is there)") from None
        if now != self.identity:
            raise StoreUnavailable(
                f"store {url} is unavailable: {self.path} is another file than the one this process "
                "opened (replaced or restored); restart the process to open the new one")
