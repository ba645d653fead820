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
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from worker.connect_pacing import ConnectPacer
from worker.connection_state import Call, ConnectionState, Ending, Failure, Frame
from worker.credentials import NO_CREDENTIALS, Credentials, SecretCache, SecretError
from worker.delivery import Delivery, Handler
from worker.metrics import FleetMetrics
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


def _being_cancelled() -> bool:
    """True when the current task has a cancellation request of its own (from
    ``Task.cancel``), as opposed to a ``CancelledError`` a handler raised by itself."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass(frozen=True, slots=True)
class Outcome:
    ending: Ending
    released: bool
    last_seq: int
    restarted: bool = False
    """Started again by the router under a newer generation, seen by a notice or the
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
        self._resumed = asyncio.Event()
        """Set by a session renew that moves the deadline, or by the ending."""
        self._ended: asyncio.Future[Ending] = asyncio.get_running_loop().create_future()
        self._idle = asyncio.Event()
        self._idle.set()
        self._handler_scope: asyncio.Timeout | None = None
        self._closed: asyncio.Task[None] | None = None
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
        fence deadline, extend the handler call in flight, wake a paused reader."""
        moved = self.state.renewed(sent_at)
        if moved is not None and self._handler_scope is not None:
            self._handler_scope.reschedule(moved)
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
        with the final checkpoint. Cancelling ``run`` cuts the wait for the handler
        call in flight short, but the release still happens before it returns."""
        reader = asyncio.create_task(self._read_loop(), name=f"read:{self.connection_id}")
        reader.add_done_callback(self._task_ended)
        try:
            ending = await self._ended
            # Order (docs/DESIGN.md §3.3): stop reading, let the handler call in flight
            # finish by the deadline fixed at the stop, then release with the final
            # checkpoint. A reaped session stops at once.
            if ending.graceful:
                await self._drain()
        finally:
            # Every path, cancellation included: a graceful stop that is cancelled
            # still gives the lease back with what was handled.
            self._end(Ending.SHUTDOWN)
            ending = self._ended.result()
            reader.cancel()
            await self._quiesce()
            released = await self._release() if ending.releases else None
            # The upstream socket may take a moment to close (its close handshake
            # waits behind frames that piled up); the release and the handoff do not
            # wait for it: nothing can be handled on it any more.
            self._closed = asyncio.create_task(
                self._join(reader), name=f"close:{self.connection_id}"
            )
            self._log_end(ending, released)
        return Outcome(
            ending,
            released is not None and released.released,
            self.checkpoint,
            restarted=ending is Ending.RESTARTED or (released is not None and released.restarted),
        )

    # --- ending ------------------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

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
        if self._handler_scope is not None:
            self._handler_scope.reschedule(self.state.call_deadline)
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
                if self.parked_reason is not None:
                    released = await loop.run_in_executor(
                        None,
                        s.store.park,
                        self.lease,
                        self.checkpoint,
                        self.parked_reason,
                        s.wall_ms(),
                    )
                else:
                    # A stream that cannot resume leaves when it last moved, for the
                    # next owner's gap.
                    advanced = None if self._resumable else self._advanced_at_ms()
                    extra: dict[str, Any] = {} if advanced is None else {"advanced_at_ms": advanced}
                    released = await loop.run_in_executor(
                        None,
                        functools.partial(
                            s.store.release, self.lease, self.checkpoint, s.wall_ms(), **extra
                        ),
                    )
            except Exception as error:
                delay = next(delays)
                if loop.time() + delay >= give_up_at:
                    # The connection stays owned by this session: the next reconcile
                    # finds it among its own entries, not run, and releases it then.
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
                    async for data in ws:
                        if not await self._on_frame(ws, data):
                            break
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
            ping_timeout=s.ping_interval,
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

    async def _on_frame(self, ws: ClientConnection, data: str | bytes) -> bool:
        """Act on one frame; False means: leave this upstream connection."""
        frame = self.protocol.decode(data)
        if isinstance(frame, Reply):
            await ws.send(frame.data)
            return True
        if isinstance(frame, Unreadable):
            log.warning(
                "unreadable upstream frame skipped",
                extra={"connection_id": self.connection_id, "reason": frame.reason},
            )
            return True
        verdict = self.state.classify(frame.seq)
        if verdict is Frame.DUPLICATE:
            return True
        if verdict is Frame.GAP:
            if not self._resumable:
                return await self._deliver(frame)  # nothing to resume: go on from here
            self._left_because = "gap in upstream seqs"
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
        state = self.state
        loop = asyncio.get_running_loop()
        delivery = Delivery(
            self.connection_id, self.lease.epoch, message.seq, message.payload, s.worker_id
        )
        delays = backoff_delays(initial=0.1, maximum=10.0, rng=s.rng.random)
        while True:
            call = state.before_call(loop.time())
            if call is Call.PAUSE:
                await self._paused()
                continue
            if call is not Call.GO:
                return False
            failure = await self.call_handler(delivery)
            if failure is None:
                state.call_returned(message.seq)
                self._advanced_at = loop.time()
                s.metrics.count(m.MESSAGES_PROCESSED)
                if self._gap_open:
                    self._measure_gap()
                if self.failing.message_handled():
                    await self._clear_failing()
                return True
            hit_deadline = isinstance(failure, DeadlineReachedError)
            verdict = state.call_failed(message.seq, hit_deadline=hit_deadline)
            if verdict is Failure.PAUSE:
                log.warning(
                    "handler call cut at the session's fence deadline; waiting for a renew",
                    extra={"connection_id": self.connection_id, "seq": message.seq},
                )
                continue
            s.metrics.count(m.HANDLER_ERRORS)
            log.error(
                "handler failed"
                + ("; message skipped" if verdict is Failure.SKIP else "; retrying"),
                extra={
                    "connection_id": self.connection_id,
                    "seq": message.seq,
                    "error": repr(failure),
                },
            )
            if verdict is Failure.SKIP:
                return True
            await asyncio.sleep(next(delays))

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
        """One handler call, bounded by the call deadline (the fence deadline, or the
        drain deadline once a graceful ending is decided; moved by session renews
        while it runs); what it raised, if anything (:class:`DeadlineReachedError` when the
        deadline cut it). The reader makes every call through here."""
        self._idle.clear()
        scope = asyncio.timeout_at(self.state.call_deadline)
        try:
            async with scope:
                self._handler_scope = scope
                await self._s.handler.handle(delivery)
        except (Exception, asyncio.CancelledError) as error:
            if isinstance(error, asyncio.CancelledError) and _being_cancelled():
                raise  # the runner is stopping this task, not a handler failure
            if isinstance(error, TimeoutError) and scope.expired():
                return DeadlineReachedError()
            return error
        finally:
            self._handler_scope = None
            self._idle.set()
        return None


class DeadlineReachedError(Exception):
    """The handler call was cut by its deadline."""


def _failure_fields(error: Exception, *, with_secret: bool) -> dict[str, str]:
    """How a failed upstream connection is logged: the error's repr, or, for a
    connection with credentials (whose URL may carry some, and an exception's text may
    quote the URL), its short description and class only."""
    if with_secret:
        return {"error": describe(error), "error_class": type(error).__name__}
    return {"error": repr(error)}
