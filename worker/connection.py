"""One owned connection: read the upstream, hand messages to the handler, and end
when the router, the session or the worker says so.

One task runs per connection: the reader. The connection's item is not renewed: the
worker's session is (worker.session), and each successful session renew moves this
connection's fence deadline through :meth:`ConnectionRunner.session_renewed`. Every
decision (duplicate, gap or next frame; call the handler, wait or stop; retry, skip or
wait after a failure; how the connection ends) is taken by the pure
:class:`~worker.connection_state.ConnectionState`.

The runner composes the parts that act on those decisions, each knowing only what it
is given (the state, the settings, the lease, and the objects it reports through):

- :class:`~worker.upstream_link.UpstreamLink`: connect with resume and credentials,
  reconnect with backoff, give a failing upstream up (the reason to park);
- :class:`~worker.message_pump.MessagePump`: frames to handler calls, single or
  batched, pausing past the fence deadline, retrying or skipping failed calls;
- :class:`~worker.handler_calls.HandlerCalls`: each handler call, bounded by the
  connection's watchdog;
- :class:`~worker.failing_mark.FailingMark`: the failing streak's mark on the item.

The runner itself keeps how the connection ends: deciding the ending, draining the
call in flight, releasing (or parking) with the final checkpoint, and the outcome.

The fence deadline ``sent_at(last successful session renew) + lease - margin``
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from worker.connection_settings import ConnectionSettings
from worker.connection_state import ConnectionState, Ending, Restarts
from worker.delivery import Delivery
from worker.failing_mark import FailingMark
from worker.handler_calls import HandlerCalls
from worker.message_pump import MessagePump
from worker.protocol_plugins import PluginSetupError, connection_protocol
from worker.releasing import release_within_budget
from worker.sequence_restarts import SequenceRestarts, lease_in_generation
from worker.upstream_failures import FailingClock
from worker.upstream_health import UpstreamHealth
from worker.upstream_link import UpstreamLink
from worker.upstream_protocol import is_resumable, restart_rule
from wsfleet import metric_names as m
from wsfleet.checkpoint_page import PageEntry
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import Released
from wsfleet.protocol_specs import InvalidProtocolError, UnknownProtocolError

log = logging.getLogger(__name__)

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


class ConnectionRunner:
    def __init__(self, settings: ConnectionSettings, lease: Lease, deadline: float) -> None:
        """``deadline``: the session's fence deadline at the moment of the acquire."""
        self._s = settings
        self._won = lease
        self.state = ConnectionState(
            settings.timing,
            checkpoint=lease.last_seq,
            deadline=deadline,
            skip_failed_messages=settings.skip_failed_messages,
            seq_gen=lease.seq_gen,
        )
        self._loop = asyncio.get_running_loop()
        self.health = UpstreamHealth(self._loop.time(), lease.last_seq)
        self._resumed = asyncio.Event()
        """Set by a session renew that moves the deadline, or by the ending."""
        self._ended: asyncio.Future[Ending] = self._loop.create_future()
        self._closed: asyncio.Task[None] | None = None
        self.outcome: Outcome | None = None
        """How the connection ended, once it has (also when :meth:`run` was cancelled)."""
        self.failing = FailingClock(
            fail_after_ms=round(settings.fail_after * 1000),
            failing_since_ms=lease.failing_since_ms,
        )
        self.parked_reason: str | None = None
        """Set with the ``PARKED`` ending: what the park write records."""
        self._protocol_error: str | None = None
        """Why the connection's protocol cannot be used: it parks with this reason."""
        try:
            self.protocol = connection_protocol(
                lease.protocol, settings.protocol, settings.plugins, settings.max_message_bytes
            )
        except UnknownProtocolError as error:
            # Deployments out of step: a router that knows a plug-in this worker lacks.
            self.protocol = settings.protocol
            self._protocol_error = (
                f"protocol {error.name!r} is not registered on this worker "
                f"(it has {', '.join(error.known)})"
            )
        except InvalidProtocolError as error:
            self.protocol = settings.protocol
            self._protocol_error = f"invalid protocol: {error}"
        except PluginSetupError as error:
            self.protocol = settings.protocol
            self._protocol_error = str(error)
        self._resumable = is_resumable(self.protocol)
        self.state.restarts = Restarts(restart_rule(self.protocol))
        self._calls = HandlerCalls(self.state, self._loop)
        mark = FailingMark(self.failing, settings.store, lease, settings.timing, settings.wall_ms)
        restarts = SequenceRestarts(settings.store, lease, settings.timing, settings.wall_ms)
        self.pump = MessagePump(
            settings, lease, self.protocol, self.state, self._calls, mark, restarts, self._resumed
        )
        self._link = UpstreamLink(settings, lease, self.protocol, self.state, self.health, mark)

    @property
    def lease(self) -> Lease:
        """The lease as this holder counts now: in the sequence generation its stream
        is in (a restart of the upstream's numbering begins another)."""
        return lease_in_generation(self._won, self.state.seq_gen)

    @property
    def connection_id(self) -> str:
        return self._won.connection_id

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
        if self.state.may_handle(self._loop.time()):
            self._resumed.set()

    def page_entry(self, now: float, now_ms: int) -> PageEntry:
        """This connection's line of the session's checkpoint page: only what handler
        calls that returned have passed, and how the upstream is doing (its rate over
        the time since the previous line)."""
        advanced = self.pump.advanced_at
        health = self.health
        return PageEntry(
            epoch=self._won.epoch,
            seq_gen=self.state.seq_gen,
            seq=self.state.checkpoint,
            advanced_at_ms=None if advanced is None else now_ms - round((now - advanced) * 1000),
            rate=health.rate_since_last(now, self.state.checkpoint),
            status=health.status,
            reconnects=health.reconnects,
            last_error=health.last_error,
            keepalive_sent_ms=health.keepalive_sent_ms,
            keepalive_answered_ms=health.keepalive_answered_ms,
        )

    async def call_handler(self, delivery: Delivery) -> BaseException | None:
        """One call of the handler's ``handle``, as the reader makes them
        (:meth:`HandlerCalls.call`)."""
        task = asyncio.current_task()
        assert task is not None
        handle: Callable[[Delivery], Awaitable[None]] = self._s.handler.handle  # type: ignore[union-attr]
        return await self._calls.call(task, handle, delivery)

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
        reader = asyncio.create_task(self._read(), name=f"read:{self.connection_id}")
        reader.add_done_callback(self._task_ended)
        cancelled = False
        try:
            # Shielded: a cancellation must not cancel the ending's own future.
            ending = await asyncio.shield(self._ended)
            # Order (docs/DESIGN.md §3.3): stop reading, let the handler call in flight
            # finish by the deadline fixed at the stop, then release with the final
            # checkpoint. A reaped session stops at once.
            if ending.graceful and not await self._calls.ended_by(self.state.drain_deadline):
                log.warning(
                    "handler call still running at the drain deadline; cutting it short",
                    extra={"connection_id": self.connection_id, "epoch": self.lease.epoch},
                )
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

    async def _read(self) -> None:
        """The reader: the upstream link, its connections pumped to the handler, until
        the connection ends, or the upstream is given up on (parked)."""
        if self._protocol_error is not None:
            log.warning(
                "the connection's protocol cannot be used: parking the connection",
                extra={"connection_id": self.connection_id, "reason": self._protocol_error},
            )
            reason: str | None = self._protocol_error
        else:
            reason = await self._link.run(self.pump.receive)
        if reason is not None:
            self.parked_reason = reason
            self._end(Ending.PARKED)

    async def _finish(self, reader: asyncio.Task[None]) -> Outcome:
        """End the connection: stop reading, wait for the call in flight, release."""
        self._end(Ending.SHUTDOWN)
        ending = self._ended.result()
        reader.cancel()
        # After cancelling the reader, no handler call is in flight once this returns,
        # so the checkpoint is final before it is released.
        if not await self._calls.ended_by(self._loop.time() + TASK_STOP_SECONDS):
            # A handler that swallows cancellation: its call may go on, but no new
            # call can start (the connection is ending), so the release goes ahead.
            log.error(
                "handler call did not stop when cancelled",
                extra={"connection_id": self.connection_id, "epoch": self.lease.epoch},
            )
        self._calls.disarm()
        released = await self._release() if ending.releases else None
        # The upstream socket may take a moment to close (its close handshake waits
        # behind frames that piled up); the release and the handoff do not wait for
        # it: nothing can be handled on it any more.
        self._closed = asyncio.create_task(self._join(reader), name=f"close:{self.connection_id}")
        self._log_end(ending, released)
        unanswered = None
        if ending.releases and released is None:
            unanswered = self.page_entry(self._loop.time(), self._s.wall_ms())
        return Outcome(
            ending,
            released is not None and released.released,
            self.checkpoint,
            restarted=ending is Ending.RESTARTED or started_since(ending, released),
            unanswered=unanswered,
        )

    # --- ending ------------------------------------------------------------------------

    def _end(self, ending: Ending) -> None:
        """Decide the ending (the first decision wins). No handler call starts after
        this step, whatever the ending; a graceful one bounds the call in flight by
        the deadline of this moment."""
        self.state.end(ending, self._loop.time())
        self._carry_ending()

    def _carry_ending(self) -> None:
        """Carry an ending the state decided into the runner, in the same step: bound
        the call in flight by its new deadline and wake :meth:`run`."""
        ending = self.state.ending
        if ending is None or self._ended.done():
            return
        self._calls.rearm()
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

    async def _join(self, *tasks: asyncio.Task[None]) -> None:
        _, pending = await asyncio.wait(tasks, timeout=TASK_STOP_SECONDS)
        for task in pending:
            log.error(
                "connection task did not stop when cancelled",
                extra={"connection_id": self.connection_id, "task": task.get_name()},
            )

    async def _release(self) -> Released | None:
        """Release (or park) with the final checkpoint, retrying errors for up to the
        release budget; None when it never got an answer."""
        s = self._s
        if self.parked_reason is not None:
            write = functools.partial(
                s.store.park, self.lease, self.checkpoint, self.parked_reason, s.wall_ms()
            )
        else:
            # A stream that cannot resume leaves when it last moved (wall-clock ms),
            # for the next owner's gap.
            advanced = None if self._resumable else self.pump.advanced_at
            extra: dict[str, Any] = {}
            if advanced is not None:
                extra["advanced_at_ms"] = s.wall_ms() - round((self._loop.time() - advanced) * 1000)
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


def started_since(ending: Ending, released: Released | None) -> bool:
    """The release found the connection started under a newer generation, or, for a
    runner stopped on the router's notice alone, started at all: a start came since
    (docs/DESIGN.md §3.4), and the worker takes it again at once."""
    if released is None:
        return False
    return released.restarted or (ending is Ending.STOPPED and released.started)
