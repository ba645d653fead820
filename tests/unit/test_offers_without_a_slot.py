"""An offered connection the receiver cannot even try to acquire (every slot reserved,
say by a takeover in flight; no session ready; shutting down) is passed on with a
``reassign`` hint, like a move beyond the receiver's share. Dropped instead, it waited
in the unowned index, where every worker at or above its share leaves it (found by the
simulator, seed 5019: a balance move to a receiver whose slots a failing takeover had
reserved, 8.4 s dark)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.bare_worker import bare_worker
from worker.acquire_result import AcquireResult
from wsfleet import session_rules
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)


def offers(kind: str, *ids: str) -> set[str]:
    return {session_rules.notice_token(cid, kind, 1_000, "ab12") for cid in ids}


async def test_offers_that_find_every_slot_reserved_are_hinted() -> None:
    w = bare_worker(TIMING)
    # A live session, renewed just now.
    w.standing.gen, w.standing.live = 1, True
    w.standing.deadline = asyncio.get_running_loop().time() + TIMING.lease
    while w.capacity.try_reserve():
        pass  # every slot reserved by a takeover whose transactions are in flight
    w.balancer.room = lambda: 5  # type: ignore[method-assign]  # its share has room
    hinted: list[str] = []

    async def send_reassign(connection_id: str) -> None:
        hinted.append(connection_id)

    w.notices._send_reassign = send_reassign
    tokens = offers(session_rules.OFFER, "m1", "m2") | offers(session_rules.DRAIN, "d1")
    acted: set[str] = set()
    await w.notices.act_on(tokens, acted)
    assert await w.acquire("m1") is AcquireResult.NO_CAPACITY
    assert sorted(hinted) == ["d1", "m1", "m2"]
    assert acted == tokens  # acted on: the hint now stands for the offer


async def test_offers_to_a_worker_without_a_ready_session_are_hinted() -> None:
    w = bare_worker(TIMING)  # no session open
    hinted: list[str] = []

    async def send_reassign(connection_id: str) -> None:
        hinted.append(connection_id)

    w.notices._send_reassign = send_reassign
    tokens = offers(session_rules.DRAIN, "d1", "d2")
    acted: set[str] = set()
    await w.notices.act_on(tokens, acted)
    assert acted == tokens
    assert sorted(hinted) == ["d1", "d2"]


async def test_offers_won_or_held_elsewhere_are_not_hinted() -> None:
    w = bare_worker(TIMING)
    results = {"d1": AcquireResult.WON, "d2": AcquireResult.HELD, "d3": AcquireResult.STOPPED}

    async def acquire(connection_id: str) -> AcquireResult:
        return results[connection_id]

    hinted: list[str] = []

    async def send_reassign(connection_id: str) -> None:
        hinted.append(connection_id)

    w.notices._acquire = acquire
    w.notices._send_reassign = send_reassign
    tokens = offers(session_rules.DRAIN, "d1", "d2", "d3")
    acted: set[str] = set()
    await w.notices.act_on(tokens, acted)
    assert acted == tokens
    assert hinted == []
