"""What the fleet looks like from outside: members (and their DCs), lock holders and the
home-DC rule, read from ZooKeeper without joining (for ``status``, ``lag``, the exporter
and ``shards home``), and the rule written by an operator."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, InvalidInput, PermissionDenied
from ..security import ZkSecurity
from ..settings import zookeeper_credentials as read_credentials
from ..settings import zookeeper_security
from . import dcs as dcrec
from .url import check_coordinator_url
from .zkconn import kazoo_client, zk_unreachable


@dataclass(frozen=True)
class FleetSnapshot:
    """What ZooKeeper says about the fleet right now, for views and the exporter."""

    members: list[str]
    owners: dict[int, str]  # shard -> member holding its lock
    dcs: dict[str, str | None] = field(default_factory=dict)  # member -> the DC it advertises
    weights: dict[str, int] = field(default_factory=dict)  # the home-DC rule ({}: none)


@contextlib.contextmanager
def _fleet_zk(url: str, timeout_s: float, credentials: Callable[[], str | None],
              security: Callable[[], ZkSecurity], what: str) -> Iterator[tuple[Any, str, list[Any] | None]]:
    """A started kazoo client on the fleet of ``url``, its root and the fleet's ACL;
    ``ConfigError`` for ``local``; ZooKeeper's refusals as one-line errors."""
    from kazoo.exceptions import KazooException, NoAuthError
    from kazoo.handlers.threading import KazooTimeoutError

    zk_url = check_coordinator_url(url)  # ConfigError, one line, before anything connects
    if zk_url is None:
        raise ConfigError(f"{what} needs a ZooKeeper fleet: pass --coordinator zookeeper://HOST:PORT/ROOT "
                          "(or set SCHEDULER_COORDINATOR)")
    sec, creds = security(), credentials()
    zk = kazoo_client(zk_url.hosts, timeout_s, creds, sec)
    try:
        zk.start(timeout=timeout_s)
        yield zk, zk_url.root, sec.acl(creds)
    except NoAuthError:
        user = (creds or "(none)").partition(":")[0]
        raise PermissionDenied(
            f"ZooKeeper at {zk_url.hosts} refuses user {user!r} access to {zk_url.root} for {what}: "
            "read access needs its digest id in the pollers' SCHEDULER_ZK_READERS; writes need "
            "the pollers' own credentials") from None
    except (KazooTimeoutError, KazooException) as exc:
        raise zk_unreachable(zk_url.hosts, exc, sec, f"{what} failed") from None
    finally:
        # Each step on its own: a stop that raises must not skip the close, which frees
        # the client's threads and socket.
        with contextlib.suppress(Exception):
            zk.stop()
        with contextlib.suppress(Exception):
            zk.close()


def read_fleet(url: str, *, timeout_s: float = 10.0,
               credentials: Callable[[], str | None] = read_credentials,
               security: Callable[[], ZkSecurity] = zookeeper_security) -> FleetSnapshot | None:
    """Members, their DCs, lock holders and the home-DC rule, read without joining the
    fleet. None for ``local`` coordination (it lives inside one process). Raises
    ``StoreUnavailable`` when ZooKeeper cannot be reached."""
    from kazoo.exceptions import NoNodeError

    if check_coordinator_url(url) is None:
        return None
    with _fleet_zk(url, timeout_s, credentials, security, "reading the fleet") as (zk, root, _):
        members = sorted(zk.get_children(f"{root}/members")) if zk.exists(f"{root}/members") else []
        dcs: dict[str, str | None] = {}
        for m in members:
            try:
                dcs[m] = dcrec.decode_member(zk.get(f"{root}/members/{m}")[0])
            except NoNodeError:  # left while we looked
                dcs[m] = None
        owners: dict[int, str] = {}
        shards = zk.get_children(f"{root}/locks") if zk.exists(f"{root}/locks") else []
        for name in shards:
            if not name.isdigit():
                continue
            try:
                # kazoo's Lock: contenders are "<uuid>__lock__<seq>"; the lowest holds it,
                # and its data is the holder's identifier (our member id).
                nodes = sorted(zk.get_children(f"{root}/locks/{name}"), key=lambda n: n[-10:])
                if nodes:
                    data, _ = zk.get(f"{root}/locks/{name}/{nodes[0]}")
                    owners[int(name)] = data.decode("utf-8", "replace")
            except NoNodeError:  # released while we looked
                continue
        try:
            weights = dcrec.read_home(zk, root)
        except InvalidInput:
            weights = {}  # unreadable: shown as no rule; `shards home` says why
        return FleetSnapshot(members, owners, dcs, weights)


def read_home_rule(url: str, *, timeout_s: float = 10.0,
                   credentials: Callable[[], str | None] = read_credentials,
                   security: Callable[[], ZkSecurity] = zookeeper_security) -> dict[str, int]:
    """The fleet's home-DC rule ({}: none). ``InvalidInput`` for a node that does not
    parse; ``ConfigError`` for ``local``."""
    with _fleet_zk(url, timeout_s, credentials, security, "reading the home-DC rule") as (zk, root, _):
        return dcrec.read_home(zk, root)


def write_home_rule(url: str, weights: dict[str, int] | None, *, timeout_s: float = 10.0,
                    credentials: Callable[[], str | None] = read_credentials,
                    security: Callable[[], ZkSecurity] = zookeeper_security) -> None:
    """Set (None: remove) the fleet's home-DC rule; the members follow it within a tick."""
    with _fleet_zk(url, timeout_s, credentials, security, "setting the home-DC rule") as (zk, root, acl):
        dcrec.write_home(zk, root, weights, acl)
