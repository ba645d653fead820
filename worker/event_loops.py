"""The event loop the worker runs on (``EVENT_LOOP``): asyncio's own, or uvloop's.

uvloop (libuv under the asyncio API, which ``websockets`` supports) is the default
where it is installed: it runs the per-message path's transport callbacks in C.

Its ``time()`` is libuv's clock, in whole milliseconds and possibly the coarse kernel
clock: a reading may be a millisecond or two behind ``time.monotonic``. The fence and
the session expiry read the loop's clock and are argued on a clock that is never
behind, so the worker's uvloop reads ``time.monotonic`` instead, as asyncio's loop
does; uvloop's timers stay its own (they start from a fresh libuv reading, so they
fire within about a millisecond of when they are asked for, and every decision a
timer wakes reads the clock again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from wsfleet import accelerators
from wsfleet.accelerators import ASYNCIO, UVLOOP


def factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop factory for ``asyncio.Runner``; raises ValueError for an unknown or
    missing loop."""
    if name == ASYNCIO:
        return asyncio.new_event_loop
    if name != UVLOOP:
        raise ValueError(
            f"unknown event loop {name!r}: one of {', '.join(accelerators.EVENT_LOOPS)}"
        )
    if not accelerators.installed(UVLOOP):
        raise ValueError("uvloop is not installed")
    return _monotonic_uvloop_class()


def _monotonic_uvloop_class() -> type[asyncio.AbstractEventLoop]:
    import uvloop

    class MonotonicUvLoop(uvloop.Loop):
        """uvloop with asyncio's clock: ``time.monotonic``, never behind."""

        monotonic_clock = True

        def time(self) -> float:
            return time.monotonic()

    return MonotonicUvLoop


def clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's clock as one C call where it is ``time.monotonic`` (asyncio's loops,
    the worker's uvloop), else the loop's own ``time`` (a simulated loop)."""
    kind = type(loop)
    if kind.time is asyncio.BaseEventLoop.time or getattr(kind, "monotonic_clock", False):
        return time.monotonic
    return loop.time
