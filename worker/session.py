"""The worker's session: one liveness write per heartbeat for all its connections.

The renews run on threads of their own with a DynamoDB client of their own, so they
are never queued behind page writes, takeovers or releases, nor delayed by a busy event
loop. One thread keeps the schedule (:class:`~worker.renew_plan.RenewPlan`): a renew
goes out every heartbeat on a thread of its own, whether or not the earlier ones have
answered, and each is awaited as long as its answer could still move the fence
deadline (the whole fence window). It reports to the loop with
``call_soon_threadsafe``: a renew that moved the deadline (when it was sent, and the
router's notices), a renew that failed, a reap, and a session given up (no renew
landed for its fence window and a heartbeat).

The loop keeps the fence deadline of every connection from the ``sent_at`` the thread
reports; both read the event loop's clock (``time.monotonic`` in production, virtual
time in the simulator). Threads and mailboxes come from the
:class:`~worker.threads.Threads` port.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from worker.renew_plan import RenewPlan, Step
from worker.threads import OS_THREADS, Joinable, Mailbox, MailboxEmptyError, Threads
from wsfleet.session_rules import RenewRefusal
from wsfleet.session_store import SessionRenewed, SessionStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionEvents:
    """What the keeper tells the event loop (each called on the loop's thread)."""

    renewed: Callable[[int, float, float, frozenset[str]], None]
    """(session_gen, sent_at, lateness, notices): a renew sent at ``sent_at`` (that
    many seconds after it was due) landed and moved the fence deadline."""
    failed: Callable[[int, float], None]
    """(session_gen, lateness of the attempt): an error or timeout; unknown outcome."""
    reaped: Callable[[int], None]
    """(session_gen): the session is DEAD; its connections are lost."""
    given_up: Callable[[int], None]
    """(session_gen): no renew landed for the fence window and a heartbeat; the keeper
    has stopped renewing: the session's connections must be given up."""


@dataclass(frozen=True, slots=True)
class _Answer:
    sent_at: float
    lateness: float
    acted: frozenset[str]
    result: SessionRenewed | RenewRefusal | Exception


_STOP = object()


class SessionKeeper:
    """Renews one session (``worker_id``, ``session_gen``) every heartbeat until
    stopped, reaped or given up."""

    def __init__(
        self,
        store: SessionStore,
        worker_id: str,
        session_gen: int,
        loop: asyncio.AbstractEventLoop,
        events: SessionEvents,
        *,
        wall_ms: Callable[[], int],
        connections: Callable[[], int],
        capacity: Callable[[], int],
        first_renew_at: float,
        opened_at: float | None = None,
        threads: Threads = OS_THREADS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``opened_at``: when the session's open was sent (its first fence deadline is
        counted from it); a heartbeat before ``first_renew_at`` when not given.
        ``clock``: the event loop's (``loop.time``), which the fence deadlines use."""
        self._store = store
        self.worker_id = worker_id
        self.session_gen = session_gen
        self._loop = loop
        self._events = events
        self._wall_ms = wall_ms
        self._connections = connections
        self._capacity = capacity
        timing = store.timing
        if opened_at is None:
            opened_at = first_renew_at - timing.heartbeat
        self._plan = RenewPlan.opened(timing, opened_at, first_renew_at)
        self._clock = clock
        self._threads = threads
        self._stop = threading.Event()
        self._answers: Mailbox[_Answer | object] = threads.mailbox()
        self._acted: set[str] = set()
        self._lock = threading.Lock()
        self._thread: Joinable | None = None

    def start(self) -> None:
        self._thread = self._threads.start(self._run, f"session-renew-{self.session_gen}")

    def stop(self) -> None:
        """Stop renewing (returns at once; renews in flight are no longer awaited)."""
        self._stop.set()
        self._answers.put(_STOP)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def acted_on(self, notices: set[str]) -> None:
        """The owner acted on these notices: the next renew removes them."""
        with self._lock:
            self._acted |= notices

    def _run(self) -> None:
        plan = self._plan
        while not self._stop.is_set():
            now = self._clock()
            step = plan.step(now)
            if step is Step.SEND:
                self._send(now, plan.sent(now))
                continue
            if step is Step.GIVE_UP:
                log.error(
                    "no session renew landed for the fence window: giving the session up",
                    extra={"session_gen": self.session_gen, "in_flight": len(plan.in_flight)},
                )
                self._post(self._events.given_up, self.session_gen)
                return
            try:
                answer = self._answers.get(timeout=max(0.0, plan.wake_at() - now))
            except MailboxEmptyError:
                continue
            if not isinstance(answer, _Answer) or not self._take(plan, answer):
                return

    def _send(self, sent_at: float, lateness: float) -> None:
        with self._lock:
            acted = frozenset(self._acted)
        now_ms = self._wall_ms()  # after sent_at: any delay only moves the deadline earlier
        connections, capacity = self._connections(), self._capacity()

        def attempt() -> None:
            result: SessionRenewed | RenewRefusal | Exception
            try:
                result = self._store.renew(
                    self.worker_id,
                    self.session_gen,
                    now_ms,
                    connections=connections,
                    acted_on=acted,
                    capacity=capacity,
                )
            except Exception as error:
                result = error
            self._answers.put(_Answer(sent_at, lateness, acted, result))

        self._threads.start(attempt, f"session-renew-{self.session_gen}-attempt")

    def _take(self, plan: RenewPlan, answer: _Answer) -> bool:
        """Apply one answer; False once the session is reaped."""
        result, now = answer.result, self._clock()
        if isinstance(result, Exception):
            log.warning(
                "session renew failed, retrying",
                extra={"session_gen": self.session_gen, "error": repr(result)},
            )
            plan.failed(answer.sent_at, now)
            self._post(self._events.failed, self.session_gen, answer.lateness)
        elif isinstance(result, SessionRenewed):
            with self._lock:
                self._acted -= answer.acted
            if plan.landed(answer.sent_at, now):
                self._post(
                    self._events.renewed,
                    self.session_gen,
                    answer.sent_at,
                    answer.lateness,
                    result.notices,
                )
        else:
            log.error("session reaped", extra={"session_gen": self.session_gen})
            self._post(self._events.reaped, self.session_gen)
            return False
        return True

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            # The loop is closed: the process is ending.
            self._stop.set()
