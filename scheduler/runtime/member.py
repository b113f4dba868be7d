"""A poller in a fleet: keeps the shards the fleet's published plan gives it, and only
those.

Loop (every ``tick_s``): read the members; once they have been stable for ``debounce_s``,
read the published plan (``plan.py``). When it is for other members or another live
shard set (``assign.live_shards``: the latest layout's shards plus older layouts' shards
not yet drained past their cutover), the leader (first member by name; any member after
``LEADER_GRACE_S``) publishes the next one, ``assign.rebalance`` of the current: exactly
balanced, moving only the share of who joined or left. While no plan for the current
members is published, a member keeps what it holds and takes nothing. Shards no
longer ours are handed over (in-flight rows finish, checkpoint, lock released); shards
newly ours are taken as soon as their lock is free, with the lock node's czxid as the
fencing token. A shard the poller lost (a fenced write was refused) or whose lock went
with the session is dropped at once.

A poller that cannot reach the store (its ZooKeeper session healthy) would hold its
shards while none of their jobs fire. After ``store_release_s`` (30 s) of failing store
calls with no success in between it *steps out*: it drops its shards without writing
(it cannot), releases their locks and deletes its member node, so the others take them.
While stepped out it takes nothing; it probes the store every tick and rejoins the
membership at the first answer.

A lost session (expired while the process was frozen or cut off) ends the member: it
drops every shard and sets ``ended``; ``scheduler run`` then exits with status 3 so its
supervisor starts a fresh member. Crash-only recovery keeps one path for "my ownership
may be stale": start over.
"""

from __future__ import annotations

import logging
import threading
import time

from ..domain.assign import live_shards
from ..domain.plan import next_plan
from ..errors import OwnershipLost, SchedulerError
from ..fleet.coord import Coordinator
from ..observe.faults import FaultLog
from ..poller import Poller, ShardState

log = logging.getLogger("scheduler.fleet")


# A member back from a store outage waits this long before it takes shards, so that
# every other poller's driver (reconnecting every second) and recorder (retrying every
# 0.5 s) have written the outcomes of jobs they fired while the store was away: a new
# owner then skips those jobs instead of firing them again.
REJOIN_SETTLE_S = 3.0


