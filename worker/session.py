"""The worker's session: one liveness write per heartbeat for all its connections.

The renew runs on a thread of its own with a DynamoDB client of its own (one attempt
per request, bounded by a third of a heartbeat), so it is never queued behind page
writes, takeovers or releases, nor delayed by a busy event loop. It reports to the
loop with ``call_soon_threadsafe``: a renew that landed (when it was sent, and the
router's notices), a renew that failed, and a reap.

The loop keeps the fence deadline of every connection from the ``sent_at`` the thread
reports; both use the same monotonic clock (``time.monotonic``, the event loop's
clock).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from wsfleet.session_rules import RenewRefusal
from wsfleet.session_store import SessionRenewed, SessionStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionEvents:
    """What the keeper tells the event loop (each called on the loop's thread)."""

    renewed: Callable[[int, float, float, frozenset[str]], None]
    """(session_gen, sent_at, lateness, notices): a renew sent at ``sent_at`` (that
    many seconds after it was due) landed."""
    failed: Callable[[int, float], None]
    """(session_gen, lateness of the attempt): an error or timeout; unknown outcome."""
    reaped: Callable[[int], None]
    """(session_gen): the session is DEAD; its connections are lost."""


class SessionKeeper:
    """Renews one session (``worker_id``, ``session_gen``) every heartbeat until
    stopped or reaped."""

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
    ) -> None:
        self._store = store
        self.worker_id = worker_id
        self.session_gen = session_gen
        self._loop = loop
        self._events = events
        self._wall_ms = wall_ms
        self._connections = connections
        self._capacity = capacity
        self._next = first_renew_at
        self._stop = threading.Event()
        self._acted: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name=f"session-renew-{session_gen}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (returns at once; the thread ends within one request)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def acted_on(self, notices: set[str]) -> None:
        """The owner acted on these notices: the next renew removes them."""
        with self._lock:
            self._acted |= notices

    def _run(self) -> None:
        heartbeat = self._store.timing.heartbeat
        while not self._stop.wait(max(0.0, self._next - time.monotonic())):
            sent_at = time.monotonic()
            lateness = sent_at - self._next
            with self._lock:
                acted = set(self._acted)
            try:
                result = self._store.renew(
                    self.worker_id,
                    self.session_gen,
                    self._wall_ms(),
                    connections=self._connections(),
                    acted_on=acted,
                    capacity=self._capacity(),
                )
            except Exception as error:
                log.warning(
                    "session renew failed, retrying",
                    extra={"session_gen": self.session_gen, "error": repr(error)},
                )
                self._next = time.monotonic() + heartbeat / 4
                self._post(self._events.failed, self.session_gen, lateness)
                continue
            if isinstance(result, SessionRenewed):
                with self._lock:
                    self._acted -= acted
                self._next = sent_at + heartbeat
                self._post(
                    self._events.renewed, self.session_gen, sent_at, lateness, result.notices
                )
            elif result is RenewRefusal.SUPERSEDED:
                self._next = sent_at + heartbeat
            else:
                log.error("session reaped", extra={"session_gen": self.session_gen})
                self._post(self._events.reaped, self.session_gen)
                return

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            # The loop is closed: the process is ending.
            self._stop.set()
