"""The two drivers of effect generators (``scheduler.domain.effects``) behave alike: results
are sent back, store errors are thrown in at the ``yield`` (so ``except`` works around
it), pauses pause, and what the generator does not catch reaches the caller."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from scheduler.domain.effects import Sleep, Steps, call, run_async, run_sync
from scheduler.errors import StoreUnavailable


class FakeStore:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_next = 0

    def get(self, key: str) -> str:
        self.calls.append(key)
        if self.fail_next:
            self.fail_next -= 1
            raise StoreUnavailable("down")
        return key.upper()

    async def acall(self, method: str, *args: object) -> object:
        return getattr(self, method)(*args)


def steps() -> Steps[list[str]]:
    out = [(yield from call("get", "a"))]
    try:
        out.append((yield from call("get", "b")))
    except StoreUnavailable:
        out.append("caught")
    yield Sleep(0.001)
    out.append((yield from call("get", "c")))
    return out


def drive(kind: str, store: FakeStore, gen: Steps[list[str]]) -> list[str]:
    if kind == "sync":
        return run_sync(store, gen)
    return asyncio.run(run_async(store.acall, gen))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_results_errors_and_pauses(kind):
    store = FakeStore()
    assert drive(kind, store, steps()) == ["A", "B", "C"]
    assert store.calls == ["a", "b", "c"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_the_generator_does_not_catch_reaches_the_caller(kind):
    store = FakeStore()
    store.fail_next = 1
    with pytest.raises(StoreUnavailable):
        drive(kind, store, steps())
    store = FakeStore()

    def caught() -> Steps[list[str]]:
        store.fail_next = 0
        a = yield from call("get", "a")
        store.fail_next = 1
        try:
            b = yield from call("get", "b")
        except StoreUnavailable:
            b = "caught"
        return [a, b]

    assert drive(kind, store, caught()) == ["A", "caught"]


def test_the_readme_python_examples_compile():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        compile(block, "README.md", "exec")


def test_nudge_datagrams_round_trip_and_stay_small():
    from scheduler.producer.wire import DATAGRAM_BYTES, decode, encode

    entries = [(i % 16, 1_800_000_000, 1_800_000_000_000 + i, f"job-{i}") for i in range(500)]
    datagrams = encode(entries)
    assert len(datagrams) > 1 and all(len(d) <= DATAGRAM_BYTES for d in datagrams)
    assert [e for d in datagrams for e in decode(d)] == entries
    for bad in (b"x", b"{}", b'{"v":1,"j":[[1,2,"3","a"]]}', b'{"v":2,"j":[]}'):
        with pytest.raises(ValueError):
            decode(bad)
