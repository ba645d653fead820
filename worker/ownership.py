"""A worker's holds, from the write that wins a connection to what follows its release:
acquire, take over (one, or many of a dead session in batched transactions), start
the runner, and once the runner has ended give its slot back and do what its ending
asks for (a ``reassign`` hint, an acquire again after a restart, the answer to a
hand-off). What is won but cannot be run goes to :class:`~worker.give_back.GiveBack`.

Each hold's bookkeeping is in :class:`~worker.holdings.Holdings`; whether work may be
taken, and under which session, in :class:`~worker.standing.Standing`. Both are given
to this part, as are the store, the slots and the start queue it writes to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from worker.acquire_result import AcquireResult
from worker.capacity import Capacity
from worker.connection import ConnectionRunner, Outcome
from worker.connection_settings import ConnectionSettings
from worker.connection_state import Ending
from worker.give_back import GiveBack
from worker.holdings import Holdings
from worker.metrics import FleetMetrics
from worker.standing import Standing
from wsfleet import metric_names as m
from wsfleet import session_rules
from wsfleet.checkpoint_page import CheckpointPage
from wsfleet.item import ConnectionItem
from wsfleet.lease_rules import AcquireRefusal, Lease, TakeoverStep
from wsfleet.lease_store import TAKEOVER_BATCH, LeaseStore
from wsfleet.session_rules import SessionItem

log = logging.getLogger(__name__)

_REFUSALS = {
    AcquireRefusal.HELD: AcquireResult.HELD,
    AcquireRefusal.STOPPED: AcquireResult.STOPPED,
    AcquireRefusal.PARKED: AcquireResult.PARKED,
    AcquireRefusal.UNKNOWN_ID: AcquireResult.UNKNOWN_ID,
    TakeoverStep.GONE: AcquireResult.HELD,
    TakeoverStep.CLEAR: AcquireResult.STOPPED,
    TakeoverStep.RETRY: AcquireResult.HELD,
}


def _now() -> float:
    """Monotonic seconds: the running loop's clock (``time.monotonic`` in production,
    virtual time in the simulator)."""
    return asyncio.get_running_loop().time()


class Ownership:
    def __init__(
        self,
        *,
        worker_id: str,
        store: LeaseStore,
        settings: ConnectionSettings,
        capacity: Capacity,
        holdings: Holdings,
        standing: Standing,
        give_back: GiveBack,
        send_reassign: Callable[[str], Awaitable[None]],
        reassign_on_release: bool,
        metrics: FleetMetrics,
        wall_ms: Callable[[], int],
    ) -> None:
        """``settings``: what the runners share; ``send_reassign``: hints a free
        connection on the start queue."""
        self.worker_id = worker_id
        self._store = store
        self._settings = settings
        self._capacity = capacity
        self._holdings = holdings
        self._standing = standing
        self._give_back = give_back
        self.send_reassign = send_reassign
        self._reassign_on_release = reassign_on_release
        self._metrics = metrics
        self._wall_ms = wall_ms

    async def acquire(self, connection_id: str) -> AcquireResult:
        """Try to take ``connection_id`` (free, from a start hint or the unowned index)."""
        gen = self._standing.session_gen
        return await self._take(
            connection_id,
            gen,
            lambda: self._store.acquire(connection_id, self.worker_id, gen, self._wall_ms()),
        )

    async def take_over(
        self, seen: ConnectionItem, session: SessionItem, page: CheckpointPage | None
    ) -> AcquireResult:
        """Take a STARTED connection of a DEAD session, resuming from its page."""
        gen = self._standing.session_gen

        def attempt() -> Lease | AcquireRefusal | TakeoverStep:
            now_ms = self._wall_ms()
            return self._store.take_over(
                seen,
                self.worker_id,
                gen,
                page,
                now_ms,
                latency_ms=session_rules.takeover_latency_ms(session, now_ms),
            )

        return await self._take(seen.connection_id, gen, attempt)

    async def take_over_many(
        self, seen: list[ConnectionItem], session: SessionItem, page: CheckpointPage | None
    ) -> list[str]:
        """Take over many STARTED connections of one DEAD session at once (batched
        transactions, :meth:`LeaseStore.take_over_many`), as many as there are free
        slots; returns the ids taken."""
        holdings = self._holdings
        in_flight = {
            task
            for item in seen
            if (task := holdings.acquiring.get(item.connection_id)) is not None
        }
        if in_flight:
            # An acquire of one of them may be in flight (a sweeper's hint of what was
            # handed to the dead session): it answers "held", the dead session owning
            # it, and skipped here the connection waited for the next pass (seed 91).
            # As for a single acquire, wait for it and take what it did not win.
            await asyncio.wait(in_flight)
        if self._standing.closing or not self._standing.ready(_now()):
            return []
        chosen: list[ConnectionItem] = []
        for item in seen:
            if holdings.holds(item.connection_id):
                continue
            if not self._capacity.try_reserve():
                break
            chosen.append(item)
        if not chosen:
            return []
        gen = self._standing.session_gen

        def attempt(chunk: list[ConnectionItem]) -> dict[str, Lease | TakeoverStep]:
            now_ms = self._wall_ms()
            return self._store.take_over_many(
                chunk,
                self.worker_id,
                gen,
                page,
                now_ms,
                latency_ms=session_rules.takeover_latency_ms(session, now_ms),
            )

        batch = asyncio.create_task(self._attempt_many(chosen, gen, attempt), name="take-over")
        for item in chosen:
            holdings.acquiring[item.connection_id] = batch
        holdings.keep(batch)

        def settled(_: asyncio.Task[list[str]]) -> None:
            # When the batch ends, not when its caller does: a caller cancelled at
            # shutdown leaves the batch running, and the shutdown waits for it (its
            # won leases get runners, stopped and released, and its slots come back).
            for item in chosen:
                holdings.settled(item.connection_id, batch)

        batch.add_done_callback(settled)
        return await asyncio.shield(batch)

    async def hand_off(self, connection_ids: Sequence[str]) -> list[str]:
        """End these connections for another worker to take: each finishes its handler
        call in flight and is released with its final checkpoint. The ids released.
        Waits for every one of them: each runner's ending is bounded by its own drain
        and release budgets, and an id whose release landed must be offered."""
        loop = asyncio.get_running_loop()
        handing_off = self._holdings.handing_off
        waiting: dict[str, asyncio.Future[bool]] = {}
        for cid in connection_ids:
            runner = self._holdings.runners.get(cid)
            if runner is None or cid in handing_off:
                continue
            waiting[cid] = handing_off[cid] = loop.create_future()
            runner.stop(Ending.HANDED_OFF)
        if not waiting:
            return []
        try:
            await asyncio.wait(waiting.values())
        finally:
            for cid in waiting:
                handing_off.pop(cid, None)
        return [cid for cid, done in waiting.items() if done.done() and done.result()]

    async def _take(
        self,
        connection_id: str,
        gen: int,
        attempt: Callable[[], Lease | AcquireRefusal | TakeoverStep],
    ) -> AcquireResult:
        """Take ``connection_id`` with ``attempt`` (an acquire or a takeover); at most
        one attempt per id is in flight.

        The attempt runs as its own task and callers wait on it shielded: a caller
        cancelled at shutdown must not abandon a lease that the write just won.
        """
        holdings = self._holdings
        # Another attempt at it in flight (a takeover batch, say) may lose: wait for
        # it, and try again unless it won. Answered "already mine" at once, the hint
        # that brought this call would be spent on an attempt that lost, and the
        # connection would wait in the unowned index.
        while (in_flight := holdings.acquiring.get(connection_id)) is not None:
            await asyncio.wait([in_flight])
        if self._standing.closing:
            return AcquireResult.CLOSING
        if connection_id in holdings.runners:
            return AcquireResult.ALREADY_MINE
        if not self._standing.ready(_now()):
            return AcquireResult.NO_SESSION
        if not self._capacity.try_reserve():
            return AcquireResult.NO_CAPACITY
        task = asyncio.create_task(
            self._attempt(connection_id, gen, attempt), name=f"acquire:{connection_id}"
        )
        holdings.acquiring[connection_id] = task
        holdings.keep(task)
        task.add_done_callback(lambda _: holdings.settled(connection_id, task))
        return await asyncio.shield(task)

    async def _attempt(
        self,
        connection_id: str,
        gen: int,
        attempt: Callable[[], Lease | AcquireRefusal | TakeoverStep],
    ) -> AcquireResult:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, attempt)
        except BaseException:
            self._standing.suspect(gen, _now())
            await self._capacity.release()
            raise
        return await self._run_taken(connection_id, result, asyncio.current_task())

    async def _attempt_many(
        self,
        chosen: list[ConnectionItem],
        gen: int,
        attempt: Callable[[list[ConnectionItem]], dict[str, Lease | TakeoverStep]],
    ) -> list[str]:
        """The transactions of one takeover run one after the other (side by side they
        contend for the same partitions and time out), and each connection's runner
        starts as soon as its transaction answered."""
        loop = asyncio.get_running_loop()
        chunks = [
            chosen[start : start + TAKEOVER_BATCH]
            for start in range(0, len(chosen), TAKEOVER_BATCH)
        ]

        async def one(chunk: list[ConnectionItem]) -> list[str]:
            try:
                results = await loop.run_in_executor(None, attempt, chunk)
            except BaseException:
                # Unknown outcome: whatever landed is owned by this session and run by
                # nobody; the next reconcile releases it as a stray.
                self._standing.suspect(gen, _now())
                for _ in chunk:
                    await self._capacity.release()
                raise
            # Side by side: what was won under a session lost meanwhile is given back
            # with a write and a hint each, and a batch of them one after the other
            # held the last for seconds (found by the simulator, seed 139).
            attempt_task = asyncio.current_task()
            outcomes = await asyncio.gather(
                *(
                    self._run_taken(
                        item.connection_id,
                        results.get(item.connection_id, TakeoverStep.GONE),
                        attempt_task,
                    )
                    for item in chunk
                ),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            return [
                item.connection_id
                for item, outcome in zip(chunk, outcomes, strict=True)
                if outcome is AcquireResult.WON
            ]

        taken: list[str] = []
        for chunk in chunks:
            try:
                taken += await one(chunk)
            except Exception as error:
                log.warning("a takeover transaction failed", extra={"error": repr(error)})
        return taken

    async def _run_taken(
        self,
        connection_id: str,
        result: Lease | AcquireRefusal | TakeoverStep,
        attempt_task: asyncio.Task[Any] | None,
    ) -> AcquireResult:
        """Start the runner of a connection just taken (its slot is reserved), or give
        the slot back. ``attempt_task``: the attempt that counts it as being acquired."""
        if not isinstance(result, Lease):
            await self._capacity.release()
            return _REFUSALS[result]
        if result.session_gen != self._standing.session_gen:
            # Won under a session that was reaped while the write was on its way: it
            # is never run (no renew of another session proves that one), and given
            # back at once, so that neither a forgotten session nor nobody holds it.
            # No longer being taken: the give-back's hint may come back to this
            # worker's own start queue, and must find it free here, not "already
            # mine" (the shutdown still waits for the attempt: it is kept).
            self._holdings.settled(connection_id, attempt_task)
            try:
                await self._give_back.unrun(result)
            finally:
                await self._capacity.release()
            return AcquireResult.HELD
        if result.malformed is not None:
            # Won, but the item cannot be run: parked at once, never held silently.
            try:
                await self._give_back.malformed(result, result.malformed)
            finally:
                await self._capacity.release()
            return AcquireResult.PARKED
        self._metrics.count(m.LEASES_ACQUIRED)
        if result.takeover_latency_ms is not None:
            self._metrics.takeover_latency(result.takeover_latency_ms)
        log.info(
            "lease acquired",
            extra={
                "connection_id": connection_id,
                "epoch": result.epoch,
                "last_seq": result.last_seq,
                "takeover_latency_ms": result.takeover_latency_ms,
                "failing_since_ms": result.failing_since_ms,
                "secret": result.auth_secret,
            },
        )
        try:
            runner = ConnectionRunner(self._settings, result, self._standing.deadline)
        except Exception as error:
            log.exception("could not build a runner", extra={"connection_id": connection_id})
            try:
                await self._give_back.malformed(result, f"cannot be run: {type(error).__name__}")
            finally:
                await self._capacity.release()
            return AcquireResult.PARKED
        holdings = self._holdings
        holdings.unanswered.pop(connection_id, None)  # a new hold: the old one is settled
        holdings.runners[connection_id] = runner
        task = asyncio.create_task(self._own(runner), name=f"own:{connection_id}")
        holdings.own_tasks[connection_id] = task
        holdings.keep(task)
        return AcquireResult.WON

    async def _own(self, runner: ConnectionRunner) -> None:
        """Run one connection, then give its slot back and do what its ending asks
        for, on every path: a cancelled runner still ends in order (released with its
        checkpoint), and so does this, before the cancellation is raised."""
        connection_id = runner.connection_id
        holdings = self._holdings
        outcome: Outcome | None = None
        cancelled = False
        try:
            outcome = await runner.run()
        except asyncio.CancelledError:
            cancelled = True
            outcome = runner.outcome
        except Exception:
            log.exception("connection runner crashed", extra={"connection_id": connection_id})
        finally:
            del holdings.runners[connection_id]
            holdings.own_tasks.pop(connection_id, None)
            holdings.released[connection_id] = _now()
            if outcome is None or (outcome.ending.releases and not outcome.released):
                self._standing.doubt = True
            if outcome is not None and outcome.unanswered is not None:
                holdings.unanswered[connection_id] = outcome.unanswered
            await self._capacity.release()
            handing_off = holdings.handing_off.get(connection_id)
            if handing_off is not None and not handing_off.done():
                handing_off.set_result(
                    outcome is not None and outcome.released and outcome.ending is Ending.HANDED_OFF
                )
        if outcome is not None and outcome.released:
            await self._after_release(connection_id, outcome)
        await runner.wait_closed()
        if cancelled:
            raise asyncio.CancelledError

    async def _after_release(self, connection_id: str, outcome: Outcome) -> None:
        if outcome.ending is Ending.HANDED_OFF:
            return  # offered to its receiver by the balancer
        if self._standing.closing or outcome.ending is Ending.SHUTDOWN:
            if self._reassign_on_release:
                await self.send_reassign(connection_id)
        elif outcome.restarted:
            # Restarted (maybe with a new URL) while we held it, seen by the renew or
            # by the release: take it again at once with the new generation instead of
            # waiting for a reconcile (the router's start hint may already have been
            # consumed as "already mine", or as held while this worker ran it).
            # Not taken (the acquire raised, or was not tried: no session ready, no
            # free slot), it would wait in the unowned index, its start hint spent: a
            # hint brings it to whoever has a free slot. What an acquire that raised
            # may have landed is the own-check's, on the next pass.
            try:
                result = await self.acquire(connection_id)
            except Exception as error:
                log.warning(
                    "could not take a restarted connection again; hinting it",
                    extra={"connection_id": connection_id, "error": repr(error)},
                )
                await self.send_reassign(connection_id)
                return
            log.info(
                "re-acquired after restart",
                extra={"connection_id": connection_id, "result": result.value},
            )
            if not result.settled:
                await self.send_reassign(connection_id)
