"""One session that cannot be swept costs the reconcile pass only that session
(worker/reconciler.py): the sessions listed after it are still reaped and swept."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from worker.capacity import Capacity
from worker.reconciler import Reconciler
from wsfleet import schema
from wsfleet.item import ConnectionItem
from wsfleet.session_rules import SessionItem
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)
NOW = 1_800_000_000_000


def dead(worker_id: str) -> SessionItem:
    return SessionItem(
        worker_id, 1, schema.DEAD, NOW - 5_000, reaped_at_ms=NOW - 1_000, reaped_by="me"
    )


def entry(connection_id: str, worker_id: str) -> ConnectionItem:
    return ConnectionItem(
        connection_id, schema.STARTED, "wss://feed.example/a", worker_id, 1, lease_epoch=1
    )


class Sessions:
    def __init__(self, sessions: list[SessionItem]) -> None:
        self.sessions = sessions

    def list_sessions(self, *args: Any, **kwargs: Any) -> list[SessionItem]:
        return self.sessions

    def read_page(self, *args: Any, **kwargs: Any) -> None:
        return None


class Store:
    timing = TIMING
    takeover_conflicts = 0

    def owned_by(self, worker_id: str, session_gen: int) -> list[ConnectionItem]:
        if worker_id == "broken":
            raise ValueError("an entry that does not decode")
        return [entry(f"{worker_id}-c", worker_id)]


class Owner:
    worker_id = "me"
    session_gen = 1

    def __init__(self) -> None:
        self.taken: list[str] = []

    async def take_over_many(self, seen: list[ConnectionItem], *args: Any) -> list[str]:
        self.taken += [item.connection_id for item in seen]
        return [item.connection_id for item in seen]


class Metrics:
    def count(self, name: str, value: int = 1) -> None:
        pass

    def malformed_item(self, key: str, problem: str) -> None:
        pass


def test_a_session_whose_sweep_fails_does_not_stop_the_others() -> None:
    async def sweep() -> tuple[list[str], bool]:
        owner = Owner()
        reconciler = Reconciler(
            store=cast(Any, Store()),
            sessions=cast(Any, Sessions([dead("broken"), dead("fine")])),
            owner=cast(Any, owner),
            capacity=Capacity(10),
            balancer=cast(Any, SimpleNamespace(enabled=False, observe=lambda *args: None)),
            metrics=cast(Any, Metrics()),
            wall_ms=lambda: NOW,
            rng=random.Random(1),
        )
        return await reconciler.sweep_sessions()

    taken, draining = asyncio.run(sweep())
    assert taken == ["fine-c"]
    assert not draining
