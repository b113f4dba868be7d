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

With a home-DC rule (``scheduler shards home``; docs/two-data-centres.md) the plan
gives each shard to members of its home DC; when that DC has had no member for
``failover_s`` the plan gives its shards to the other DCs' members (a *take-over*: the
claim is fenced at SERIAL where it can be, and recorded in ZooKeeper as an outage
window), and after ``failover_s`` with a member there again they return to it through
the ordinary planned hand-over.

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
from ..domain.home import home_of
from ..domain.keys import bucket_of_ms
from ..domain.links import PeerLinks
from ..domain.plan import Plan, next_plan
from ..errors import OwnershipLost, SchedulerError, StoreUnavailable, WriteTimeout
from ..fleet.coord import Coordinator
from ..observe.faults import FaultLog
from ..poller import Poller, ShardState
from .catchup import CatchUps
from .homedc import DcClocks, Rule

log = logging.getLogger("scheduler.fleet")


# A member back from a store outage waits this long before it takes shards, so that
# every other poller's driver (reconnecting every second) and recorder (retrying every
# 0.5 s) have written the outcomes of jobs they fired while the store was away: a new
# owner then skips those jobs instead of firing them again.
REJOIN_SETTLE_S = 3.0


class Fleet:
    def __init__(self, poller: Poller, coordinator: Coordinator, *, tick_s: float = 0.5,
                 debounce_s: float = 1.0, live_refresh_s: float = 5.0,
                 store_release_s: float = 30.0, failover_s: float = 30.0) -> None:
        self.poller = poller
        self.dc = coordinator.dc
        self._clocks = DcClocks(failover_s, failover_s)
        self._plan: Plan | None = None  # the plan our shards come from
        self._foreign_homes: set[str] = set()  # home DCs of the foreign shards last counted
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
        # (plan version, members, live set generation, rule) of the last fresh plan, and
        # our shards in it
        self._live_gen = 0
        self._fresh: tuple[tuple[int, tuple[str, ...], int, Rule | None] | None, set[int]] = (None, set())
        self._stop = threading.Event()
        self.ended = threading.Event()
        self._thread: threading.Thread | None = None
        self.moves = 0
        self.catch_ups = CatchUps(poller, coordinator)
        self._links = PeerLinks()
        self._to_close: dict[int, int] = {}  # home shards claimed back: drained bucket

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
        self.catch_ups.stop()
        self.poller.stop()
        self.coord.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_links()
                self.rebalance()
                self._close_outages()  # those a claim could not close
                self._fault.ok()
            except SchedulerError as exc:
                self._fault.failed(exc)  # once, then a summary every 30 s
            # Waiting for the leader's plan: look again soon, so that a hand-over does
            # not wait a whole extra tick for it (only during a change: one exists()).
            self._stop.wait(self.tick_s / 5 if self._awaiting_plan else self.tick_s)

    def _watch_links(self) -> None:
        """When every node of the other DCs is back after some were down (a cut, or
        their stop), catch up our shards over the window (``domain/links.py``)."""
        window = self._links.observe(self.poller.store.peers_down(), self.poller.clock.now_ms())
        if window is not None and self.poller.shards:
            first = bucket_of_ms(window[0], self.poller.meta.bucket_width_s)
            log.warning("every node of the other DCs is back: catching up %d shards over the "
                        "window since %d", len(self.poller.shards), first,
                        extra={"action": "peers_back", "shards": len(self.poller.shards)})
            self.catch_ups.add([{"shard": s, "from_bucket": first, "to_bucket": first}
                                for s in sorted(self.poller.shards)])

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
                self._claim(shard, token)
                self._moved("acquired", shard)
            except OwnershipLost as exc:
                coord.release(shard)
                log.warning("could not claim shard %d: %s", shard, exc, extra={"action": "claim_refused"})
        self._count_foreign()

    def _claim(self, shard: int, token: int) -> None:
        """Claim ``shard``. Under a home-DC rule the claim may cross DCs (a take-over,
        or a fail-back after one): fenced at SERIAL, among every DC's copies; when that
        cannot be had (the other DC's copies are gone with it) at the store's own level,
        the ZooKeeper lock then being the fence (docs/two-data-centres.md). A take-over
        is recorded as an outage window; a home claim closes the shard's open records and
        hands their windows to the catch-up (``catchup.py``)."""
        weights = self._plan.weights if self._plan is not None else {}
        if not weights:
            self.poller.claim(shard, token, ceiling=self.coord.token_ceiling)
            return
        try:
            drained = self.poller.claim(shard, token, global_fence=True, ceiling=self.coord.token_ceiling)
        except (StoreUnavailable, WriteTimeout) as exc:
            log.warning("claiming shard %d at SERIAL failed (%s): claiming it at the DC's own level",
                        shard, exc, extra={"action": "claim_local_fence", "shard": shard})
            drained = self.poller.claim(shard, token, ceiling=self.coord.token_ceiling)
        home = home_of(shard, weights)
        now_ms = self.poller.clock.now_ms()
        try:
            if home != self.dc:
                self.coord.record_outage({"shard": shard, "home_dc": home, "dc": self.dc,
                                          "member": self.poller.name, "at_ms": now_ms,
                                          "from_bucket": drained})
                log.warning("took over shard %d of DC %s from bucket %d", shard, home, drained,
                            extra={"action": "shard_taken_over", "shard": shard, "home_dc": home})
            else:
                self._to_close[shard] = drained
                self._close_outages()
        except StoreUnavailable as exc:
            # The shard is ours and fires; the window's record is what a catch-up needs,
            # so say loudly that this one is missing.
            log.error("%s", exc, extra={"action": "outage_record_failed", "shard": shard})

    def _close_outages(self) -> None:
        """Close the take-over records of the home shards claimed back and hand their
        windows to the catch-up; a shard whose records could not be read or written
        (ZooKeeper away) is tried again every tick while it is ours. Raises
        ``StoreUnavailable`` for the first that fails."""
        for shard, drained in sorted(self._to_close.items()):
            if shard not in self.poller.shards:
                del self._to_close[shard]
                continue
            windows = self.coord.close_outages(shard, self.poller.clock.now_ms(), drained)
            del self._to_close[shard]
            if windows:
                log.info("shard %d is back in its home DC at bucket %d", shard, drained,
                         extra={"action": "shard_failed_back", "shard": shard})
                self.catch_ups.add(windows)

    def _count_foreign(self) -> None:
        """``scheduler_fleet_foreign_shards``: our shards whose home is another DC."""
        weights = self._plan.weights if self._plan is not None else {}
        counts = {dc: 0 for dc in weights if dc != self.dc}
        for shard in self.poller.shards:
            home = home_of(shard, weights) if weights else None
            if home is not None and home != self.dc:
                counts[home] = counts.get(home, 0) + 1
        for home in self._foreign_homes - set(counts):  # the rule changed: no stale series
            counts[home] = 0
        self._foreign_homes = {h for h, n in counts.items() if n}
        for home, n in counts.items():
            self.poller.metrics.foreign_shards.labels(dc=self.dc or "", home_dc=home).set(n)

    def _mine(self, members: list[str]) -> set[int] | None:
        """Our shards in the published plan for ``members``, after publishing a new
        plan when it is our turn (``plan.next_plan``); None while no plan for these
        members is published."""
        coord, live = self.coord, self._live_shards()
        current, version = coord.read_plan()
        rule = self._rule(members, current)
        key = (version, tuple(members), self._live_gen, rule)
        if key == self._fresh[0]:
            return self._fresh[1]  # nothing changed: skip the O(S) comparisons
        now = time.monotonic()
        fresh = (current is not None and current.members == tuple(members) and current.covers() == live
                 and _follows(current, rule))
        if fresh and current is not None:
            self._stale_since = None
            self._plan = current
            self._fresh = (key, current.shards_of(self.poller.name))
            return self._fresh[1]
        if self._stale_since is None:
            self._stale_since = now
        if rule is None:
            new = next_plan(current, members, live, self.poller.name, now - (self._stale_since or now))
        else:
            new = next_plan(current, members, live, self.poller.name, now - (self._stale_since or now),
                            dcs=dict(zip(sorted(members), rule.dcs, strict=False)),
                            weights=dict(rule.weights), away=rule.away)
        if new is not None and coord.publish_plan(new, version):
            moved = sum(1 for s, m in new.owners.items() if current is None or current.owners.get(s) != m)
            log.info("published the shard assignment: %d members, %d shards, %d moved",
                     len(new.members), len(new.owners), moved,
                     extra={"action": "plan_published", "members": len(new.members), "moved": moved})
            current, self._stale_since = new, None
        if current is None or current.members != tuple(members):
            return None
        self._plan = current
        return current.shards_of(self.poller.name)

    def _rule(self, members: list[str], current: Plan | None) -> Rule | None:
        """The home-DC rule as this member sees it now (None: no rule set)."""
        weights = self.coord.read_home()
        if not weights:
            return None
        dcs = self.coord.member_dcs()
        if sorted(dcs) != sorted(members):  # changed since: the next tick sees it settled
            dcs = {m: dcs.get(m) for m in members}
        return self._clocks.rule(weights, dcs, current.away if current is not None else ())

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


def _follows(plan: Plan, rule: Rule | None) -> bool:
    """True when ``plan`` was made under ``rule`` (both None: no rule)."""
    if rule is None:
        return not plan.weights
    return (tuple(sorted(plan.weights.items())) == rule.weights and plan.dcs == rule.dcs
            and plan.away == rule.away)
