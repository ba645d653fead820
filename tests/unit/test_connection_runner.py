"""One connection runner in-process against a real feed on loopback and a scripted
lease store: fencing when DynamoDB is unreachable, and the ending order."""

from __future__ import annotations

import asyncio
import io
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from local_stack.feed import serve_feed
from worker.connection import ConnectionRunner, ConnectionSettings
from worker.connection_state import Ending
from worker.delivery import Delivery
from worker.metrics import FleetMetrics
from worker.upstream_protocol import JsonSeqProtocol
from wsfleet.lease_rules import Lease, RenewRefusal
from wsfleet.lease_store import Released, Renewed
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(30)

TIMING = LeaseTiming.from_lease(1.0)  # heartbeat 0.25, skew 0.05, margin 0.1: fence after 0.85


class _Crash(BaseException):
    """Escapes the renewer's error handling, as a bug would."""


@dataclass
class ScriptedStore:
    """Stands in for LeaseStore: renews answer as scripted, releases are recorded."""

    renew_answer: object = "ok"  # "ok", "hang", an exception or a RenewRefusal
    releases: list[tuple[int, int]] = field(default_factory=list)
    unblock: threading.Event = field(default_factory=threading.Event)
    renews: int = 0
    release_errors: int = 0  # the first N release attempts raise, as a throttle would
    release_attempts: int = 0

    def renew(self, lease: Lease, last_seq: int, now_ms: int) -> Renewed | RenewRefusal:
        self.renews += 1
        answer = self.renew_answer
        if answer == "crash":
            raise _Crash("a bug, not an AWS error")
        if answer == "hang":
            self.unblock.wait(5)
            raise TimeoutError("partitioned")
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, RenewRefusal):
            return answer
        return Renewed(now_ms + TIMING.lease_ms)

    def release(self, lease: Lease, last_seq: int, now_ms: int) -> Released:
        self.release_attempts += 1
        if self.release_attempts <= self.release_errors:
            raise ConnectionError("throttled")
        self.releases.append((lease.epoch, last_seq))
        return Released(released=True, restarted=False, checkpointed=True)


class Recorder:
    """Records handler calls. ``delay``: seconds each call takes; ``slow_from``: only
    calls from this seq on take that long. ``on_seq``: a hook run inside the call of
    that seq, before it returns (it may raise)."""

    def __init__(
        self,
        delay: float = 0.0,
        *,
        slow_from: int = 0,
        on_seq: dict[int, Callable[[], Awaitable[None]]] | None = None,
    ) -> None:
        self.entered: list[tuple[float, int]] = []
        self.finished: list[int] = []
        self.delay = delay
        self.slow_from = slow_from
        self.on_seq = dict(on_seq or {})

    async def handle(self, delivery: Delivery) -> None:
        self.entered.append((asyncio.get_running_loop().time(), delivery.seq))
        hook = self.on_seq.pop(delivery.seq, None)
        if hook is not None:
            await hook()
        if self.delay and delivery.seq >= self.slow_from:
            await asyncio.sleep(self.delay)
        self.finished.append(delivery.seq)


@pytest.fixture
async def feed_url():
    server = await serve_feed("127.0.0.1", 0, default_rate=40.0)
    port = server.sockets[0].getsockname()[1]
    yield f"ws://127.0.0.1:{port}/runner"
    server.close()
    await server.wait_closed()


def make_runner(store: ScriptedStore, handler: Recorder, url: str) -> ConnectionRunner:
    settings = ConnectionSettings(
        store=store,  # type: ignore[arg-type]
        handler=handler,
        protocol=JsonSeqProtocol(),
        metrics=FleetMetrics(
            namespace="T", service="s", task_id="t", active_connections=lambda: 1, out=io.StringIO()
        ),
        timing=TIMING,
        worker_id="w-test",
        wall_ms=lambda: time.time_ns() // 1_000_000,
        rng=random.Random(1),
        ping_interval=1.0,
    )
    lease = Lease("c1", "w-test", epoch=4, start_gen=1, ws_url=url, last_seq=0, expires_at_ms=0)
    return ConnectionRunner(settings, lease, asyncio.get_running_loop().time())


