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


def heal_acls(zk: Any, root: str, acl: list[Any] | None) -> None:
    """Give the fleet's long-lived znodes ``acl`` where they lack it (a reader id added to
    SCHEDULER_ZK_READERS after they were created). Four or five reads when nothing changed."""
    if not acl:
        return
    paths = [root, f"{root}/members", f"{root}/locks"]
    for extra in ("assignment", "home", "outages"):  # the plan (plan.py) and dcs.py's nodes
        if zk.exists(f"{root}/{extra}"):
            paths.append(f"{root}/{extra}")
    if all(set(zk.get_acls(p)[0]) == set(acl) for p in paths):
        return
    for lock in [f"{root}/locks/{name}" for name in zk.get_children(f"{root}/locks")]:
        with contextlib.suppress(Exception):  # released meanwhile
            paths += [lock, *(f"{lock}/{node}" for node in zk.get_children(lock))]
    for path in paths:
        with contextlib.suppress(Exception):  # gone meanwhile, or not ours to change
            zk.set_acls(path, acl)
    log.info("set the fleet's znode ACLs (%d znodes) to the configured owner and readers", len(paths))


def zk_unreachable(hosts: str, exc: BaseException, security: ZkSecurity, hint: str) -> SchedulerError:
    """The one error for a ZooKeeper connection that failed: the TLS cause when there is one."""
    return explain_zookeeper(exc, hosts, security.tls) or StoreUnavailable(
        f"cannot reach ZooKeeper at {hosts} ({type(exc).__name__}: {exc}); {hint}")
