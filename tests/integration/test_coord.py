"""The ZooKeeper coordinator against a real ZooKeeper: membership, exclusive shard
locks, increasing fencing tokens, session loss, ACLs."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from scheduler.errors import ConfigError
from scheduler.fleet.coord import LocalCoordinator, ZooKeeperCoordinator, open_coordinator
from scheduler.settings import zookeeper_credentials as read_credentials
from tests.conftest import ZOOKEEPER_HOSTS
from tests.procs import wait_until


def coord(root: str, name: str, **kw) -> ZooKeeperCoordinator:
    c = ZooKeeperCoordinator(ZOOKEEPER_HOSTS, root, session_timeout_s=kw.pop("timeout", 4.0), **kw)
    c.start(name)
    return c


def test_membership_locks_and_fencing_tokens(zk_root):
    a, b = coord(zk_root, "a"), coord(zk_root, "b")
    try:
        assert a.members() == ["a", "b"]
        t1 = a.try_acquire(3)
        assert t1 is not None and b.try_acquire(3) is None
        assert a.try_acquire(3) == t1, "re-acquiring a held lock is a no-op"
        a.release(3)
        t2 = b.try_acquire(3)
        assert t2 is not None and t2 > t1, "a later holder gets a larger token"
        assert b.held() == {3} and a.held() == set()
        assert a.lease_valid() and b.lease_valid()
    finally:
        a.stop()
        b.stop()


def test_a_lost_session_drops_locks_and_the_lease(zk_root):
    a = coord(zk_root, "a", timeout=4.0)
    b = coord(zk_root, "b")
    try:
        assert a.try_acquire(1) is not None
        # Expire a's session from the server side, as a long pause would.
        client_id = a.zk.client_id
        killer = KazooClient(hosts=ZOOKEEPER_HOSTS, client_id=client_id)
        killer.start(timeout=10)
        killer.stop()
        killer.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (a.held() or b.try_acquire(1) is None):
            time.sleep(0.2)
        assert b.held() == {1}
        assert a.held() == set()
    finally:
        a.stop()
        b.stop()


def test_digest_acl_protects_the_root(zk_root):
    a = coord(zk_root, "a", credentials="sched:s3cret")
    try:
        other = KazooClient(hosts=ZOOKEEPER_HOSTS)
        other.start(timeout=10)
        try:
            with pytest.raises(NoAuthError):
                other.create(f"{zk_root}/members/intruder", b"", ephemeral=True)
        finally:
            other.stop()
            other.close()
    finally:
        a.stop()


def test_credentials_come_from_env_or_file(tmp_path):
    assert read_credentials({}) is None
    assert read_credentials({"SCHEDULER_ZK_AUTH": "u:p"}) == "u:p"
    f = tmp_path / "cred"
    f.write_text("u2:p2\n")
    assert read_credentials({"SCHEDULER_ZK_AUTH_FILE": str(f)}) == "u2:p2"
    with pytest.raises(ConfigError, match="user:password"):
        read_credentials({"SCHEDULER_ZK_AUTH": "nopassword"})


def test_coordinator_urls():
    assert isinstance(open_coordinator("local"), LocalCoordinator)
    assert isinstance(open_coordinator(None), LocalCoordinator)
    with pytest.raises(ConfigError, match="unknown coordinator"):
        open_coordinator("etcd://x")


@pytest.mark.parametrize("kind", ["local", "zookeeper"])
def test_the_plan_is_published_by_compare_and_set(kind, request):
    import uuid

    from scheduler.domain.plan import Plan
    from scheduler.fleet.coord import Coordinator

    a: Coordinator
    b: Coordinator
    if kind == "local":
        root = f"plan-{uuid.uuid4().hex}"
        a, b = LocalCoordinator(root), LocalCoordinator(root)
        a.start("a")
        b.start("b")
    else:
        root = request.getfixturevalue("zk_root")
        a, b = coord(root, "a"), coord(root, "b")
    try:
        assert a.read_plan() == (None, -1)
        one = Plan(("a", "b"), {0: "a", 1: "b"})
        assert a.publish_plan(one, -1)
        assert not b.publish_plan(Plan(("a", "b"), {0: "b", 1: "b"}), -1)
        plan, version = b.read_plan()
        assert plan == one and version >= 0
        two = Plan(("a",), {0: "a", 1: "a"})
        assert b.publish_plan(two, version)
        assert not a.publish_plan(one, version), "a stale version is refused"
        assert a.read_plan() == (two, version + 1)
    finally:
        a.stop()
        b.stop()


def test_at_rest_a_member_reads_only_its_lease_and_watches_say_what_changed(zk_root):
    """The member list, the plan and held lock nodes are read again only when a watch
    fired: repeated calls at rest make no reads, yet a join, a leave, a publish by
    another member and a lock node deleted behind the holder's back are all seen."""
    from scheduler.domain.plan import Plan

    a = coord(zk_root, "a")
    reads = {"get_children": 0, "exists": 0, "get": 0}

    def counting(name: str):
        real = getattr(a.zk, name)

        def call(path, *args, **kw):
            if not path.endswith("/members/a"):  # the lease's own exists() is not counted
                reads[name] += 1
            return real(path, *args, **kw)
        return call

    for name in reads:  # a spy on the real client's calls, which still reach the server
        setattr(a.zk, name, counting(name))
    b = None
    try:
        assert a.members() == ["a"] and a.read_plan() == (None, -1)
        assert a.try_acquire(5) is not None
        before = dict(reads)
        for _ in range(20):
            assert a.members() == ["a"] and a.read_plan() == (None, -1)
        time.sleep(a.session_timeout_s / 6 * 2.5)  # two lease renewals
        assert reads == before, "no reads at rest"
        b = coord(zk_root, "b")
        wait_until(lambda: a.members() == ["a", "b"], 10, "a to see b join")
        plan = Plan(("a", "b"), {0: "a", 1: "b"})
        assert b.publish_plan(plan, -1)
        wait_until(lambda: a.read_plan() == (plan, 0), 10, "a to see b's plan")
        b.stop()
        b = None
        wait_until(lambda: a.members() == ["a"], 10, "a to see b leave")
        lock_dir = f"{zk_root}/locks/5"
        admin = KazooClient(hosts=ZOOKEEPER_HOSTS)
        admin.start(timeout=10)
        try:
            for node in admin.get_children(lock_dir):
                admin.delete(f"{lock_dir}/{node}")  # as an operator's cleanup would
        finally:
            admin.stop()
            admin.close()
        wait_until(lambda: a.held() == set(), 10, "a to drop the lock whose node went")
        assert a.lease_valid()
    finally:
        a.stop()
        if b is not None:
            b.stop()
