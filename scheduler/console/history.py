"""Lag per shard over the last hour, for the fleet page's heatmap. Pure, no I/O.

The store keeps only each shard's current checkpoint, so the console samples the lag
every ``step_s`` (from the same ``lag_report`` as ``scheduler lag``) and keeps the last
hour of samples in memory: the heatmap starts empty when the console starts. Memory is
one float per shard per sample (4,096 shards x 120 samples: 2 MB).
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass


def levels(width_s: int) -> tuple[float, float, float]:
    """Lag thresholds (s) of the cell colours. A healthy shard's lag saws between 0 and
    one bucket width (it is measured to the end of the last drained bucket), so: within
    a bucket and 10 s is normal, then behind, late, and stalled from 5 minutes over the
    bucket (where SchedulerShardLagHigh pages)."""
    return (width_s + 10.0, width_s + 60.0, width_s + 300.0)


def level(lag_s: float, width_s: int = 60) -> int:
    """0 (normal) to 3 (stalled)."""
    return sum(lag_s >= t for t in levels(width_s))


@dataclass(frozen=True)
class Heatmap:
    times_s: list[float]  # one column per sample, oldest first
    rows: list[tuple[str, list[float]]]  # (shard range label, the worst lag of the range per sample)


class LagHistory:
    def __init__(self, window_s: float = 3600.0, step_s: float = 30.0) -> None:
        self.step_s = step_s
        self._samples: deque[tuple[float, array[float]]] = deque(maxlen=max(1, int(window_s // step_s)))

    def add(self, t_s: float, lags: dict[int, float]) -> None:
        size = max(lags, default=-1) + 1
        row = array("f", [0.0] * size)
        for shard, lag in lags.items():
            row[shard] = lag
        self._samples.append((t_s, row))

    def heatmap(self, max_rows: int = 64) -> Heatmap:
        """The samples folded into at most ``max_rows`` rows of consecutive shards, each
        cell the worst lag of its shards at that sample."""
        if not self._samples:
            return Heatmap([], [])
        shards = max(len(row) for _, row in self._samples)
        per_row = max(1, -(-shards // max_rows))
        rows = []
        for first in range(0, shards, per_row):
            last = min(shards, first + per_row) - 1
            label = str(first) if first == last else f"{first}-{last}"
            rows.append((label, [max(row[first:last + 1], default=0.0) for _, row in self._samples]))
        return Heatmap([t for t, _ in self._samples], rows)
