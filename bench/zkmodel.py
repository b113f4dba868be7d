"""The ZooKeeper latency model for ``bench.fleetsim``, measured on the real ZooKeeper
that ``ops/zookeeper`` runs, at a scale this machine holds: ``sessions`` kazoo sessions
(default 100), each a fleet member node, and ``locks`` shard locks (default 16,384)
taken through the project's own ``ZooKeeperCoordinator``.

Measured (medians unless named):
- ``read_s``: ``exists`` of a node; ``members_read_s``: ``get_children`` of the members
  (one per session); ``plan_read_s``: ``get`` of a published plan of ``locks`` shards.
- ``write_s``: a ``set`` of the plan (compare-and-set); ``acquire_s`` and
  ``release_s``: ``try_acquire`` / ``release`` of a free shard lock (a sample of 256
  shards; the other lock nodes are created pipelined, so the folder holds them all).
- ``locks_list_s``: ``get_children`` of the locks folder with every lock taken (what
  ``read_fleet`` does for ``status`` and the exporter).
- ``expiry_s``: from a member process's kill -9 until its ephemeral node is gone, with
  a 4 s session timeout (ZooKeeper expires sessions on its tick, so this exceeds 4 s).
- ``reads_per_s``: ``get_children`` of the members from all sessions at once, the
  server's read throughput (a membership change makes every member read the list once).

    .venv/bin/python -m bench.zkmodel [--zk 127.0.0.1:2181] [--sessions 100] [--locks 16384] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.common import machine, report
from scheduler.domain.assign import rebalance
from scheduler.domain.plan import Plan, encode
from scheduler.fleet.coord import ZooKeeperCoordinator

SESSION_TIMEOUT_S = 4.0


def _median_s(fn: Any, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _expiry_s(zk_hosts: str, root: str) -> float:
    """kill -9 a process holding a member node; seconds until the node is gone."""
    from kazoo.client import KazooClient

    code = ("import sys,time; from kazoo.client import KazooClient\n"
            f"zk=KazooClient(hosts={zk_hosts!r}, timeout={SESSION_TIMEOUT_S}); zk.start()\n"
            f"zk.create({root + '/members/victim'!r}, ephemeral=True, makepath=True)\n"
            "print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    watcher = KazooClient(hosts=zk_hosts)
    watcher.start()
    try:
        t0 = time.monotonic()
        proc.kill()
        proc.wait()
        while watcher.exists(f"{root}/members/victim") and time.monotonic() - t0 < 60:
            time.sleep(0.02)
        return time.monotonic() - t0
    finally:
        watcher.stop()
        watcher.close()


def zkmodel(zk_hosts: str, sessions: int = 100, locks: int = 16384) -> dict[str, Any]:
    root = f"/bench-zkmodel-{uuid.uuid4().hex[:8]}"
    coords: list[ZooKeeperCoordinator] = []
    try:
        def member(i: int) -> None:
            c = ZooKeeperCoordinator(zk_hosts, root, session_timeout_s=SESSION_TIMEOUT_S)
            c.start(f"member-{i:04d}")
            coords.append(c)  # list.append is atomic: the finally below stops every one started
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(member, range(sessions)))
        coords.sort(key=lambda c: c.member_id)
        first = coords[0]
        zk = first.zk
        # The raw read, not coord.members(): that answers from its cache until a watch fires.
        members_read = _median_s(lambda: zk.get_children(f"{root}/members"), 200)
        read = _median_s(lambda: zk.exists(f"{root}/members"), 200)
        names = tuple(sorted(f"member-{i:04d}" for i in range(sessions)))
        plan = Plan(names, rebalance({}, range(locks), names))
        assert first.publish_plan(plan, -1)
        writes = []
        for version in range(50):
            t0 = time.perf_counter()
            assert first.publish_plan(plan, version)
            writes.append(time.perf_counter() - t0)
        plan_read = _median_s(lambda: zk.get(f"{root}/assignment"), 50)
        # try_acquire timed on a sample of shards (each through its planned owner);
        # the other lock nodes are created pipelined, so the folder holds ``locks``.
        by_member = {c.member_id: c for c in coords}
        sample = list(plan.owners.items())[:: max(1, locks // 256)]
        acquire: list[float] = []
        for shard, owner in sample:
            t0 = time.perf_counter()
            assert by_member[owner].try_acquire(shard) is not None
            acquire.append(time.perf_counter() - t0)
        taken = {shard for shard, _ in sample}
        t_all = time.perf_counter()
        rest = [shard for shard in plan.owners if shard not in taken]
        for p in [zk.create_async(f"{root}/locks/{shard}", b"") for shard in rest]:
            p.get()
        for p in [zk.create_async(f"{root}/locks/{shard}/x__lock__", b"member", ephemeral=True,
                                  sequence=True) for shard in rest]:
            p.get()
        take_all_s = (time.perf_counter() - t_all) + statistics.median(acquire) * len(taken)
        locks_list = _median_s(lambda: zk.get_children(f"{root}/locks"), 20)
        release = []
        for c in coords[:4]:
            for shard in sorted(c.held())[:5]:
                t0 = time.perf_counter()
                c.release(shard)
                release.append(time.perf_counter() - t0)
        # The server's read throughput: every session reads the members at once, for 3 s
        # (what a membership change makes every member do once).
        count = [0]
        stop_at = time.monotonic() + 3.0

        def poll(c: ZooKeeperCoordinator) -> None:
            n = 0
            while time.monotonic() < stop_at:
                c.zk.get_children(f"{root}/members")
                n += 1
            count[0] += n
        with ThreadPoolExecutor(min(sessions, 32)) as pool:
            list(pool.map(poll, coords[:32]))
        reads_per_s = count[0] / 3.0
        expiry = _expiry_s(zk_hosts, root)
        return {"benchmark": "zkmodel", "sessions": sessions, "locks": locks,
                "session_timeout_s": SESSION_TIMEOUT_S,
                "read_s": round(read, 6), "members_read_s": round(members_read, 6),
                "plan_read_s": round(plan_read, 6), "plan_bytes": len(encode(plan)),
                "write_s": round(statistics.median(writes), 6),
                "acquire_s": round(statistics.median(acquire), 6),
                "release_s": round(statistics.median(release), 6),
                "take_all_locks_s": round(take_all_s, 2),
                "locks_list_s": round(locks_list, 6), "expiry_s": round(expiry, 2),
                "reads_per_s": round(reads_per_s)}
    finally:
        for c in coords:
            c.stop()
        from kazoo.client import KazooClient

        zk2 = KazooClient(hosts=zk_hosts)
        zk2.start()
        zk2.delete(root, recursive=True)
        zk2.stop()
        zk2.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zk", default="127.0.0.1:2181")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--locks", type=int, default=16384)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**zkmodel(args.zk, args.sessions, args.locks), **machine()}, args.json)


if __name__ == "__main__":
    main()
