"""The runner keeps the fence: no call after the deadline even with frames buffered,
the deadline counted from a renew's send, every call bounded, lost leases counted.
Against a real feed on loopback and a scripted store (see test_connection_runner)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.unit import test_connection_runner as runner_support
from tests.unit.test_connection_runner import (
    TIMING,
    Recorder,
    ScriptedStore,
    make_runner,
    wait_for,
)
from worker.connection import DeadlineReachedError
from worker.connection_state import Ending
from worker.delivery import Delivery
from wsfleet import metric_names as m
from wsfleet.lease_rules import Lease, RenewRefusal
from wsfleet.lease_store import Renewed

pytestmark = pytest.mark.timeout(30)

feed_url = runner_support.feed_url  # the same in-process feed fixture


async def test_a_paused_loop_hands_no_buffered_frame_over_after_the_deadline(feed_url):
    """As after SIGSTOP: the loop does not run until past the fence deadline while
    frames pile up in the socket; the next buffered frame is read before any timer
    fires, and the check right before the call must stop it."""
    store = ScriptedStore(renew_answer="hang")  # nothing moves the deadline
    runner = None

    async def pause_past_the_deadline() -> None:
        assert runner is not None
        await asyncio.sleep(0.2)  # frames 3, 4, ... reach the client's queue meanwhile
        pause = max(0.0, runner.fence_deadline - asyncio.get_running_loop().time()) + 0.2
        time.sleep(pause)  # noqa: ASYNC251 - the frozen loop is the point of this test

    handler = Recorder(on_seq={2: pause_past_the_deadline})
    runner = make_runner(store, handler, feed_url)
    deadline = runner.fence_deadline
    outcome = await asyncio.wait_for(runner.run(), 5)
    store.unblock.set()
    assert outcome.ending is Ending.FENCED
    assert [seq for _, seq in handler.entered] == [1, 2]  # seq 3 was buffered, not handed over
    assert all(t < deadline for t, _ in handler.entered)


class SlowRenews(ScriptedStore):
    """Renews land, but each answer takes 0.2 s; records when each answered renew
    was sent, on the loop's clock (asyncio's default clock is time.monotonic)."""

    def __init__(self) -> None:
        super().__init__()
        self.answered_sent: list[float] = []
        self._lock = threading.Lock()

    def renew(self, lease: Lease, last_seq: int, now_ms: int) -> Renewed | RenewRefusal:
        sent = time.monotonic()
        time.sleep(0.2)
        with self._lock:
            self.answered_sent.append(sent)
        return Renewed(now_ms + TIMING.lease_ms)


async def test_the_deadline_counts_from_a_renew_send_not_from_its_answer(feed_url):
    store = SlowRenews()
    runner = make_runner(store, Recorder(), feed_url)
    first = runner.fence_deadline
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: runner.fence_deadline > first and len(store.answered_sent) >= 2, 5)
    # The deadline comes from the send of the latest renew that landed; counted from
    # its answer it would be 0.2 s later than any answered renew's send allows.
    assert runner.fence_deadline <= max(store.answered_sent) + TIMING.fence_after + 0.05
    assert runner.fence_deadline >= min(store.answered_sent) + TIMING.fence_after - 0.05
    runner.stop()
    await asyncio.wait_for(task, 3)


async def test_every_handler_call_is_bounded_by_the_deadline(feed_url):
    """A call that would run for 30 s is cut at the fence deadline, and says so."""

    class Endless(Recorder):
        async def handle(self, delivery: Delivery) -> None:
            await asyncio.sleep(30)

    runner = make_runner(ScriptedStore(), Endless(), feed_url)
    loop = asyncio.get_running_loop()
    delivery = Delivery("c1", 4, 1, {}, "w-test")
    failure = await asyncio.wait_for(runner.call_handler(delivery), 3)
    assert isinstance(failure, DeadlineReachedError)
    assert loop.time() >= runner.fence_deadline


@pytest.mark.parametrize(
    ("refusal", "lost"),
    [(RenewRefusal.LOST, 1), (RenewRefusal.STOPPED, 0), (RenewRefusal.GONE, 0)],
)
async def test_lost_leases_are_counted(feed_url, refusal, lost):
    store = ScriptedStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.finished) >= 2, 5)
    store.renew_answer = refusal
    await asyncio.wait_for(task, 3)
    assert runner._s.metrics.snapshot()[m.LEASES_LOST] == lost
