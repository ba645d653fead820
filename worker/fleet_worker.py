"""The worker process: opens its session and keeps it renewed, wires the start path,
the reconciler, the checkpoint pages and one runner per owned connection, and shuts
down in order (stop taking work, release with final checkpoints, send ``reassign``
hints, then retire the session)."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from secrets import token_hex
from typing import TYPE_CHECKING, Any, TextIO

from worker import health, loop_watch
from worker.acquire_result import AcquireResult
from worker.balancer import Balancer
from worker.capacity import Capacity
from worker.config import WorkerConfig
from worker.connect_pacing import ConnectPacer
from worker.connection import TASK_STOP_SECONDS, ConnectionRunner, ConnectionSettings, Outcome
from worker.connection_state import Ending
from worker.credentials import SecretCache
from worker.delivery import AnyHandler
from worker.metrics import FleetMetrics
from worker.reconciler import Reconciler
from worker.releasing import release_within_budget
from worker.session import SessionEvents, SessionKeeper
from worker.start_queue import StartConsumer, StartQueue
from worker.threads import OS_THREADS, Threads
from worker.upstream_protocol import UpstreamProtocol
from wsfleet import lease_rules, session_rules
from wsfleet import metric_names as m
from wsfleet.backoff import backoff_delays
from wsfleet.checkpoint_page import CheckpointPage, PageEntry
from wsfleet.item import ConnectionItem, connection_key_text
from wsfleet.lease_rules import AcquireRefusal, Lease, TakeoverStep
from wsfleet.lease_store import TAKEOVER_BATCH, LeaseStore
from wsfleet.session_rules import SessionItem
from wsfleet.session_store import SessionStore
from wsfleet.start_messages import REASSIGN, StartMessage
from wsfleet.version import VERSION

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

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

HEALTH_STAMP_SECONDS = 1.0
RELEASED_RECENTLY_SECONDS = 5.0
"""A connection released this long ago may still show as ours in the eventually
consistent ``by-owner`` index: not a stray."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _now() -> float:
    """Monotonic seconds: the running loop's clock (``time.monotonic`` in production,
    virtual time in the simulator)."""
    return asyncio.get_running_loop().time()


@dataclass(frozen=True, slots=True)
class WorkerDeps:
    store: LeaseStore
    sessions: SessionStore
    """Session listing, reaps, pages (on the shared executor)."""
    renewals: SessionStore
    """The session renew's own store: its own client, one short attempt per request."""
    sqs: SQSClient
    handler: AnyHandler
    protocol: UpstreamProtocol
    wall_ms: Callable[[], int] = wall_clock_ms
    rng: random.Random | None = None
    secrets: SecretCache | None = None
    """Where connections that name a secret read it (None: they cannot connect)."""
    threads: Threads = OS_THREADS
    """The session renew's and the long poll's threads (worker.threads)."""
    tokens: Callable[[int], str] = token_hex
    """``tokens(n)``: ``n`` random bytes as hex (the offers' nonces)."""
    stamp_health: Callable[[], None] | None = None
    """Records that the event loop runs (None: the config's health file is touched)."""
    lag_probe_seconds: float | None = loop_watch.LAG_PROBE_SECONDS
    """How often event-loop lag is sampled (None: not sampled)."""
    metrics_out: TextIO | None = None
    """Where the EMF documents go (None: standard output)."""


