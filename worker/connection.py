"""One owned connection: read the upstream, hand messages to the handler, renew the
lease with the checkpoint, and end the moment the lease is in doubt.

Two tasks run per connection: the reader (connect with resume, receive, deliver,
reconnect with backoff) and the renewer (one conditional write per heartbeat). The
fence deadline ``sent_at(last successful renew) + lease - skew - margin`` is checked
synchronously before every handler call and bounds each call, so a paused or
partitioned worker never hands over a message after another worker may have taken
the lease, even when no condition ever failed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection, connect

from worker.delivery import Delivery, Handler
from worker.metrics import FleetMetrics
from worker.upstream_protocol import Message, Reply, Unreadable, UpstreamProtocol
from wsfleet import lease_rules
from wsfleet import metric_names as m
from wsfleet.backoff import backoff_delays
from wsfleet.lease_rules import Lease, RenewRefusal
from wsfleet.lease_store import LeaseStore, Released, Renewed
from wsfleet.timing import LeaseTiming

log = logging.getLogger(__name__)

TASK_STOP_SECONDS = 2.0
"""How long a cancelled reader or renewer may take to finish (an upstream close
handshake included) before it is left behind."""


def _being_cancelled() -> bool:
    """True when the current task has a cancellation request of its own (from
    ``Task.cancel``), as opposed to a ``CancelledError`` a handler raised by itself."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Ending(enum.Enum):
    """Why a connection stopped running on this worker."""

    SHUTDOWN = "shutdown"
    STOPPED = "stopped"
    RESTARTED = "restarted"
    GONE = "gone"
    LOST = "lost"
    FENCED = "fenced"

    @property
    def graceful(self) -> bool:
        """The lease is ours: finish the handler call in flight, then release."""
        return self in (Ending.SHUTDOWN, Ending.STOPPED, Ending.RESTARTED)

    @property
    def releases(self) -> bool:
        # FENCED: ownership is unknown (DynamoDB unreachable or the process was
        # paused); the release is conditional on owner and epoch, so trying costs
        # nothing when another worker holds it and frees it at once when not.
        return self.graceful or self is Ending.FENCED


_REFUSAL_ENDINGS = {
    RenewRefusal.LOST: Ending.LOST,
    RenewRefusal.STOPPED: Ending.STOPPED,
    RenewRefusal.RESTARTED: Ending.RESTARTED,
    RenewRefusal.GONE: Ending.GONE,
}


@dataclass(frozen=True, slots=True)
class Outcome:
    ending: Ending
    released: bool
    last_seq: int
    restarted: bool = False
    """Started again by the router under a newer generation, seen by the renew or the
    release: the worker takes it again at once."""


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """What every connection of a worker shares."""

    store: LeaseStore
    handler: Handler
    protocol: UpstreamProtocol
    metrics: FleetMetrics
    timing: LeaseTiming
    worker_id: str
    wall_ms: Callable[[], int]
    rng: random.Random
    skip_failed_messages: bool = False
    ping_interval: float = 5.0
    max_message_bytes: int = 1 << 20
    open_timeout: float = 10.0


