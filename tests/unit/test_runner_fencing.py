"""The runner keeps the session's fence: no handler call starts at or after the
deadline (even with frames buffered), the call in flight is cut at it, past it the
connection pauses until a session renew moves the deadline, and the checkpoint never
passes a message whose call did not return. Against a real feed on loopback and a
fake store (see test_connection_runner); the session's renews are reported by hand
with ``session_renewed(sent_at)``, as the worker does after each renew that landed."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.unit import test_connection_runner as runner_support
from tests.unit.test_connection_runner import (
    EPOCH,
    TIMING,
    FakeStore,
    Recorder,
    make_runner,
    new_metrics,
    start,
    wait_for,
)
from worker.connection_state import Ending
from worker.delivery import Delivery
from worker.handler_calls import DeadlineReachedError
from wsfleet import metric_names as m

pytestmark = pytest.mark.timeout(30)

feed_url = runner_support.feed_url  # the same in-process feed fixture


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_no_handler_call_starts_at_or_after_the_deadline_without_a_renew(feed_url):
    """No renew lands (DynamoDB unreachable): messages flow until the deadline, then
    none is handed over; the connection waits (it does not end by itself), and a reap
    ends it without a release."""
    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url, metrics=metrics)
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: now() > deadline + 0.4, 3)
    assert handler.entered, "messages flowed before the deadline"
    assert all(t < deadline for t, _ in handler.entered)
    assert not task.done()  # paused, not ended: only the session's reap ends it
    assert runner.checkpoint == handler.finished[-1]
    runner.stop(Ending.LOST)
    outcome = await asyncio.wait_for(task, 3)
    assert (outcome.ending, outcome.released, outcome.last_seq) == (
        Ending.LOST,
        False,
        handler.finished[-1],
    )
    assert store.releases == []
    assert metrics.snapshot()[m.LEASES_LOST] == 1


async def test_a_paused_loop_hands_no_buffered_frame_over_after_the_deadline(feed_url):
    """As after SIGSTOP: the loop does not run until past the fence deadline while
    frames pile up in the socket; the next buffered frame is read before any timer
    fires, and the check right before the call must stop it. A renew after that
    resumes the connection with that same frame."""
    runner = None

    async def freeze_past_the_deadline() -> None:
        assert runner is not None
        await asyncio.sleep(0.2)  # frames 3, 4, ... reach the client's queue meanwhile
        pause = max(0.0, runner.fence_deadline - now()) + 0.2
        time.sleep(pause)  # noqa: ASYNC251 - the frozen loop is the point of this test

    store = FakeStore()
    handler = Recorder(on_seq={2: freeze_past_the_deadline})
    runner = make_runner(store, handler, feed_url)
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: 2 in handler.finished and now() > deadline + 0.3, 5)
    assert handler.entered_seqs() == [1, 2]  # seq 3 was buffered, not handed over
    assert all(t < deadline for t, _ in handler.entered)
    assert runner.checkpoint == 2
    renewed_at = now()
    runner.session_renewed(renewed_at)
    await wait_for(lambda: len(handler.finished) >= 5, 5)
    assert handler.finished[:5] == [1, 2, 3, 4, 5]
    assert all(t >= renewed_at for t, seq in handler.entered if seq >= 3)
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert (outcome.ending, outcome.released) == (Ending.SHUTDOWN, True)


async def test_the_call_in_flight_is_cut_at_the_deadline_and_called_again_after_a_renew(
    feed_url,
):
    metrics = new_metrics()
    store = FakeStore()
    cut: list[float] = []

    async def runs_past_the_deadline() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cut.append(now())
            raise

    handler = Recorder(on_seq={3: runs_past_the_deadline})
    runner = make_runner(store, handler, feed_url, metrics=metrics)
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: cut, 3)
    assert deadline <= cut[0] < deadline + 0.5
    await asyncio.sleep(0.3)  # paused: nothing called, nothing checkpointed
    assert handler.entered_seqs() == [1, 2, 3]
    assert runner.checkpoint == 2
    assert runner.page_entry(now(), time.time_ns() // 1_000_000).seq == 2
    renewed_at = now()
    runner.session_renewed(renewed_at)
    assert runner.fence_deadline == renewed_at + TIMING.fence_after
    await wait_for(lambda: 3 in handler.finished, 3)
    third = [t for t, seq in handler.entered if seq == 3]
    assert len(third) == 2  # the same message again, under the same lease
    assert third[1] >= renewed_at
    assert handler.deliveries[3].epoch == handler.deliveries[2].epoch == EPOCH
    assert metrics.snapshot()[m.HANDLER_ERRORS] == 0  # the deadline, not the handler
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert outcome.last_seq == runner.checkpoint >= 3
    assert store.releases == [(EPOCH, outcome.last_seq)]


async def test_the_deadline_comes_from_the_renews_send_and_never_moves_back(feed_url):
    runner = make_runner(FakeStore(), Recorder(), feed_url, deadline=now())
    sent = now() - 0.2  # sent 0.2 s ago, answered just now
    runner.session_renewed(sent)
    assert runner.fence_deadline == sent + TIMING.fence_after
    runner.session_renewed(sent - 0.1)  # an older renew reported late
    assert runner.fence_deadline == sent + TIMING.fence_after


async def test_a_renew_that_lands_too_late_does_not_resume_a_paused_runner(feed_url):
    """A renew whose send is more than the fence span ago proves nothing for now."""
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: now() > deadline + 0.2, 3)
    handled = len(handler.entered)
    stale = now() - TIMING.fence_after - 0.05
    runner.session_renewed(stale)
    assert runner.fence_deadline == stale + TIMING.fence_after < now()
    await asyncio.sleep(0.3)
    assert len(handler.entered) == handled
    runner.session_renewed(now())
    await wait_for(lambda: len(handler.entered) > handled, 3)
    runner.stop()
    await asyncio.wait_for(task, 3)


async def test_a_paused_runner_stopped_gracefully_releases_its_checkpoint(feed_url):
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: now() > deadline + 0.2, 3)
    stopped_at = now()
    runner.stop(Ending.STOPPED)
    outcome = await asyncio.wait_for(task, 3)
    assert now() - stopped_at < 0.5  # nothing in flight to drain
    assert (outcome.ending, outcome.released) == (Ending.STOPPED, True)
    assert store.releases == [(EPOCH, handler.finished[-1])]
    assert all(t < deadline for t, _ in handler.entered)


async def test_every_handler_call_is_bounded_by_the_deadline(feed_url):
    """A call that would run for 30 s is cut at the fence deadline, and says so."""

    class Endless(Recorder):
        async def handle(self, delivery: Delivery) -> None:
            await asyncio.sleep(30)

    runner = make_runner(FakeStore(), Endless(), feed_url, deadline=now() + 0.3)
    delivery = Delivery("c1", EPOCH, 1, {}, "w-test")
    failure = await asyncio.wait_for(runner.call_handler(delivery), 3)
    assert isinstance(failure, DeadlineReachedError)
    assert now() >= runner.fence_deadline


async def test_a_renew_during_a_call_extends_it(feed_url):
    class Slow(Recorder):
        async def handle(self, delivery: Delivery) -> None:
            await asyncio.sleep(0.6)

    runner = make_runner(FakeStore(), Slow(), feed_url, deadline=now() + 0.4)

    async def renew_soon() -> None:
        await asyncio.sleep(0.05)
        runner.session_renewed(now())

    renewing = asyncio.create_task(renew_soon())
    failure = await asyncio.wait_for(runner.call_handler(Delivery("c1", EPOCH, 1, {}, "w")), 3)
    await renewing
    assert failure is None  # 0.6 s, past the first deadline but inside the moved one


async def test_an_idle_connection_pauses_quietly_and_a_renew_resumes_it(feed_url):
    """No frame comes, so no handler call checks the deadline: the connection stays,
    and still hands nothing over until a renew once frames come."""
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url + "?count=0")
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: now() > deadline + 0.3, 3)
    assert not task.done()
    assert handler.entered == []
    runner.session_renewed(now())
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert (outcome.ending, outcome.released, outcome.last_seq) == (Ending.SHUTDOWN, True, 0)
    assert store.releases == [(EPOCH, 0)]


async def test_the_watchdog_follows_renews_and_cuts_at_the_last_deadline(feed_url):
    """One watchdog per connection, not moved by renews: it fires at the first
    deadline, finds it moved, and cuts the call only at the deadline of the last
    renew. The task that made the call carries no cancel request afterwards."""
    cut: list[float] = []

    class Endless(Recorder):
        async def handle(self, delivery: Delivery) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cut.append(now())
                raise

    runner = make_runner(FakeStore(), Endless(), feed_url, deadline=now() + 0.3)

    async def renew_twice() -> None:
        for _ in range(2):
            await asyncio.sleep(0.2)
            runner.session_renewed(now())

    renewing = asyncio.create_task(renew_twice())
    failure = await asyncio.wait_for(runner.call_handler(Delivery("c1", EPOCH, 1, {}, "w")), 5)
    await renewing
    assert isinstance(failure, DeadlineReachedError)
    assert runner.fence_deadline <= cut[0] < runner.fence_deadline + 0.2
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(0.01)  # not cancelled by a leftover request


async def test_a_handler_that_swallows_the_cut_and_returns_has_handled_it(feed_url):
    class Stubborn(Recorder):
        async def handle(self, delivery: Delivery) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return

    runner = make_runner(FakeStore(), Stubborn(), feed_url, deadline=now() + 0.2)
    failure = await asyncio.wait_for(runner.call_handler(Delivery("c1", EPOCH, 1, {}, "w")), 3)
    assert failure is None
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
