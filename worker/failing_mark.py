"""The failing mark on a connection's item: when its current streak of failed upstream
attempts began (``failing_since_ms``, docs/DESIGN.md §3.7), so that the next owner
goes on counting from there.

:class:`~worker.upstream_failures.FailingClock` decides when the mark is written and
when it is removed; this part makes those writes (one each, off the event loop,
bounded by a heartbeat) and tells the clock when one landed. A write that fails is
tried again at the next occasion: the next failed attempt, or the next handled
message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from worker.upstream_failures import FailingClock
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.timing import LeaseTiming

log = logging.getLogger(__name__)


class FailingMark:
    def __init__(
        self,
        clock: FailingClock,
        store: LeaseStore,
        lease: Lease,
        timing: LeaseTiming,
        wall_ms: Callable[[], int],
    ) -> None:
        self.clock = clock
        self._store = store
        self._lease = lease
        self._timing = timing
        self._wall_ms = wall_ms

    async def record(self) -> None:
        """Write when the failing streak began (once per streak)."""
        since = self.clock.failing_since_ms
        if since is None:  # pragma: no cover - attempt_failed has just set it
            return
        if await self._write(self._store.record_failing_since, since, self._wall_ms()):
            self.clock.recorded()

    async def clear(self) -> None:
        """A message was handled after a failing streak: remove the mark."""
        if await self._write(self._store.clear_failing_since, self._wall_ms()):
            self.clock.cleared()

    async def _write(self, write: Callable[..., bool], *args: int) -> bool:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timing.heartbeat):
                return await loop.run_in_executor(None, write, self._lease, *args)
        except Exception as error:
            log.warning(
                "could not write the failing mark",
                extra={"connection_id": self._lease.connection_id, "error": repr(error)},
            )
            return False
