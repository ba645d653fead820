"""Every reconcile interval (jittered +-20%), find orphans through the GSI and try
to take them in random order, up to the worker's free capacity."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from worker.acquire_result import AcquireResult
from worker.capacity import Capacity
from worker.metrics import FleetMetrics
from wsfleet import metric_names as m
from wsfleet.backoff import jittered
from wsfleet.lease_store import LeaseStore

log = logging.getLogger(__name__)

MAX_ORPHANS_PER_PASS = 1000
PARALLEL_ACQUIRES = 8


class Reconciler:
    def __init__(
        self,
        *,
        store: LeaseStore,
        capacity: Capacity,
        acquire: Callable[[str], Awaitable[AcquireResult]],
        is_mine: Callable[[str], bool],
        metrics: FleetMetrics,
        wall_ms: Callable[[], int],
        rng: random.Random,
    ) -> None:
        self._store = store
        self._capacity = capacity
        self._acquire = acquire
        self._is_mine = is_mine
        self._metrics = metrics
        self._wall_ms = wall_ms
        self._rng = rng

    async def run(self) -> None:
        interval = self._store.timing.reconcile
        while True:
            try:
                await self.reconcile_once()
            except Exception as error:
                log.warning("reconcile pass failed", extra={"error": repr(error)})
            await asyncio.sleep(jittered(interval, 0.2, self._rng.random))

    async def reconcile_once(self) -> list[str]:
        """One pass; returns the ids this worker took."""
        free = self._capacity.free
        if free <= 0:
            return []
        limit = min(MAX_ORPHANS_PER_PASS, 2 * free + 8)
        found = await asyncio.get_running_loop().run_in_executor(
            None, self._store.find_orphans, self._wall_ms(), limit
        )
        orphans = [cid for cid in found if not self._is_mine(cid)]
        if not orphans:
            return []
        self._metrics.count(m.ORPHANS_FOUND, len(orphans))
        self._rng.shuffle(orphans)
        gate = asyncio.Semaphore(PARALLEL_ACQUIRES)
        taken: list[str] = []

        async def take(connection_id: str) -> None:
            async with gate:
                if self._capacity.free <= 0:
                    return
                try:
                    result = await self._acquire(connection_id)
                except Exception as error:
                    log.warning(
                        "acquire of an orphan failed",
                        extra={"connection_id": connection_id, "error": repr(error)},
                    )
                    return
                if result is AcquireResult.WON:
                    taken.append(connection_id)

        await asyncio.gather(*(take(cid) for cid in orphans))
        if taken:
            log.info("orphans taken", extra={"found": len(orphans), "taken": len(taken)})
        return taken
