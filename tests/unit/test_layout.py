from __future__ import annotations

import pytest

from scheduler.domain.layout import Layout, Layouts, check_resize, earliest_cutover_ms, mark_end_for
from scheduler.errors import InvalidInput, ResizeRefused

W = 60
NOW_MS = 1_800_000_000_000  # a bucket boundary: 1800000000 % 60 == 0


def test_write_layout_picks_the_last_start_at_or_before():
    lays = Layouts([Layout(1000, 8), Layout(2000, 32), Layout(3000, 16)])
    assert lays.write_layout(999).shard_count == 8  # before the first: the first
    assert lays.write_layout(1000).shard_count == 8
    assert lays.write_layout(1999).shard_count == 8
    assert lays.write_layout(2000).shard_count == 32
    assert lays.write_layout(5000).shard_count == 16


def test_read_count_is_the_write_count_without_marks():
    lays = Layouts([Layout(1000, 8), Layout(2000, 32), Layout(3000, 16)])
    assert [lays.read_count(b) for b in (1000, 2000, 3000)] == [8, 32, 16]


def test_read_count_widens_to_an_older_layout_writers_reached():
    # Producers wrote under S=32 up to (not including) bucket 7200 before the shrink to 16
    # at 3600 took effect: buckets 3600..7199 must still be read with 32 shards.
    lays = Layouts([Layout(0, 32, mark_end=7200), Layout(3600, 16)])
    assert lays.read_count(3600) == 32
    assert lays.read_count(7140) == 32
    assert lays.read_count(7200) == 16
    # Growing is covered by the new count anyway.
    grow = Layouts([Layout(0, 8, mark_end=7200), Layout(3600, 32)])
    assert grow.read_count(3600) == 32


def test_mark_end_rounds_up_to_the_next_hour():
    assert mark_end_for(0) == 3600
    assert mark_end_for(3599) == 3600
    assert mark_end_for(3600) == 7200


def _resize(count, cutover_ms, lays=None):
    lays = lays or Layouts([Layout(NOW_MS // 1000 - 3600, 16)])
    return check_resize(lays, count, cutover_ms, NOW_MS, W, 30_000, 2_000, 500)


def test_resize_accepts_the_earliest_allowed_cutover():
    earliest = earliest_cutover_ms(NOW_MS, 30_000, 2_000, 500)
    first = (earliest // 60_000 + 1) * 60_000
    lay = _resize(32, first)
    assert lay.from_bucket == first // 1000 and lay.shard_count == 32


def test_resize_too_early_names_the_earliest_time():
    with pytest.raises(ResizeRefused, match=r"earliest allowed cutover is 2027-01-15T08:01:00\+00:00"):
        _resize(32, NOW_MS)


def test_resize_off_boundary_is_refused():
    with pytest.raises(ResizeRefused, match="bucket boundary"):
        _resize(32, NOW_MS + 3_600_000 + 1_000)


def test_resize_must_follow_the_latest_layout():
    lays = Layouts([Layout(NOW_MS // 1000 - 3600, 16), Layout(NOW_MS // 1000 + 7200, 32)])
    with pytest.raises(ResizeRefused, match="not after the latest layout"):
        _resize(8, NOW_MS + 3_600_000, lays)


@pytest.mark.parametrize("count", [0, -1, 16385])
def test_resize_rejects_bad_counts(count):
    with pytest.raises(InvalidInput):
        _resize(count, NOW_MS + 3_600_000)
