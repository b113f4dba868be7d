"""What the fleet looks like from outside: members and lock holders, read from
ZooKeeper without joining (for ``status``, ``lag`` and the exporter)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import PermissionDenied
from ..security import ZkSecurity
from ..settings import zookeeper_credentials as read_credentials
from ..settings import zookeeper_security
from .url import check_coordinator_url
from .zkconn import kazoo_client, zk_unreachable


@dataclass(frozen=True)
class FleetSnapshot:
    """What ZooKeeper says about the fleet right now, for views and the exporter."""

    members: list[str]
    owners: dict[int, str]  # shard -> member holding its lock


def read_fleet(url: str, *, timeout_s: float = 10.0,
               credentials: Callable[[], str | None] = read_credentials,
               security: Callable[[], ZkSecurity] = zookeeper_security) -> FleetSnapshot | None:
    """Members and lock holders, read without joining the fleet. None for ``local``
    coordination (it lives inside one process). Raises ``StoreUnavailable`` when
    ZooKeeper cannot be reached."""
    from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError

    zk_url = check_coordinator_url(url)  # ConfigError, one line, before anything connects
    if zk_url is None:
        return None
    root = zk_url.root
    sec = security()
    zk = kazoo_client(zk_url.hosts, timeout_s, credentials(), sec)
    try:
        zk.start(timeout=timeout_s)
        members = sorted(zk.get_children(f"{root}/members")) if zk.exists(f"{root}/members") else []
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
        return FleetSnapshot(members, owners)
    except NoAuthError:
        user = (credentials() or "(none)").partition(":")[0]
        raise PermissionDenied(
            f"ZooKeeper at {zk_url.hosts} refuses user {user!r} read access to {root}: add its digest "
            "id to the pollers' SCHEDULER_ZK_READERS (they grant it when they start)") from None
    except (KazooTimeoutError, KazooException) as exc:
        raise zk_unreachable(zk_url.hosts, exc, sec, "the fleet could not be read") from None
    finally:
        # Each step on its own: a stop that raises must not skip the close, which frees
        # the client's threads and socket.
        with contextlib.suppress(Exception):
            zk.stop()
        with contextlib.suppress(Exception):
            zk.close()