async def wait_for(predicate, within: float) -> None:
    """Poll a condition that other tasks make true, with a deadline."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - the state has no event to wait on
            await asyncio.sleep(0.01)


async def test_unreachable_dynamodb_fences_before_the_lease_can_be_taken(feed_url):
    store = ScriptedStore(renew_answer="hang")
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    deadline = runner.fence_deadline
    outcome = await asyncio.wait_for(runner.run(), 3)
    store.unblock.set()
    assert outcome.ending is Ending.FENCED
    assert handler.entered, "messages flowed before the partition mattered"
    assert all(t < deadline for t, _ in handler.entered)
    assert store.releases == [(4, outcome.last_seq)]  # one conditional release attempt


async def test_renew_errors_alone_fence_too(feed_url):
    store = ScriptedStore(renew_answer=ConnectionError("throttled"))
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    deadline = runner.fence_deadline
    outcome = await asyncio.wait_for(runner.run(), 3)
    assert outcome.ending is Ending.FENCED
    assert store.renews >= 2  # retried before giving up
    assert all(t < deadline for t, _ in handler.entered)


async def test_successful_renews_keep_it_running_past_the_first_deadline(feed_url):
    store = ScriptedStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    first_deadline = runner.fence_deadline
    task = asyncio.create_task(runner.run())
    loop = asyncio.get_running_loop()
    await wait_for(lambda: any(t > first_deadline + 0.2 for t, _ in handler.entered), 5)
    assert loop.time() > first_deadline
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert outcome.ending is Ending.SHUTDOWN
    assert outcome.released
    assert store.releases == [(4, handler.finished[-1])]


@pytest.mark.parametrize(
    ("refusal", "ending", "releases"),
    [
        (RenewRefusal.STOPPED, Ending.STOPPED, True),
        (RenewRefusal.RESTARTED, Ending.RESTARTED, True),
        (RenewRefusal.LOST, Ending.LOST, False),
        (RenewRefusal.GONE, Ending.GONE, False),
    ],
)
async def test_renew_refusals_end_the_connection(feed_url, refusal, ending, releases):
    store = ScriptedStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.finished) >= 3, 5)
    store.renew_answer = refusal
    outcome = await asyncio.wait_for(task, 3)
    assert outcome.ending is ending
    assert outcome.last_seq == handler.finished[-1]
    assert store.releases == ([(4, outcome.last_seq)] if releases else [])


async def test_shutdown_lets_the_handler_call_in_flight_finish(feed_url):
    store = ScriptedStore()
    handler = Recorder(delay=0.3)
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.entered) >= 2, 5)  # the second call is in flight
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert handler.finished == [seq for _, seq in handler.entered]  # none cut short
    assert outcome.last_seq == handler.finished[-1] == 2
    assert store.releases == [(4, 2)]


async def test_a_crashed_task_fences_the_connection_instead_of_hanging(feed_url):
    store = ScriptedStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.finished) >= 2, 5)
    store.renew_answer = "crash"
    outcome = await asyncio.wait_for(task, 3)
    assert outcome.ending is Ending.FENCED


# --- hardening: every ending releases, a held lease always means messages flow -------


async def test_a_handler_raising_cancelled_error_is_a_handler_failure_not_a_silent_hold(
    feed_url,
):
    """A handler that raises CancelledError on its own (a pool cancelling its futures)
    must not end the reader as "cancelled" and leave the lease renewed with nothing
    delivered: it is a handler failure, retried, and the connection keeps flowing."""

    async def cancelled() -> None:
        raise asyncio.CancelledError

    store = ScriptedStore()
    handler = Recorder(on_seq={3: cancelled})
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.finished) >= 8, 5)
    assert [seq for _, seq in handler.entered].count(3) == 2  # failed once, then retried
    assert handler.finished[:8] == list(range(1, 9))
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert outcome.ending is Ending.SHUTDOWN


async def test_a_reader_cancelled_from_outside_fences_and_releases(feed_url):
    """Whenever the reader ends while the connection is not ending, even cancelled by
    something other than the runner, the connection fences and releases."""
    store = ScriptedStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.finished) >= 2, 5)
    (reader,) = [t for t in asyncio.all_tasks() if t.get_name() == "read:c1"]
    reader.cancel()
    outcome = await asyncio.wait_for(task, 3)
    assert outcome.ending is Ending.FENCED
    assert store.releases == [(4, outcome.last_seq)]


async def test_a_stop_bounds_the_call_in_flight_by_the_deadline_of_that_moment(feed_url):
    """Renews go on during a graceful ending; they must not stretch the deadline of
    the call in flight, or a slow handler holds the shutdown open without end."""
    store = ScriptedStore()
    handler = Recorder(delay=30.0, slow_from=3)
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.entered) >= 3, 5)  # seq 3 is in flight, slowly
    loop = asyncio.get_running_loop()
    stopped_at = loop.time()
    deadline_at_stop = runner.fence_deadline
    runner.stop()
    outcome = await asyncio.wait_for(task, 2 * TIMING.fence_after)
    assert loop.time() <= deadline_at_stop + 0.5
    assert loop.time() - stopped_at < 2 * TIMING.fence_after
    assert handler.finished == [1, 2]  # seq 3 was cut short, so it is not checkpointed
    assert store.renews >= 1
    assert (outcome.ending, outcome.last_seq, outcome.released) == (Ending.SHUTDOWN, 2, True)
    assert store.releases == [(4, 2)]


async def test_cancelling_run_still_releases_with_the_final_checkpoint(feed_url):
    """A shutdown that runs out of patience cancels the runner: the lease must still
    be given back with the checkpoint, not left to lapse."""
    store = ScriptedStore()
    handler = Recorder(delay=30.0, slow_from=4)
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.entered) >= 4, 5)
    runner.stop()  # draining seq 4 ...
    await asyncio.sleep(0)
    task.cancel()  # ... and cancelled while draining
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 3)
    assert store.releases == [(4, 3)]


async def test_a_failed_release_is_retried(feed_url):
    store = ScriptedStore(release_errors=2)
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.finished) >= 3, 5)
    runner.stop()
    outcome = await asyncio.wait_for(task, 2 * TIMING.release_budget)
    assert store.release_attempts == 3
    assert outcome.released
    assert store.releases == [(4, outcome.last_seq)]
    assert outcome.last_seq >= 3


async def test_a_release_that_keeps_failing_gives_up_within_its_budget(feed_url):
    store = ScriptedStore(release_errors=1_000)
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    task = asyncio.create_task(runner.run())
    await wait_for(lambda: len(handler.finished) >= 1, 5)
    runner.stop()
    outcome = await asyncio.wait_for(task, 2 * TIMING.release_budget)
    assert not outcome.released
    assert store.release_attempts > 2


@pytest.mark.parametrize("ending", [Ending.LOST, Ending.GONE, Ending.FENCED])
async def test_an_ending_that_is_not_graceful_stops_new_calls_in_the_same_step(feed_url, ending):
    """Decided while more frames are already buffered: not one more handler call may
    start, not even before ``run`` wakes up to act on the ending."""
    runner: ConnectionRunner | None = None

    async def lose_it() -> None:
        await asyncio.sleep(0.2)  # let frames 4, 5, ... pile up in the socket
        assert runner is not None
        runner.stop(ending)  # what the renewer does when it sees another owner

    store = ScriptedStore()
    handler = Recorder(on_seq={3: lose_it})
    runner = make_runner(store, handler, feed_url)
    outcome = await asyncio.wait_for(runner.run(), 3)
    assert outcome.ending is ending
    assert [seq for _, seq in handler.entered] == [1, 2, 3]
