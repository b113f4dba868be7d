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


def every_znode(zk: KazooClient, path: str) -> list[str]:
    """``path`` and every znode below it, whatever the fleet's code says there is."""
    return [path, *(p for child in zk.get_children(path) for p in every_znode(zk, f"{path}/{child}"))]


def test_every_fleet_znode_is_given_to_a_reader_added_later(zk_root):
    """A member started before SCHEDULER_ZK_READERS named the reader makes every kind of
    fleet znode (a member node with its DC, a lock, the plan, the home-DC rule, an outage
    record) without the reader; the next member to start gives the reader read on each,
    and the reader's views then read them all. Every znode under the root is one
    ``FLEET_ZNODES`` lists: a kind added without it fails here."""
    from kazoo.security import Permissions, make_digest_acl_credential

    from scheduler.domain.plan import Plan
    from scheduler.errors import PermissionDenied
    from scheduler.fleet import dcs as dcrec
    from scheduler.fleet.view import read_fleet, read_home_rule, write_home_rule
    from scheduler.fleet.zkconn import fleet_znodes
    from scheduler.security import ZkSecurity

    app, reader = "app:app-password", "reader:reader-password"
    reader_id = make_digest_acl_credential("reader", "reader-password")
    url = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"

    def as_reader() -> str:
        return reader

    old = coord(zk_root, "old", credentials=app, dc="dc1")
    new = None
    try:
        assert old.try_acquire(2) is not None
        assert old.publish_plan(Plan(("old",), {2: "old"}), -1)
        write_home_rule(url, {"dc1": 1}, credentials=lambda: app, security=ZkSecurity)
        old.record_outage({"shard": 2, "home_dc": "dc2", "dc": "dc1", "member": "old", "at_ms": 1,
                           "from_bucket": 0})
        with pytest.raises(PermissionDenied, match="SCHEDULER_ZK_READERS"):
            read_fleet(url, credentials=as_reader, security=ZkSecurity)

        new = coord(zk_root, "new", credentials=app, security=ZkSecurity(readers=(reader_id,)))
        nodes = every_znode(new.zk, zk_root)
        made = {"members/old", "members/new", "assignment", "home", "locks/2"}
        assert {f"{zk_root}/{n}" for n in made} <= set(nodes), nodes
        assert any(n.startswith(f"{zk_root}/outages/s2-") for n in nodes), nodes
        assert any(n.startswith(f"{zk_root}/locks/2/") for n in nodes), nodes
        assert sorted(fleet_znodes(new.zk, zk_root)) == sorted(nodes), "a znode FLEET_ZNODES does not list"
        for path in nodes:
            assert any(a.id.scheme == "digest" and a.id.id == reader_id and a.perms == Permissions.READ
                       for a in new.zk.get_acls(path)[0]), f"{path} not readable by the reader"

        fleet = read_fleet(url, credentials=as_reader, security=ZkSecurity)
        assert fleet is not None and fleet.members == ["new", "old"]
        assert fleet.dcs == {"new": None, "old": "dc1"} and fleet.owners == {2: "old"}
        assert fleet.weights == {"dc1": 1}
        assert read_home_rule(url, credentials=as_reader, security=ZkSecurity) == {"dc1": 1}
        view = KazooClient(hosts=ZOOKEEPER_HOSTS, auth_data=[("digest", reader)])
        view.start(timeout=10)
        try:
            assert [r["member"] for r in dcrec.read_outages(view, zk_root)] == ["old"]
        finally:
            view.stop()
            view.close()
    finally:
        for c in (new, old):
            if c is not None:
                c.stop()
        owner = KazooClient(hosts=ZOOKEEPER_HOSTS, auth_data=[("digest", app)])
        owner.start(timeout=10)
        try:
            owner.delete(zk_root, recursive=True)  # the fixture's client may not
        finally:
            owner.stop()
            owner.close()


def test_the_home_rule_set_without_the_readers_setting_is_readable_by_the_fleets_reader(zk_root):
    """``shards home --dc`` run where SCHEDULER_ZK_READERS is not set creates the rule
    with the fleet's ACL (its root's), so the reader its pollers name can read it."""
    from kazoo.security import make_digest_acl_credential

    from scheduler.fleet.view import read_home_rule, write_home_rule
    from scheduler.security import ZkSecurity

    app, reader = "app:app-password", "reader:reader-password"
    reader_id = make_digest_acl_credential("reader", "reader-password")
    url = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    member = coord(zk_root, "m", credentials=app, security=ZkSecurity(readers=(reader_id,)))
    try:
        write_home_rule(url, {"dc1": 2, "dc2": 1}, credentials=lambda: app, security=ZkSecurity)
        assert read_home_rule(url, credentials=lambda: reader, security=ZkSecurity) == {"dc1": 2, "dc2": 1}
    finally:
        member.stop()
        owner = KazooClient(hosts=ZOOKEEPER_HOSTS, auth_data=[("digest", app)])
        owner.start(timeout=10)
        try:
            owner.delete(zk_root, recursive=True)
        finally:
            owner.stop()
            owner.close()
