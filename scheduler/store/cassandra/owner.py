"""The Cassandra store's fleet-facing methods (a mixin of ``CassandraStore``, which
provides ``prepared``, ``session`` and ``_lwt``): fenced shard ownership (claim, save,
release: lightweight transactions on the checkpoint row's ``owner_epoch``), the
checkpoints view, and the pollers' nudge addresses (``notify_endpoints``)."""

from __future__ import annotations

from typing import Any

from ...domain.progress import Checkpoint
from ...errors import OwnershipLost
from ..base import ShardCheckpoint
from .conf import dt_ms, translate
from .run import CqlSteps, Run, dual


class CassandraOwnership:
    cfg: Any
    prepared: Any
    session: Any
    _lwt: Any

    def _serial_checkpoint(self, shard: int, serial: str | None = None) -> tuple[Any, ...] | None:
        from cassandra import ConsistencyLevel

        bound = self.prepared("select_checkpoint").bind((shard,))
        # The fencing level (LOCAL_SERIAL with a DC, else SERIAL): sees every transaction
        # of the pollers it fences against.
        bound.consistency_level = ConsistencyLevel.name_to_value[serial or self.cfg.serial_cl]
        try:
            return self.session.execute(bound).one()  # type: ignore[no-any-return]
        except Exception as exc:
            raise translate(exc, f"reading checkpoint of shard {shard}") from exc

    def claim_shard(self, shard: int, owner: str, epoch: int, initial_drained: int,
                    now_ms: int, *, global_fence: bool = False) -> Checkpoint:
        what = f"claiming shard {shard}"
        # A claim across DCs (docs/two-data-centres.md, "Fencing a take-over"): Paxos
        # among the copies of every DC, not only ours.
        serial = "SERIAL" if global_fence else None
        created, _ = self._lwt("create_checkpoint", (shard, initial_drained, owner, epoch, now_ms), what,
                               serial)
        if not created:
            self._lwt("claim_checkpoint", (owner, epoch, now_ms, shard, epoch), what, serial)
        return self._held(shard, owner, epoch, serial)

    def take_released_shard(self, shard: int, owner: str, epoch: int, seen_epoch: int, now_ms: int,
                            *, global_fence: bool = False) -> Checkpoint:
        serial = "SERIAL" if global_fence else None
        self._lwt("take_released_checkpoint", (owner, epoch, now_ms, shard, seen_epoch),
                  f"taking released shard {shard}", serial)
        return self._held(shard, owner, epoch, serial)

    def _held(self, shard: int, owner: str, epoch: int, serial: str | None) -> Checkpoint:
        """The shard's checkpoint, read at the fencing level, if ``owner`` holds it at
        ``epoch`` (a transaction that timed out may have applied); else ``OwnershipLost``."""
        row = self._serial_checkpoint(shard, serial)
        if row is None:
            raise OwnershipLost(f"shard {shard}: checkpoint row vanished while claiming")
        bucket, fire, job_id, holder, held_epoch = row
        if held_epoch != epoch or holder != owner:
            raise OwnershipLost(f"shard {shard} is held by {holder} with epoch {held_epoch}",
                                holder=holder, held_epoch=int(held_epoch))
        return Checkpoint(int(bucket), None if fire is None else (dt_ms(fire), job_id))

    def save_checkpoint(self, shard: int, epoch: int, checkpoint: Checkpoint, now_ms: int) -> None:
        fire, job_id = checkpoint.done_cursor or (None, None)
        applied, current = self._lwt(
            "save_checkpoint",
            (checkpoint.drained, fire, job_id, now_ms, shard, epoch, checkpoint.drained),
            f"saving checkpoint of shard {shard}")
        if not applied and current.get("owner_epoch") != epoch:
            raise OwnershipLost(
                f"shard {shard}: checkpoint refused, epoch {epoch} no longer owns it "
                f"(owner epoch {current.get('owner_epoch')})")

    def release_shard(self, shard: int, epoch: int, now_ms: int) -> bool:
        applied, current = self._lwt("release_checkpoint", (now_ms, shard, epoch), f"releasing shard {shard}")
        return bool(applied or current.get("owner_epoch") == epoch)

    @dual
    def set_notify_endpoint(self, owner: str, address: str | None, now_ms: int) -> CqlSteps[None]:
        if address is None:
            yield Run("delete_notify_endpoint", (owner,), "removing a nudge address")
        else:
            yield Run("upsert_notify_endpoint", (owner, address), "recording a nudge address")

    @dual
    def notify_endpoints(self, now_ms: int) -> CqlSteps[dict[str, str]]:
        return {o: a for o, a in (yield Run("select_notify_endpoints", (), "reading nudge addresses"))}

    @dual
    def checkpoints(self) -> CqlSteps[list[ShardCheckpoint]]:
        return [ShardCheckpoint(int(sh), int(b), None if f is None else (dt_ms(f), j), o, int(e),
                                None if u is None else dt_ms(u))
                for sh, b, f, j, o, e, u in (yield Run("select_checkpoints"))]
