"""The worker's sessions, one after the other (docs/DESIGN.md §3.1, §3.6): open one,
keep it renewed through its :class:`~worker.session.SessionKeeper`, carry each renew
that landed to the runners of that session and its notices to whoever acts on them,
and when the session is lost (reaped, or given up after no renew landed for its fence
window) end its connections as lost and open the next one. At shutdown, retire the
last one.

A renew proves its own session only: it extends only the runners whose lease that
session owns, and a runner of an earlier session is never resumed by it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from worker.connection import TASK_STOP_SECONDS
from worker.connection_state import Ending
from worker.holdings import Holdings
from worker.metrics import FleetMetrics
from worker.session import SessionEvents, SessionKeeper
from worker.standing import Standing
from worker.threads import Threads
from wsfleet import metric_names as m
from wsfleet import schema, session_rules
from wsfleet.backoff import backoff_delays
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

log = logging.getLogger(__name__)

ActOnNotices = Callable[[set[str], set[str]], Awaitable[None]]
"""``(tokens, acted)``: act on these notices, adding each one acted on to ``acted``."""


class SessionCycle:
    def __init__(
        self,
        *,
        worker_id: str,
        sessions: SessionStore,
        renewals: SessionStore,
        timing: LeaseTiming,
        standing: Standing,
        holdings: Holdings,
        act_on_notices: ActOnNotices,
        opened: Callable[[], None],
        connections: Callable[[], int],
        metrics: FleetMetrics,
        threads: Threads,
        wall_ms: Callable[[], int],
        rng: random.Random,
        round_trip: Callable[[float], object] = lambda seconds: None,
    ) -> None:
        """``sessions``: opens and retires at shutdown (on the shared executor);
        ``renewals``: the renew's own store, also used to retire a session given up;
        ``opened``: told when a session has just been opened; ``connections``: what
        the session publishes as this worker's connections; ``round_trip``: told how
        long each renew that landed took, send to answer (worker.patient_calls)."""
        self._worker_id = worker_id
        self._sessions = sessions
        self._renewals = renewals
        self._timing = timing
        self._standing = standing
        self._holdings = holdings
        self._act_on_notices = act_on_notices
        self._opened = opened
        self._connections = connections
        self._metrics = metrics
        self._threads = threads
        self._wall_ms = wall_ms
        self._rng = rng
        self._round_trip = round_trip
        self._keeper: SessionKeeper | None = None
        self._last_renew_sent: float | None = None
        self._opening: asyncio.Task[None] | None = None
        self._notices_in_progress: set[str] = set()

    async def open(self) -> None:
        """Open a new session (the next generation) and start renewing it; retries
        errors with backoff until it is open or the worker closes."""
        loop = asyncio.get_running_loop()
        timing = self._timing
        standing = self._standing
        delays = backoff_delays(initial=0.1, maximum=timing.heartbeat, rng=self._rng.random)
        gen = standing.gen
        while not standing.closing:
            if not await self._table_is_ours():
                await asyncio.sleep(timing.lease)
                continue
            gen += 1
            sent_at = loop.time()
            try:
                # On the renew's client, with its timeout (the fence window): an answer
                # that slow still opens a session worth having, and a worker whose
                # DynamoDB is slow (a brownout) must not be kept from opening one by a
                # timeout its renews would not have hit.
                opened = await loop.run_in_executor(
                    None,
                    self._renewals.open,
                    self._worker_id,
                    gen,
                    self._wall_ms(),
                    standing.max_connections,
                )
            except Exception as error:
                # Unknown outcome: the next generation is always fresh.
                log.warning("could not open a session", extra={"error": repr(error)})
                await asyncio.sleep(next(delays))
                continue
            if not opened:
                continue
            standing.opened(gen, sent_at)
            self._last_renew_sent = sent_at
            self._keeper = SessionKeeper(
                self._renewals,
                self._worker_id,
                gen,
                loop,
                SessionEvents(self._renewed, self._renew_failed, self._reaped, self._given_up),
                wall_ms=self._wall_ms,
                connections=self._connections,
                capacity=lambda: standing.published_capacity(len(self._holdings.runners)),
                first_renew_at=sent_at + timing.heartbeat,
                opened_at=sent_at,
                threads=self._threads,
                clock=loop.time,
            )
            self._keeper.start()
            self._opened()
            log.info("session opened", extra={"session_gen": gen})
            return

    async def _table_is_ours(self) -> bool:
        """No live session of another session protocol is listed: a worker refuses to
        open one beside them (an error is logged each time, and counted); True as
        well when the listing fails (the open's own error then shows)."""
        try:
            sessions = await asyncio.get_running_loop().run_in_executor(
                None, self._sessions.list_sessions
            )
        except Exception:
            return True
        others = session_rules.foreign(sessions)
        if not others:
            return True
        self._metrics.count(m.FOREIGN_SESSIONS, len(others))
        log.error(
            "refusing to open a session: live sessions of another session protocol"
            " share this table (docs/DEPLOY.md, changing the session protocol)",
            extra={
                "protocol": schema.SESSION_PROTOCOL_NOW,
                "foreign": sorted(
                    f"{s.worker_id}#{s.session_gen} (protocol {s.protocol or 1})" for s in others
                ),
            },
        )
        return False

    async def retire(self) -> None:
        """After the last release: stop renewing and mark the session DEAD, so others
        need not wait for it to lapse (its sweepers find nothing and forget it)."""
        keeper, gen = self._keeper, self._standing.gen
        if keeper is None:
            return
        keeper.stop()
        self._keeper = None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                None, self._sessions.retire, self._worker_id, gen, self._wall_ms()
            )
        except Exception as error:
            # It then lapses and is reaped like a crashed one; nothing is left in it.
            log.warning("could not retire the session", extra={"error": repr(error)})
        await loop.run_in_executor(None, keeper.join, self._timing.heartbeat)

    def _renewed(self, gen: int, sent_at: float, lateness: float, notices: frozenset[str]) -> None:
        standing = self._standing
        if gen != standing.session_gen:
            return
        now = asyncio.get_running_loop().time()
        self._round_trip(now - sent_at)
        gap = None if self._last_renew_sent is None else sent_at - self._last_renew_sent
        self._last_renew_sent = sent_at
        self._metrics.renew_lateness(lateness)
        self._metrics.session_renewed(gap, standing.deadline - now)
        standing.renewed(sent_at)
        for runner in self._holdings.runners.values():
            # A renew proves its own session only: it extends only the runners whose
            # lease that session owns.
            if runner.lease.session_gen == gen:
                runner.session_renewed(sent_at)
        fresh = set(notices) - self._notices_in_progress
        if fresh:
            self._notices_in_progress |= fresh
            task = asyncio.create_task(self._notices(fresh), name="notices")
            self._holdings.keep(task)

    async def _notices(self, tokens: set[str]) -> None:
        """Act on these notices; the next renew removes the ones acted on."""
        acted: set[str] = set()
        try:
            await self._act_on_notices(tokens, acted)
        finally:
            self._notices_in_progress -= tokens
            if self._keeper is not None and acted:
                self._keeper.acted_on(acted)

    def _renew_failed(self, gen: int, lateness: float) -> None:
        if gen == self._standing.session_gen:
            self._metrics.count(m.RENEW_FAILURES)
            self._metrics.renew_lateness(lateness)

    def _reaped(self, gen: int) -> None:
        """The session is DEAD: every connection of it is lost (others take them over
        from the last page). Open a new session and go on."""
        if gen != self._standing.session_gen:
            return
        self._metrics.count(m.RENEW_FAILURES)
        log.error(
            "session reaped: its connections are lost",
            extra={"session_gen": gen, "connections": len(self._holdings.runners)},
        )
        self._lose(gen)
        self._next(self.open())

    def _given_up(self, gen: int) -> None:
        """No renew of the session landed for its fence window and a heartbeat more
        (its keeper has stopped renewing it): its connections have been paused for a
        heartbeat. Give them up rather than hold them dark: they end as lost, the
        session is marked DEAD so that others take them over from its page, and the
        next session opens (docs/DESIGN.md §3.6)."""
        if gen != self._standing.session_gen:
            return
        self._metrics.count(m.RENEW_FAILURES)
        log.error(
            "session given up: no renew landed for its fence window; its connections"
            " go to the others",
            extra={"session_gen": gen, "connections": len(self._holdings.runners)},
        )
        ending = self._lose(gen)
        self._next(self._retire_given_up(gen, ending))

    def _lose(self, gen: int) -> list[asyncio.Task[None]]:
        """End every connection of session ``gen`` as lost, and let no runner start or
        resume under it any more; returns the tasks of the runners ending."""
        self._standing.live = False
        holdings = self._holdings
        ending = []
        for cid, runner in list(holdings.runners.items()):
            if runner.lease.session_gen == gen:
                runner.stop(Ending.LOST)
                task = holdings.own_tasks.get(cid)
                if task is not None:
                    ending.append(task)
        self._keeper = None
        return ending

    def _next(self, opening: Coroutine[Any, Any, None]) -> None:
        if self._standing.closing or (self._opening is not None and not self._opening.done()):
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
        timing = self._timing
        give_up_at = loop.time() + timing.release_budget
        delays = backoff_delays(initial=0.1, maximum=timing.heartbeat, rng=self._rng.random)
        while True:
            try:
                retired = await loop.run_in_executor(
                    None, self._renewals.retire, self._worker_id, gen, self._wall_ms()
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
        await self.open()
