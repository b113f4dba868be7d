"""``fleetsim``: a fleet of 1,000 pollers and 16,384 shards, simulated with the project's
own assignment code (``plan.next_plan``, ``assign.rebalance``, ``plan.encode``) and the
fleet's tick loop (``fleet.Fleet.rebalance``: members read every ``tick_s``, a change
waits ``debounce_s``, the leader publishes, the others follow, locks are taken without
waiting and retried every tick). ZooKeeper is modelled with the latencies that
``bench.zkmodel`` measures on the real server here (sessions, reads, compare-and-set,
lock take and release, session expiry after kill -9).

Reported:
- ``moves``: shards moved per join and per leave, against the ideal S/N (goal <= 1.1x);
- ``compute_ms``: wall time of one member's ``next_plan`` after a change at N = 1,000,
  S = 16,384 (goal < 100 ms);
- ``zk_per_change``: ZooKeeper writes, watches fired and nodes read per join or leave;
- ``rolling_restart``: every member restarted once, one at a time (stable names, as
  ``--name`` or ``--processes`` give): total shard-seconds without an owner, and the
  longest a shard was unowned;
- ``zone_outage``: a third of the members killed at once: seconds until every shard has
  an owner again;
- ``cross_check``: the simulation of ``ops/bench``'s ``handover`` (3 pollers, 16 shards,
  a planned leave and a kill -9) and ``shards_moved`` (N = 4, S = 64) against the
  measured figures, when given.

ZooKeeper reads are counted as ``zkcoord`` makes them: at rest only each member's lease
renewal (one read per session timeout / 6); a membership change fires every member's
watch on the member list (one read each), a publish every member's watch on the plan
(its stat and its data), a released lock node its holder's watch.

Simplifications, stated: a member's tick does the fleet's work instantly except the
modelled ZooKeeper and claim latencies; members that nothing concerns are not stepped,
their lease reads are counted; sessions of members killed together expire together
(ZooKeeper expires them on its tick).

    .venv/bin/python -m bench.fleetsim [--members 1000] [--shards 16384] [--json]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench.common import machine, report
from scheduler.domain.assign import rebalance
from scheduler.domain.plan import Plan, encode, next_plan


@dataclass
class Model:
    """Seconds. The ZooKeeper figures default to a measured run of ``bench.zkmodel``."""

    tick_s: float = 0.5            # fleet.Fleet tick_s
    debounce_s: float = 1.0        # fleet.Fleet debounce_s
    session_s: float = 4.0         # the session timeout (zkmodel's; pollers default to 10 s)
    expiry_s: float = 4.5          # kill -9 until the session's nodes are gone (timeout 4 s)
    read_s: float = 0.0006
    write_s: float = 0.003
    acquire_s: float = 0.009       # coord.try_acquire of a free lock
    release_s: float = 0.0015
    claim_s: float = 0.01          # the checkpoint's owner_epoch LWT (Cassandra)
    stop_s: float = 0.2            # SIGTERM until a stopping poller has released its locks
    restart_s: float = 2.0         # process start until its member node exists
    first_read_s: float = 0.05     # a claim wakes the reader: its first read of the shard

    @classmethod
    def from_zk(cls, zk: dict[str, Any]) -> Model:
        return cls(expiry_s=zk["expiry_s"], read_s=zk["read_s"], write_s=zk["write_s"],
                   acquire_s=zk["acquire_s"], release_s=zk["release_s"])


@dataclass
class Member:
    name: str
    phase: float
    alive: bool = False
    seen: tuple[str, ...] = ()
    since: float = 0.0
    stale_since: float | None = None
    held: set[int] = field(default_factory=set)
    active: bool = False


class Sim:
    def __init__(self, n: int, s: int, model: Model, seed: int = 1) -> None:
        self.m, self.shards, self.rng = model, list(range(s)), random.Random(seed)
        names = [f"poller-{i:04d}" for i in range(n)]
        self.members: dict[str, Member] = {x: Member(x, self.rng.random() * model.tick_s) for x in names}
        self.zk_members: tuple[str, ...] = tuple(sorted(names))
        self.plan = Plan(self.zk_members, rebalance({}, self.shards, names))
        self.version = 0
        self.plan_bytes = len(encode(self.plan))
        self.by_owner = owner_index(self.plan)
        self.lock: dict[int, str | None] = dict(self.plan.owners)
        self.lock_free_at: dict[int, float] = {}
        self.down_since: dict[int, float] = {}
        for x in names:
            mem = self.members[x]
            mem.alive, mem.seen, mem.since = True, self.zk_members, -10.0
            mem.held = set(self.by_owner.get(x, set()))
        self.t = 0.0
        self.events: list[tuple[float, int, str, str]] = []
        self.seq = 0
        self.last_change = -10.0
        self.gaps: list[float] = []
        self.ops = {"reads": 0, "writes": 0, "watches": 0, "bytes_read": 0}
        self.moves = 0
        self.compute_s: list[float] = []
        self.publishes = 0

    # --- the event loop -------------------------------------------------------------

    def at(self, t: float, kind: str, who: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, who))

    def next_tick(self, mem: Member, after: float) -> float:
        k = max(0, int((after - mem.phase) // self.m.tick_s) + 1)
        return mem.phase + k * self.m.tick_s

    def activate(self, name: str) -> None:
        mem = self.members[name]
        if not mem.active and mem.alive:
            mem.active = True
            if mem.seen != self.zk_members:  # it observed the last change at its first tick after it
                mem.seen, mem.since = self.zk_members, self.next_tick(mem, self.last_change)
            self.at(self.next_tick(mem, self.t), "tick", name)

    def run_until_quiet(self, limit_s: float = 600.0) -> float:
        end = self.t + limit_s
        while self.events and self.events[0][0] <= end:
            t, _, kind, who = heapq.heappop(self.events)
            self.t = t
            getattr(self, f"on_{kind}")(who)
        return self.t

    # --- ZooKeeper-side events --------------------------------------------------------

    def membership(self, names: tuple[str, ...]) -> None:
        self.zk_members, self.last_change = names, self.t
        self.ops["writes"] += 1
        # Every member's watch on the list fires; each reads the list once.
        self.ops["watches"] += len(names)
        self.ops["reads"] += len(names)
        if names:
            self.activate(names[0])  # the leader: it publishes

    def on_node_del(self, who: str) -> None:
        for shard, holder in self.lock.items():
            if holder == who:
                self.lock[shard] = None
                self.lock_free_at[shard] = self.t
        self.membership(tuple(x for x in self.zk_members if x != who))

    def on_node_add(self, who: str) -> None:
        mem = self.members[who]
        mem.alive, mem.seen, mem.held, mem.active = True, (), set(), False
        self.membership(tuple(sorted({*self.zk_members, who})))
        self.activate(who)

    def on_kill(self, who: str) -> None:
        mem = self.members[who]
        mem.alive = False
        for shard in mem.held:
            self.down_since.setdefault(shard, self.t)
        mem.held = set()
        self.at(self.t + self.m.expiry_s, "node_del", who)

    def on_stop(self, who: str) -> None:
        # A stopping poller fires what is in flight and due until it has released its
        # shards (``stop_s``): they are without an owner from then on.
        mem = self.members[who]
        mem.alive = False
        for shard in mem.held:
            self.down_since.setdefault(shard, self.t + self.m.stop_s)
        mem.held = set()
        self.at(self.t + self.m.stop_s, "release_all", who)

    def on_release_all(self, who: str) -> None:
        for shard, holder in self.lock.items():
            if holder == who:
                self.lock[shard] = None
                self.lock_free_at[shard] = self.t
                self.ops["writes"] += 1
        self.membership(tuple(x for x in self.zk_members if x != who))

    # --- a member's tick (fleet.Fleet.rebalance, modelled) ----------------------------

    def on_tick(self, who: str) -> None:
        mem, m = self.members[who], self.m
        if not mem.alive:
            mem.active = False
            return
        members = self.zk_members
        again, waiting = True, False
        if members != mem.seen:
            mem.seen, mem.since = members, self.t
        elif self.t - mem.since >= m.debounce_s:
            again = self.act(mem, members)
            waiting = self.plan.members != members
        if again:
            # fleet.Fleet looks again after tick_s / 5 while it waits for the leader's plan.
            self.at(self.t + (m.tick_s / 5 if waiting else m.tick_s), "tick", who)
        else:
            mem.active = False

    def act(self, mem: Member, members: tuple[str, ...]) -> bool:
        """One decision tick; True while the member still has work (keeps ticking)."""
        m = self.m
        # The shard set is fixed here, so a plan for these members is fresh.
        fresh = self.plan.members == members
        mem.stale_since = None if fresh else (mem.stale_since if mem.stale_since is not None else self.t)
        if not fresh:
            t0 = time.perf_counter()
            new = next_plan(self.plan, members, self.shards, mem.name, self.t - (mem.stale_since or self.t))
            if new is not None:
                self.compute_s.append(time.perf_counter() - t0)
                self.publish(new)
        if self.plan.members != members:
            return True
        mine = self.by_owner.get(mem.name, set())
        now = self.t
        for shard in sorted(mem.held - mine):
            mem.held.discard(shard)
            self.down_since.setdefault(shard, now)
            now += m.release_s
            self.lock[shard] = None
            self.lock_free_at[shard] = now
            self.ops["writes"] += 1
            self.ops["watches"] += 1  # ours on the lock node, which marks it; no read follows
            self.moves += 1
        for shard in sorted(mine - mem.held):
            if self.lock.get(shard) is None and self.lock_free_at.get(shard, 0.0) <= now:
                now += m.acquire_s + m.claim_s
                self.lock[shard] = mem.name
                mem.held.add(shard)
                self.ops["writes"] += 1
                self.ops["reads"] += 1
                down = self.down_since.pop(shard, None)
                if down is not None:
                    self.gaps.append(now - down)
            else:  # kazoo's non-blocking acquire: create, list, delete
                self.ops["writes"] += 2
                self.ops["reads"] += 1
        return mem.held != mine

    def publish(self, new: Plan) -> None:
        old = self.plan
        self.plan, self.version = new, self.version + 1
        self.plan_bytes = len(encode(new))
        self.by_owner = owner_index(new)
        self.publishes += 1
        self.ops["writes"] += 1
        # Every member's watch on the plan fires; each reads its stat and its data once.
        self.ops["watches"] += len(self.zk_members)
        self.ops["reads"] += 2 * len(self.zk_members)
        self.ops["bytes_read"] += len(self.zk_members) * self.plan_bytes
        for shard, owner in new.owners.items():
            if old.owners.get(shard) != owner:
                self.activate(owner)
                prev = old.owners.get(shard)
                if prev is not None and prev in self.members and self.members[prev].alive:
                    self.activate(prev)

    # --- scenarios --------------------------------------------------------------------

    def settle(self) -> float:
        """Run until nothing is scheduled; returns when the last shard was claimed."""
        self.run_until_quiet()
        return self.t

    def lease_reads(self, seconds: float) -> int:
        """Reads at rest: each member renews its lease every session timeout / 6."""
        return int(6 * len(self.zk_members) * seconds / self.m.session_s)


def owner_index(plan: Plan) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for shard, owner in plan.owners.items():
        out.setdefault(owner, set()).add(shard)
    return out


def ideal_moves(s: int, n: int) -> float:
    return s / n


def change(n: int, s: int, model: Model, kind: str) -> dict[str, Any]:
    """One join or one leave (planned) on a settled fleet."""
    sim = Sim(n, s, model)
    before = dict(sim.plan.owners)
    ops0 = dict(sim.ops)
    sim.t = 10.0
    if kind == "join":
        sim.members["joiner"] = Member("joiner", sim.rng.random() * model.tick_s)
        sim.at(sim.t, "node_add", "joiner")
    else:
        sim.at(sim.t, "stop", sim.zk_members[len(sim.zk_members) // 2])
    sim.settle()
    moved = sum(1 for shard, owner in sim.plan.owners.items() if before.get(shard) != owner)
    duration = sim.t - 10.0
    ops = {k: sim.ops[k] - ops0[k] for k in ops0}
    ops["reads"] += sim.lease_reads(duration)
    ideal = ideal_moves(s, n + 1 if kind == "join" else n)
    return {"moved": moved, "ideal": round(ideal, 1), "ratio": round(moved / ideal, 3),
            "compute_ms": round(max(sim.compute_s) * 1000, 2), "seconds_to_settle": round(duration, 2),
            "zk": ops, "plan_bytes": sim.plan_bytes, "publishes": sim.publishes}


def rolling_restart(n: int, s: int, model: Model, limit: int | None = None) -> dict[str, Any]:
    """Each member in turn: SIGTERM, restart under the same name after ``restart_s``,
    the next one once the fleet has settled."""
    sim = Sim(n, s, model)
    sim.t = 10.0
    names = list(sim.zk_members)[:limit] if limit else list(sim.zk_members)
    for name in names:
        sim.at(sim.t, "stop", name)
        sim.at(sim.t + model.stop_s + model.restart_s, "node_add", name)
        sim.settle()
        sim.t += model.tick_s
    return {"members_restarted": len(names), "shard_seconds_unowned": round(sum(sim.gaps), 1),
            "longest_unowned_s": round(max(sim.gaps, default=0.0), 2),
            "moves": sim.moves, "publishes": sim.publishes, "sim_seconds": round(sim.t - 10.0)}


def zone_outage(n: int, s: int, model: Model) -> dict[str, Any]:
    sim = Sim(n, s, model)
    sim.t = 10.0
    victims = [x for i, x in enumerate(sim.zk_members) if i % 3 == 0]
    for v in victims:
        sim.at(sim.t, "kill", v)
    sim.settle()
    unowned = [sh for sh, holder in sim.lock.items() if holder is None]
    return {"killed": len(victims), "all_owned_after_s": round(max(sim.gaps, default=0.0), 2),
            "shards_moved": len(sim.gaps), "unowned_at_end": len(unowned)}


def cross_check(model: Model, measured: dict[str, Any] | None) -> dict[str, Any]:
    """The bench's ``handover`` (3 pollers, 16 shards) and ``shards_moved`` (N = 4, S = 64).
    A pause depends on where the members' ticks fall: the mean over 20 draws of them."""
    def pause(kind: str, seed: int) -> float:
        sim = Sim(3, 16, model, seed)
        sim.t = 10.0
        sim.at(sim.t, kind, sim.zk_members[0 if kind == "stop" else 1])
        sim.settle()
        # A job due just after the event fires at the new owner's first read after its claim.
        return max(sim.gaps) + model.first_read_s

    out: dict[str, Any] = {
        "planned_leave_pause_s": round(statistics.mean(pause("stop", i) for i in range(20)), 2),
        "kill_9_pause_s": round(statistics.mean(pause("kill", i) for i in range(20)), 2),
        "moves_n4_join": change(4, 64, model, "join")["moved"],
        "moves_n4_leave": change(4, 64, model, "leave")["moved"]}
    if measured:
        errors = {}
        for key, real in (("planned_leave_pause_s", measured.get("planned_leave_pause_s")),
                          ("kill_9_pause_s", measured.get("kill_9_pause_s")),
                          ("moves_n4_join", measured.get("moves_n4_join")),
                          ("moves_n4_leave", measured.get("moves_n4_leave"))):
            if real:
                errors[key] = round(abs(out[key] - real) / real, 3)
        out["measured"] = measured
        out["relative_error"] = errors
        out["within_20pct"] = all(e <= 0.2 for e in errors.values())
    return out


