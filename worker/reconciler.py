"""Every reconcile interval (jittered +-20%), and when a session listed ALIVE lapses if
it was not renewed, one pass over the table:

1. **Sessions.** List every session (a Query per session item collection, no index).
   Reap each lapsed one (mark it DEAD, once, finally), recording in the reap who takes
   which of its connections (parts of the sorted ids, the reaper's first, that bring
   every taker towards its fair share, none beyond its room), and
   sweep each DEAD one: take over its STARTED connections (each worker its own part,
   at once; a part whose taker is gone or full to whoever rendezvous hashing picks;
   anything once four leases have passed since the reap; a reap that recorded no plan,
   by an older worker, by the rules before it), clear the owner of its STOPPED ones,
   and forget the session and its page once nothing has been seen under it for a full
   lease.
2. **Own connections** (every four passes, and on the pass after a write whose outcome
   is unknown, whether or not the sessions could be listed). Compare this session's
   ``by-owner`` entries with what the worker runs, and release the difference (an
   acquire whose reply was lost must not leave a connection held by a live session
   and run by nobody), with a ``reassign`` hint for each STARTED one released; an
   entry stopped or started again under a runner that got no notice of it is read
   and acted on.
3. **Free connections.** Query two shards of the sparse ``unowned`` index in rotation (every one
   of them while another worker drains) and try to acquire what they hold, in random
   order, up to the worker's room; with balancing on, only what an earlier scan
   already saw free two heartbeats ago (:mod:`worker.free_sightings`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from worker.acquire_result import AcquireResult
from worker.balancer import Balancer
from worker.capacity import Capacity
from worker.free_sightings import FreeSightings
from worker.metrics import FleetMetrics
from wsfleet import metric_names as m
from wsfleet import schema, session_rules
from wsfleet.backoff import jittered
from wsfleet.checkpoint_page import CheckpointPage
from wsfleet.item import ConnectionItem, MalformedItemError, connection_key_text
from wsfleet.lease_store import LeaseStore
from wsfleet.session_rules import SessionItem
from wsfleet.session_store import SessionStore
from wsfleet.session_watch import SessionWatch
from wsfleet.timing import OWN_CHECK_PASSES, LeaseTiming

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_FREE_PER_PASS = 1000
PARALLEL_TAKES = 16
UNOWNED_SHARDS_PER_PASS = 2


def sweep_bound(timing: LeaseTiming) -> float:
    """How soon a free connection that no hint reaches (its start hint lost with a
    receiver that crashed, or with a reply that never came) is taken by the sweep of
    a worker below its share: one rotation over the shards sees it, the next takes it
    (a sighting must be two heartbeats old, well inside a rotation), passes at +20%
    jitter, and a second for the acquire (docs/DESIGN.md §3.11)."""
    rotation = schema.UNOWNED_SHARDS / UNOWNED_SHARDS_PER_PASS
    return 2 * rotation * 1.2 * timing.reconcile + 1.0


OWN_PAGE = 100
"""Entries per page of the worker's own listing (about 20 KB, 5 read units)."""


class Owner(Protocol):
    """What the reconciler needs of the worker."""

    worker_id: str

    @property
    def session_gen(self) -> int: ...

    def own_generations(self) -> list[int]:
        """The sessions of this worker whose entries the own-check lists."""
        ...

    def own_check_found(self, gen: int, entries: int, checked_at: float) -> None:
        """What the own-check found under one of :meth:`own_generations`."""
        ...

    def own_entries_listed(self, connection_ids: set[str]) -> None:
        """Every connection the own-check listed as this worker's."""
        ...

    def holds(self, connection_id: str) -> bool: ...

    def takeover_room(self, free: int) -> int:
        """Of ``free`` slots, how many a reap of this worker names it for."""
        ...

    def recently_released(self, connection_id: str) -> bool: ...

    def take_doubt(self) -> bool:
        """True (once) when a write whose outcome is unknown may have left a connection
        owned by this session and run by nobody since the last call."""
        ...

    async def acquire(self, connection_id: str) -> AcquireResult: ...

    async def take_over(
        self, seen: ConnectionItem, session: SessionItem, page: CheckpointPage | None
    ) -> AcquireResult: ...

    async def take_over_many(
        self, seen: list[ConnectionItem], session: SessionItem, page: CheckpointPage | None
    ) -> list[str]: ...

    async def release_stray(self, seen: ConnectionItem) -> bool:
        """Release a connection this session holds and does not run; whether the
        release landed."""
        ...

    async def recheck_changed(self, seen: list[ConnectionItem]) -> None: ...

    async def send_reassign(self, connection_id: str) -> None: ...


