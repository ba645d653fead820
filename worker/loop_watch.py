"""How well the event loop keeps time, and the garbage collector's share of it.

- :func:`probe_lag`: a task that sleeps ``LAG_PROBE_SECONDS`` again and again and
  records how late each wake-up came (event-loop lag: a long callback, a collector
  pause, a busy machine).
- :class:`GcFreezer`: measures every collection of the cyclic garbage collector, by
  generation, in CPU time of the thread that ran it (wall time would count the
  moments the machine gave the process no CPU), and keeps full collections short.

Full collections are what made the loop lag at 1,000 connections: each one walks
every tracked object of the process that is not frozen, and at steady state objects
that live for a second or so (a connection's wait for its next frame) are promoted to
the oldest generation fast enough to start one every few seconds. So after each full
collection the freezer freezes what survived it (``gc.freeze()``): the next one walks
only what came since. Frozen objects are still freed by reference counting; only
reference cycles among them (a connection that ended, say) wait for the freezer to
unfreeze everything, every ``UNFREEZE_SECONDS``, so that the full collection after
that walks the whole heap once and frees them.

Both feed :class:`~worker.metrics.FleetMetrics`, which logs their summary with each
"worker stats" line (not published as metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import time
from typing import Any

from worker.metrics import FleetMetrics

LAG_PROBE_SECONDS = 0.02
UNFREEZE_SECONDS = 600.0
YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (CPython's default:
700). At a thousand connections the default collects it so often that objects living
about a second (a connection's wait for its next frame) survive into the middle
generation, whose collections then took around 10 ms of CPU more than once a second:
the event loop's p99 lag. Collected less often, most of those objects are gone first
(BENCHMARKS.md, "Throughput": event-loop lag)."""


async def probe_lag(metrics: FleetMetrics, interval: float = LAG_PROBE_SECONDS) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        metrics.loop_lag(loop.time() - due)


class AfterFull(enum.Enum):
    """What follows a full collection."""

    FREEZE = "freeze"
    """Freeze its survivors: the next full collection walks only newer objects."""
    UNFREEZE = "unfreeze"
    """Unfreeze everything: the next full collection walks the whole heap and frees
    the cycles among objects that were frozen."""


def after_full(now: float, unfrozen_at: float, every: float = UNFREEZE_SECONDS) -> AfterFull:
    """The freezer's rule, at ``now`` (monotonic seconds), everything having last been
    unfrozen at ``unfrozen_at``."""
    return AfterFull.UNFREEZE if now - unfrozen_at >= every else AfterFull.FREEZE


class GcFreezer:
    """Install with :meth:`install` once the process has built its long-lived objects
    (it freezes them then). Collections can run on any thread; the freeze or unfreeze
    that follows a full one runs on the event loop's."""

    def __init__(
        self,
        metrics: FleetMetrics,
        loop: asyncio.AbstractEventLoop,
        *,
        unfreeze_every: float = UNFREEZE_SECONDS,
    ) -> None:
        self._metrics = metrics
        self._loop = loop
        self._every = unfreeze_every
        self._started = 0.0
        self._unfrozen_at = time.monotonic()
        self.freezes = 0
        self.unfreezes = 0
        self._thresholds: tuple[int, int, int] = gc.get_threshold()

    def install(self) -> None:
        self._thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, *self._thresholds[1:])
        gc.freeze()
        gc.callbacks.append(self._collected)

    def uninstall(self) -> None:
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
            gc.set_threshold(*self._thresholds)

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        generation = int(info["generation"])
        self._metrics.gc_pause(generation, time.thread_time() - self._started)
        if generation == 2:
            # A closed loop (RuntimeError): the process is ending.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._after_full)

    def _after_full(self) -> None:
        now = time.monotonic()
        if after_full(now, self._unfrozen_at, self._every) is AfterFull.UNFREEZE:
            gc.unfreeze()
            self._unfrozen_at = now
            self.unfreezes += 1
        else:
            gc.freeze()
            self.freezes += 1