def fleetsim(members: int = 1000, shards: int = 16384, zk: dict[str, Any] | None = None,
             measured: dict[str, Any] | None = None, restarts: int | None = None) -> dict[str, Any]:
    model = Model.from_zk(zk) if zk else Model()
    join, leave = change(members, shards, model, "join"), change(members, shards, model, "leave")
    rolling = rolling_restart(members, shards, model, restarts)
    outage = zone_outage(members, shards, model)
    worst_move = max(join["ratio"], leave["ratio"])
    compute = max(join["compute_ms"], leave["compute_ms"])
    return {"benchmark": "fleetsim", "members": members, "shards": shards, "model": model.__dict__,
            "join": join, "leave": leave, "moves_ratio_max": worst_move, "compute_ms_max": compute,
            "rest_reads_per_s": round(6 * members / model.session_s),
            "rolling_restart": rolling, "zone_outage": outage,
            "cross_check": cross_check(model, measured),
            "goal": "moves <= 1.1x S/N, compute < 100 ms",
            "met": worst_move <= 1.1 and compute < 100}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=16384)
    ap.add_argument("--restarts", type=int, default=None, help="restart only this many (default all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**fleetsim(args.members, args.shards, restarts=args.restarts), **machine()}, args.json)


if __name__ == "__main__":
    main()
