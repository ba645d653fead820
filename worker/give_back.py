"""Connections a worker holds in the table but does not run, given back: a lease won
under a session that is no longer live (released unrun), a stray the own-check found
(released with the final checkpoint of an unanswered release, when there was one),
and an item that cannot be run (parked with the problem as its reason,
docs/DESIGN.md §2.2).

A give-back whose outcome stays unknown marks the worker's standing with doubt, so
the next reconcile pass lists its own entries again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable

from worker.holdings import Holdings
from worker.metrics import FleetMetrics
from worker.releasing import release_within_budget
from worker.standing import Standing
from wsfleet import lease_rules
from wsfleet import metric_names as m
from wsfleet.item import ConnectionItem, connection_key_text
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore

log = logging.getLogger(__name__)


def _now() -> float:
    return asyncio.get_running_loop().time()


class GiveBack:
    def __init__(
        self,
        *,
        worker_id: str,
        store: LeaseStore,
        holdings: Holdings,
        standing: Standing,
        metrics: FleetMetrics,
        wall_ms: Callable[[], int],
        rng: random.Random,
        send_reassign: Callable[[str], Awaitable[None]],
    ) -> None:
        self._worker_id = worker_id
        self._store = store
        self._holdings = holdings
        self._standing = standing
        self._metrics = metrics
        self._wall_ms = wall_ms
        self._rng = rng
        self._send_reassign = send_reassign

    async def unrun(self, lease: Lease) -> None:
        """Release a lease that was never run: conditional on owner and epoch, and
        without a checkpoint, since nothing was handled under it."""
        log.warning(
            "lease won under a session that is no longer live: giving it back unrun",
            extra={
                "connection_id": lease.connection_id,
                "epoch": lease.epoch,
                "session_gen": lease.session_gen,
                "live_session_gen": self._standing.session_gen,
            },
        )
        self._holdings.released[lease.connection_id] = _now()
        released = await release_within_budget(
            functools.partial(self._store.release, lease, None, self._wall_ms()),
            lease.connection_id,
            self._standing.timing,
            self._rng,
        )
        if released is None:
            self._standing.suspect(lease.session_gen, _now())
        elif released.released:
            self._metrics.count(m.LEASES_RELEASED)
            # Free in the unowned index alone, it would wait there: every worker at
            # or above its share leaves what it finds there, and this one does not
            # take back what it just released. A hint hands it to whoever has room.
            await self._send_reassign(lease.connection_id)

    async def stray(self, seen: ConnectionItem) -> bool:
        """Release a connection this session owns but does not run, with the final
        checkpoint of its unanswered release when there was one for that hold (park it
        when its entry cannot be run: a release would compare what is malformed).
        Whether a release landed (False for a park)."""
        cid = seen.connection_id
        unanswered = self._holdings.unanswered
        kept = lease_rules.unanswered_checkpoint(unanswered.get(cid), seen)
        lease = lease_rules.lease_of_entry(seen, self._worker_id, seen.owner_session_gen or 0)
        self._holdings.released[cid] = _now()
        if lease.malformed is not None:
            await self.malformed(lease, lease.malformed)
            return False
        loop = asyncio.get_running_loop()
        released = await loop.run_in_executor(
            None, self._store.release, lease, kept, self._wall_ms()
        )
        unanswered.pop(cid, None)  # answered: released, or no longer ours
        if released.released:
            self._metrics.count(m.LEASES_RELEASED)
        return released.released

    async def malformed(self, lease: Lease, problem: str) -> None:
        """Park a connection this session holds whose item cannot be run, with the
        problem as its reason (docs/DESIGN.md §2.2). An error leaves
        it to the own-check, which finds it held and not run."""
        self._metrics.malformed_item(connection_key_text(lease.connection_id), problem)
        loop = asyncio.get_running_loop()
        try:
            released = await loop.run_in_executor(
                None, self._store.park_malformed, lease, problem, self._wall_ms()
            )
        except Exception as error:
            self._standing.doubt = True
            log.warning(
                "could not park a malformed connection",
                extra={"connection_id": lease.connection_id, "error": repr(error)},
            )
            return
        if released.parked:
            self._metrics.count(m.CONNECTIONS_FAILED)
            log.warning(
                "connection parked: its item cannot be run",
                extra={"connection_id": lease.connection_id, "reason": problem},
            )
