"""The worker process: wires the start path, the reconciler and one runner per owned
connection, and shuts down in order (stop taking work, release with final
checkpoints, send ``reassign`` hints)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker import health
from worker.acquire_result import AcquireResult
from worker.capacity import Capacity
from worker.config import WorkerConfig
from worker.connection import ConnectionRunner, ConnectionSettings, Outcome
from worker.connection_state import Ending
from worker.delivery import Handler
from worker.metrics import FleetMetrics
from worker.reconciler import Reconciler
from worker.start_queue import StartConsumer, StartQueue
from worker.upstream_protocol import UpstreamProtocol
from wsfleet import metric_names as m
from wsfleet.lease_rules import AcquireRefusal, Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.start_messages import REASSIGN, StartMessage

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

log = logging.getLogger(__name__)

_REFUSALS = {
    AcquireRefusal.HELD: AcquireResult.HELD,
    AcquireRefusal.STOPPED: AcquireResult.STOPPED,
    AcquireRefusal.PARKED: AcquireResult.PARKED,
    AcquireRefusal.UNKNOWN_ID: AcquireResult.UNKNOWN_ID,
}

HEALTH_STAMP_SECONDS = 1.0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class WorkerDeps:
    store: LeaseStore
    sqs: SQSClient
    handler: Handler
    protocol: UpstreamProtocol
    wall_ms: Callable[[], int] = wall_clock_ms
    rng: random.Random | None = None


class Worker:
    def __init__(self, config: WorkerConfig, deps: WorkerDeps) -> None:
        self.config = config
        self._store = deps.store
        self._wall_ms = deps.wall_ms
        rng = deps.rng or random.Random()
        self.capacity = Capacity(config.max_connections)
        self._runners: dict[str, ConnectionRunner] = {}
        self._acquiring: dict[str, asyncio.Task[AcquireResult]] = {}
        self._owning: set[asyncio.Task[None]] = set()
        self._closing = False
        self.metrics = FleetMetrics(
            namespace=config.metrics_namespace,
            service=config.service_name,
            task_id=config.worker_id,
            active_connections=lambda: len(self._runners),
        )
        self._settings = ConnectionSettings(
            store=deps.store,
            handler=deps.handler,
            protocol=deps.protocol,
            metrics=self.metrics,
            timing=config.timing,
            worker_id=config.worker_id,
            wall_ms=deps.wall_ms,
            rng=rng,
            skip_failed_messages=config.handler_errors == "skip",
            ping_interval=config.ping_interval,
            max_message_bytes=config.max_message_bytes,
            fail_after=config.upstream_fail_after,
        )
        self.queue = StartQueue(deps.sqs, config.queue_url, wait_seconds=config.sqs_wait_seconds)
        self.consumer = StartConsumer(
            self.queue,
            capacity=self.capacity,
            acquire=self.acquire,
            retry_seconds=max(1, round(config.timing.heartbeat)),
            rng=rng,
        )
        self.reconciler = Reconciler(
            store=deps.store,
            capacity=self.capacity,
            acquire=self.acquire,
            is_mine=self.holds,
            metrics=self.metrics,
            wall_ms=deps.wall_ms,
            rng=rng,
        )

    # --- ownership ---------------------------------------------------------------------

    def holds(self, connection_id: str) -> bool:
        return connection_id in self._runners or connection_id in self._acquiring

    def owned(self) -> dict[str, int]:
        """Connection id -> lease epoch, for every connection this worker runs."""
        return {cid: runner.lease.epoch for cid, runner in self._runners.items()}

    async def acquire(self, connection_id: str) -> AcquireResult:
        """Try to take ``connection_id``; at most one attempt per id is in flight.

        The attempt runs as its own task and callers wait on it shielded: a caller
        cancelled at shutdown must not abandon a lease that the write just won.
        """
        if self._closing:
            return AcquireResult.CLOSING
        if self.holds(connection_id):
            return AcquireResult.ALREADY_MINE
        if not self.capacity.try_reserve():
            return AcquireResult.NO_CAPACITY
        task = asyncio.create_task(self._acquire(connection_id), name=f"acquire:{connection_id}")
        self._acquiring[connection_id] = task
        task.add_done_callback(lambda _: self._acquiring.pop(connection_id, None))
        return await asyncio.shield(task)

    async def _acquire(self, connection_id: str) -> AcquireResult:
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        try:
            result = await loop.run_in_executor(
                None, self._store.acquire, connection_id, self.config.worker_id, self._wall_ms()
            )
        except BaseException:
            await self.capacity.release()
            raise
        if not isinstance(result, Lease):
            await self.capacity.release()
            return _REFUSALS[result]
        self.metrics.count(m.LEASES_ACQUIRED)
        if result.takeover_latency_ms is not None:
            self.metrics.takeover_latency(result.takeover_latency_ms)
        log.info(
            "lease acquired",
            extra={
                "connection_id": connection_id,
                "epoch": result.epoch,
                "last_seq": result.last_seq,
                "takeover_latency_ms": result.takeover_latency_ms,
                "failing_since_ms": result.failing_since_ms,
            },
        )
        runner = ConnectionRunner(self._settings, result, sent_at)
        self._runners[connection_id] = runner
        task = asyncio.create_task(self._own(runner), name=f"own:{connection_id}")
        self._owning.add(task)
        task.add_done_callback(self._owning.discard)
        return AcquireResult.WON

    async def _own(self, runner: ConnectionRunner) -> None:
        connection_id = runner.connection_id
        try:
            outcome: Outcome | None = await runner.run()
        except Exception:
            log.exception("connection runner crashed", extra={"connection_id": connection_id})
            outcome = None
        finally:
            del self._runners[connection_id]
            await self.capacity.release()
        if outcome is not None and outcome.released:
            await self._after_release(connection_id, outcome)
        await runner.wait_closed()

    async def _after_release(self, connection_id: str, outcome: Outcome) -> None:
        if self._closing or outcome.ending is Ending.SHUTDOWN:
            if self.config.reassign_on_release:
                await self._send_reassign(connection_id)
        elif outcome.restarted:
            # Restarted (maybe with a new URL) while we held it, seen by the renew or
            # by the release: take it again at once with the new generation instead of
            # waiting for a reconcile (the router's start hint may already have been
            # consumed as "already mine").
            result = await self.acquire(connection_id)
            log.info(
                "re-acquired after restart",
                extra={"connection_id": connection_id, "result": result.value},
            )

    async def _send_reassign(self, connection_id: str) -> None:
        try:
            await self.queue.send(StartMessage(REASSIGN, connection_id))
        except Exception as error:
            # The released lease is still found by the next reconcile of any worker.
            log.warning(
                "could not send reassign",
                extra={"connection_id": connection_id, "error": repr(error)},
            )

    # --- lifecycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down gracefully."""
        log.info(
            "worker started",
            extra={
                "worker_id": self.config.worker_id,
                "max_connections": self.config.max_connections,
                "lease_seconds": self.config.timing.lease,
            },
        )
        loops = [
            asyncio.create_task(self.consumer.run(), name="start-queue"),
            asyncio.create_task(self.reconciler.run(), name="reconciler"),
            asyncio.create_task(self._stamp_health(), name="health"),
            asyncio.create_task(self._flush_metrics(), name="metrics"),
        ]
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopped, *loops], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopped}:
            # The loops never return; one that did has crashed.
            log.error("worker loop ended unexpectedly", extra={"loop": task.get_name()})
        stopped.cancel()
        await self.shutdown(loops)

    async def shutdown(self, loops: list[asyncio.Task[None]]) -> None:
        started = time.monotonic()
        self._closing = True
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        drained = asyncio.create_task(self.consumer.drain(self.config.sqs_wait_seconds + 5.0))
        # Attempts in flight finish (a won lease gets a runner, stopped just below).
        await asyncio.gather(*self._acquiring.values(), return_exceptions=True)
        count = len(self._runners)
        for runner in list(self._runners.values()):
            runner.stop(Ending.SHUTDOWN)
        await self._wait_for_connections()
        handed_back = await drained
        self._flush_and_log()
        log.info(
            "worker stopped",
            extra={
                "connections": count,
                "handed_back": handed_back,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    async def _wait_for_connections(self) -> None:
        """Every runner drains (bounded by its fence deadline) and releases (bounded
        by the release budget); one still running after both is cancelled, which cuts
        its drain short but still releases it with its final checkpoint."""
        if not self._owning:
            return
        timing = self.config.timing
        _, stragglers = await asyncio.wait(set(self._owning), timeout=timing.shutdown_budget)
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
                health.stamp(self.config.health_file)
            except OSError as error:
                log.warning("cannot write the health stamp", extra={"error": repr(error)})
            await asyncio.sleep(HEALTH_STAMP_SECONDS)

    async def _flush_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_interval)
            self._flush_and_log()

    def _flush_and_log(self) -> None:
        lateness = self.metrics.lateness_summary()
        counts = self.metrics.snapshot()
        try:
            self.metrics.flush(self._wall_ms())
        except Exception:
            # Metrics must never take the worker down with them (it owns leases).
            log.exception("metrics flush failed")
        log.info(
            "worker stats",
            extra={
                "active_connections": len(self._runners),
                "free_slots": self.capacity.free,
                "messages_processed": counts[m.MESSAGES_PROCESSED],
                "renew_lateness": lateness,
            },
        )