class Fleet:
    def __init__(self, poller: Poller, coordinator: Coordinator, *, tick_s: float = 0.5,
                 debounce_s: float = 1.0, live_refresh_s: float = 5.0,
                 store_release_s: float = 30.0) -> None:
        self.poller = poller
        self.store_release_s = store_release_s
        self.stepped_out = False
        self._fault = FaultLog(log, "rebalancing", action="rebalance")
        self.coord = coordinator
        self.tick_s = tick_s
        self.debounce_s = debounce_s
        self.live_refresh_s = live_refresh_s
        self._live: set[int] = set()
        self._live_at = -1e9
        self._seen_members: list[str] = []
        self._members_since = 0.0
        self._settle_until = 0.0
        self._stale_since: float | None = None
        self._awaiting_plan = False
        # (plan version, members, live set generation) of the last fresh plan, and our shards in it
        self._live_gen = 0
        self._fresh: tuple[tuple[int, tuple[str, ...], int] | None, set[int]] = (None, set())
        self._stop = threading.Event()
        self.ended = threading.Event()
        self._thread: threading.Thread | None = None
        self.moves = 0

    def start(self) -> None:
        self.coord.start(self.poller.name)
        self.poller.lease = self.coord.lease_valid
        self.poller.start()
        self._thread = self.poller.core.start_thread("fleet", self._loop)

    def stop(self) -> None:
        """Planned leave: stop rebalancing, stop the poller (checkpoints saved, shards
        released in the store), then release the locks and leave the membership."""
        self._stop.set()
        if self._thread is not None:
            # A tick blocked on a store call gives up at the request timeout (10 s).
            self._thread.join(timeout=12)
        self.poller.stop()
        self.coord.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.rebalance()
                self._fault.ok()
            except SchedulerError as exc:
                self._fault.failed(exc)  # once, then a summary every 30 s
            # Waiting for the leader's plan: look again soon, so that a hand-over does
            # not wait a whole extra tick for it (only during a change: one exists()).
            self._stop.wait(self.tick_s / 5 if self._awaiting_plan else self.tick_s)

    def _live_shards(self) -> set[int]:
        now = time.monotonic()
        if now - self._live_at >= self.live_refresh_s or not self._live:
            store = self.poller.store
            drained = {c.shard: c.drained for c in store.checkpoints()}
            live = live_shards(store.layouts(), drained, self.poller.meta.bucket_width_s)
            if live != self._live:
                self._live, self._live_gen = live, self._live_gen + 1
            self._live_at = now
        return self._live

    def rebalance(self) -> None:
        poller, coord = self.poller, self.coord
        # Set again below only when this tick reached the plan and found none; a tick
        # that returns earlier (a membership change, the store gate) waits a whole tick.
        self._awaiting_plan = False
        if coord.session_lost():
            for shard in poller.shards:
                poller.lose(shard, "the ZooKeeper session expired")
            if not self.ended.is_set():
                log.error("ZooKeeper session lost: leaving the fleet; restart this poller",
                          extra={"action": "member_ended"})
                self.ended.set()
            self._stop.set()
            return
        if self._store_gate():
            return
        # Shards whose lock went with the session, or that the poller lost to fencing.
        held = coord.held()
        for shard in poller.shards - held:
            poller.lose(shard, "its ZooKeeper lock is gone")
        for shard in held - poller.shards:
            if poller.state(shard) is ShardState.LOST:
                coord.release(shard)
        members = coord.members()
        if members != self._seen_members:
            self._seen_members = members
            self._members_since = max(time.monotonic(), self._settle_until)
            return
        if self.poller.name not in members or time.monotonic() - self._members_since < self.debounce_s:
            return
        mine = self._mine(members)
        self._awaiting_plan = mine is None
        if mine is None:
            return  # no plan for these members yet: keep what we hold, take nothing
        owned = poller.shards
        for shard in sorted(owned - mine):
            poller.release(shard)
            coord.release(shard)
            self._moved("released", shard)
        if not coord.lease_valid():
            return
        for shard in sorted(mine - poller.shards):
            token = coord.try_acquire(shard)
            if token is None:
                continue  # the previous owner is still handing it over
            try:
                poller.claim(shard, token)
                self._moved("acquired", shard)
            except OwnershipLost as exc:
                coord.release(shard)
                log.warning("could not claim shard %d: %s", shard, exc, extra={"action": "claim_refused"})

    def _mine(self, members: list[str]) -> set[int] | None:
        """Our shards in the published plan for ``members``, after publishing a new
        plan when it is our turn (``plan.next_plan``); None while no plan for these
        members is published."""
        coord, live = self.coord, self._live_shards()
        current, version = coord.read_plan()
        key = (version, tuple(members), self._live_gen)
        if key == self._fresh[0]:
            return self._fresh[1]  # nothing changed: skip the O(S) comparisons
        now = time.monotonic()
        fresh = current is not None and current.members == tuple(members) and set(current.owners) == live
        if fresh and current is not None:
            self._stale_since = None
            self._fresh = (key, current.shards_of(self.poller.name))
            return self._fresh[1]
        if self._stale_since is None:
            self._stale_since = now
        new = next_plan(current, members, live, self.poller.name, now - (self._stale_since or now))
        if new is not None and coord.publish_plan(new, version):
            moved = sum(1 for s, m in new.owners.items() if current is None or current.owners.get(s) != m)
            log.info("published the shard assignment: %d members, %d shards, %d moved",
                     len(new.members), len(new.owners), moved,
                     extra={"action": "plan_published", "members": len(new.members), "moved": moved})
            current, self._stale_since = new, None
        if current is None or current.members != tuple(members):
            return None
        return current.shards_of(self.poller.name)

    def _store_gate(self) -> bool:
        """Step out of the fleet while the store stays unreachable, back in when it
        answers. True while stepped out (the rest of the tick is skipped)."""
        poller, coord = self.poller, self.coord
        if self.stepped_out:
            try:
                poller.store.server_now_ms()
            except SchedulerError:
                return True
            poller.store_fault.ok()
            # Outcomes of jobs fired while the store was away are written before the
            # shards can come back to anyone: a new owner then skips them.
            while poller.record_outcomes() > 0:
                pass
            coord.join()
            self.stepped_out = False
            poller.metrics.stepped_out.set(0)
            self._settle_until = time.monotonic() + REJOIN_SETTLE_S
            log.warning("the store answers again: rejoined the fleet",
                        extra={"action": "member_rejoined"})
            return False
        failing = poller.store_fault.failing_for()
        if self.store_release_s <= 0 or failing < self.store_release_s:
            return False
        shards = sorted(poller.shards | coord.held())
        for shard in shards:
            poller.lose(shard, "the store is unreachable", fenced=False)
            coord.release(shard)
        coord.leave()
        self.stepped_out = True
        poller.metrics.stepped_out.set(1)
        log.error("the store has failed for %.0f s: released %d shards and left the fleet "
                  "until it answers", failing, len(shards),
                  extra={"action": "member_stepped_out", "shards": len(shards)})
        return True

    def _moved(self, what: str, shard: int) -> None:
        self.moves += 1
        self.poller.metrics.rebalances.inc()
        log.info("%s shard %d", what, shard, extra={"action": f"shard_{what}", "shard": shard})