class ConnectionRunner:
    def __init__(self, settings: ConnectionSettings, lease: Lease, acquire_sent_at: float) -> None:
        """``acquire_sent_at``: loop time taken just before the acquire was sent."""
        self._s = settings
        self.lease = lease
        self.checkpoint = lease.last_seq
        self._deadline = lease_rules.fence_deadline(acquire_sent_at, settings.timing)
        self._next_renew = acquire_sent_at + settings.timing.heartbeat
        self._ending: asyncio.Future[Ending] = asyncio.get_running_loop().create_future()
        self._stopping = False
        self._drain_deadline = self._deadline
        self._idle = asyncio.Event()
        self._idle.set()
        self._handler_scope: asyncio.Timeout | None = None
        self._closed: asyncio.Task[None] | None = None

    @property
    def connection_id(self) -> str:
        return self.lease.connection_id

    @property
    def fence_deadline(self) -> float:
        return self._deadline

    def stop(self, ending: Ending = Ending.SHUTDOWN) -> None:
        """Ask the connection to end; :meth:`run` returns once it has."""
        self._end(ending)

    async def wait_closed(self) -> None:
        """Return once the tasks of an ended connection have finished (bounded)."""
        if self._closed is not None:
            await asyncio.shield(self._closed)

    async def run(self) -> Outcome:
        """Run until the connection ends, then release it (when the ending says so)
        with the final checkpoint. Cancelling ``run`` cuts the wait for the handler
        call in flight short, but the release still happens before it returns."""
        reader = asyncio.create_task(self._read_loop(), name=f"read:{self.connection_id}")
        renewer = asyncio.create_task(self._renew_loop(), name=f"renew:{self.connection_id}")
        reader.add_done_callback(self._task_ended)
        renewer.add_done_callback(self._task_ended)
        try:
            ending = await self._ending
            # Order (docs/DESIGN.md, lease protocol): stop reading, let the handler call
            # in flight finish by the deadline fixed at the stop, then release with the
            # final checkpoint. A lost lease stops at once.
            if ending.graceful:
                await self._drain()
        finally:
            # Every path, cancellation included: a graceful stop that is cancelled
            # still gives the lease back with what was handled.
            self._end(Ending.SHUTDOWN)
            ending = self._ending.result()
            reader.cancel()
            renewer.cancel()
            await self._quiesce()
            released = await self._release() if ending.releases else None
            # The upstream socket may take a moment to close (its close handshake
            # waits behind frames that piled up); the release and the handoff do not
            # wait for it: nothing can be handled on it any more.
            self._closed = asyncio.create_task(
                self._join(reader, renewer), name=f"close:{self.connection_id}"
            )
            self._log_end(ending, released)
        return Outcome(
            ending,
            released is not None and released.released,
            self.checkpoint,
            restarted=ending is Ending.RESTARTED or (released is not None and released.restarted),
        )

    # --- ending ------------------------------------------------------------------------

    def _end(self, ending: Ending) -> None:
        """Decide the ending; the first decision wins. No handler call starts after
        this step, whatever the ending; a graceful one fixes the deadline of the call
        in flight now, so renews during the drain cannot stretch it."""
        if self._ending.done():
            return
        self._stopping = True
        if ending.graceful:
            now = asyncio.get_running_loop().time()
            self._drain_deadline = min(self._deadline, now + self._s.timing.drain_budget)
            if self._handler_scope is not None:
                self._handler_scope.reschedule(self._drain_deadline)
        self._ending.set_result(ending)

    async def _drain(self) -> None:
        """Wait for the handler call in flight, until the drain deadline."""
        try:
            async with asyncio.timeout_at(self._drain_deadline):
                await self._idle.wait()
        except TimeoutError:
            log.warning(
                "handler call still running at the drain deadline; cutting it short",
                extra={"connection_id": self.connection_id, "epoch": self.lease.epoch},
            )

    async def _quiesce(self) -> None:
        """After cancelling the reader: wait until no handler call is in flight, so
        the checkpoint is final before it is released."""
        try:
            async with asyncio.timeout(TASK_STOP_SECONDS):
                await self._idle.wait()
        except TimeoutError:
            # A handler that swallows cancellation: its call may go on, but no new
            # call can start (the connection is ending), so the release goes ahead.
            log.error(
                "handler call did not stop when cancelled",
                extra={"connection_id": self.connection_id, "epoch": self.lease.epoch},
            )

    async def _join(self, *tasks: asyncio.Task[None]) -> None:
        _, pending = await asyncio.wait(tasks, timeout=TASK_STOP_SECONDS)
        for task in pending:
            log.error(
                "connection task did not stop when cancelled",
                extra={"connection_id": self.connection_id, "task": task.get_name()},
            )

    def _log_end(self, ending: Ending, released: Released | None) -> None:
        if ending in (Ending.LOST, Ending.FENCED):
            self._s.metrics.count(m.LEASES_LOST)
        log.info(
            "connection ended",
            extra={
                "connection_id": self.connection_id,
                "epoch": self.lease.epoch,
                "ending": ending.value,
                "released": released is not None and released.released,
                "last_seq": self.checkpoint,
            },
        )

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """Neither task ends on its own while the connection runs, not even cancelled
        (only :meth:`run` cancels them, once the ending is decided); one that did has
        a bug. Whether the lease is still held is then unknown: fence and release."""
        if self._ending.done():
            return
        error = "cancelled" if task.cancelled() else repr(task.exception())
        log.error(
            "connection task ended unexpectedly",
            extra={"connection_id": self.connection_id, "task": task.get_name(), "error": error},
        )
        self._fence(f"{task.get_name()} ended unexpectedly")

    def _fence(self, why: str) -> None:
        if not self._ending.done():
            log.warning(
                "fenced: stop handling",
                extra={"connection_id": self.connection_id, "epoch": self.lease.epoch, "why": why},
            )
        self._end(Ending.FENCED)

    def _stop_requested(self) -> bool:
        # A method, not the attribute: other tasks change it while this one awaits.
        return self._stopping

    def _may_handle(self) -> bool:
        return lease_rules.may_handle(asyncio.get_running_loop().time(), self._deadline)

    async def _release(self) -> Released | None:
        """Release with the final checkpoint, retrying errors (throttling, timeouts)
        with backoff for up to the release budget; None when it never got an answer."""
        loop = asyncio.get_running_loop()
        s = self._s
        give_up_at = loop.time() + s.timing.release_budget
        delays = backoff_delays(
            initial=0.05, maximum=max(0.05, s.timing.heartbeat / 2), rng=s.rng.random
        )
        while True:
            try:
                released = await loop.run_in_executor(
                    None, s.store.release, self.lease, self.checkpoint, s.wall_ms()
                )
            except Exception as error:
                delay = next(delays)
                if loop.time() + delay >= give_up_at:
                    # The lease then lapses on its own and a reconcile reassigns it.
                    log.error(
                        "release failed; giving up",
                        extra={"connection_id": self.connection_id, "error": repr(error)},
                    )
                    return None
                log.warning(
                    "release failed, retrying",
                    extra={"connection_id": self.connection_id, "error": repr(error)},
                )
                await asyncio.sleep(delay)
                continue
            if released.released:
                s.metrics.count(m.LEASES_RELEASED)
            return released

    # --- renewing ----------------------------------------------------------------------

    def _extend(self, renew_sent_at: float) -> None:
        deadline = lease_rules.fence_deadline(renew_sent_at, self._s.timing)
        if deadline > self._deadline:
            self._deadline = deadline
            if self._handler_scope is not None and not self._stopping:
                self._handler_scope.reschedule(deadline)

    async def _renew_loop(self) -> None:
        loop = asyncio.get_running_loop()
        timing = self._s.timing
        while True:
            await asyncio.sleep(max(0.0, min(self._next_renew, self._deadline) - loop.time()))
            if not self._may_handle():
                self._fence("no successful renew before the fence deadline")
                return
            sent_at = loop.time()
            self._s.metrics.renew_lateness(sent_at - self._next_renew)
            try:
                async with asyncio.timeout_at(self._deadline):
                    result = await loop.run_in_executor(
                        None, self._s.store.renew, self.lease, self.checkpoint, self._s.wall_ms()
                    )
            except TimeoutError:
                if not self._may_handle():
                    self._fence("renew still pending at the fence deadline")
                    return
                result = None
            except Exception as error:
                log.warning(
                    "renew failed, retrying",
                    extra={"connection_id": self.connection_id, "error": repr(error)},
                )
                result = None
            if result is None:
                self._s.metrics.count(m.RENEW_FAILURES)
                self._next_renew = loop.time() + timing.heartbeat / 4
                continue
            self._next_renew = sent_at + timing.heartbeat
            if isinstance(result, Renewed):
                self._extend(sent_at)
            elif not result.keeps_lease:
                if result is RenewRefusal.LOST:
                    self._s.metrics.count(m.RENEW_FAILURES)
                log.info(
                    "renew refused",
                    extra={"connection_id": self.connection_id, "reason": result.value},
                )
                self._end(_REFUSAL_ENDINGS[result])
                return

    # --- reading -----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        s = self._s
        delays = backoff_delays(initial=0.25, maximum=30.0, rng=s.rng.random)
        while not self._stopping:
            url = s.protocol.resume_url(self.lease.ws_url, self.checkpoint)
            delivered_before = self.checkpoint
            try:
                async with connect(
                    url,
                    open_timeout=s.open_timeout,
                    ping_interval=s.ping_interval,
                    ping_timeout=s.ping_interval,
                    close_timeout=1.0,
                    max_size=s.max_message_bytes,
                ) as ws:
                    log.info(
                        "upstream connected",
                        extra={
                            "connection_id": self.connection_id,
                            "from_seq": self.checkpoint + 1,
                        },
                    )
                    async for data in ws:
                        if not await self._on_frame(ws, data):
                            break
            except Exception as error:
                log.warning(
                    "upstream connection failed",
                    extra={"connection_id": self.connection_id, "error": repr(error)},
                )
            if self._stop_requested():
                return
            s.metrics.count(m.UPSTREAM_RECONNECTS)
            if self.checkpoint > delivered_before:
                delays = backoff_delays(initial=0.25, maximum=30.0, rng=s.rng.random)
            await asyncio.sleep(next(delays))

    async def _on_frame(self, ws: ClientConnection, data: str | bytes) -> bool:
        """Act on one frame; False means: leave this upstream connection."""
        frame = self._s.protocol.decode(data)
        if isinstance(frame, Reply):
            await ws.send(frame.data)
            return True
        if isinstance(frame, Unreadable):
            log.warning(
                "unreadable upstream frame skipped",
                extra={"connection_id": self.connection_id, "reason": frame.reason},
            )
            return True
        if frame.seq <= self.checkpoint:
            return True  # a duplicate of something already handled
        if frame.seq != self.checkpoint + 1:
            log.warning(
                "gap in upstream seqs; reconnecting to resume",
                extra={
                    "connection_id": self.connection_id,
                    "expected": self.checkpoint + 1,
                    "received": frame.seq,
                },
            )
            return False
        return await self._deliver(frame)

    async def _deliver(self, message: Message) -> bool:
        """Hand one message to the handler until it is handled (or skipped); False
        when the connection must stop reading instead."""
        s = self._s
        delivery = Delivery(
            self.connection_id, self.lease.epoch, message.seq, message.payload, s.worker_id
        )
        delays = backoff_delays(initial=0.1, maximum=10.0, rng=s.rng.random)
        while True:
            if self._stopping:
                return False
            if not self._may_handle():
                self._fence("fence deadline passed before a handler call")
                return False
            self._idle.clear()
            scope = asyncio.timeout_at(self._deadline)
            try:
                async with scope:
                    self._handler_scope = scope
                    await s.handler.handle(delivery)
            except (Exception, asyncio.CancelledError) as error:
                if isinstance(error, asyncio.CancelledError) and _being_cancelled():
                    raise  # the runner is stopping this task, not a handler failure
                if isinstance(error, TimeoutError) and scope.expired():
                    self._fence("handler call ran into the fence deadline")
                    return False
                failure: BaseException | None = error
            else:
                failure = None
            finally:
                self._handler_scope = None
                self._idle.set()
            if failure is None:
                self.checkpoint = message.seq
                s.metrics.count(m.MESSAGES_PROCESSED)
                return True
            s.metrics.count(m.HANDLER_ERRORS)
            log.error(
                "handler failed"
                + ("; message skipped" if s.skip_failed_messages else "; retrying"),
                extra={
                    "connection_id": self.connection_id,
                    "seq": message.seq,
                    "error": repr(failure),
                },
            )
            if s.skip_failed_messages:
                self.checkpoint = message.seq
                return True
            await asyncio.sleep(next(delays))
