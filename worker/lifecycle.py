"""The worker's life as a process: start its loops once the first session is being
opened, keep the health stamp and the metrics going, and on the stop signal shut down
in order (docs/DESIGN.md §4.8): stop taking work, let the acquisitions in flight
finish, hand the connections to the others, end what is left with its final
checkpoint, then retire the session and flush the metrics a last time.

The loops it runs and the steps of the shutdown belong to other parts; it is given
them as callables, and the worker's standing and holdings to read and mark.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from worker import loop_watch
from worker.capacity import Capacity
from worker.config import WorkerConfig
from worker.connection_state import Ending
from worker.holdings import Holdings
from worker.metrics import FleetMetrics
from worker.standing import Standing
from wsfleet import metric_names as m
from wsfleet.version import VERSION

log = logging.getLogger(__name__)

HEALTH_STAMP_SECONDS = 1.0

Loop = Callable[[], Coroutine[Any, Any, None]]
"""A loop of the worker that runs until it is cancelled."""


class Lifecycle:
    def __init__(
        self,
        config: WorkerConfig,
        *,
        standing: Standing,
        holdings: Holdings,
        capacity: Capacity,
        metrics: FleetMetrics,
        loops: Mapping[str, Loop],
        open_session: Loop,
        retire_session: Loop,
        hand_over: Callable[[], Awaitable[set[str]]],
        hand_back: Callable[[float], Coroutine[Any, Any, int]],
        stamp_health: Callable[[], None],
        lag_probe_seconds: float | None,
        wall_ms: Callable[[], int],
    ) -> None:
        """``loops``: by name, what runs once the first session is being opened (the
        start queue, the reconciler, the pages); ``hand_over``: hands the connections
        to the other workers, the ids handed; ``hand_back``: hands the start-queue
        poll in flight back, given how long to wait for it; ``stamp_health``: records
        that the event loop runs."""
        self._config = config
        self._standing = standing
        self._holdings = holdings
        self._capacity = capacity
        self._metrics = metrics
        self._loops = loops
        self._open_session = open_session
        self._retire_session = retire_session
        self._hand_over = hand_over
        self._hand_back = hand_back
        self._stamp = stamp_health
        self._lag_probe_seconds = lag_probe_seconds
        self._wall_ms = wall_ms

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down gracefully."""
        config = self._config
        log.info(
            "worker started",
            extra={
                "worker_id": config.worker_id,
                "max_connections": config.max_connections,
                "lease_seconds": config.timing.lease,
                "event_loop": config.event_loop,
                "json_decoder": config.json_decoder,
                "upstream_protocol": config.upstream_protocol,
                "upstream_protocols": sorted(config.upstream_protocols),
                "version": VERSION,
            },
        )
        health = asyncio.create_task(self._stamp_health(), name="health")
        opening = asyncio.create_task(self._open_session(), name="open-session")
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([opening, stopped], return_when=asyncio.FIRST_COMPLETED)
        loops = [
            health,
            *(asyncio.create_task(loop(), name=name) for name, loop in self._loops.items()),
            asyncio.create_task(self._flush_metrics(), name="metrics"),
        ]
        if self._lag_probe_seconds is not None:
            probe = loop_watch.probe_lag(self._metrics, self._lag_probe_seconds)
            loops.append(asyncio.create_task(probe, name="loop-lag"))
        done, _ = await asyncio.wait([stopped, *loops], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopped}:
            # The loops never return; one that did has crashed.
            log.error("worker loop ended unexpectedly", extra={"loop": task.get_name()})
        stopped.cancel()
        opening.cancel()
        await self._shutdown(loops)

    async def _shutdown(self, loops: list[asyncio.Task[None]]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        holdings = self._holdings
        self._standing.closing = True
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        drained = asyncio.create_task(self._hand_back(self._config.sqs_wait_seconds + 5.0))
        # Attempts in flight finish (a won lease gets a runner, stopped just below).
        await asyncio.gather(*holdings.acquiring.values(), return_exceptions=True)
        count = len(holdings.runners)
        handed = await self._drain()
        if holdings.runners:
            # The others had no room for them (or the hand-over failed): each ends
            # here, released with a ``reassign`` hint for whoever has room later.
            log.warning(
                "connections not handed over; releasing them with hints",
                extra={"connections": len(holdings.runners)},
            )
        for runner in list(holdings.runners.values()):
            runner.stop(Ending.SHUTDOWN)
        await self._wait_for_connections()
        # Retired before the poll in flight is waited for (up to SQS_WAIT_SECONDS + 5 s):
        # what the session owns and nobody runs (an acquire that landed unseen) is the
        # others' to take over from the retire on, not after the poll.
        await self._retire_session()
        handed_back = await drained
        self._flush_and_log()
        log.info(
            "worker stopped",
            extra={
                "connections": count,
                "handed_over": len(handed),
                "handed_back": handed_back,
                "seconds": round(loop.time() - started, 3),
            },
        )

    async def _drain(self) -> set[str]:
        """Hand the connections to the others; what is left ends with a ``reassign``
        hint. The session publishes capacity 0 from its next renew on, so the others
        stop counting on this worker."""
        if not self._holdings.runners:
            return set()
        try:
            return await self._hand_over()
        except Exception as error:
            log.warning("drain failed; releasing with hints", extra={"error": repr(error)})
            return set()

    async def _wait_for_connections(self) -> None:
        """Every runner drains (bounded by its fence deadline) and releases (bounded
        by the release budget); one still running after both is cancelled, which cuts
        its drain short but still releases it with its final checkpoint."""
        owning = self._holdings.owning
        if not owning:
            return
        timing = self._config.timing
        _, stragglers = await asyncio.wait(set(owning), timeout=timing.shutdown_budget)
        if not stragglers:
            return
        log.error(
            "connections still ending after the shutdown budget; cancelling them",
            extra={
                "connections": sorted(t.get_name().removeprefix("own:") for t in stragglers),
                "budget_seconds": timing.shutdown_budget,
            },
        )
        for task in stragglers:
            task.cancel()
        await asyncio.wait(stragglers, timeout=timing.release_budget + 1.0)

    async def _stamp_health(self) -> None:
        while True:
            try:
                self._stamp()
            except OSError as error:
                log.warning("cannot write the health stamp", extra={"error": repr(error)})
            await asyncio.sleep(HEALTH_STAMP_SECONDS)

    async def _flush_metrics(self) -> None:
        while True:
            await asyncio.sleep(self._config.metrics_interval)
            self._flush_and_log()

    def _flush_and_log(self) -> None:
        metrics = self._metrics
        lateness = metrics.lateness_summary()
        session = metrics.session_summary()
        loop_figures = metrics.loop_summary()
        counts = metrics.snapshot()
        try:
            metrics.flush(self._wall_ms())
        except Exception:
            # Metrics must never take the worker down with them (it owns leases).
            log.exception("metrics flush failed")
        log.info(
            "worker stats",
            extra={
                "active_connections": len(self._holdings.runners),
                "free_slots": self._capacity.free,
                "messages_processed": counts[m.MESSAGES_PROCESSED],
                "session_gen": self._standing.gen,
                "renew_lateness": lateness,
                "session_renews": session,
                "loop": loop_figures,
            },
        )
