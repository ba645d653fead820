"""What the router and the other workers tell this worker through its session, and
the checks that stand in for a notice that never came.

A renew's answer carries notices (docs/DESIGN.md §3.4): stops and restarts of the
session's connections, and offers of connections another worker released for this one
(a balance move, a drain). Offers are acquired (moves up to this worker's fair share,
drains up to capacity); a stop ends its runner at once; the other notices are checked
by reading the named items strongly, in batches, and the runners that were restarted,
deleted or lost are ended. The own-check's listing goes the same way when an entry
differs from what its runner was started with (``recheck_changed``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from worker.acquire_result import AcquireResult
from worker.connection_state import Ending
from worker.holdings import Holdings
from wsfleet import session_rules
from wsfleet.item import ConnectionItem
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore

log = logging.getLogger(__name__)

STOPS_REMEMBERED = 4096
"""Stop notices remembered as acted on: far more than a session holds at once."""


class Room(Protocol):
    def room(self) -> int:
        """How many balance moves this worker may take now (its fair share)."""
        ...


class Notices:
    def __init__(
        self,
        *,
        store: LeaseStore,
        holdings: Holdings,
        balancer: Room,
        acquire: Callable[[str], Awaitable[AcquireResult]],
        send_reassign: Callable[[str], Awaitable[None]],
    ) -> None:
        self._store = store
        self._holdings = holdings
        self._balancer = balancer
        self._acquire = acquire
        self._send_reassign = send_reassign
        self._stops_done: dict[str, None] = {}
        """Stop notices acted on, oldest first (:meth:`_end_stopped`)."""

    async def act_on(self, tokens: set[str], acted: set[str]) -> None:
        """The router stopped or restarted some of this session's connections, or
        other workers offered some: read the named items strongly, in batches (a burst
        of stops costs a round trip per hundred, not one each), and end their runners
        accordingly; take the offers. Each token acted on is added to ``acted`` as
        soon as it is (the next renew removes them)."""
        offers = {t for t in tokens if session_rules.notice_kind(t) in session_rules.HANDOFFS}
        others = tokens - offers
        stopped = self._end_stopped(others)
        acted |= {t for t in others if session_rules.notice_connection_id(t) in stopped}
        acted |= await self._take_offers(offers)
        others = {t for t in others if session_rules.notice_connection_id(t) not in stopped}
        decided = await self._recheck({session_rules.notice_connection_id(t) for t in others})
        acted |= {t for t in others if session_rules.notice_connection_id(t) in decided}

    def _end_stopped(self, tokens: set[str]) -> set[str]:
        """End at once, on the router's word alone, each runner whose connection's
        latest notice is a stop: the stop bound holds whenever the renews land, however
        slow this worker's other reads are (docs/DESIGN.md §3.4). Ending is always
        safe: the release is conditional, and one that finds the connection started
        after all takes it again. A stop notice is acted on once: a renew in flight
        before it was removed returns it again, after the connection may have been
        started and taken again. The ids decided (one being acquired is decided by its
        acquire's answer: the notice stays for the next renew)."""
        done = self._stops_done
        stops = {t for t in tokens if session_rules.notice_kind(t) == "stop"}
        fresh = {t for t in stops if t not in done}
        for token in fresh:
            done[token] = None
        while len(done) > STOPS_REMEMBERED:
            del done[next(iter(done))]
        ended = set()
        for cid in session_rules.stopped_by_notice(tokens):
            if cid in self._holdings.acquiring:
                continue
            ended.add(cid)
            runner = self._holdings.runners.get(cid)
            named = {t for t in fresh if session_rules.notice_connection_id(t) == cid}
            if runner is not None and named:
                log.info("connection stopped by notice", extra={"connection_id": cid})
                runner.stop(Ending.STOPPED)
        return ended

    async def recheck_changed(self, seen: list[ConnectionItem]) -> None:
        """Entries of this session's ``by-owner`` listing whose desired state or
        ``start_gen`` differ from what the runner was started with: a stop or a restart
        whose notice never arrived (the router failed between its two writes). They
        are read strongly and acted on like notices."""
        changed = set()
        for item in seen:
            runner = self._holdings.runners.get(item.connection_id)
            if runner is None or (item.started and item.start_gen == runner.lease.start_gen):
                continue
            log.warning(
                "owned connection changed without a notice; checking it",
                extra={"connection_id": item.connection_id},
            )
            changed.add(item.connection_id)
        await self._recheck(changed)

    async def _take_offers(self, tokens: set[str]) -> set[str]:
        """Connections another worker released for this one: a balance move, taken up to
        this worker's fair share, or a drain, taken up to capacity like
        a dead session's (everything of a worker that shuts down must find a home).
        A move beyond the share is declined and hinted on the start queue, and so is an
        offer this worker could not even try (no free slot, no session ready, closing:
        an unsettled result). Every offer is acted on but one whose acquire raised (its
        outcome unknown: the next renew returns the offer again, and the own-check looks
        at what may have landed)."""
        if not tokens:
            return set()
        drains = {t for t in tokens if session_rules.notice_kind(t) == session_rules.DRAIN}
        drained = sorted({session_rules.notice_connection_id(t) for t in drains})
        moves = sorted({session_rules.notice_connection_id(t) for t in tokens - drains})
        room = self._balancer.room() if moves else 0
        accepted = drained + moves[:room]
        declined = moves[room:]
        outcomes = await asyncio.gather(
            *(self._acquire(cid) for cid in accepted), return_exceptions=True
        )
        results = [r for r in outcomes if isinstance(r, AcquireResult)]
        failed = {
            cid for cid, r in zip(accepted, outcomes, strict=True) if isinstance(r, Exception)
        }
        for cid, outcome in zip(accepted, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # a cancellation: the worker is stopping
            if cid in failed:
                log.warning(
                    "could not take an offered connection; the offer stays",
                    extra={"connection_id": cid, "error": repr(outcome)},
                )
        # Not tried (every slot reserved, by a takeover in flight say): dropped, the
        # offer would leave the connection in the unowned index like a declined move.
        declined += [
            cid
            for cid, outcome in zip(accepted, outcomes, strict=True)
            if isinstance(outcome, AcquireResult) and not outcome.settled
        ]
        # A move this worker does not take (its view of the loads says it is at its
        # share; the giver's said otherwise) would wait in the unowned index, where
        # every worker at or above its share leaves it too: a hint hands it to whoever
        # has a free slot now (a hint is taken up to capacity), and a later round
        # evens the loads out gracefully.
        await asyncio.gather(*(self._send_reassign(cid) for cid in declined))
        log.info(
            "offers",
            extra={
                "drained": len(drained),
                "moved": len(moves),
                "room": room,
                "won": sum(1 for r in results if r is AcquireResult.WON),
                "declined": len(declined),
                "failed": len(failed),
            },
        )
        return {t for t in tokens if session_rules.notice_connection_id(t) not in failed}

    async def _recheck(self, connection_ids: set[str]) -> set[str]:
        """Read these connections strongly and end each runner that was stopped,
        started again, deleted or lost; the ids decided (an id being acquired is
        decided by the acquire's own answer, and none is when the read fails: both
        are looked at again later)."""
        runners = self._holdings.runners
        pending = {cid for cid in connection_ids if cid not in self._holdings.acquiring}
        decided = pending - set(runners)
        running = sorted(pending & set(runners))
        if not running:
            return decided
        # A runner started after the read belongs to a newer hold, which its own
        # acquire decided: only the runners read about are acted on.
        read_for = {cid: runners[cid] for cid in running}
        loop = asyncio.get_running_loop()
        try:
            items = await loop.run_in_executor(None, self._store.get_many, running)
        except Exception as error:
            log.warning(
                "could not read noticed connections",
                extra={"connections": len(running), "error": repr(error)},
            )
            return decided
        for cid in running:
            runner = runners.get(cid)
            if runner is read_for[cid]:
                ending = _notice_ending(items.get(cid), runner.lease)
            else:
                ending = None
            if runner is not None and ending is not None:
                log.info(
                    "connection noticed as changed",
                    extra={"connection_id": cid, "ending": ending.value},
                )
                runner.stop(ending)
            decided.add(cid)
        return decided


def _notice_ending(item: ConnectionItem | None, lease: Lease) -> Ending | None:
    """How a connection named in a notice ends, from its item read strongly."""
    if item is None:
        return Ending.GONE
    if item.lease_owner != lease.owner or item.lease_epoch != lease.epoch:
        return Ending.LOST
    if not item.started:
        return Ending.STOPPED
    if item.start_gen != lease.start_gen:
        return Ending.RESTARTED
    return None
