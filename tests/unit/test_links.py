"""The windows in which another DC's nodes were seen down (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.links import PeerLinks


def test_a_spell_of_nodes_down_gives_one_window_once_they_are_all_back():
    links = PeerLinks(lookback_ms=60_000)
    assert links.observe(0, 1_000) is None and not links.open
    assert links.observe(1, 100_000) is None and links.open
    assert links.observe(2, 110_000) is None  # more go down: the same spell
    assert links.observe(1, 120_000) is None  # not all back yet
    assert links.observe(0, 130_000) == (40_000, 130_000)
    assert links.observe(0, 140_000) is None and not links.open  # answered once


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 10_000)), max_size=50))
def test_every_window_starts_the_lookback_before_its_spell_and_ends_when_all_are_back(steps):
    links, now, since = PeerLinks(lookback_ms=5_000), 0, None
    for down, dt in steps:
        now += dt
        window = links.observe(down, now)
        if down:
            since = now if since is None else since
            assert window is None
        elif since is not None:
            assert window == (since - 5_000, now)
            since = None
        else:
            assert window is None
