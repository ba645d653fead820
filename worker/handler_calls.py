"""One connection's handler calls and the watchdog that bounds them.

Every handler call is bounded by the call deadline of the connection's
:class:`~worker.connection_state.ConnectionState`: the session's fence deadline, or
the drain deadline once a graceful ending is decided. The bound is one watchdog timer
per connection, not a timeout scope per call: it is armed at the call deadline by a
call that finds none armed, a session renew does not touch it (a renew only moves the
state's deadline), and when it fires the state says whether to cut the call in flight,
fire again at the moved deadline, or disarm (no call in flight).

This part knows nothing of sockets, the store or how the connection ends: it makes
the calls it is asked for, in the task it is given, and says how each ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from worker.connection_state import ConnectionState, Watch


class DeadlineReachedError(Exception):
    """The handler call was cut by its deadline."""


class HandlerCalls:
    def __init__(self, state: ConnectionState, loop: asyncio.AbstractEventLoop) -> None:
        self._state = state
        self._loop = loop
        self._call_task: asyncio.Task[Any] | None = None
        """The task of the handler call in flight (None: no call in flight)."""
        self._idle_waiter: asyncio.Future[None] | None = None
        """Made only by a wait for the call in flight to end; resolved when it does."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._cut = False
        """The watchdog cut the call in flight (its task has a cancel request of ours)."""

    async def call(
        self, task: asyncio.Task[Any], call: Callable[[Any], Awaitable[None]], arg: Any
    ) -> BaseException | None:
        """One handler call in ``task`` (the current one), bounded by the call deadline
        (the fence deadline, or the drain deadline once a graceful ending is decided;
        moved by session renews while it runs); what it raised, if anything
        (:class:`DeadlineReachedError` when the deadline cut it)."""
        if self._watchdog is None:
            self._watchdog = self._loop.call_at(self._state.call_deadline, self._watch)
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
        watch = self._state.watchdog(self._loop.time(), in_call=task is not None)
        if watch is Watch.LATER:
            self._watchdog = self._loop.call_at(self._state.call_deadline, self._watch)
        elif watch is Watch.CUT and task is not None:
            self._cut = True
            task.cancel()

    def rearm(self) -> None:
        """The call deadline may have moved earlier (an ending's drain deadline): an
        armed watchdog fires at the new one."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = self._loop.call_at(self._state.call_deadline, self._watch)

    def disarm(self) -> None:
        """No call is made any more: the watchdog is not needed."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def ended_by(self, when: float) -> bool:
        """Wait until no handler call is in flight, or until ``when`` (loop time);
        False when a call was still in flight then."""
        try:
            async with asyncio.timeout_at(when):
                await self._ended()
        except TimeoutError:
            return False
        return True

    async def _ended(self) -> None:
        """Return once no handler call is in flight."""
        if self._call_task is None:
            return
        if self._idle_waiter is None or self._idle_waiter.done():
            self._idle_waiter = self._loop.create_future()
        await asyncio.shield(self._idle_waiter)
