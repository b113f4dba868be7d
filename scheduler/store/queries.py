"""Load named queries from the packaged ``cql/`` files.

A file holds blocks that start with ``-- name: NAME`` and end at the next such line;
other comment lines are dropped. Versioned schema files are split on ``;``.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$")


def read(relpath: str) -> str:
    """Text of a packaged file under ``cql/`` (works from a wheel, not only a checkout)."""
    node = resources.files("scheduler.cql")
    for part in relpath.split("/"):
        node = node.joinpath(part)
    return node.read_text(encoding="utf-8")


@cache
def named(relpath: str) -> dict[str, str]:
    """``{name: statement}`` for every named block in the file, trailing ';' removed."""
    return parse_named(read(relpath))


def parse_named(text: str) -> dict[str, str]:
    """``{name: statement}`` for every ``-- name:`` block of ``text``. A name given twice
    raises ``ValueError``: the later block would silently replace the earlier one."""
    out: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in [*text.splitlines(), "-- name: _end"]:
        m = _NAME.match(line)
        if m:
            if m.group(1) in out or m.group(1) == name:
                raise ValueError(f"the query name {m.group(1)!r} is given twice")
            if name is not None:
                out[name] = "\n".join(lines).strip().rstrip(";").strip()
            name, lines = m.group(1), []
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    out.pop("_end", None)
    return out


def statements(text: str) -> list[str]:
    """Split a schema script into statements, dropping comment lines."""
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def versions(folder: str) -> list[tuple[int, str, str]]:
    """``[(version, description, text)]`` for ``vNNN_description.*`` files, in order."""
    node = resources.files("scheduler.cql").joinpath(folder)
    found = []
    for entry in node.iterdir():
        m = re.match(r"^v(\d+)_(\w+)\.(cql|sql)$", entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found)
