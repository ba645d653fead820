"""One owned connection: read the upstream, hand messages to the handler, and end
when the router, the session or the worker says so.

One task runs per connection: the reader (connect with resume, receive, deliver,
reconnect with backoff). The connection's item is not renewed: the worker's session
is (worker.session), and each successful session renew moves this connection's fence
deadline through :meth:`ConnectionRunner.session_renewed`. Every decision (duplicate,
gap or next frame; call the handler, wait or stop; retry, skip or wait after a
failure; how the connection ends) is taken by the pure
:class:`~worker.connection_state.ConnectionState`; this module is the plumbing
around it: sockets, tasks, timers, the store, logs and metrics.

The fence deadline ``sent_at(last successful session renew) + lease - skew - margin``
is checked synchronously before every handler call and bounds each call, so a paused
or partitioned worker never hands over a message after another worker may have
reaped its session, even when no condition ever failed. Past it the connection waits
(no handler call) until a later renew of the same session resumes it, or a reap
ends it.

The bound is one watchdog timer per connection, not a timeout scope per call: it is
armed at the call deadline by a call that finds none armed, a renew does not touch
it, and when it fires the state says whether to cut the call in flight, fire again
at the moved deadline, or disarm (no call in flight). The per-message path makes no
object but the :class:`~worker.delivery.Delivery` (and the decoded frame); its common
case (the next seq, a call that may start and returns) is a few comparisons against
the state's fields, and every other case goes through the state's decisions. A batch
handler (``handle_batch``) gets every message already buffered in one call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from worker.config import DEFAULT_PING_TIMEOUT
from worker.connect_pacing import ConnectPacer
from worker.connection_state import Call, ConnectionState, Ending, Failure, Frame, Watch
from worker.credentials import NO_CREDENTIALS, Credentials, SecretCache, SecretError
from worker.delivery import AnyHandler, Delivery, batch_call, make_delivery
from worker.metrics import FleetMetrics
from worker.releasing import release_within_budget
from worker.upstream_failures import FailingClock, Verdict, describe
from worker.upstream_health import UpstreamHealth
from worker.upstream_protocol import (
    Message,
    Reply,
    Unreadable,
    UpstreamProtocol,
    is_resumable,
    open_frames,
    protocol_for,
    reader,
    with_query,
)
from wsfleet import metric_names as m
from wsfleet.backoff import backoff_delays
from wsfleet.checkpoint_page import BACKING_OFF, CONNECTING, STREAMING, PageEntry
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore, Released
from wsfleet.protocol_specs import InvalidProtocolError
from wsfleet.timing import LeaseTiming

log = logging.getLogger(__name__)

AUTH_REFUSALS = frozenset((401, 403))
"""Handshake answers that read the connection's secret again and retry at once."""

_handshake_log = logging.getLogger("worker.upstream.handshake")
# websockets logs a handshake's headers at DEBUG: a connection with credentials logs
# through this logger, which never goes below INFO whatever LOG_LEVEL says.
_handshake_log.setLevel(logging.INFO)

TASK_STOP_SECONDS = 2.0
"""How long a cancelled reader may take to finish (an upstream close
handshake included) before it is left behind."""


@dataclass(frozen=True, slots=True)
class Outcome:
    ending: Ending
    released: bool
    last_seq: int
    restarted: bool = False
    """Started again by the router under a newer generation, seen by a notice or the
    release: the worker takes it again at once."""
    unanswered: PageEntry | None = None
    """The ending released, but the release never got an answer: the final checkpoint
    (as a page entry), which the worker keeps until a release of it is answered."""


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """What every connection of a worker shares."""

    store: LeaseStore
    handler: AnyHandler
    protocol: UpstreamProtocol
    metrics: FleetMetrics
    timing: LeaseTiming
    worker_id: str
    wall_ms: Callable[[], int]
    rng: random.Random
    skip_failed_messages: bool = False
    ping_interval: float = 5.0
    ping_timeout: float = DEFAULT_PING_TIMEOUT
    max_message_bytes: int = 1 << 20
    open_timeout: float = 10.0
    fail_after: float = 600.0
    """Seconds of failed attempts with no message handled before a connection is
    parked (``UPSTREAM_FAIL_AFTER_SECONDS``)."""
    secrets: SecretCache | None = None
    """Where connections that name a secret read their credentials (None: such a
    connection cannot connect)."""
    pacer: ConnectPacer = field(default_factory=ConnectPacer)
    """Paces every connect attempt per upstream host (``UPSTREAM_CONNECT_BURST``,
    ``UPSTREAM_CONNECTS_PER_SECOND``); the default paces nothing."""