@dataclass
class _DeadSession:
    last_entries_seen: float
    """When an entry was last listed under it (the loop's clock)."""
    hinted: bool = False
    """Its pending hand-offs have been hinted on the start queue."""


class Reconciler:
    def __init__(
        self,
        *,
        store: LeaseStore,
        sessions: SessionStore,
        owner: Owner,
        capacity: Capacity,
        balancer: Balancer,
        metrics: FleetMetrics,
        wall_ms: Callable[[], int],
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: the event loop's (``time.monotonic`` in production), on which
        this worker observes the sessions: expiry is decided on it alone."""
        self._clock = clock
        self._store = store
        self._sessions = sessions
        self._owner = owner
        self._capacity = capacity
        self._balancer = balancer
        self._metrics = metrics
        self._wall_ms = wall_ms
        self._rng = rng
        self._dead: dict[tuple[str, int], _DeadSession] = {}
        self._next_shard = rng.randrange(schema.UNOWNED_SHARDS)
        # With balancing on, offers and hints get the first claim on a freed connection.
        grace = 2 * store.timing.heartbeat if balancer.enabled else 0.0
        self._sightings = FreeSightings(grace)
        self._passes_to_own_check = rng.randrange(OWN_CHECK_PASSES)
        self._listed: list[SessionItem] = []
        self._foreign_seen: set[tuple[str, int]] = set()
        self.watch = SessionWatch(store.timing)
        """What this worker has seen of the sessions: expiry is decided from it."""

    def next_pass_in(self, interval: float) -> float:
        """Seconds to the next pass: ``interval``, or less when a session seen ALIVE
        lapses before then if it is not renewed (:meth:`SessionWatch.next_lapse`), so
        that every worker reaps, or takes its part, as soon as the reap may pass."""
        mine = (self._owner.worker_id, self._owner.session_gen)
        now = self._clock()
        due = self.watch.next_lapse(mine, now)
        if due is None:
            return interval
        return min(interval, due - now)

    async def run(self) -> None:
        interval = self._store.timing.reconcile
        while True:
            try:
                await self.reconcile_once()
            except Exception as error:
                log.warning("reconcile pass failed", extra={"error": repr(error)})
            await asyncio.sleep(self.next_pass_in(jittered(interval, 0.2, self._rng.random)))

    async def reconcile_once(self) -> list[str]:
        """One pass; returns the ids this worker took (by takeover or acquire)."""
        if self._owner.session_gen == 0:
            return []
        try:
            taken, draining = await self.sweep_sessions()
        except Exception:
            # The own-check does not rest on the listing: what this session holds and
            # nobody runs is given back whatever the other sessions' listing does.
            # Free connections and balance rounds wait for a listing (they weigh the
            # others' loads).
            if self._own_check_due():
                await self.release_strays()
            raise
        if self._own_check_due():
            await self.release_strays()
        taken += await self.take_free(every_shard=draining)
        self._balancer.start_round(self._clock())
        return taken

    # --- 1. sessions -----------------------------------------------------------------

    async def sweep_sessions(self) -> tuple[list[str], bool]:
        """Reap and sweep; also says whether another live session is draining (a
        graceful shutdown publishes capacity 0 until its last release), in which case
        this pass looks for free connections in every shard, not only two."""
        sessions = await self._call(self._sessions.list_sessions, self._report_malformed)
        now = self._clock()
        self.watch.observe(sessions, now)
        self._listed = sessions
        self._balancer.observe(sessions, self.watch.overdue(sessions, now))
        mine = (self._owner.worker_id, self._owner.session_gen)
        taken: list[str] = []
        listed = set()
        draining = False
        for session in sessions:
            listed.add(session.key)
            if session.key == mine:
                continue
            if session.alive and session.capacity == 0:
                draining = True
            # One session that cannot be reaped or swept costs this pass that session
            # only: the next one is still reaped, swept and taken over.
            try:
                taken += await self._reap_and_sweep(session, sessions)
            except Exception as error:
                log.warning(
                    "reaping or sweeping a session failed",
                    extra={
                        "session_worker": session.worker_id,
                        "session_gen": session.session_gen,
                        "error": repr(error),
                    },
                )
        for key in set(self._dead) - listed:
            del self._dead[key]
        return taken, draining

    async def _reap_and_sweep(self, session: SessionItem, sessions: list[SessionItem]) -> list[str]:
        if session_rules.foreign([session]):
            # Renewed by rules this worker does not read (no beat): never reaped here.
            # The worker that opened it refuses to share the table the same way.
            if session.key not in self._foreign_seen:
                self._foreign_seen.add(session.key)
                self._metrics.count(m.FOREIGN_SESSIONS)
                log.error(
                    "a live session of another session protocol shares this table;"
                    " it is never reaped here (docs/DEPLOY.md)",
                    extra={
                        "session_worker": session.worker_id,
                        "session_gen": session.session_gen,
                        "protocol": session.protocol or 1,
                    },
                )
            return []
        entries: list[ConnectionItem] | None = None
        if self.watch.lapsed(session, self._clock()):
            reaped, entries = await self._reap(session, sessions)
            if reaped is None:
                return []  # renewed after all, or reaped by another without a plan
            session = reaped
        if session.state != schema.DEAD:
            return []
        return await self._sweep(session, sessions, entries)

    def _report_malformed(self, error: MalformedItemError) -> None:
        self._metrics.malformed_item(error.key, error.problem)

    async def _reap(
        self, session: SessionItem, sessions: list[SessionItem]
    ) -> tuple[SessionItem | None, list[ConnectionItem]]:
        """Reap a lapsed session, recording who takes which of its connections (listed
        first, and handed on to the sweep); returns it as DEAD, or, when another
        worker's reap came first, as that reap left it (read back, so its plan is
        followed in this pass), or None."""
        me = self._owner.worker_id
        entries = await self._call(self._store.owned_by, session.worker_id, session.session_gen)
        takers = session_rules.takeover_plan(
            [
                item.connection_id
                for item in entries
                if item.started and not item.parked and item.problem is None
            ],
            reaper=me,
            room=self._owner.takeover_room(self._capacity.free),
            sessions=sessions,
            overdue=self.watch.overdue(sessions, self._clock()),
        )
        now_ms = self._wall_ms()
        if not await self._call(self._sessions.reap, session, me, now_ms, takers):
            current = await self._call(
                self._sessions.get_session, session.worker_id, session.session_gen
            )
            if current is None or current.alive or current.takers is None:
                return None, entries
            return current, entries
        self._metrics.count(m.SESSIONS_REAPED)
        log.warning(
            "session reaped",
            extra={
                "session_worker": session.worker_id,
                "session_gen": session.session_gen,
                "unrenewed_seconds": round(self.watch.unchanged_for(session, self._clock()), 3),
                "takers": len(takers),
            },
        )
        reaped = replace(
            session, state=schema.DEAD, reaped_at_ms=now_ms, reaped_by=me, takers=takers
        )
        self.watch.reaped(reaped, self._clock())
        return reaped, entries

    async def _sweep(
        self,
        session: SessionItem,
        sessions: list[SessionItem],
        listed: list[ConnectionItem] | None = None,
    ) -> list[str]:
        timing = self._store.timing
        now = self._clock()
        dead_for = self.watch.unchanged_for(session, now)
        me = self._owner.worker_id
        if not session_rules.may_sweep(session, me, dead_for, timing.heartbeat):
            return []
        entries = list(
            listed
            if listed is not None
            else await self._call(self._store.owned_by, session.worker_id, session.session_gen)
        )
        keys = {s.key for s in sessions}
        for gen in session_rules.unlisted_predecessors(session, keys):
            # An acquire that landed under an earlier session of this worker after that
            # session was forgotten, and that the worker never gave back: nobody else
            # lists it, so whoever sweeps the worker's last session takes it too. The
            # listing is eventually consistent: only a session that a strong read
            # does not find is gone.
            if await self._call(self._sessions.get_session, session.worker_id, gen) is None:
                entries += await self._call(self._store.owned_by, session.worker_id, gen)
        seen = self._dead.setdefault(session.key, _DeadSession(now))
        if not seen.hinted:
            # Connections another worker handed to this session just before it died
            # were released (free, in the unowned index) and wait for a renew that
            # never comes: a hint hands them to whoever has a free slot now, instead
            # of a sweep seconds later. Each sweeper hints once; a second hint for a
            # connection already taken is settled as held.
            seen.hinted = True
            await asyncio.gather(
                *(self._owner.send_reassign(cid) for cid in session_rules.handed_to(session))
            )
        if not entries:
            if session_rules.may_forget(now - seen.last_entries_seen, timing):
                if await self._call(self._sessions.forget, session):
                    log.info(
                        "dead session forgotten",
                        extra={
                            "session_worker": session.worker_id,
                            "session_gen": session.session_gen,
                        },
                    )
                self._dead.pop(session.key, None)
            return []
        seen.last_entries_seen = now
        now_ms = self._wall_ms()
        page: CheckpointPage | None = None
        page_read = False
        if any(not item.started for item in entries):
            # Stopped while their owner died: their checkpoints are on its page.
            page, page_read = await self._read_page(session), True
        for item in entries:
            if not item.started:
                await self._call(self._store.clear_dead_owner, item, page, now_ms)
            elif item.problem is not None and not item.parked:
                await self._park_seen(item, item.problem, now_ms)
        started = {
            item.connection_id: item
            for item in entries
            if item.started and not item.parked and item.problem is None
        }
        reaper = session_rules.reaper_of(session) == me
        share = session_rules.sweep_share(
            session,
            list(started),
            me=me,
            sessions=sessions,
            free=self._capacity.free,
            dead_for=dead_for,
            overdue=self.watch.overdue(sessions, now),
            timing=timing,
        )
        if not share:
            return []
        if not page_read:
            page = await self._read_page(session)
        conflicts_before = self._store.takeover_conflicts
        try:
            taken = await self._owner.take_over_many([started[cid] for cid in share], session, page)
        except Exception as error:
            log.warning(
                "taking over a dead session's connections failed",
                extra={"session_worker": session.worker_id, "error": repr(error)},
            )
            taken = []
        log.info(
            "dead session swept",
            extra={
                "session_worker": session.worker_id,
                "session_gen": session.session_gen,
                "entries": len(started),
                "share": len(share),
                "taken": len(taken),
                "reaper": reaper,
                "planned": session.takers is not None,
                "failed_conditional_writes": self._store.takeover_conflicts - conflicts_before,
                "page_entries": 0 if page is None else len(page.entries),
            },
        )
        return taken

    async def _read_page(self, session: SessionItem) -> CheckpointPage | None:
        return await self._call(
            functools.partial(
                self._sessions.read_page,
                session.worker_id,
                session.session_gen,
                report=self._report_malformed,
            )
        )

    async def _park_seen(self, item: ConnectionItem, problem: str, now_ms: int) -> None:
        """A dead session's entry that cannot be run (an attribute of the wrong type,
        which its takeover would have to compare): parked where it is, with the
        problem as its reason."""
        self._metrics.malformed_item(connection_key_text(item.connection_id), problem)
        if await self._call(self._store.park_seen, item, problem, now_ms):
            self._metrics.count(m.CONNECTIONS_FAILED)

    # --- 2. own connections --------------------------------------------------------------

    def _own_check_due(self) -> bool:
        """Every :data:`OWN_CHECK_PASSES` passes, or on the pass after a write whose
        outcome is unknown."""
        doubt = self._owner.take_doubt()
        if doubt or self._passes_to_own_check <= 0:
            self._passes_to_own_check = OWN_CHECK_PASSES - 1
            return True
        self._passes_to_own_check -= 1
        return False

    async def release_strays(self) -> None:
        entries: list[ConnectionItem] = []
        for gen in self._owner.own_generations():
            checked_at = self._clock()
            found = await self._own_entries(gen)
            self._owner.own_check_found(gen, len(found), checked_at)
            entries += found
        self._owner.own_entries_listed({item.connection_id for item in entries})
        await self._owner.recheck_changed(entries)
        released: list[str] = []
        for item in entries:
            cid = item.connection_id
            if self._owner.holds(cid) or self._owner.recently_released(cid):
                continue
            log.warning(
                "owned by this session but not running: releasing it",
                extra={"connection_id": cid, "epoch": item.lease_epoch},
            )
            if await self._owner.release_stray(item) and item.started:
                released.append(cid)
        # Back in the unowned index, where every worker at or above its share leaves
        # them (and this one does not take back what it just released): a hint hands
        # each to whoever has a free slot now. Sent together once every stray is
        # released: a slow hint must not hold the next stray's release.
        await asyncio.gather(*(self._owner.send_reassign(cid) for cid in released))

    async def _own_entries(self, gen: int) -> list[ConnectionItem]:
        """The ``by-owner`` entries of this worker's session ``gen``, :data:`OWN_PAGE`
        at a time, one page per executor call: the event loop runs between the pages."""
        entries: list[ConnectionItem] = []
        for key in schema.owner_keys(self._owner.worker_id, gen):
            start: dict[str, Any] | None = None
            while True:
                page, start = await self._call(self._store.owned_page, key, start, OWN_PAGE)
                entries += page
                if start is None:
                    break
        return entries

    # --- 3. free connections -------------------------------------------------------------

    async def take_free(self, *, every_shard: bool = False) -> list[str]:
        free = self._capacity.free
        if free <= 0:
            return []
        shards = schema.free_shards()
        if every_shard:
            picked = list(shards)
        else:
            picked = [
                shards[(self._next_shard + n) % len(shards)] for n in range(UNOWNED_SHARDS_PER_PASS)
            ]
            self._next_shard = (self._next_shard + UNOWNED_SHARDS_PER_PASS) % len(shards)
        limit = min(MAX_FREE_PER_PASS, 2 * free + 8)
        found = await self._call(self._store.find_unowned, picked, limit)
        now = self._clock()
        ready = self._sightings.scanned(picked, found, now)
        free_ids = [cid for cid in ready if not self._owner.holds(cid)]
        if not free_ids:
            return []
        self._metrics.count(m.ORPHANS_FOUND, len(free_ids))
        # What this worker has just released is for the others (a balance move on its
        # way to the receiver's next renew), not to be taken back.
        free_ids = [cid for cid in free_ids if not self._owner.recently_released(cid)]
        # Up to this worker's fair share: a worker at or above it leaves them to those
        # below theirs.
        room = self._balancer.room_for_free(len(free_ids))
        if room <= 0:
            return []
        self._rng.shuffle(free_ids)
        return await self._acquire_each(free_ids, room)

    # --- plumbing ------------------------------------------------------------------------

    async def _acquire_each(self, ids: Iterable[str], room: int) -> list[str]:
        """Acquire ``ids``, :data:`PARALLEL_TAKES` at a time, until ``room`` are taken
        or there is no free slot."""
        gate = asyncio.Semaphore(PARALLEL_TAKES)
        taken: list[str] = []

        async def one(connection_id: str) -> None:
            async with gate:
                if self._capacity.free <= 0 or len(taken) >= room:
                    return
                try:
                    result = await self._owner.acquire(connection_id)
                except Exception as error:
                    log.warning(
                        "taking a connection failed",
                        extra={"connection_id": connection_id, "error": repr(error)},
                    )
                    return
                if result is AcquireResult.WON:
                    taken.append(connection_id)

        await asyncio.gather(*(one(cid) for cid in ids))
        if taken:
            log.info("connections taken", extra={"taken": len(taken)})
        return taken

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
