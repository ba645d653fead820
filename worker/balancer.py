"""The fleet's balance on one worker (docs/DESIGN.md §4.4): how much it may take, and
the connections it hands to workers below their fair share.

The rules are :mod:`wsfleet.balance_rules`; this module feeds them the live sessions
as the reconciler last listed them (with this worker's own load as it is now, not as
its last renew published it) and carries out this worker's part of the plan:

- **room**: the reconciler's unowned sweep and balance offers take only up to
  :meth:`Balancer.room` (start messages, ``reassign`` hints, drains and the takeover
  of a dead session are not limited by it, only by capacity);
- **rounds**: at most every ``BALANCE_ROUND_SECONDS``, and not while the listing
  shows a crash failover under way, a worker above its share by more than the
  tolerance stops the planned number of its connections with a
  graceful release (the final checkpoint goes into the item) and offers them, one
  write per receiver and chunk of 50, on the receivers' session items. A receiver's
  next renew (within a heartbeat) returns the offer, and it acquires them: nothing is
  delivered twice, nothing is skipped, and the gap is a release, a heartbeat at most
  and a connect;
- **drain**: at shutdown the worker publishes capacity 0 and hands everything it runs
  to the others the same way (``drain`` notices, which a receiver takes up to its
  capacity, like the takeover of a dead session), not limited by the round cap; what
  fits nowhere goes back with a ``reassign`` hint.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from worker.metrics import FleetMetrics
from wsfleet import metric_names as m
from wsfleet import session_rules
from wsfleet.balance_rules import (
    BalanceSettings,
    Load,
    imbalance,
    loads_of,
    plan_moves,
    room_to_take,
)
from wsfleet.session_rules import SessionItem
from wsfleet.session_store import SessionStore

log = logging.getLogger(__name__)

OFFER_ATTEMPTS = 3
"""Tries of one offer write before the connections go to ``reassign`` hints instead."""
OFFER_CHUNK = 50
"""Connections per offer write: released together, offered together."""


class BalanceOwner(Protocol):
    """What the balancer needs of the worker."""

    worker_id: str

    @property
    def session_gen(self) -> int: ...

    def load(self) -> tuple[int, int]:
        """``(connections run now, capacity as published: 0 while closing)``."""
        ...

    def movable(self) -> list[str]:
        """The connections that may be handed off now, in no particular order."""
        ...

    async def hand_off(self, connection_ids: Sequence[str]) -> list[str]:
        """End these connections gracefully and release them; the ids released."""
        ...

    async def send_reassign(self, connection_id: str) -> None: ...


def session_key(worker_id: str, session_gen: int) -> str:
    return f"{worker_id}#{session_gen}"


class Balancer:
    def __init__(
        self,
        owner: BalanceOwner,
        sessions: SessionStore,
        settings: BalanceSettings | None,
        *,
        metrics: FleetMetrics,
        wall_ms: Callable[[], int],
        rng: random.Random,
        settle: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        tokens: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        """``settings`` None: balancing is off (rooms are then the free capacity).
        ``settle``: how long after a hand-over its connections may still be counted by
        nobody else (the receiver's renew that returns the offer publishes its load from
        before the acquire; its next renew, a heartbeat later, counts them)."""
        self._owner = owner
        self._sessions = sessions
        self._settings = settings
        self._metrics = metrics
        self._wall_ms = wall_ms
        self._rng = rng
        self._listed: list[SessionItem] = []
        self._overdue: frozenset[tuple[str, int]] = frozenset()
        self._next_round_at: float | None = None
        self._round: asyncio.Task[int] | None = None
        self._settle = settle
        self._monotonic = monotonic
        self._tokens = tokens
        self._handed: list[tuple[float, int]] = []
        """``(when, how many)`` of the hand-overs of the last ``settle`` seconds."""

    @property
    def enabled(self) -> bool:
        return self._settings is not None

    @property
    def _me(self) -> str:
        return session_key(self._owner.worker_id, self._owner.session_gen)

    def observe(
        self, sessions: Iterable[SessionItem], overdue: frozenset[tuple[str, int]] = frozenset()
    ) -> None:
        """The sessions as the reconciler has just listed them, and those of them it
        has seen unrenewed for a lease or more (:meth:`SessionWatch.overdue`)."""
        self._listed = list(sessions)
        self._overdue = overdue

    def loads(self) -> list[Load]:
        """The live sessions' loads, this worker's own as it is now. A session past its
        lease unrenewed is not counted (its worker is not renewing: a receiver that
        cannot take anything, and its connections are taken over, not balanced), nor
        an older session of this very worker (dead by definition, whether reaped yet or
        not)."""
        me = self._me
        connections, capacity = self._owner.load()
        live = [
            s
            for s in self._listed
            if s.alive and s.key not in self._overdue and s.worker_id != self._owner.worker_id
        ]
        return [*loads_of(live), Load(me, connections, capacity)]

    def in_flight(self) -> int:
        """Connections this worker handed over within the settle time: released, and
        maybe not yet published by their receiver. Safe to call from the renew thread."""
        since = self._monotonic() - self._settle
        return sum(count for at, count in list(self._handed) if at > since)

    def published_connections(self) -> int:
        """What this worker's session publishes as its ``connections``: those it runs,
        plus those it handed over within the settle time. A move is then counted twice
        for a moment, never by nobody: a fleet total that dipped by the connections in
        flight would make workers at their share look above it, and give back what
        they just received. Called from the renew thread."""
        connections, _ = self._owner.load()
        return connections + self.in_flight()

    def room(self) -> int:
        """How many connections this worker may take from balance offers or the unowned
        index now: up to its fair share of the connections the live sessions publish (a
        giver publishes a move until it settled, :meth:`published_connections`)."""
        connections, capacity = self._owner.load()
        if self._settings is None:
            return max(0, capacity - connections)
        return room_to_take(self._me, self.loads())

    def room_for_free(self, seen: int) -> int:
        """How many of ``seen`` free connections found in the unowned index this worker
        may take: its :meth:`room`, or one when it is at its share but the free ones,
        counted in, would give it room (a stray that every worker at its share would
        otherwise leave to the others; the conditional acquire lets one of them win)."""
        room = self.room()
        if room > 0 or self._settings is None:
            return room
        return min(1, room_to_take(self._me, self.loads(), seen))

    def start_round(self, now: float) -> asyncio.Task[int] | None:
        """Start a round in the background when one is due and none is running
        (``now``: loop time), so the reconciler's passes never wait for the releases of
        a round; the round's task, if one started."""
        if self._round is not None and not self._round.done():
            return None
        if not self._due(now):
            return None
        self._round = asyncio.create_task(self._guarded_round(), name="balance-round")
        return self._round

    async def _guarded_round(self) -> int:
        try:
            return await self.balance_once()
        except Exception as error:
            # What was released is in the unowned index; the sweeps find it.
            log.warning("balance round failed", extra={"error": repr(error)})
            return 0

    def _due(self, now: float) -> bool:
        settings = self._settings
        if settings is None or self._owner.session_gen == 0:
            return False
        if self._next_round_at is None:
            # The first round waits one interval: the listing has to show the fleet
            # as it is, newcomers included, before anything moves.
            self._next_round_at = now + settings.round_seconds
        if now < self._next_round_at:
            return False
        if self.in_flight():
            # Its last hand-over has not settled: the listing may not count it yet.
            return False
        if self.failover_listed():
            return False
        self._next_round_at = now + settings.round_seconds
        return True

    def failover_listed(self) -> bool:
        """Whether the last listing shows a crash failover under way: a session lapsed
        (ALIVE but unrenewed for a lease) or reaped and not forgotten yet. Its connections are in
        no live load until taken over, and its takers publish theirs at different
        moments, so a round planned now would move what the takeover has just placed,
        often before its first delivery; the round waits until the session is gone (a
        retired session, a graceful shutdown's, does not hold it back)."""
        return any(
            (s.alive and s.key in self._overdue) or (not s.alive and s.reaped_by != s.worker_id)
            for s in self._listed
        )

    async def balance_once(self) -> int:
        """One round: hand this worker's excess to the workers below their share.
        Returns how many connections it moved."""
        settings = self._settings
        if settings is None or self._owner.session_gen == 0:
            return 0
        loads = self.loads()
        plan = plan_moves(self._me, loads, settings)
        if not plan:
            return 0
        moved = await self._hand_over(plan, session_rules.OFFER)
        self._metrics.count(m.CONNECTIONS_MOVED, moved)
        log.info(
            "balance round",
            extra={
                "planned": sum(plan.values()),
                "moved": moved,
                "receivers": len(plan),
                "imbalance_before": round(imbalance(loads), 3),
            },
        )
        return moved

    async def drain(self) -> set[str]:
        """At shutdown, once this worker publishes capacity 0: hand everything it runs
        to the others (not limited by the round cap). Returns the ids handed over;
        the caller ends the rest as usual."""
        if self._owner.session_gen == 0:
            return set()
        connections, _ = self._owner.load()
        loads = [
            load if load.key != self._me else Load(load.key, connections, 0)
            for load in self.loads()
        ]
        # Planned from this worker's own listing: the receivers take a drain up to
        # their capacity, so they need not have listed this worker as draining yet.
        plan = plan_moves(self._me, loads, self._settings or BalanceSettings())
        if not plan:
            return set()
        handed: set[str] = set()
        await self._hand_over(plan, session_rules.DRAIN, handed)
        log.info(
            "drain handed over",
            extra={"planned": sum(plan.values()), "handed": len(handed), "receivers": len(plan)},
        )
        return handed

    async def _hand_over(
        self, plan: dict[str, int], kind: str, handed: set[str] | None = None
    ) -> int:
        """Release the planned number of connections for each receiver and offer them
        to it, receivers side by side; the number offered."""
        movable = self._owner.movable()
        self._rng.shuffle(movable)
        groups: dict[str, list[str]] = {}
        for receiver, count in sorted(plan.items()):
            groups[receiver], movable = movable[:count], movable[count:]
        done = await asyncio.gather(
            *(self._hand_to(receiver, ids, kind, handed) for receiver, ids in groups.items() if ids)
        )
        return sum(done)

    async def _hand_to(
        self, receiver: str, ids: list[str], kind: str, handed: set[str] | None
    ) -> int:
        """Hand ``ids`` to one receiver, in chunks of :data:`OFFER_CHUNK` side by side:
        each chunk is offered as soon as its own releases are done, so the first
        connections of a large hand-over (a drain) do not wait in the ``unowned``
        index for the last release of the group."""
        chunks = [ids[n : n + OFFER_CHUNK] for n in range(0, len(ids), OFFER_CHUNK)]
        done = await asyncio.gather(
            *(self._hand_chunk(receiver, chunk, kind, handed) for chunk in chunks)
        )
        return sum(done)

    async def _hand_chunk(
        self, receiver: str, ids: list[str], kind: str, handed: set[str] | None
    ) -> int:
        released = await self._owner.hand_off(ids)
        if handed is not None:
            handed.update(released)
        if not released:
            return 0
        self._handed = [
            *(h for h in self._handed if h[0] > self._monotonic() - self._settle),
            (self._monotonic(), len(released)),
        ]
        worker_id, _, gen = receiver.rpartition("#")
        now_ms = self._wall_ms()
        tokens = [
            session_rules.notice_token(cid, kind, now_ms, self._tokens(4)) for cid in released
        ]
        loop = asyncio.get_running_loop()
        offered = False
        # An offer is an ADD to a string set: sending it again after an error whose
        # outcome is unknown (a timeout) is harmless, and saves a detour by hints.
        for attempt in range(1, OFFER_ATTEMPTS + 1):
            try:
                offered = await loop.run_in_executor(
                    None, self._sessions.offer, worker_id, int(gen), tokens
                )
                break
            except Exception as error:
                log.warning(
                    "offer failed",
                    extra={"receiver": receiver, "attempt": attempt, "error": repr(error)},
                )
        if not offered:
            # The receiver is gone: the connections wait in the unowned index; a hint
            # brings them to someone with room sooner than a sweep would.
            for cid in released:
                await self._owner.send_reassign(cid)
            return 0
        return len(released)
