"""ZooKeeper connections as the fleet uses them: a kazoo client with the settings' TLS and
digest credentials, one typed error for a failed connection, and the fleet's znode ACLs
kept to the configured owner and readers."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ..diagnose import explain_zookeeper
from ..errors import ConfigError, SchedulerError, StoreUnavailable
from ..security import ZkSecurity, is_loopback

log = logging.getLogger("scheduler.coord")

RECONNECT = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}


def kazoo_client(hosts: str, timeout_s: float, credentials: str | None, security: ZkSecurity,
                 **kwargs: Any) -> Any:
    """A ``KazooClient`` with the settings' TLS and digest credentials. Digest credentials
    cross the wire in clear text: refused (``ConfigError``) without TLS unless every
    host is a loopback address."""
    from kazoo.client import KazooClient

    if credentials and security.tls is None and not is_loopback(hosts):
        raise ConfigError(f"ZooKeeper digest credentials would cross the network in clear text to "
                          f"{hosts}: set SCHEDULER_ZK_CA (TLS) or use a loopback address")
    auth = [("digest", credentials)] if credentials else None
    return KazooClient(hosts=hosts, timeout=timeout_s, auth_data=auth, **security.kazoo_args(), **kwargs)


# Every znode of a fleet lives in one of these, under its root, at most this many levels
# down (and a reader's view reads every one: status, the exporter, `shards home`). A node
# the fleet adds goes here, or a reader added later is refused it (``heal_acls``):
#   members/<member>           ephemeral; data: the member's DC (dcs.py), read by views
#   locks/<shard>/<contender>  kazoo Locks; data: the holder's member id
#   assignment                 the published plan (plan.py)
#   home                       the home-DC rule (dcs.py)
#   outages/<record>           take-over records (dcs.py)
FLEET_ZNODES: dict[str, int] = {"members": 1, "locks": 2, "assignment": 0, "home": 0, "outages": 1}


def fleet_znodes(zk: Any, root: str) -> list[str]:
    """Every znode of the fleet at ``root`` (``FLEET_ZNODES``), the root first and parents
    before their children. Absent ones are left out; one removed while listed, or whose
    children we may not list, may be in it. Other kazoo errors propagate."""
    from kazoo.exceptions import NoAuthError, NoNodeError

    def below(path: str, depth: int) -> list[str]:
        if not depth:
            return [path]
        try:
            children = zk.get_children(path)
        except (NoNodeError, NoAuthError):
            return [path]
        return [path, *(p for child in children for p in below(f"{path}/{child}", depth - 1))]

    return [root, *(p for name, depth in FLEET_ZNODES.items() if zk.exists(f"{root}/{name}")
                    for p in below(f"{root}/{name}", depth))]


def heal_acls(zk: Any, root: str, acl: list[Any] | None) -> None:
    """Give every znode of the fleet (``fleet_znodes``) ``acl`` when the root or one of its
    top-level nodes lacks it (a reader id added to SCHEDULER_ZK_READERS after they were
    created). Six reads when nothing changed. A node gone meanwhile, or not ours to
    change, is skipped; other kazoo errors propagate."""
    from kazoo.exceptions import NoNodeError

    if not acl:
        return

    def differs(path: str) -> bool:
        try:
            return set(zk.get_acls(path)[0]) != set(acl)
        except NoNodeError:  # not made yet: it will be made with our ACL
            return False

    if not any(differs(p) for p in [root, *(f"{root}/{name}" for name in FLEET_ZNODES)]):
        return
    paths = fleet_znodes(zk, root)
    for path in paths:
        with contextlib.suppress(Exception):  # gone meanwhile, or not ours to change
            zk.set_acls(path, acl)
    log.info("set the fleet's znode ACLs (%d znodes) to the configured owner and readers", len(paths))


def zk_unreachable(hosts: str, exc: BaseException, security: ZkSecurity, hint: str) -> SchedulerError:
    """The one error for a ZooKeeper connection that failed: the TLS cause when there is one."""
    return explain_zookeeper(exc, hosts, security.tls) or StoreUnavailable(
        f"cannot reach ZooKeeper at {hosts} ({type(exc).__name__}: {exc}); {hint}")
