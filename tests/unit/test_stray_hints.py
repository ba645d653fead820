"""The own-check's release of a STARTED connection this worker holds but does not run
(an acquire whose reply was lost) is followed by a ``reassign`` hint: released into the
unowned index alone, it waited there, since every worker at or above its share leaves
what it finds there and the worker that released it does not take it back for a while
(found by the simulator, seed 28: a drain's offer to a worker whose replies were being
lost, acquired, reported as failed, taken again as held by itself, released as a stray
and left 8.4 s dark)."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.support.bare_worker import bare_worker
from worker.reconciler import Reconciler
from wsfleet import schema
from wsfleet.item import ConnectionItem
from wsfleet.lease_store import Released
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)


def entry(cid: str, desired_state: str = schema.STARTED) -> ConnectionItem:
    return ConnectionItem(
        connection_id=cid,
        desired_state=desired_state,
        ws_url="wss://feed",
        lease_owner="w",
        owner_session_gen=1,
        lease_epoch=7,
    )


class Owner:
    worker_id = "w"
    session_gen = 1

    def __init__(self, entries: list[ConnectionItem], landed: set[str]) -> None:
        self.entries = entries
        self.landed = landed
        self.released: list[str] = []
        self.hinted: list[str] = []

    def own_generations(self) -> list[int]:
        return [1]

    def own_check_found(self, gen: int, entries: int, checked_at: float) -> None:
        pass

    def own_entries_listed(self, connection_ids: set[str]) -> None:
        pass

    async def recheck_changed(self, seen: list[ConnectionItem]) -> None:
        pass

    def holds(self, connection_id: str) -> bool:
        return connection_id == "running"

    def recently_released(self, connection_id: str) -> bool:
        return False

    async def release_stray(self, seen: ConnectionItem) -> bool:
        self.released.append(seen.connection_id)
        return seen.connection_id in self.landed

    async def send_reassign(self, connection_id: str) -> None:
        self.hinted.append(connection_id)


def reconciler(owner: Owner) -> Reconciler:
    def owned_page(key: str, start: Any, limit: int) -> tuple[list[ConnectionItem], None]:
        return [e for e in owner.entries if schema.owner_key("w", 1, e.connection_id) == key], None

    store = SimpleNamespace(timing=TIMING, owned_page=owned_page)
    return Reconciler(
        store=cast(Any, store),
        sessions=cast(Any, None),
        owner=cast(Any, owner),
        capacity=cast(Any, None),
        balancer=cast(Any, SimpleNamespace(enabled=True)),
        metrics=cast(Any, None),
        wall_ms=lambda: 0,
        rng=random.Random(1),
    )


async def test_a_started_stray_released_is_hinted() -> None:
    owner = Owner([entry("c82"), entry("running")], landed={"c82"})
    await reconciler(owner).release_strays()
    assert owner.released == ["c82"]
    assert owner.hinted == ["c82"]


async def test_no_hint_for_a_stopped_stray_or_a_release_that_did_not_land() -> None:
    owner = Owner([entry("stopped", schema.STOPPED), entry("taken")], landed={"stopped"})
    await reconciler(owner).release_strays()
    assert sorted(owner.released) == ["stopped", "taken"]
    assert owner.hinted == []


async def test_the_worker_says_whether_its_stray_release_landed() -> None:
    w = bare_worker(TIMING)
    answers = iter(
        [
            Released(released=True, restarted=False, checkpointed=False),
            Released(released=False, restarted=False, checkpointed=False),
        ]
    )
    w.give_back._store.release = lambda lease, kept, now_ms: next(answers)  # type: ignore[method-assign]
    assert await w.release_stray(entry("c1")) is True
    assert await w.release_stray(entry("c2")) is False


class SlowHintOwner(Owner):
    """Its hints answer only once every stray is released: a hint sent before the
    next release would wait forever."""

    def __init__(self, entries: list[ConnectionItem]) -> None:
        super().__init__(entries, landed={e.connection_id for e in entries})
        self.all_released = asyncio.Event()

    async def release_stray(self, seen: ConnectionItem) -> bool:
        landed = await super().release_stray(seen)
        if len(self.released) == len(self.entries):
            self.all_released.set()
        return landed

    async def send_reassign(self, connection_id: str) -> None:
        await self.all_released.wait()
        self.hinted.append(connection_id)


async def test_a_hint_slow_to_answer_does_not_hold_the_next_strays_release() -> None:
    # Seed 200037 (draws of 116d324): the own-check released its first stray, and the
    # hint's reply was lost; the pass waited out the long poll's read timeout before
    # the next stray, which stayed dark 10.7 s after the fault healed.
    owner = SlowHintOwner([entry("c1"), entry("c33"), entry("c141")])
    await asyncio.wait_for(reconciler(owner).release_strays(), 5.0)
    assert owner.released == ["c1", "c33", "c141"]
    assert sorted(owner.hinted) == ["c1", "c141", "c33"]