class ConnectionRunner:
    def __init__(self, settings: ConnectionSettings, lease: Lease, deadline: float) -> None:
        """``deadline``: the session's fence deadline at the moment of the acquire."""
        self._s = settings
        self.lease = lease
        self.state = ConnectionState(
            settings.timing,
            checkpoint=lease.last_seq,
            deadline=deadline,
            skip_failed_messages=settings.skip_failed_messages,
        )
        self._advanced_at: float | None = None
        """Loop time of the last checkpoint advance (for the page's "advanced at")."""
        self.health = UpstreamHealth(asyncio.get_running_loop().time(), lease.last_seq)
        self._loop = asyncio.get_running_loop()
        self._clock = _clock_of(self._loop)
        self._tally = settings.metrics.handled
        self._resumed = asyncio.Event()
        """Set by a session renew that moves the deadline, or by the ending."""
        self._ended: asyncio.Future[Ending] = self._loop.create_future()
        self._call_task: asyncio.Task[Any] | None = None
        """The task of the handler call in flight (None: no call in flight)."""
        self._idle_waiter: asyncio.Future[None] | None = None
        """Made only by a wait for the call in flight to end; resolved when it does."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._cut = False
        """The watchdog cut the call in flight (its task has a cancel request of ours)."""
        self._closed: asyncio.Task[None] | None = None
        self.outcome: Outcome | None = None
        """How the connection ended, once it has (also when :meth:`run` was cancelled)."""
        self.failing = FailingClock(
            fail_after_ms=round(settings.fail_after * 1000),
            failing_since_ms=lease.failing_since_ms,
        )
        self.parked_reason: str | None = None
        """Set with the ``PARKED`` ending: what the park write records."""
        self._left_because: str | None = None
        """Why the reader left the current upstream connection itself, if it did."""
        self._protocol_error: str | None = None
        try:
            self.protocol = protocol_for(lease.protocol, settings.protocol)
        except InvalidProtocolError as error:
            self.protocol = settings.protocol
            self._protocol_error = str(error)
        self._resumable = is_resumable(self.protocol)
        self._gap_open = False
        """A stream that cannot resume has (re)connected: its first delivery measures
        the gap since the previous one."""
        self._gap_from: float | None = None
        """Loop time of this hold's last delivery before the current upstream
        connection (None: none in this hold; the lease's ``advanced_at_ms`` then)."""

    @property
    def connection_id(self) -> str:
        return self.lease.connection_id

    @property
    def checkpoint(self) -> int:
        return self.state.checkpoint

    @property
    def ending(self) -> bool:
        """Whether an ending has been decided (the connection is on its way out)."""
        return self.state.ending is not None

    @property
    def fence_deadline(self) -> float:
        return self.state.deadline

    def stop(self, ending: Ending = Ending.SHUTDOWN) -> None:
        """Ask the connection to end; :meth:`run` returns once it has."""
        self._end(ending)

    def session_renewed(self, sent_at: float) -> None:
        """The session was renewed by a write sent at ``sent_at`` (loop time): move the
        fence deadline (which extends the handler call in flight), wake a paused
        reader."""
        # The watchdog is not moved: it looks at the state's deadline when it fires.
        self.state.renewed(sent_at)
        if self.state.may_handle(self._now()):
            self._resumed.set()

    def page_entry(self, now: float, now_ms: int) -> PageEntry:
        """This connection's line of the session's checkpoint page: only what handler
        calls that returned have passed, and how the upstream is doing (its rate over
        the time since the previous line)."""
        advanced = self._advanced_at
        health = self.health
        return PageEntry(
            epoch=self.lease.epoch,
            seq_gen=self.lease.seq_gen,
            seq=self.state.checkpoint,
            advanced_at_ms=None if advanced is None else now_ms - round((now - advanced) * 1000),
            rate=health.rate_since_last(now, self.state.checkpoint),
            status=health.status,
            reconnects=health.reconnects,
            last_error=health.last_error,
        )

    async def wait_closed(self) -> None:
        """Return once the tasks of an ended connection have finished (bounded)."""
        if self._closed is not None:
            await asyncio.shield(self._closed)

    async def run(self) -> Outcome:
        """Run until the connection ends, then release it (when the ending says so)
        with the final checkpoint, and return how it ended.

        Cancelling ``run`` cuts the wait for the handler call in flight short, but
        the connection still ends in order, its release included, and only then is
        the cancellation raised; the outcome is then in :attr:`outcome`."""
        reader = asyncio.create_task(self._read_loop(), name=f"read:{self.connection_id}")
        reader.add_done_callback(self._task_ended)
        cancelled = False
        try:
            # Shielded: a cancellation must not cancel the ending's own future.
            ending = await asyncio.shield(self._ended)
            # Order (docs/DESIGN.md §3.3): stop reading, let the handler call in flight
            # finish by the deadline fixed at the stop, then release with the final
            # checkpoint. A reaped session stops at once.
            if ending.graceful:
                await self._drain()
        except asyncio.CancelledError:
            # A graceful stop that is cancelled still gives the lease back with what
            # was handled.
            cancelled = True
        finish = asyncio.ensure_future(self._finish(reader))
        while not finish.done():
            try:
                await asyncio.shield(finish)
            except asyncio.CancelledError:
                cancelled = True  # cancelled again: the ending still completes
        self.outcome = finish.result()
        if cancelled:
            raise asyncio.CancelledError
        return self.outcome

    async def _finish(self, reader: asyncio.Task[None]) -> Outcome:
        """End the connection: stop reading, wait for the call in flight, release."""
        self._end(Ending.SHUTDOWN)
        ending = self._ended.result()
        reader.cancel()
        await self._quiesce()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        released = await self._release() if ending.releases else None
        # The upstream socket may take a moment to close (its close handshake waits
        # behind frames that piled up); the release and the handoff do not wait for
        # it: nothing can be handled on it any more.
        self._closed = asyncio.create_task(self._join(reader), name=f"close:{self.connection_id}")
        self._log_end(ending, released)
        unanswered = None
        if ending.releases and released is None:
            unanswered = self.page_entry(self._now(), self._s.wall_ms())
        return Outcome(
            ending,
            released is not None and released.released,
            self.checkpoint,
            restarted=ending is Ending.RESTARTED or (released is not None and released.restarted),
            unanswered=unanswered,
        )

    # --- ending ------------------------------------------------------------------------

    def _now(self) -> float:
        return self._loop.time()

    def _end(self, ending: Ending) -> None:
        """Decide the ending (the first decision wins). No handler call starts after
        this step, whatever the ending; a graceful one bounds the call in flight by
        the deadline of this moment."""
        self.state.end(ending, self._now())
        self._carry_ending()

    def _carry_ending(self) -> None:
        """Carry an ending the state decided into the runner, in the same step: bound
        the call in flight by its new deadline and wake :meth:`run`."""
        ending = self.state.ending
        if ending is None or self._ended.done():
            return
        if self._watchdog is not None:
            # The call deadline may have moved earlier (the drain's): re-arm at it.
            self._watchdog.cancel()
            self._watchdog = self._loop.call_at(self.state.call_deadline, self._watch)
        self._resumed.set()
        self._ended.set_result(ending)

    def _fenced(self, why: str) -> None:
        """The state has just fenced the connection (or had already ended it)."""
        if not self._ended.done():
            log.warning(
                "fenced: stop handling",
                extra={"connection_id": self.connection_id, "epoch": self.lease.epoch, "why": why},
            )
        self._end(Ending.FENCED)

    async def _drain(self) -> None:
        """Wait for the handler call in flight, until the drain deadline."""
        try:
            async with asyncio.timeout_at(self.state.drain_deadline):
                await self._call_ended()
        except TimeoutError:
            log.warning(
                "handler call still running at the drain deadline; cutting it short",
                extra={"connection_id": self.connection_id, "epoch": self.lease.epoch},
            )

    async def _call_ended(self) -> None:
        """Return once no handler call is in flight."""
        if self._call_task is None:
            return
        if self._idle_waiter is None or self._idle_waiter.done():
            self._idle_waiter = self._loop.create_future()
        await asyncio.shield(self._idle_waiter)

    async def _quiesce(self) -> None:
        """After cancelling the reader: wait until no handler call is in flight, so
        the checkpoint is final before it is released."""
        try:
            async with asyncio.timeout(TASK_STOP_SECONDS):
                await self._call_ended()
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
        if ending.loses_lease:
            self._s.metrics.count(m.LEASES_LOST)
        log.info(
            "connection ended",
            extra={
                "connection_id": self.connection_id,
                "epoch": self.lease.epoch,
                "ending": ending.value,
                "released": released is not None and released.released,
                "parked": released is not None and released.parked,
                "parked_reason": self.parked_reason,
                "last_seq": self.checkpoint,
            },
        )

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """The reader never ends on its own while the connection runs, not even
        cancelled (only :meth:`run` cancels it, once the ending is decided); one that
        did has a bug. Whether the lease is still held is then unknown: fence and
        release."""
        if self._ended.done():
            return
        error = "cancelled" if task.cancelled() else repr(task.exception())
        log.error(
            "connection task ended unexpectedly",
            extra={"connection_id": self.connection_id, "task": task.get_name(), "error": error},
        )
        self._fenced(f"{task.get_name()} ended unexpectedly")

    def _stop_requested(self) -> bool:
        # A method, not the attribute: other tasks change it while this one awaits.
        return self.state.stopping

    async def _release(self) -> Released | None:
        """Release (or park) with the final checkpoint, retrying errors for up to the
        release budget; None when it never got an answer."""
        s = self._s
        if self.parked_reason is not None:
            write = functools.partial(
                s.store.park, self.lease, self.checkpoint, self.parked_reason, s.wall_ms()
            )
        else:
            # A stream that cannot resume leaves when it last moved, for the next
            # owner's gap.
            advanced = None if self._resumable else self._advanced_at_ms()
            extra: dict[str, Any] = {} if advanced is None else {"advanced_at_ms": advanced}
            write = functools.partial(
                s.store.release, self.lease, self.checkpoint, s.wall_ms(), **extra
            )
        released = await release_within_budget(write, self.connection_id, s.timing, s.rng)
        if released is None:
            # The connection stays owned by this session: the next reconcile finds it
            # among its own entries, not run, and releases it then.
            return None
        if released.released:
            s.metrics.count(m.LEASES_RELEASED)
        if released.parked:
            s.metrics.count(m.CONNECTIONS_FAILED)
        return released

    # --- reading -----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        s = self._s
        delays = backoff_delays(initial=0.25, maximum=30.0, rng=s.rng.random)
        health = self.health
        if self._protocol_error is not None:
            log.warning(
                "stored protocol does not validate: parking the connection",
                extra={"connection_id": self.connection_id, "reason": self._protocol_error},
            )
            self.parked_reason = f"invalid protocol: {self._protocol_error}"
            self._end(Ending.PARKED)
            return
        while not self._stop_requested():
            url = self.protocol.resume_url(self.lease.ws_url, self.checkpoint)
            delivered_before = self.checkpoint
            failure: Exception | None = None
            self._left_because = None
            health.status = CONNECTING
            await s.pacer.wait(url)  # cancelled by a stop like every other wait here
            try:
                ws, frames = await self._open(url)
                async with ws:
                    # Before anything is read: a subscribe that the upstream waits for.
                    for frame in frames:
                        await ws.send(frame)
                    health.status = STREAMING
                    log.info(
                        "upstream connected",
                        extra={
                            "connection_id": self.connection_id,
                            "from_seq": self.checkpoint + 1,
                        },
                    )
                    if not self._resumable:
                        self._gap_open, self._gap_from = True, self._advanced_at
                    await self._receive(ws)
            except Exception as error:
                failure = error
                log.warning(
                    "upstream connection failed",
                    extra={
                        "connection_id": self.connection_id,
                        **_failure_fields(error, with_secret=self.lease.auth_secret is not None),
                    },
                )
            if self._stop_requested():
                return
            delivered = self.checkpoint > delivered_before
            health.attempt_ended(
                self._left_because or describe(failure, delivered=delivered), BACKING_OFF
            )
            park_in: float | None = None
            if delivered:
                delays = backoff_delays(initial=0.25, maximum=30.0, rng=s.rng.random)
            else:
                failed = self.failing.attempt_failed(failure, s.wall_ms())
                if failed.verdict is Verdict.PARK:
                    log.warning(
                        "upstream given up on: parking the connection",
                        extra={"connection_id": self.connection_id, "reason": failed.reason},
                    )
                    self.parked_reason = failed.reason
                    self._end(Ending.PARKED)
                    return
                if failed.record:
                    await self._mark_failing()
                park_in = failed.park_in
            s.metrics.count(m.UPSTREAM_RECONNECTS)
            delay = next(delays)
            if park_in is not None:
                # The next attempt comes by the end of the failing time at the latest,
                # so a 30 s backoff does not stretch it.
                delay = min(delay, max(park_in, 0.05))
            await asyncio.sleep(delay)

    async def _open(self, url: str) -> tuple[ClientConnection, list[str]]:
        """Connect to ``url`` with the connection's credentials (from its secret, when
        it names one: headers in the handshake, query parameters in this attempt's
        URL only) and make the frames to send first. A handshake refused with 401 or
        403 reads the secret again and tries once more at once; refused again, the
        refusal stands (a permanent one, which parks)."""
        reference = self.lease.auth_secret
        credentials = await self._credentials(reference)
        try:
            return await self._connect(url, credentials)
        except InvalidStatus as refused:
            status = refused.response.status_code
            if reference is None or self._s.secrets is None or status not in AUTH_REFUSALS:
                raise
            log.warning(
                "upstream refused the credentials; reading the secret again",
                extra={"connection_id": self.connection_id, "secret": reference, "status": status},
            )
            self._s.secrets.invalidate(reference, credentials)
            credentials = await self._credentials(reference)
            await self._s.pacer.wait(url)  # a mass rotation must not burst either
            return await self._connect(url, credentials)

    async def _credentials(self, reference: str | None) -> Credentials:
        if reference is None:
            return NO_CREDENTIALS
        if self._s.secrets is None:
            raise SecretError(reference, "no secret store configured")
        try:
            async with asyncio.timeout(self._s.open_timeout):
                return await self._s.secrets.get(reference)
        except SecretError as error:
            log.warning(
                "secret not usable",
                extra={
                    "connection_id": self.connection_id,
                    "secret": reference,
                    "reason": error.reason,
                },
            )
            raise

    async def _connect(
        self, url: str, credentials: Credentials
    ) -> tuple[ClientConnection, list[str]]:
        s = self._s
        frames = open_frames(self.protocol, self.checkpoint, credentials.fields)
        ws = await connect(
            with_query(url, credentials.query),
            additional_headers=dict(credentials.headers) or None,
            open_timeout=s.open_timeout,
            ping_interval=s.ping_interval,
            ping_timeout=s.ping_timeout,
            close_timeout=1.0,
            max_size=s.max_message_bytes,
            logger=None if credentials is NO_CREDENTIALS else _handshake_log,
        )
        return ws, frames

    def _measure_gap(self) -> None:
        """The first delivery of a stream that cannot resume after it (re)connected:
        what was sent since the previous delivery (this hold's, or the previous
        owner's) is lost; the time between the two is the gap."""
        self._gap_open = False
        s = self._s
        if self._gap_from is not None and self._advanced_at is not None:
            gap_ms = (self._advanced_at - self._gap_from) * 1000
        elif self.lease.advanced_at_ms is not None:
            gap_ms = s.wall_ms() - self.lease.advanced_at_ms
        else:
            return  # nothing delivered before: nothing to miss
        gap_ms = max(0, round(gap_ms))
        s.metrics.upstream_gap(gap_ms)
        log.info(
            "stream cannot resume: gap since the previous delivery",
            extra={"connection_id": self.connection_id, "gap_ms": gap_ms},
        )

    def _advanced_at_ms(self) -> int | None:
        """Wall-clock ms of this hold's last checkpoint advance (None: none)."""
        advanced = self._advanced_at
        if advanced is None:
            return None
        return self._s.wall_ms() - round((self._now() - advanced) * 1000)

    async def _mark_failing(self) -> None:
        """Write when the failing streak began (once per streak): the next owner goes on
        from there. A write that fails is tried again at the next failed attempt."""
        since = self.failing.failing_since_ms
        if since is None:  # pragma: no cover - attempt_failed has just set it
            return
        s = self._s
        if await self._failing_write(s.store.record_failing_since, since, s.wall_ms()):
            self.failing.recorded()

    async def _clear_failing(self) -> None:
        """A message was handled after a failing streak: remove the mark (one write; a
        write that fails is tried again after the next handled message)."""
        if await self._failing_write(self._s.store.clear_failing_since, self._s.wall_ms()):
            self.failing.cleared()

    async def _failing_write(self, write: Callable[..., bool], *args: int) -> bool:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._s.timing.heartbeat):
                return await loop.run_in_executor(None, write, self.lease, *args)
        except Exception as error:
            log.warning(
                "could not write the failing mark",
                extra={"connection_id": self.connection_id, "error": repr(error)},
            )
            return False

    # --- the per-message path ----------------------------------------------------------

    async def _receive(self, ws: ClientConnection) -> None:
        """Hand the upstream's messages to the handler, one call per message, until
        this upstream connection must be left (a gap, the connection ending) or it
        closes (a normal close ends the iteration, others raise)."""
        s = self._s
        handle_batch = batch_call(s.handler)
        if handle_batch is not None:
            await self._receive_batches(ws, handle_batch)
            return
        handle: Callable[[Delivery], Awaitable[None]] = s.handler.handle  # type: ignore[union-attr]
        state = self.state
        clock = self._clock
        read = reader(self.protocol)
        connection_id, epoch, worker_id = self.connection_id, self.lease.epoch, s.worker_id
        task = asyncio.current_task()
        assert task is not None
        async for data in ws:
            frame = read(data)
            if isinstance(frame, tuple):
                seq, payload = frame
            elif isinstance(frame, Message):
                seq, payload = frame.seq, frame.payload
            else:
                await self._not_a_message(ws, frame)
                continue
            # seq == checkpoint + 1 is Frame.NEXT; the state classifies the rest.
            if seq != state.checkpoint + 1 and not self._takes(seq):
                if self._out_of_order(seq):
                    continue
                return
            delivery = make_delivery(connection_id, epoch, seq, payload, worker_id)
            # The common case, inline: the call may start (ConnectionState.before_call
            # says GO exactly when now < go_until) and returns.
            if clock() < state.go_until:
                failure = await self._call(task, handle, delivery)
                if failure is None:
                    if self._handled(seq, 1):
                        await self._clear_failing()
                    continue
                call_now: Call | None = Call.GO
            else:
                call_now, failure = None, None
            if not await self._deliver(task, handle, delivery, seq, 1, call_now, failure):
                return

    async def _receive_batches(
        self,
        ws: ClientConnection,
        handle_batch: Callable[[Sequence[Delivery]], Awaitable[None]],
    ) -> None:
        """As :meth:`_receive`, with a batch handler: each call gets every message
        already buffered when the previous call returned, in seq order; a gap ends the
        batch before it (and then this upstream connection)."""
        s = self._s
        state = self.state
        clock = self._clock
        read = reader(self.protocol)
        connection_id, epoch, worker_id = self.connection_id, self.lease.epoch, s.worker_id
        buffered = ws.recv_messages.frames.queue
        task = asyncio.current_task()
        assert task is not None
        async for data in ws:
            batch: list[Delivery] = []
            last = state.checkpoint
            leave = False
            while True:
                frame = read(data)
                if isinstance(frame, tuple):
                    seq, payload = frame
                elif isinstance(frame, Message):
                    seq, payload = frame.seq, frame.payload
                else:
                    await self._not_a_message(ws, frame)
                    seq = 0
                if not seq:
                    pass
                # seq == last + 1 is Frame.NEXT; the state classifies the rest.
                elif seq == last + 1 or self._takes(seq, last):
                    last = seq
                    batch.append(make_delivery(connection_id, epoch, seq, payload, worker_id))
                elif not self._out_of_order(seq, last):
                    leave = True
                    break
                # A whole message already buffered (websockets keeps the data frames
                # it received there; the first of a fragmented message is not final
                # and the batch stops before it): recv returns it at once.
                if not buffered or not buffered[0].fin:
                    break
                data = await ws.recv()
            if batch:
                # The common case inline, as in _receive.
                if clock() < state.go_until:
                    failure = await self._call(task, handle_batch, batch)
                    if failure is None:
                        if self._handled(last, len(batch)):
                            await self._clear_failing()
                        if leave:
                            return
                        continue
                    call_now: Call | None = Call.GO
                else:
                    call_now, failure = None, None
                if not await self._deliver(
                    task, handle_batch, batch, last, len(batch), call_now, failure
                ):
                    return
            if leave:
                return

    async def _not_a_message(self, ws: ClientConnection, frame: Reply | Unreadable) -> None:
        """Answer an application-level ping; log and skip an unreadable frame."""
        if isinstance(frame, Reply):
            await ws.send(frame.data)
            return
        log.warning(
            "unreadable upstream frame skipped",
            extra={"connection_id": self.connection_id, "reason": frame.reason},
        )

    def _takes(self, seq: int, after: int | None = None) -> bool:
        """A message past a gap that is delivered anyway: the stream cannot resume,
        so there is nothing to ask for again; it goes on from there (§4.6)."""
        return not self._resumable and self.state.classify(seq, after) is Frame.GAP

    def _out_of_order(self, seq: int, after: int | None = None) -> bool:
        """A message that is not the next one (``after``: the last seq of the batch
        being gathered): True for a duplicate (dropped); False for a gap (leave this
        upstream connection, resume from the checkpoint)."""
        if self.state.classify(seq, after) is not Frame.GAP:
            return True
        self._left_because = "gap in upstream seqs"
        log.warning(
            "gap in upstream seqs; reconnecting to resume",
            extra={
                "connection_id": self.connection_id,
                "expected": (self.checkpoint if after is None else after) + 1,
                "received": seq,
            },
        )
        return False

    async def _deliver(
        self,
        task: asyncio.Task[Any],
        call: Callable[[Any], Awaitable[None]],
        arg: Any,
        last: int,
        count: int,
        call_now: Call | None = None,
        failure: BaseException | None = None,
    ) -> bool:
        """Hand one message, or one batch of ``count`` messages ending at seq ``last``,
        to the handler until it is handled (or skipped); False when the connection
        must stop reading instead. A batch is retried, skipped or cut whole.

        ``call_now``, ``failure``: a first attempt made by the caller (what
        :meth:`ConnectionState.before_call` said and, for ``GO``, how the call
        failed); this goes on from there."""
        s = self._s
        state = self.state
        loop = self._loop
        delays: Iterator[float] | None = None
        while True:
            if call_now is None:
                call_now = state.before_call(loop.time())
                failure = await self._call(task, call, arg) if call_now is Call.GO else None
            if call_now is not Call.GO:
                if call_now is not Call.PAUSE:
                    return False
                call_now = None
                await self._paused()
                continue
            call_now = None
            if failure is None:
                if self._handled(last, count):
                    await self._clear_failing()
                return True
            hit_deadline = isinstance(failure, DeadlineReachedError)
            verdict = state.call_failed(last, hit_deadline=hit_deadline)
            # What the log lines below name; it decides nothing.
            seqs = (  # pragma: no mutate
                {"seq": last} if count == 1 else {"seq": last - count + 1, "last_seq": last}
            )
            if verdict is Failure.PAUSE:
                log.warning(
                    "handler call cut at the session's fence deadline; waiting for a renew",
                    extra={"connection_id": self.connection_id, **seqs},
                )
                continue
            s.metrics.count(m.HANDLER_ERRORS, count)
            log.error(
                "handler failed"
                + ("; message skipped" if verdict is Failure.SKIP else "; retrying"),
                extra={"connection_id": self.connection_id, **seqs, "error": repr(failure)},
            )
            if verdict is Failure.SKIP:
                return True
            if delays is None:
                delays = backoff_delays(initial=0.1, maximum=10.0, rng=s.rng.random)
            await asyncio.sleep(next(delays))

    def _handled(self, last: int, count: int) -> bool:
        """A call of ``count`` messages up to seq ``last`` returned: pass the
        checkpoint over them. True when the failing mark must now be cleared."""
        self.state.call_returned(last)
        self._advanced_at = self._clock()
        self._tally.messages += count
        if self._gap_open:
            self._measure_gap()
        failing = self.failing
        # message_handled() has nothing to do unless a failing streak is on.
        return (failing.failing_since_ms is not None or failing.on_item) and (
            failing.message_handled()
        )

    async def _paused(self) -> None:
        """Wait, handling nothing, until a session renew moves the fence deadline or
        the connection ends."""
        self._resumed.clear()
        if self.state.may_handle(self._now()) or self.state.stopping:
            return
        log.warning(
            "session fence deadline passed: pausing",
            extra={"connection_id": self.connection_id, "epoch": self.lease.epoch},
        )
        await self._resumed.wait()

    async def call_handler(self, delivery: Delivery) -> BaseException | None:
        """One call of the handler's ``handle``, as the reader makes them (see
        :meth:`_call`)."""
        task = asyncio.current_task()
        assert task is not None
        handle: Callable[[Delivery], Awaitable[None]] = self._s.handler.handle  # type: ignore[union-attr]
        return await self._call(task, handle, delivery)

    async def _call(
        self, task: asyncio.Task[Any], call: Callable[[Any], Awaitable[None]], arg: Any
    ) -> BaseException | None:
        """One handler call in ``task`` (the current one), bounded by the call deadline
        (the fence deadline, or the drain deadline once a graceful ending is decided;
        moved by session renews while it runs); what it raised, if anything
        (:class:`DeadlineReachedError` when the deadline cut it)."""
        if self._watchdog is None:
            self._watchdog = self._loop.call_at(self.state.call_deadline, self._watch)
        self._call_task = task
        try:
            await call(arg)
        except (Exception, asyncio.CancelledError) as error:
            if self._cut:
                # Our cancel request is answered here, whatever the handler did with it.
                self._cut = False
                if task.uncancel() == 0 and isinstance(error, asyncio.CancelledError):
                    return DeadlineReachedError()
            if isinstance(error, asyncio.CancelledError) and task.cancelling() > 0:
                # A cancellation request of the task's own (the runner is stopping
                # it), not a CancelledError the handler raised by itself.
                raise
            return error
        finally:
            self._call_task = None
            waiter = self._idle_waiter
            if waiter is not None:
                self._idle_waiter = None
                if not waiter.done():
                    waiter.set_result(None)
        if self._cut:  # cut, but the handler swallowed the cancellation and returned
            self._cut = False
            task.uncancel()
        return None

    def _watch(self) -> None:
        """The watchdog's timer fired: cut the call in flight at its deadline."""
        self._watchdog = None
        task = self._call_task
        watch = self.state.watchdog(self._loop.time(), in_call=task is not None)
        if watch is Watch.LATER:
            self._watchdog = self._loop.call_at(self.state.call_deadline, self._watch)
        elif watch is Watch.CUT and task is not None:
            self._cut = True
            task.cancel()


def _clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's clock as one C call: asyncio's loops read ``time.monotonic``
    (``BaseEventLoop.time``); another loop's own ``time`` otherwise."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


class DeadlineReachedError(Exception):
    """The handler call was cut by its deadline."""


def _failure_fields(error: Exception, *, with_secret: bool) -> dict[str, str]:
    """How a failed upstream connection is logged: the error's repr, or, for a
    connection with credentials (whose URL may carry some, and an exception's text may
    quote the URL), its short description and class only."""
    if with_secret:
        return {"error": describe(error), "error_class": type(error).__name__}
    return {"error": repr(error)}
