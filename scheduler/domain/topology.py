"""Data centres: the keyspace's replication setting, a DC name, and the consistency a
producer writes with. Pure parsing; the store turns the results into CQL and driver
settings (scheduler/store/cassandra/conf.py).

Every parser here raises ``ConfigError`` (one line: what was wrong, what to write) for
any string, and nothing else."""

from __future__ import annotations

import re

from ..errors import ConfigError

# A DC name as a snitch reports it (cassandra-rackdc.properties, a cloud region): ASCII
# letters, digits, '_', '.', '-'. It ends up inside a CQL string literal, so nothing that
# could close one is accepted.
DC_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,48}\Z")
_RF_RE = re.compile(r"^[1-9][0-9]{0,1}\Z")  # 1..99: more copies than that is a typo
REPLICATION_FORMS = ("simple:RF (one DC, development), DC:RF[,DC:RF...] (e.g. dc1:2,dc2:1) "
                     "or nts:DC=RF[,DC=RF...]")

# What a producer may write with (see docs/two-data-centres.md): LOCAL_QUORUM answers once
# a quorum of the client's own DC has the write; EACH_QUORUM waits for a quorum in every DC.
WRITE_CONSISTENCIES = ("local_quorum", "each_quorum")


def _shown(text: str) -> str:
    """``text`` quoted and cut short, control characters escaped: safe in one log line."""
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def check_dc(name: str, where: str) -> str:
    """``name`` when it is a valid DC name, else ``ConfigError`` naming ``where`` it came from."""
    if not DC_NAME_RE.match(name):
        raise ConfigError(f"{where} {_shown(name)} is not a DC name: use the name the cluster's snitch "
                          "reports (letters, digits, '_', '.', '-'; e.g. dc1)")
    return name


def parse_replication(spec: str) -> tuple[str, dict[str, int]]:
    """``("SimpleStrategy", {"replication_factor": RF})`` for ``simple:RF`` (``simple``
    alone: RF 1), else ``("NetworkTopologyStrategy", {DC: RF, ...})`` for ``DC:RF,...``
    or the older ``nts:DC=RF,...``. A DC may appear once; RF is 1 to 99. A DC named
    ``simple`` or ``nts`` needs the ``nts:`` form."""
    bad = ConfigError(f"--replication {_shown(spec)} is not valid: use {REPLICATION_FORMS}")
    if not isinstance(spec, str):
        raise bad
    kind, colon, rest = spec.partition(":")
    if kind == "simple":
        rf = rest or "1"
        if not _RF_RE.match(rf):
            raise bad
        return "SimpleStrategy", {"replication_factor": int(rf)}
    items, sep = (rest, "=") if kind == "nts" and colon else (spec, ":")
    factors: dict[str, int] = {}
    for item in items.split(","):
        dc, eq, rf = item.partition(sep)
        if not eq or not DC_NAME_RE.match(dc) or not _RF_RE.match(rf) or dc in factors:
            raise bad
        factors[dc] = int(rf)
    return "NetworkTopologyStrategy", factors


def replication_cql(spec: str) -> str:
    """The CQL replication map of ``spec`` (see ``parse_replication``)."""
    cls, factors = parse_replication(spec)
    return "{" + ", ".join([f"'class': '{cls}'", *(f"'{k}': {v}" for k, v in factors.items())]) + "}"


def parse_write_consistency(value: str, where: str) -> str:
    """``local_quorum`` or ``each_quorum`` (any case, surrounding blanks ignored), else
    ``ConfigError`` naming ``where`` it came from."""
    norm = value.strip().lower() if isinstance(value, str) else ""
    if norm not in WRITE_CONSISTENCIES:
        raise ConfigError(f"{where} {_shown(str(value))} is not a write consistency: use local_quorum "
                          "(the default) or each_quorum")
    return norm
