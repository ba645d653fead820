"""The session keeper's threads against a scripted store (worker/session.py): renews go
out a heartbeat apart while earlier ones are unanswered, a late answer counts from its
send, and a session whose renews never answer is given up. Every renew waits for the
test to answer it, so the order of events is the test's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.support.session_events import Told
from worker.session import SessionKeeper
from wsfleet.session_rules import RenewRefusal
from wsfleet.session_store import SessionRenewed
from wsfleet.timing import LeaseTiming

#: Short, so the tests are quick: heartbeat 0.1 s, fence window 0.85 s.
TIMING = LeaseTiming(lease=1.0, heartbeat=0.1, reconcile=0.1, margin=0.1)
WAIT_S = 10.0
"""How long a test waits for anything (a bound, never a pause)."""


@dataclass
class Renew:
    at: float
    answer: SessionRenewed | RenewRefusal | Exception | None = None
    answered: threading.Event = field(default_factory=threading.Event)


class ScriptedStore:
    """A session store whose every renew blocks until the test answers it."""

    timing = TIMING

    def __init__(self) -> None:
        self.renews: list[Renew] = []
        self.changed = threading.Condition()
        self.closed = threading.Event()

    def renew(self, worker_id: str, session_gen: int, now_ms: int, **_: object) -> object:
        call = Renew(time.monotonic())
        with self.changed:
            self.renews.append(call)
            self.changed.notify_all()
        while not call.answered.wait(0.05):
            if self.closed.is_set():
                raise TimeoutError("the test ended")
        assert call.answer is not None
        if isinstance(call.answer, Exception):
            raise call.answer
        return call.answer

    def answer(self, n: int, answer: SessionRenewed | RenewRefusal | Exception) -> None:
        call = self.renews[n]
        call.answer = answer
        call.answered.set()

    def wait_renews(self, count: int) -> list[Renew]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.renews) >= count, WAIT_S):
                raise TimeoutError(f"{len(self.renews)} renews sent, waiting for {count}")
            return list(self.renews)


@pytest.fixture
def store() -> Iterator[ScriptedStore]:
    store = ScriptedStore()
    yield store
    store.closed.set()


def start_keeper(store: ScriptedStore, told: Told) -> tuple[SessionKeeper, float]:
    opened_at = time.monotonic()
    keeper = SessionKeeper(
        store,  # type: ignore[arg-type]
        "w",
        1,
        told,  # type: ignore[arg-type]
        told.events(),
        wall_ms=lambda: time.time_ns() // 1_000_000,
        connections=lambda: 0,
        capacity=lambda: 1,
        first_renew_at=opened_at + TIMING.heartbeat,
        opened_at=opened_at,
    )
    keeper.start()
    return keeper, opened_at


def test_the_next_renew_goes_out_while_one_is_unanswered_and_the_late_answer_counts(store):
    told = Told()
    keeper, _ = start_keeper(store, told)
    try:
        first, second = store.wait_renews(2)[:2]
        assert not first.answered.is_set()  # the second went out meanwhile
        assert second.at - first.at >= TIMING.heartbeat - 0.01
        store.answer(0, SessionRenewed(frozenset({"n1"})))  # two heartbeats late, counts
        told.wait(lambda: len(told.landed) == 1, WAIT_S, "the late renew to land")
        assert told.landed[0].sent_at <= first.at
        store.answer(1, SessionRenewed(frozenset()))
        told.wait(lambda: len(told.landed) == 2, WAIT_S, "the second renew to land")
        assert told.landed[1].sent_at <= second.at
        assert told.landed[0].sent_at < told.landed[1].sent_at
    finally:
        keeper.stop()


def test_an_older_renew_answered_after_a_newer_one_is_not_reported(store):
    told = Told()
    keeper, _ = start_keeper(store, told)
    try:
        first, second = store.wait_renews(2)[:2]
        store.answer(1, SessionRenewed(frozenset()))
        told.wait(lambda: len(told.landed) == 1, WAIT_S, "the newer renew to land")
        store.answer(0, SessionRenewed(frozenset()))  # moves nothing: not told
        third = store.wait_renews(3)[2]
        store.answer(2, SessionRenewed(frozenset()))
        told.wait(lambda: len(told.landed) == 2, WAIT_S, "the third renew to land")
        assert first.at < told.landed[0].sent_at <= second.at  # the second's
        assert second.at < told.landed[1].sent_at <= third.at  # the third's
    finally:
        keeper.stop()


def test_a_session_whose_renews_never_answer_is_given_up_a_heartbeat_past_its_deadline(store):
    told = Told()
    keeper, opened_at = start_keeper(store, told)
    told.wait(lambda: bool(told.given_up), WAIT_S, "the session to be given up")
    given_up_at = told.given_up[0]
    assert given_up_at >= opened_at + TIMING.fence_after + TIMING.heartbeat
    sent = len(store.renews)
    assert 1 <= sent <= 4  # never more in flight than the cap
    assert all(renew.at < given_up_at for renew in store.renews)
    keeper.join(WAIT_S)
    assert not keeper._thread.is_alive()  # nothing is sent any more
    store.answer(0, SessionRenewed(frozenset()))  # too late: counts for nothing
    assert told.landed == []
    assert told.given_up == [given_up_at]


def test_an_error_is_told_and_the_renews_go_on(store):
    told = Told()
    keeper, _ = start_keeper(store, told)
    try:
        store.wait_renews(1)
        store.answer(0, ConnectionError("refused"))
        told.wait(lambda: told.failures == 1, WAIT_S, "the failure to be told")
        store.wait_renews(2)
        store.answer(1, SessionRenewed(frozenset()))
        told.wait(lambda: len(told.landed) == 1, WAIT_S, "the next renew to land")
    finally:
        keeper.stop()


def test_a_refusal_on_a_dead_session_ends_the_keeper_as_reaped(store):
    told = Told()
    keeper, _ = start_keeper(store, told)
    store.wait_renews(1)
    store.answer(0, RenewRefusal.REAPED)
    told.wait(lambda: told.reaped == 1, WAIT_S, "the reap to be told")
    keeper.join(WAIT_S)
    assert told.given_up == []
