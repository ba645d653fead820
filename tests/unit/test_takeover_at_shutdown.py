"""A batched takeover whose caller (the reconcile loop) is cancelled at shutdown goes on,
and the shutdown still waits for it: its slots come back before the worker exits.
Before, cancelling the caller also dropped the batch from what the shutdown waits for,
and the worker exited with the batch's slots reserved and its takeover in flight
(found by the simulator: a SIGTERM 0.1 s after a worker began taking over a crashed
session's 48 connections, which it exited still holding as slots)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.support.bare_worker import bare_worker
from wsfleet.item import ConnectionItem
from wsfleet.lease_rules import TakeoverStep
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)


def listed(connection_id: str) -> ConnectionItem:
    return cast(ConnectionItem, SimpleNamespace(connection_id=connection_id))


async def until(condition: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 5.0
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within 5 s: {what}"
        await asyncio.sleep(0.01)


async def test_a_takeover_whose_caller_is_cancelled_is_still_awaited_by_the_shutdown() -> None:
    w = bare_worker(TIMING)
    w.standing.gen, w.standing.live = 1, True
    w.standing.deadline = asyncio.get_running_loop().time() + TIMING.lease
    slots = w.capacity.free
    sent, answer = threading.Event(), threading.Event()

    def take_over_many(chunk: list[ConnectionItem], *args: Any, **kwargs: Any) -> dict[str, Any]:
        sent.set()
        answer.wait(5.0)  # the transaction in flight
        return {item.connection_id: TakeoverStep.GONE for item in chunk}

    w.ownership._store.take_over_many = take_over_many  # type: ignore[method-assign]
    dead = cast(Any, SimpleNamespace(expires_at_ms=0))
    caller = asyncio.create_task(w.take_over_many([listed("c1"), listed("c2")], dead, None))
    await until(sent.is_set, "the takeover's transaction sent")
    assert w.capacity.free == slots - 2

    caller.cancel()  # the shutdown cancels the reconcile loop first
    await asyncio.gather(caller, return_exceptions=True)
    # What the shutdown waits for (Worker.shutdown: "attempts in flight finish").
    assert set(w.holdings.acquiring) == {"c1", "c2"}
    answer.set()
    await asyncio.gather(*w.holdings.acquiring.values(), return_exceptions=True)
    assert w.capacity.free == slots
    assert not w.holdings.acquiring