class Worker:
    def __init__(self, config: WorkerConfig, deps: WorkerDeps) -> None:
        self.config = config
        self._store = deps.store
        self._sessions = deps.sessions
        self._renewals = deps.renewals
        self._wall_ms = deps.wall_ms
        self._deps = deps
        self._clock: Callable[[], float] = time.monotonic
        """The event loop's clock, once :meth:`run` knows the loop (the same clock)."""
        rng = deps.rng or random.Random()
        self._rng = rng
        self.worker_id = config.worker_id
        self.capacity = Capacity(config.max_connections)
        self._runners: dict[str, ConnectionRunner] = {}
        self._acquiring: dict[str, asyncio.Task[Any]] = {}
        self._owning: set[asyncio.Task[None]] = set()
        self._own_tasks: dict[str, asyncio.Task[None]] = {}
        """Each runner's task, by connection id."""
        self._handing_off: dict[str, asyncio.Future[bool]] = {}
        """Connections being handed off: whether their release landed."""
        self._released: dict[str, float] = {}
        self._unanswered: dict[str, PageEntry] = {}
        """Final checkpoints of releases that never got an answer: the connection may
        still be this worker's, so its checkpoint stays on the page, and the stray
        release of the own-check writes it (instead of the older ``last_seq`` the
        index shows)."""
        self._doubt = False
        """A write whose outcome is unknown (an acquire or takeover that raised, a
        release that never got an answer): the next reconcile pass lists this session's
        own entries instead of waiting for its turn."""
        self._closing = False
        self._session_gen = 0
        """The latest session's generation (the next open takes the one after it)."""
        self._session_live = False
        """The latest session is open and not known to be reaped: work is taken and
        run under it, and under no other."""
        self._suspect_gens: dict[int, float] = {}
        """Earlier sessions of this worker under which a write may have landed unseen
        (an acquire or takeover without an answer, a give-back that never got one),
        with when that was last so: the own-check lists their entries too."""
        self._deadline = 0.0
        """The session's fence deadline (loop time): no handler call at or after it."""
        self._keeper: SessionKeeper | None = None
        self._last_renew_sent: float | None = None
        self._opening: asyncio.Task[None] | None = None
        self._notices_in_progress: set[str] = set()
        self._page_written: dict[str, PageEntry] = {}
        """The last page written, without its times (what decides whether a new one is due)."""
        self.metrics = FleetMetrics(
            namespace=config.metrics_namespace,
            service=config.service_name,
            task_id=config.worker_id,
            active_connections=lambda: len(self._runners),
            out=deps.metrics_out,
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
            ping_timeout=config.ping_timeout,
            max_message_bytes=config.max_message_bytes,
            fail_after=config.upstream_fail_after,
            secrets=deps.secrets,
            pacer=ConnectPacer(
                config.upstream_connect_burst, config.upstream_connects_per_second, rng=rng
            ),
        )
        self.balancer = Balancer(
            self,
            deps.sessions,
            config.balance,
            metrics=self.metrics,
            wall_ms=deps.wall_ms,
            rng=rng,
            settle=2 * config.timing.heartbeat + 1.0,
            # Read by the session renew's thread too (the load it publishes): the
            # loop's clock, which any thread may read (time.monotonic in production).
            monotonic=lambda: self._clock(),
            tokens=deps.tokens,
        )
        self.queue = StartQueue(
            deps.sqs, config.queue_url, wait_seconds=config.sqs_wait_seconds, threads=deps.threads
        )
        self.consumer = StartConsumer(
            self.queue,
            capacity=self.capacity,
            acquire=self.acquire,
            retry_seconds=max(1, round(config.timing.heartbeat)),
            rng=rng,
        )
        self.reconciler = Reconciler(
            store=deps.store,
            sessions=deps.sessions,
            owner=self,
            capacity=self.capacity,
            balancer=self.balancer,
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

    @property
    def session_gen(self) -> int:
        """The generation of the live session (0 while none is open, and from a reap
        until the next one is open)."""
        return self._session_gen if self._session_live else 0

    def own_generations(self) -> list[int]:
        """The sessions whose ``by-owner`` entries the own-check lists: the live one,
        and earlier ones under which a write may have landed unseen."""
        live = [self.session_gen] if self.session_gen else []
        return live + sorted(g for g in self._suspect_gens if g != self.session_gen)

    def own_check_found(self, gen: int, entries: int, checked_at: float) -> None:
        """The own-check listed ``entries`` under the earlier session ``gen`` at
        ``checked_at`` (monotonic): once it lists none, a release budget after the
        last write that might land there, that session is settled."""
        marked = self._suspect_gens.get(gen)
        if marked is None or gen == self.session_gen:
            self._suspect_gens.pop(gen, None)
            return
        if entries == 0 and checked_at - marked >= self.config.timing.release_budget:
            del self._suspect_gens[gen]

    def own_entries_listed(self, connection_ids: set[str]) -> None:
        """The own-check listed these entries: an unanswered release whose connection
        is no longer listed as this worker's has landed, or someone else holds it."""
        for cid in set(self._unanswered) - connection_ids:
            del self._unanswered[cid]

    def _suspect(self, gen: int) -> None:
        self._doubt = True
        if gen:
            self._suspect_gens[gen] = _now()

    def load(self) -> tuple[int, int]:
        """Connections run now, and the capacity the session publishes (0 while closing)."""
        return len(self._runners), self._published_capacity()

    def _published_capacity(self) -> int:
        return 0 if self._closing else self.config.max_connections

    def movable(self) -> list[str]:
        """Connections that may be handed off: run under the open session, not ending."""
        gen = self.session_gen
        return [
            cid
            for cid, runner in self._runners.items()
            if runner.lease.session_gen == gen
            and not runner.ending
            and cid not in self._handing_off
        ]

    async def hand_off(self, connection_ids: Sequence[str]) -> list[str]:
        """End these connections for another worker to take: each finishes its handler
        call in flight and is released with its final checkpoint. The ids released.
        Waits for every one of them: each runner's ending is bounded by its own drain
        and release budgets, and an id whose release landed must be offered."""
        loop = asyncio.get_running_loop()
        waiting: dict[str, asyncio.Future[bool]] = {}
        for cid in connection_ids:
            runner = self._runners.get(cid)
            if runner is None or cid in self._handing_off:
                continue
            waiting[cid] = self._handing_off[cid] = loop.create_future()
            runner.stop(Ending.HANDED_OFF)
        if not waiting:
            return []
        try:
            await asyncio.wait(waiting.values())
        finally:
            for cid in waiting:
                self._handing_off.pop(cid, None)
        return [cid for cid, done in waiting.items() if done.done() and done.result()]

    def recently_released(self, connection_id: str) -> bool:
        released = self._released.get(connection_id)
        return released is not None and _now() - released < RELEASED_RECENTLY_SECONDS

    def take_doubt(self) -> bool:
        doubt, self._doubt = self._doubt, False
        return doubt

    def _session_ready(self) -> bool:
        """A session is open and was renewed recently enough to take work under it."""
        now = asyncio.get_running_loop().time()
        return self.session_gen > 0 and self._deadline - now > self.config.timing.heartbeat

    async def acquire(self, connection_id: str) -> AcquireResult:
        """Try to take ``connection_id`` (free, from a start hint or the unowned index)."""
        gen = self.session_gen
        return await self._take(
            connection_id,
            gen,
            lambda: self._store.acquire(connection_id, self.worker_id, gen, self._wall_ms()),
        )

    async def take_over(
        self, seen: ConnectionItem, session: SessionItem, page: CheckpointPage | None
    ) -> AcquireResult:
        """Take a STARTED connection of a DEAD session, resuming from its page."""
        gen = self.session_gen

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

    async def _give_back_unrun(self, lease: Lease) -> None:
        """Release a lease that was never run: conditional on owner and epoch, and
        without a checkpoint, since nothing was handled under it."""
        log.warning(
            "lease won under a session that is no longer live: giving it back unrun",
            extra={
                "connection_id": lease.connection_id,
                "epoch": lease.epoch,
                "session_gen": lease.session_gen,
                "live_session_gen": self.session_gen,
            },
        )
        self._released[lease.connection_id] = _now()
        released = await release_within_budget(
            functools.partial(self._store.release, lease, None, self._wall_ms()),
            lease.connection_id,
            self.config.timing,
            self._rng,
        )
        if released is None:
            self._suspect(lease.session_gen)
        elif released.released:
            self.metrics.count(m.LEASES_RELEASED)
            # Free in the unowned index alone, it would wait there: every worker at
            # or above its share leaves what it finds there, and this one does not
            # take back what it just released. A hint hands it to whoever has room.
            await self.send_reassign(lease.connection_id)

    async def release_stray(self, seen: ConnectionItem) -> bool:
        """Release a connection this session owns but does not run, with the final
        checkpoint of its unanswered release when there was one for that hold (park it
        when its entry cannot be run: a release would compare what is malformed).
        Whether a release landed (False for a park)."""
        cid = seen.connection_id
        kept = lease_rules.unanswered_checkpoint(self._unanswered.get(cid), seen)
        lease = lease_rules.lease_of_entry(seen, self.worker_id, seen.owner_session_gen or 0)
        self._released[cid] = _now()
        if lease.malformed is not None:
            await self._park_malformed(lease, lease.malformed)
            return False
        loop = asyncio.get_running_loop()
        released = await loop.run_in_executor(
            None, self._store.release, lease, kept, self._wall_ms()
        )
        self._unanswered.pop(cid, None)  # answered: released, or no longer ours
        if released.released:
            self.metrics.count(m.LEASES_RELEASED)
        return released.released

    async def _park_malformed(self, lease: Lease, problem: str) -> None:
        """Park a connection this session holds whose item cannot be run, with the
        problem as its reason (docs/DESIGN.md §2.2). An error leaves
        it to the own-check, which finds it held and not run."""
        self.metrics.malformed_item(connection_key_text(lease.connection_id), problem)
        loop = asyncio.get_running_loop()
        try:
            released = await loop.run_in_executor(
                None, self._store.park_malformed, lease, problem, self._wall_ms()
            )
        except Exception as error:
            self._doubt = True
            log.warning(
                "could not park a malformed connection",
                extra={"connection_id": lease.connection_id, "error": repr(error)},
            )
            return
        if released.parked:
            self.metrics.count(m.CONNECTIONS_FAILED)
            log.warning(
                "connection parked: its item cannot be run",
                extra={"connection_id": lease.connection_id, "reason": problem},
            )

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
        if self._closing:
            return AcquireResult.CLOSING
        if self.holds(connection_id):
            return AcquireResult.ALREADY_MINE
        if not self._session_ready():
            return AcquireResult.NO_SESSION
        if not self.capacity.try_reserve():
            return AcquireResult.NO_CAPACITY
        task = asyncio.create_task(
            self._attempt(connection_id, gen, attempt), name=f"acquire:{connection_id}"
        )
        self._acquiring[connection_id] = task
        task.add_done_callback(lambda _: self._acquiring.pop(connection_id, None))
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
            self._suspect(gen)
            await self.capacity.release()
            raise
        return await self._run_taken(connection_id, result)

    async def _run_taken(
        self, connection_id: str, result: Lease | AcquireRefusal | TakeoverStep
    ) -> AcquireResult:
        """Start the runner of a connection just taken (its slot is reserved), or give
        the slot back."""
        if not isinstance(result, Lease):
            await self.capacity.release()
            return _REFUSALS[result]
        if result.session_gen != self.session_gen:
            # Won under a session that was reaped while the write was on its way: it
            # is never run (no renew of another session proves that one), and given
            # back at once, so that neither a forgotten session nor nobody holds it.
            try:
                await self._give_back_unrun(result)
            finally:
                await self.capacity.release()
            return AcquireResult.HELD
        if result.malformed is not None:
            # Won, but the item cannot be run: parked at once, never held silently.
            try:
                await self._park_malformed(result, result.malformed)
            finally:
                await self.capacity.release()
            return AcquireResult.PARKED
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
                "secret": result.auth_secret,
            },
        )
        try:
            runner = ConnectionRunner(self._settings, result, self._deadline)
        except Exception as error:
            log.exception("could not build a runner", extra={"connection_id": connection_id})
            try:
                await self._park_malformed(result, f"cannot be run: {type(error).__name__}")
            finally:
                await self.capacity.release()
            return AcquireResult.PARKED
        self._unanswered.pop(connection_id, None)  # a new hold: the old one is settled
        self._runners[connection_id] = runner
        task = asyncio.create_task(self._own(runner), name=f"own:{connection_id}")
        self._own_tasks[connection_id] = task
        self._owning.add(task)
        task.add_done_callback(self._owning.discard)
        return AcquireResult.WON

    async def take_over_many(
        self, seen: list[ConnectionItem], session: SessionItem, page: CheckpointPage | None
    ) -> list[str]:
        """Take over many STARTED connections of one DEAD session at once (batched
        transactions, :meth:`LeaseStore.take_over_many`), as many as there are free
        slots; returns the ids taken."""
        if self._closing or not self._session_ready():
            return []
        chosen: list[ConnectionItem] = []
        for item in seen:
            if self.holds(item.connection_id):
                continue
            if not self.capacity.try_reserve():
                break
            chosen.append(item)
        if not chosen:
            return []
        gen = self.session_gen

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
            self._acquiring[item.connection_id] = batch

        def settled(_: asyncio.Task[list[str]]) -> None:
            # When the batch ends, not when its caller does: a caller cancelled at
            # shutdown leaves the batch running, and the shutdown waits for it (its
            # won leases get runners, stopped and released, and its slots come back).
            for item in chosen:
                if self._acquiring.get(item.connection_id) is batch:
                    del self._acquiring[item.connection_id]

        batch.add_done_callback(settled)
        return await asyncio.shield(batch)

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
                self._suspect(gen)
                for _ in chunk:
                    await self.capacity.release()
                raise
            taken = []
            for item in chunk:
                result = results.get(item.connection_id, TakeoverStep.GONE)
                if await self._run_taken(item.connection_id, result) is AcquireResult.WON:
                    taken.append(item.connection_id)
            return taken

        taken: list[str] = []
        for chunk in chunks:
            try:
                taken += await one(chunk)
            except Exception as error:
                log.warning("a takeover transaction failed", extra={"error": repr(error)})
        return taken

    async def _own(self, runner: ConnectionRunner) -> None:
        """Run one connection, then give its slot back and do what its ending asks
        for, on every path: a cancelled runner still ends in order (released with its
        checkpoint), and so does this, before the cancellation is raised."""
        connection_id = runner.connection_id
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
            del self._runners[connection_id]
            self._own_tasks.pop(connection_id, None)
            self._released[connection_id] = _now()
            if outcome is None or (outcome.ending.releases and not outcome.released):
                self._doubt = True
            if outcome is not None and outcome.unanswered is not None:
                self._unanswered[connection_id] = outcome.unanswered
            await self.capacity.release()
            handing_off = self._handing_off.get(connection_id)
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
        if self._closing or outcome.ending is Ending.SHUTDOWN:
            if self.config.reassign_on_release:
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

    async def send_reassign(self, connection_id: str) -> None:
        try:
            await self.queue.send(StartMessage(REASSIGN, connection_id))
        except Exception as error:
            # The released lease is still found by the next reconcile of any worker.
            log.warning(
                "could not send reassign",
                extra={"connection_id": connection_id, "error": repr(error)},
            )

    # --- the session -------------------------------------------------------------------

    async def open_session(self) -> None:
        """Open a new session (the next generation) and start renewing it; retries
        errors with backoff until it is open or the worker closes."""
        loop = asyncio.get_running_loop()
        timing = self.config.timing
        delays = backoff_delays(initial=0.1, maximum=timing.heartbeat, rng=self._rng.random)
        gen = self._session_gen
        while not self._closing:
            gen += 1
            sent_at = loop.time()
            try:
                opened = await loop.run_in_executor(
                    None,
                    self._sessions.open,
                    self.worker_id,
                    gen,
                    self._wall_ms(),
                    self.config.max_connections,
                )
            except Exception as error:
                # Unknown outcome: the next generation is always fresh.
                log.warning("could not open a session", extra={"error": repr(error)})
                await asyncio.sleep(next(delays))
                continue
            if not opened:
                continue
            self._session_gen = gen
            self._session_live = True
            self._deadline = lease_rules.fence_deadline(sent_at, timing)
            self._last_renew_sent = sent_at
            self._keeper = SessionKeeper(
                self._renewals,
                self.worker_id,
                gen,
                loop,
                SessionEvents(self._renewed, self._renew_failed, self._reaped, self._given_up),
                wall_ms=self._wall_ms,
                connections=self.balancer.published_connections,
                capacity=self._published_capacity,
                first_renew_at=sent_at + timing.heartbeat,
                opened_at=sent_at,
                threads=self._deps.threads,
                clock=loop.time,
            )
            self._keeper.start()
            self._page_written = {}
            log.info("session opened", extra={"session_gen": gen})
            return

    def _renewed(self, gen: int, sent_at: float, lateness: float, notices: frozenset[str]) -> None:
        if gen != self.session_gen:
            return
        now = asyncio.get_running_loop().time()
        gap = None if self._last_renew_sent is None else sent_at - self._last_renew_sent
        self._last_renew_sent = sent_at
        self.metrics.renew_lateness(lateness)
        self.metrics.session_renewed(gap, self._deadline - now)
        self._deadline = max(
            self._deadline, lease_rules.fence_deadline(sent_at, self.config.timing)
        )
        for runner in self._runners.values():
            # A renew proves its own session only: it extends only the runners whose
            # lease that session owns.
            if runner.lease.session_gen == gen:
                runner.session_renewed(sent_at)
        fresh = set(notices) - self._notices_in_progress
        if fresh:
            self._notices_in_progress |= fresh
            task = asyncio.create_task(self._act_on_notices(fresh), name="notices")
            self._owning.add(task)
            task.add_done_callback(self._owning.discard)

    def _renew_failed(self, gen: int, lateness: float) -> None:
        if gen == self.session_gen:
            self.metrics.count(m.RENEW_FAILURES)
            self.metrics.renew_lateness(lateness)

    def _reaped(self, gen: int) -> None:
        """The session is DEAD: every connection of it is lost (others take them over
        from the last page). Open a new session and go on."""
        if gen != self.session_gen:
            return
        self.metrics.count(m.RENEW_FAILURES)
        log.error(
            "session reaped: its connections are lost",
            extra={"session_gen": gen, "connections": len(self._runners)},
        )
        self._lose_session(gen)
        self._next_session(self.open_session())

    def _given_up(self, gen: int) -> None:
        """No renew of the session landed for its fence window and a heartbeat more
        (its keeper has stopped renewing it): its connections have been paused for a
        heartbeat. Give them up rather than hold them dark: they end as lost, the
        session is marked DEAD so that others take them over from its page, and the
        next session opens (docs/DESIGN.md §3.6)."""
        if gen != self.session_gen:
            return
        self.metrics.count(m.RENEW_FAILURES)
        log.error(
            "session given up: no renew landed for its fence window; its connections"
            " go to the others",
            extra={"session_gen": gen, "connections": len(self._runners)},
        )
        ending = self._lose_session(gen)
        self._next_session(self._retire_given_up(gen, ending))

    def _lose_session(self, gen: int) -> list[asyncio.Task[None]]:
        """End every connection of session ``gen`` as lost, and let no runner start or
        resume under it any more; returns the tasks of the runners ending."""
        self._session_live = False
        ending = []
        for cid, runner in list(self._runners.items()):
            if runner.lease.session_gen == gen:
                runner.stop(Ending.LOST)
                task = self._own_tasks.get(cid)
                if task is not None:
                    ending.append(task)
        self._keeper = None
        return ending

    def _next_session(self, opening: Coroutine[Any, Any, None]) -> None:
        if self._closing or (self._opening is not None and not self._opening.done()):
            opening.close()
            return
        self._opening = asyncio.create_task(opening, name="open-session")

    async def _retire_given_up(self, gen: int, ending: list[asyncio.Task[None]]) -> None:
        """Mark a given-up session DEAD once its runners have ended (no handler call of
        it runs any more), then open the next one. The retire goes through the renew's
        client (awaited for a fence window, like a renew), and errors are retried for
        the release budget; if it never lands, the session lapses a lease after its
        last renew and is reaped like a crashed one's."""
        if ending:
            await asyncio.wait(ending, timeout=TASK_STOP_SECONDS)
        loop = asyncio.get_running_loop()
        timing = self.config.timing
        give_up_at = loop.time() + timing.release_budget
        delays = backoff_delays(initial=0.1, maximum=timing.heartbeat, rng=self._rng.random)
        while True:
            try:
                retired = await loop.run_in_executor(
                    None, self._renewals.retire, self.worker_id, gen, self._wall_ms()
                )
            except Exception as error:
                if loop.time() >= give_up_at:
                    log.warning(
                        "could not retire the given-up session; it lapses",
                        extra={"session_gen": gen, "error": repr(error)},
                    )
                    break
                await asyncio.sleep(next(delays))
                continue
            log.info("given-up session retired", extra={"session_gen": gen, "retired": retired})
            break
        await self.open_session()

    async def _act_on_notices(self, tokens: set[str]) -> None:
        """The router stopped or restarted some of this session's connections: read
        the named items strongly, in batches (a burst of stops costs a round trip per
        hundred, not one each), and end their runners accordingly; the next renew
        removes the notices acted on."""
        acted: set[str] = set()
        offers = {t for t in tokens if session_rules.notice_kind(t) in session_rules.HANDOFFS}
        try:
            acted |= await self._take_offers(offers)
            others = tokens - offers
            decided = await self._recheck({session_rules.notice_connection_id(t) for t in others})
            acted |= {t for t in others if session_rules.notice_connection_id(t) in decided}
        finally:
            self._notices_in_progress -= tokens
            if self._keeper is not None and acted:
                self._keeper.acted_on(acted)

    async def _take_offers(self, tokens: set[str]) -> set[str]:
        """Connections another worker released for this one: a balance move, taken up to
        this worker's fair share, or a drain, taken up to capacity like
        a dead session's (everything of a worker that shuts down must find a home).
        A move beyond the share is declined and hinted on the start queue, and so is an
        offer this worker could not even try (no free slot, no session ready, closing:
        an unsettled result). Every offer is acted on but one whose acquire raised (its
        outcome unknown: the next renew returns the offer again, and the own-check looks
        at what may have landed)."""
        if not tokens:
            return set()
        drains = {t for t in tokens if session_rules.notice_kind(t) == session_rules.DRAIN}
        drained = sorted({session_rules.notice_connection_id(t) for t in drains})
        moves = sorted({session_rules.notice_connection_id(t) for t in tokens - drains})
        room = self.balancer.room() if moves else 0
        accepted = drained + moves[:room]
        declined = moves[room:]
        outcomes = await asyncio.gather(
            *(self.acquire(cid) for cid in accepted), return_exceptions=True
        )
        results = [r for r in outcomes if isinstance(r, AcquireResult)]
        failed = {
            cid for cid, r in zip(accepted, outcomes, strict=True) if isinstance(r, Exception)
        }
        for cid, outcome in zip(accepted, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # a cancellation: the worker is stopping
            if cid in failed:
                log.warning(
                    "could not take an offered connection; the offer stays",
                    extra={"connection_id": cid, "error": repr(outcome)},
                )
        # Not tried (every slot reserved, by a takeover in flight say): dropped, the
        # offer would leave the connection in the unowned index like a declined move.
        declined += [
            cid
            for cid, outcome in zip(accepted, outcomes, strict=True)
            if isinstance(outcome, AcquireResult) and not outcome.settled
        ]
        # A move this worker does not take (its view of the loads says it is at its
        # share; the giver's said otherwise) would wait in the unowned index, where
        # every worker at or above its share leaves it too: a hint hands it to whoever
        # has a free slot now (a hint is taken up to capacity), and a later round
        # evens the loads out gracefully.
        await asyncio.gather(*(self.send_reassign(cid) for cid in declined))
        log.info(
            "offers",
            extra={
                "drained": len(drained),
                "moved": len(moves),
                "room": room,
                "won": sum(1 for r in results if r is AcquireResult.WON),
                "declined": len(declined),
                "failed": len(failed),
            },
        )
        return {t for t in tokens if session_rules.notice_connection_id(t) not in failed}

    async def recheck_changed(self, seen: list[ConnectionItem]) -> None:
        """Entries of this session's ``by-owner`` listing whose desired state or
        ``start_gen`` differ from what the runner was started with: a stop or a restart
        whose notice never arrived (the router failed between its two writes). They
        are read strongly and acted on like notices."""
        changed = set()
        for item in seen:
            runner = self._runners.get(item.connection_id)
            if runner is None or (item.started and item.start_gen == runner.lease.start_gen):
                continue
            log.warning(
                "owned connection changed without a notice; checking it",
                extra={"connection_id": item.connection_id},
            )
            changed.add(item.connection_id)
        await self._recheck(changed)

    async def _recheck(self, connection_ids: set[str]) -> set[str]:
        """Read these connections strongly and end each runner that was stopped,
        started again, deleted or lost; the ids decided (an id being acquired is
        decided by the acquire's own answer, and none is when the read fails: both
        are looked at again later)."""
        pending = {cid for cid in connection_ids if cid not in self._acquiring}
        decided = pending - set(self._runners)
        running = sorted(pending & set(self._runners))
        if not running:
            return decided
        # A runner started after the read belongs to a newer hold, which its own
        # acquire decided: only the runners read about are acted on.
        read_for = {cid: self._runners[cid] for cid in running}
        loop = asyncio.get_running_loop()
        try:
            items = await loop.run_in_executor(None, self._store.get_many, running)
        except Exception as error:
            log.warning(
                "could not read noticed connections",
                extra={"connections": len(running), "error": repr(error)},
            )
            return decided
        for cid in running:
            runner = self._runners.get(cid)
            if runner is read_for[cid]:
                ending = _notice_ending(items.get(cid), runner.lease)
            else:
                ending = None
            if runner is not None and ending is not None:
                log.info(
                    "connection noticed as changed",
                    extra={"connection_id": cid, "ending": ending.value},
                )
                runner.stop(ending)
            decided.add(cid)
        return decided

    async def _write_pages(self) -> None:
        """Every ``CHECKPOINT_SECONDS``, the checkpoint of every connection of the
        session in one item (only when something changed since the last one)."""
        while True:
            await asyncio.sleep(self.config.timing.checkpoint)
            try:
                await self.write_page()
            except Exception as error:
                log.warning("checkpoint page write failed", extra={"error": repr(error)})

    async def write_page(self) -> bool:
        """Write the session's page now; False when there was nothing new."""
        loop = asyncio.get_running_loop()
        gen = self.session_gen
        now, now_ms = loop.time(), self._wall_ms()
        entries = {
            cid: runner.page_entry(now, now_ms)
            for cid, runner in self._runners.items()
            if runner.lease.session_gen == gen
        }
        for cid, entry in self._unanswered.items():
            entries.setdefault(cid, entry)
        # The times of the last advance move only with the seqs: leave them out, or a
        # rounding millisecond would count as news.
        checkpoints = {cid: replace(e, advanced_at_ms=None) for cid, e in entries.items()}
        if gen == 0 or checkpoints == self._page_written:
            return False
        await loop.run_in_executor(
            None, self._sessions.write_page, self.worker_id, gen, entries, now_ms
        )
        self._page_written = checkpoints
        return True

    # --- lifecycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down gracefully."""
        self._clock = asyncio.get_running_loop().time
        log.info(
            "worker started",
            extra={
                "worker_id": self.config.worker_id,
                "max_connections": self.config.max_connections,
                "lease_seconds": self.config.timing.lease,
                "version": VERSION,
            },
        )
        health = asyncio.create_task(self._stamp_health(), name="health")
        opening = asyncio.create_task(self.open_session(), name="open-session")
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([opening, stopped], return_when=asyncio.FIRST_COMPLETED)
        loops = [
            health,
            asyncio.create_task(self.consumer.run(), name="start-queue"),
            asyncio.create_task(self.reconciler.run(), name="reconciler"),
            asyncio.create_task(self._write_pages(), name="pages"),
            asyncio.create_task(self._flush_metrics(), name="metrics"),
        ]
        if self._deps.lag_probe_seconds is not None:
            probe = loop_watch.probe_lag(self.metrics, self._deps.lag_probe_seconds)
            loops.append(asyncio.create_task(probe, name="loop-lag"))
        done, _ = await asyncio.wait([stopped, *loops], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopped}:
            # The loops never return; one that did has crashed.
            log.error("worker loop ended unexpectedly", extra={"loop": task.get_name()})
        stopped.cancel()
        opening.cancel()
        await self.shutdown(loops)

    async def shutdown(self, loops: list[asyncio.Task[None]]) -> None:
        started = _now()
        self._closing = True
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        drained = asyncio.create_task(self.consumer.drain(self.config.sqs_wait_seconds + 5.0))
        # Attempts in flight finish (a won lease gets a runner, stopped just below).
        await asyncio.gather(*self._acquiring.values(), return_exceptions=True)
        count = len(self._runners)
        handed = await self._drain()
        for runner in list(self._runners.values()):
            runner.stop(Ending.SHUTDOWN)
        await self._wait_for_connections()
        handed_back = await drained
        await self._retire_session()
        self._flush_and_log()
        log.info(
            "worker stopped",
            extra={
                "connections": count,
                "handed_over": len(handed),
                "handed_back": handed_back,
                "seconds": round(_now() - started, 3),
            },
        )

    async def _drain(self) -> set[str]:
        """Hand the connections to the others (:meth:`Balancer.drain`); what is left
        ends with a ``reassign`` hint. The session publishes capacity 0 from its next
        renew on, so the others stop counting on this worker."""
        if not self._runners:
            return set()
        try:
            return await self.balancer.drain()
        except Exception as error:
            log.warning("drain failed; releasing with hints", extra={"error": repr(error)})
            return set()

    async def _retire_session(self) -> None:
        """After the last release: stop renewing and mark the session DEAD, so others
        need not wait for it to lapse (its sweepers find nothing and forget it)."""
        keeper, gen = self._keeper, self._session_gen
        if keeper is None:
            return
        keeper.stop()
        self._keeper = None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                None, self._sessions.retire, self.worker_id, gen, self._wall_ms()
            )
        except Exception as error:
            # It then lapses and is reaped like a crashed one; nothing is left in it.
            log.warning("could not retire the session", extra={"error": repr(error)})
        await loop.run_in_executor(None, keeper.join, self.config.timing.heartbeat)

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
        stamp = self._deps.stamp_health or functools.partial(health.stamp, self.config.health_file)
        while True:
            try:
                stamp()
            except OSError as error:
                log.warning("cannot write the health stamp", extra={"error": repr(error)})
            await asyncio.sleep(HEALTH_STAMP_SECONDS)

    async def _flush_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_interval)
            self._flush_and_log()

    def _flush_and_log(self) -> None:
        lateness = self.metrics.lateness_summary()
        session = self.metrics.session_summary()
        loop_figures = self.metrics.loop_summary()
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
                "session_gen": self._session_gen,
                "renew_lateness": lateness,
                "session_renews": session,
                "loop": loop_figures,
            },
        )


def _notice_ending(item: ConnectionItem | None, lease: Lease) -> Ending | None:
    """How a connection named in a notice ends, from its item read strongly."""
    if item is None:
        return Ending.GONE
    if item.lease_owner != lease.owner or item.lease_epoch != lease.epoch:
        return Ending.LOST
    if not item.started:
        return Ending.STOPPED
    if item.start_gen != lease.start_gen:
        return Ending.RESTARTED
    return None
