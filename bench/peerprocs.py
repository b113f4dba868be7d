"""The peer's drain on both cores: ``scheduler run --processes N`` (the way a user runs
one poller per core) fires the same backlog due at once that ``bench.peer`` gives the
in-process poller, in paired rounds with the Postgres peer's drain.

The pollers run as a child process tree under a fresh ZooKeeper root, with the
``bench.noop:note`` handler: each start is noted (id, due, start ms) in a file that the
benchmark reads; that handler's own cost is on our side of the ledger. The tree starts
once and drains every round: a round writes ``near`` jobs due one instant, far enough
ahead to be stored first, and ends when every one has started and the tree is idle
again (its last outcomes recorded). CPU is the process tree's (``tree_cpu_s``) and
Cassandra's, over the same window as ``bench.peer``'s drains.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.common import cassandra_cpu_s, settle, tree_cpu_s, write_bucket_rows
from bench.fleet import start, stop_all, wait_claimed
from bench.peer import SHARDS, Cpu, lead_ms, run_postgres, summary
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms, shard_of
from scheduler.domain.model import Job
from scheduler.store.cassandra.store import CassandraStore

IDLE_CPU_S = 0.02  # the tree's CPU over IDLE_WINDOW_S below which its work is done
IDLE_WINDOW_S = 0.5


class SchedulerProcesses:
    """``scheduler run --processes N`` on ``store`` for the life of the ``with`` block;
    entering waits until its pollers own every shard (at most 60 s)."""

    def __init__(self, store: CassandraStore, zk: str, processes: int, out: Path) -> None:
        self.store, self.zk, self.processes, self.out = store, zk, processes, out
        self.proc: subprocess.Popen[bytes] | None = None
        self.read_to = 0  # bytes of ``out`` already taken by earlier rounds
        self.counted_to, self.counted = 0, 0  # bytes of ``out`` whose lines are counted, and how many

    def __enter__(self) -> SchedulerProcesses:
        root = f"zookeeper://{self.zk}/bench-peer-{time.time_ns()}"
        self.proc = start(self.store.url, root, self.out, "--processes", str(self.processes),
                          handler="bench.noop:note", session_timeout_s=None, metrics="off")
        wait_claimed(self.store, SHARDS, self.processes)
        owners = [c.owner for c in self.store.checkpoints()]
        if len(owners) != SHARDS or not all(owners) or len(set(owners)) != self.processes:
            stop_all([self.proc])
            raise RuntimeError(f"scheduler run --processes {self.processes} did not claim every shard "
                               f"within 60 s (owners: {sorted(set(map(str, owners)))})")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None:
            stop_all([self.proc])

    def _cpu(self) -> float:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"scheduler run exited with code {self.proc.returncode} during the drain")
        return tree_cpu_s(self.proc.pid)

    def _count(self) -> int:
        """Lines written since ``read_to``, reading only the bytes not counted yet (the
        full run writes 40 MB of them: re-reading it all would take the pollers' CPU)."""
        self._cpu()  # raises when the tree died: no waiting out the timeout for it
        if self.out.exists():
            with self.out.open("rb") as fh:
                fh.seek(self.counted_to)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.counted_to += end
            self.counted += data.count(b"\n", 0, end)
        return self.counted

    def _new_lines(self) -> list[bytes]:
        if not self.out.exists():
            return []
        with self.out.open("rb") as fh:
            fh.seek(self.read_to)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line the flusher is still writing waits for the next read
        return data[:end].splitlines()

    def drain(self, near: int, prefix: str, lead_s: float, timeout_s: float = 300.0) -> dict[str, Any]:
        """Fire ``near`` jobs due at one instant; the figures of ``bench.peer``'s drains.
        Raises when they have not all started within ``timeout_s`` of falling due."""
        now = SystemClock().now_ms()
        due = now + lead_ms(near, lead_s)
        width = self.store.meta().bucket_width_s
        jobs = [Job(job_id=f"{prefix}-{i}", kind="noop", data=b"{}", data_json=True, due_ms=due, fire_ms=due,
                    bucket=bucket_of_ms(due, width), shard=shard_of(f"{prefix}-{i}", SHARDS))
                for i in range(near)]
        write_bucket_rows(self.store, jobs)
        del jobs
        # As the peer's load is followed by a vacuum and a checkpoint: the compactions the
        # load started are not the drain's work (waited for while the lead leaves time).
        settle(max_s=max(0.0, due / 1000 - 4 - time.time()))
        cpu = Cpu(cassandra_cpu_s, due, client=self._cpu)
        deadline = time.monotonic() + (due - now) / 1000 + timeout_s
        while self._count() < near:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.counted} of {near} jobs started within {timeout_s:.0f} s")
            time.sleep(0.2)
        self._wait_idle(time.monotonic() + 30)
        used = cpu.used()
        lines = self._new_lines()
        self.read_to += sum(len(ln) + 1 for ln in lines)
        self.counted_to, self.counted = self.read_to, 0
        starts = [(int(d), int(s)) for _id, d, s in (ln.split() for ln in lines)]
        late = [float(s - d) for d, s in starts]
        name = f"scheduler ({self.processes} processes)"
        figures = summary(name, late, due, [s for _d, s in starts], 0.0, near)
        return {**figures, **used, "processes": self.processes}

    def _wait_idle(self, deadline: float) -> None:
        """Until the tree used under ``IDLE_CPU_S`` in ``IDLE_WINDOW_S``: its recorder
        has written the last outcomes (part of the work measured). Raises at
        ``deadline``: a window that ran on would charge idle polling to the drain."""
        last = self._cpu()
        while time.monotonic() < deadline:
            time.sleep(IDLE_WINDOW_S)
            now = self._cpu()
            if now - last < IDLE_CPU_S:
                return
            last = now
        raise RuntimeError("the pollers did not fall idle within 30 s of the last start: no CPU figure")


def paired_drains(store: CassandraStore, zk: str, pg_url: str, near: int, lead_s: float, rounds: int,
                  tmp: Path, processes: int = 2) -> dict[str, Any]:
    """``rounds`` pairs of drains, ours (``processes`` poller processes) and the peer's,
    the order alternating; the ratio is the median of the per-round ratios of jobs/s."""
    pairs: list[dict[str, Any]] = []
    with SchedulerProcesses(store, zk, processes, tmp / f"peer-procs-{time.time_ns()}.log") as procs:
        for i in range(rounds):
            sides = ("ours", "peer") if i % 2 == 0 else ("peer", "ours")
            got: dict[str, dict[str, Any]] = {}
            for side in sides:
                prefix = f"drain{processes}p{i}"
                if side == "peer":
                    settle()  # our side's compactions never run into the peer's drain
                got[side] = (procs.drain(near, prefix, lead_s) if side == "ours"
                             else run_postgres(pg_url, near, 0.0, prefix=prefix, lead_s=lead_s))
            pairs.append(got)
    ratios = [p["ours"]["fire_jobs_per_s"] / max(1, p["peer"]["fire_jobs_per_s"]) for p in pairs]

    def med(side: str) -> float:
        return float(statistics.median(p[side]["fire_jobs_per_s"] for p in pairs))

    return {"processes": processes, "rounds": rounds, "ratio": round(statistics.median(ratios), 3),
            "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
            "ratio_is": "median of per-round ratios of jobs/s, ours over the peer's",
            "scheduler_jobs_per_s": round(med("ours")), "postgres_jobs_per_s": round(med("peer")),
            "per_round": [{"scheduler": p["ours"], "postgres": p["peer"], "ratio": round(r, 3)}
                          for p, r in zip(pairs, ratios, strict=True)]}
