from __future__ import annotations

import pytest

from scheduler.domain.progress import Checkpoint, ShardProgress

W = 60
B0 = 1_800_000_000  # a bucket start, epoch s


def ms(bucket: int, offset_s: float = 0) -> int:
    return int((bucket + offset_s) * 1000)


def test_fresh_shard_reads_the_bucket_after_its_checkpoint():
    p = ShardProgress(3, W, Checkpoint(B0 - W))
    assert p.next_read(ms(B0) - 1) is None
    assert p.next_read(ms(B0, 10)) == (B0, None, ms(B0, 10))
    assert p.next_read(ms(B0, 100)) == (B0, None, ms(B0 + W) - 1)


def test_open_bucket_is_reread_from_the_cursor_and_closed_after_its_end():
    p = ShardProgress(0, W, Checkpoint(B0 - W))
    k1, k2 = (ms(B0, 1), "a"), (ms(B0, 2), "b")
    assert p.on_read(B0, [k1, k2], full=False, issued_at_ms=ms(B0, 1)) is False
    assert p.next_read(ms(B0, 30)) == (B0, k2, ms(B0, 30))
    # A read issued after the bucket's end closes it.
    assert p.on_read(B0, [], full=False, issued_at_ms=ms(B0 + W)) is True
    assert p.read_bucket == B0 + W and p.read_cursor is None
    # Closed but not complete: the checkpoint stays, with no cursor yet.
    assert p.checkpoint() == Checkpoint(B0 - W, None)
    p.complete(B0, k1)
    assert p.checkpoint() == Checkpoint(B0 - W, k1)
    p.complete(B0, k2)
    assert p.checkpoint() == Checkpoint(B0, None)


def test_full_page_reads_again_without_closing():
    p = ShardProgress(0, W, Checkpoint(B0 - W))
    assert p.on_read(B0, [(ms(B0, 1), "a")], full=True, issued_at_ms=ms(B0 + 5 * W)) is True
    assert p.read_bucket == B0


def test_out_of_order_completion_keeps_the_cursor_at_the_first_gap():
    p = ShardProgress(0, W, Checkpoint(B0 - W))
    keys = [(ms(B0, i), f"j{i}") for i in range(1, 5)]
    p.on_read(B0, keys, full=False, issued_at_ms=ms(B0, 10))
    p.complete(B0, keys[1])
    p.complete(B0, keys[3])
    assert p.checkpoint() == Checkpoint(B0 - W, None)
    p.complete(B0, keys[0])
    assert p.checkpoint() == Checkpoint(B0 - W, keys[1])
    assert p.in_flight == 1


def test_catch_up_drains_buckets_oldest_first_and_checkpoint_never_moves_back():
    p = ShardProgress(0, W, Checkpoint(B0 - W))
    now = ms(B0 + 10 * W)
    seen = []
    while (nxt := p.next_read(now)) is not None and nxt[0] < B0 + 10 * W:
        bucket = nxt[0]
        seen.append(bucket)
        p.on_read(bucket, [(ms(bucket, 1), "x")], full=False, issued_at_ms=now)
    assert seen == [B0 + i * W for i in range(10)]
    last = p.checkpoint()
    for bucket in reversed(seen):  # complete newest first: checkpoint waits for the oldest
        p.complete(bucket, (ms(bucket, 1), "x"))
        cp = p.checkpoint()
        assert cp.drained >= last.drained
        last = cp
    assert last.drained == B0 + 9 * W


def test_resume_from_a_saved_cursor():
    k = (ms(B0, 5), "m")
    p = ShardProgress(0, W, Checkpoint(B0 - W, k))
    assert p.next_read(ms(B0, 30)) == (B0, k, ms(B0, 30))
    assert p.checkpoint() == Checkpoint(B0 - W, k)


def test_read_of_the_wrong_bucket_is_a_bug():
    p = ShardProgress(0, W, Checkpoint(B0 - W))
    with pytest.raises(ValueError):
        p.on_read(B0 + W, [], full=False, issued_at_ms=0)


def test_a_row_taken_early_is_tracked_once_the_cursor_reads_it():
    """The due-now fast path hands a row out ahead of the cursor: the checkpoint cannot
    pass it until it is complete, and the cursor's read reports it as taken already."""
    p = ShardProgress(0, W, Checkpoint(B0 - W))
    a, early, c = (ms(B0, 1), "a"), (ms(B0, 3), "now"), (ms(B0, 4), "c")
    p.on_read(B0, [a], full=False, issued_at_ms=ms(B0, 1))
    assert not p.take_early(B0, a), "the cursor has read it: it is handed out already"
    assert not p.take_early(B0 - W, (ms(B0 - W, 5), "x")), "a closed bucket"
    assert p.take_early(B0, early) and not p.take_early(B0, early)
    p.complete(B0, a)
    assert p.checkpoint() == Checkpoint(B0 - W, a)
    assert p.early_keys([early, c]) == {early}
    p.on_read(B0, [early, c], full=False, issued_at_ms=ms(B0, 3))
    assert p.early_keys([early]) == set()
    p.complete(B0, c)
    assert p.checkpoint() == Checkpoint(B0 - W, a), "the early row is still in flight"
    p.complete(B0, early)
    assert p.checkpoint() == Checkpoint(B0 - W, c)


def test_a_row_taken_early_and_done_before_the_cursor_comes_is_complete():
    p = ShardProgress(0, W, Checkpoint(B0 - W))
    early = (ms(B0, 3), "now")
    assert p.take_early(B0, early)
    p.complete(B0, early)
    p.on_read(B0, [early], full=False, issued_at_ms=ms(B0, 3))
    assert p.in_flight == 0 and p.checkpoint() == Checkpoint(B0 - W, early)
