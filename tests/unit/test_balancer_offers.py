"""The giver's side of a move: an offer write that fails is tried again before the
connections go to hints, and a receiver that is gone gets no second try."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest

from worker.balancer import OFFER_ATTEMPTS, OFFER_CHUNK, Balancer
from worker.metrics import FleetMetrics
from wsfleet import schema
from wsfleet.balance_rules import BalanceSettings
from wsfleet.session_rules import SessionItem


class Owner:
    worker_id = "giver"
    session_gen = 1

    def __init__(self) -> None:
        self.hinted: list[str] = []

    def load(self) -> tuple[int, int]:
        return (4, 10)

    def movable(self) -> list[str]:
        return ["c1", "c2", "c3", "c4"]

    async def hand_off(self, connection_ids: Sequence[str]) -> list[str]:
        return list(connection_ids)

    async def send_reassign(self, connection_id: str) -> None:
        self.hinted.append(connection_id)


class Sessions:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, int, list[str]]] = []

    def offer(self, worker_id: str, session_gen: int, tokens: Sequence[str]) -> bool:
        self.calls.append((worker_id, session_gen, sorted(tokens)))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)


def balancer_of(owner: Owner, sessions: Sessions, **options: Any) -> Balancer:
    """A giver's balancer with balancing off (only hand-overs are driven here)."""
    metrics = FleetMetrics(
        namespace="T", service="s", task_id="giver", active_connections=lambda: 4
    )
    return Balancer(
        owner,  # type: ignore[arg-type]
        sessions,  # type: ignore[arg-type]
        None,
        metrics=metrics,
        wall_ms=lambda: 1_000,
        rng=random.Random(0),
        **options,
    )


def hand_to(answers: list[Any]) -> tuple[int, Owner, Sessions]:
    owner, sessions = Owner(), Sessions(answers)
    balancer = balancer_of(owner, sessions)
    moved = asyncio.run(balancer._hand_to("taker#2", ["c1", "c2"], "offer", None))
    return moved, owner, sessions


@pytest.mark.parametrize(
    ("answers", "moved", "calls", "hinted"),
    [
        ([True], 2, 1, []),
        ([TimeoutError("slow"), True], 2, 2, []),
        ([TimeoutError("slow")] * OFFER_ATTEMPTS, 0, OFFER_ATTEMPTS, ["c1", "c2"]),
        ([False], 0, 1, ["c1", "c2"]),  # the receiver's session is no longer ALIVE
    ],
)
def test_an_offer_is_tried_again_after_an_error_only(answers, moved, calls, hinted):
    got, owner, sessions = hand_to(answers)
    assert got == moved
    assert len(sessions.calls) == calls
    assert owner.hinted == hinted
    # Every try carries the same tokens to the same session: ADD makes it idempotent.
    assert {(w, g, tuple(t)) for w, g, t in sessions.calls} == {
        ("taker", 2, tuple(sessions.calls[0][2]))
    }
    assert all(t.split(" ")[:2] in (["c1", "offer"], ["c2", "offer"]) for t in sessions.calls[0][2])


# --- what the giver publishes while a move settles --------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def settling_balancer(clock: Clock) -> tuple[Balancer, Owner]:
    owner = Owner()
    return balancer_of(owner, Sessions([True, True]), settle=2.0, monotonic=clock), owner


def test_handed_over_connections_are_published_until_the_move_settles() -> None:
    clock = Clock()
    balancer, _owner = settling_balancer(clock)
    assert balancer.published_connections() == 4
    assert asyncio.run(balancer._hand_to("taker#2", ["c1", "c2"], "offer", None)) == 2
    clock.now += 1.0
    assert asyncio.run(balancer._hand_to("taker#2", ["c3"], "offer", None)) == 1
    # The owner's own count is what it runs; the three moved are still counted here,
    # so the fleet's total never dips while the receivers have not published them.
    assert balancer.in_flight() == 3
    assert balancer.published_connections() == 4 + 3
    clock.now += 1.0  # the first hand-over has settled
    assert balancer.in_flight() == 1
    clock.now += 1.0
    assert balancer.in_flight() == 0
    assert balancer.published_connections() == 4


def test_a_large_hand_over_is_offered_in_chunks_each_after_its_own_releases() -> None:
    owner = Owner()
    released: list[list[str]] = []

    async def hand_off(connection_ids: Sequence[str]) -> list[str]:
        released.append(list(connection_ids))
        return list(connection_ids)

    owner.hand_off = hand_off  # type: ignore[method-assign]
    sessions = Sessions([True] * 3)
    balancer = balancer_of(owner, sessions)
    ids = [f"c{n:03}" for n in range(OFFER_CHUNK * 2 + 7)]
    assert asyncio.run(balancer._hand_to("taker#2", ids, "drain", None)) == len(ids)
    assert [len(chunk) for chunk in released] == [OFFER_CHUNK, OFFER_CHUNK, 7]
    assert [len(tokens) for _, _, tokens in sessions.calls] == [OFFER_CHUNK, OFFER_CHUNK, 7]
    assert sorted(t.split()[0] for _, _, tokens in sessions.calls for t in tokens) == ids


# --- no round while a crash failover is under way -----------------------------------------


def _session(worker: str, **fields: Any) -> SessionItem:
    base: dict[str, Any] = {
        "worker_id": worker,
        "session_gen": 1,
        "state": schema.ALIVE,
        "expires_at_ms": 3_000,
        "connections": 4,
        "capacity": 10,
    }
    return SessionItem(**(base | fields))


@pytest.mark.parametrize(
    ("listed", "due"),
    [
        ([_session("other")], True),
        ([_session("other", session_gen=2)], False),  # unrenewed for a lease, not reaped yet
        ([_session("other", state=schema.DEAD, reaped_at_ms=900, reaped_by="x")], False),
        ([_session("other", state=schema.DEAD, reaped_at_ms=900, reaped_by="other")], True),
        ([_session("giver", session_gen=0, state=schema.DEAD, reaped_by="x")], False),
    ],
)
def test_no_round_starts_while_a_crashed_session_is_listed(listed, due):
    balancer = balancer_of(Owner(), Sessions([]))
    balancer._settings = BalanceSettings(round_seconds=5.0)
    assert not balancer._due(0.0)  # the first round waits one interval
    balancer.observe(listed, overdue=frozenset({("other", 2)}))
    assert balancer._due(5.0) is due
    balancer.observe([_session("other")])  # the dead session is forgotten
    assert balancer._due(5.0) is not due  # at once if held back, else the next interval
