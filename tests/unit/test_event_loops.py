"""The worker's event loops: uvloop reads the same clock as asyncio's loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from worker import event_loops
from wsfleet import accelerators

pytestmark = pytest.mark.skipif(
    not accelerators.installed(event_loops.UVLOOP), reason="uvloop has no wheel here"
)


def run_on(name: str, coroutine_fn):  # type: ignore[no-untyped-def]
    with asyncio.Runner(loop_factory=event_loops.factory(name)) as runner:
        return runner.run(coroutine_fn())


def test_the_uvloop_clock_is_never_behind_time_monotonic():
    """libuv's own clock is whole milliseconds (and may be the coarse kernel clock): a
    reading made after ``time.monotonic`` would often be below it, which would let a
    fence deadline pass unnoticed for up to a millisecond or two."""

    async def readings() -> list[tuple[float, float, float]]:
        loop = asyncio.get_running_loop()
        out = []
        for _ in range(2000):
            before = time.monotonic()
            during = loop.time()
            out.append((before, during, time.monotonic()))
        return out

    for before, during, after in run_on(event_loops.UVLOOP, readings):
        assert before <= during <= after


def test_the_uvloop_timers_fire_on_that_clock():
    async def lateness() -> list[float]:
        loop = asyncio.get_running_loop()
        out = []
        for delay in (0.002, 0.01, 0.03) * 5:
            asked = loop.time() + delay
            fired = loop.create_future()
            loop.call_at(asked, lambda f=fired: f.set_result(loop.time()))
            out.append(await fired - asked)
        return out

    # libuv rounds a delay to whole milliseconds: at most half of one early.
    assert min(run_on(event_loops.UVLOOP, lateness)) >= -0.0015


def test_the_reader_uses_time_monotonic_directly_on_both_loops():
    async def clock_is_monotonic() -> bool:
        return event_loops.clock(asyncio.get_running_loop()) is time.monotonic

    assert run_on(event_loops.UVLOOP, clock_is_monotonic)
    assert run_on(event_loops.ASYNCIO, clock_is_monotonic)


def test_uvloop_is_the_default_where_it_is_installed():
    assert accelerators.default_event_loop() == event_loops.UVLOOP


def test_unknown_and_missing_loops_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown event loop"):
        event_loops.factory("trio")
    monkeypatch.setattr(accelerators, "installed", lambda name: name == event_loops.ASYNCIO)
    with pytest.raises(ValueError, match="uvloop is not installed"):
        event_loops.factory(event_loops.UVLOOP)
    assert event_loops.factory(event_loops.ASYNCIO) is asyncio.new_event_loop
