"""One connection runner in-process against a real feed on loopback and a fake lease
store: the ending order, the release and its retries, the handler's failures, the
reader against upstreams that misbehave.

The runner does not renew anything itself: the worker renews its session and calls
``session_renewed(sent_at)`` on every runner after each renew that landed. Here a
stand-in for that keeper (:func:`start`) reports a renew every heartbeat; tests of the
fence itself (test_runner_fencing) leave it out or call ``session_renewed`` by hand.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import io
import itertools
import json
import logging
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from websockets.asyncio.server import ServerConnection, serve

from local_stack.feed import serve_feed
from worker import connection
from worker.connection import ConnectionRunner, Outcome
from worker.connection_settings import ConnectionSettings
from worker.connection_state import Ending
from worker.delivery import Delivery
from worker.metrics import FleetMetrics
from worker.upstream_protocol import JsonSeqProtocol
from wsfleet import metric_names as m
from wsfleet.checkpoint_page import BACKING_OFF, CONNECTING, STREAMING, PageEntry
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import Released
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(30)

TIMING = LeaseTiming.from_lease(1.0, heartbeat=0.25)
"""Margin 0.1: the fence falls 0.85 s after a renew was sent."""
EPOCH = 4
SEQ_GEN = 2


class _Crash(BaseException):
    """Escapes every error handling of the runner, as a bug would."""


@dataclass
class FakeStore:
    """Stands in for LeaseStore: records releases, parks and failing marks; the first
    ``release_errors`` release attempts raise, as a throttle would."""

    releases: list[tuple[int, int]] = field(default_factory=list)
    """(epoch, final checkpoint) of each release that landed."""
    release_errors: int = 0
    release_attempts: int = 0
    release_attempted_at: list[float] = field(default_factory=list)  # time.monotonic()
    release_restarted: bool = False  # what a successful release reports as `restarted`
    parks: list[tuple[int, int, str]] = field(default_factory=list)
    failing_marks: list[int | None] = field(default_factory=list)  # None: cleared
    advanced: list[int | None] = field(default_factory=list)
    """The ``advanced_at_ms`` of each release that landed."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def release(
        self, lease: Lease, last_seq: int, now_ms: int, *, advanced_at_ms: int | None = None
    ) -> Released:
        with self._lock:
            self.release_attempts += 1
            self.release_attempted_at.append(time.monotonic())
            if self.release_attempts <= self.release_errors:
                raise ConnectionError("throttled")
            self.releases.append((lease.epoch, last_seq))
            self.advanced.append(advanced_at_ms)
        return Released(released=True, restarted=self.release_restarted, checkpointed=True)

    def park(self, lease: Lease, last_seq: int, reason: str, now_ms: int) -> Released:
        self.parks.append((lease.epoch, last_seq, reason))
        return Released(released=True, restarted=False, checkpointed=True, parked=True)

    def record_failing_since(self, lease: Lease, since_ms: int, now_ms: int) -> bool:
        self.failing_marks.append(since_ms)
        return True

    generations: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(generation counted in, new generation, first seq, previous last) of each new
    sequence generation recorded."""
    generation_refusals: int = 0
    """The first this many new generations are refused (the lease is no longer ours)."""

    def begin_generation(
        self, lease: Lease, seq_gen: int, first_seq: int, previous_last: int, now_ms: int
    ) -> bool:
        with self._lock:
            if self.generation_refusals > 0:
                self.generation_refusals -= 1
                return False
            self.generations.append((lease.seq_gen, seq_gen, first_seq, previous_last))
        return True

    def clear_failing_since(self, lease: Lease, now_ms: int) -> bool:
        self.failing_marks.append(None)
        return True


class Recorder:
    """Records handler calls. ``delay``: seconds each call takes; ``slow_from``: only
    calls from this seq on take that long. ``on_seq``: a hook run inside the first
    call of that seq, before it returns (it may raise)."""

    def __init__(
        self,
        delay: float = 0.0,
        *,
        slow_from: int = 0,
        on_seq: dict[int, Callable[[], Awaitable[None]]] | None = None,
    ) -> None:
        self.entered: list[tuple[float, int]] = []
        self.finished: list[int] = []
        self.finished_at: list[tuple[float, int]] = []
        self.deliveries: list[Delivery] = []
        self.delay = delay
        self.slow_from = slow_from
        self.on_seq = dict(on_seq or {})

    async def handle(self, delivery: Delivery) -> None:
        loop = asyncio.get_running_loop()
        self.entered.append((loop.time(), delivery.seq))
        self.deliveries.append(delivery)
        hook = self.on_seq.pop(delivery.seq, None)
        if hook is not None:
            await hook()
        if self.delay and delivery.seq >= self.slow_from:
            await asyncio.sleep(self.delay)
        self.finished.append(delivery.seq)
        self.finished_at.append((loop.time(), delivery.seq))

    def entered_seqs(self) -> list[int]:
        return [seq for _, seq in self.entered]


@pytest.fixture
async def feed_url():
    server = await serve_feed("127.0.0.1", 0, default_rate=40.0)
    port = server.sockets[0].getsockname()[1]
    yield f"ws://127.0.0.1:{port}/runner"
    server.close()
    await server.wait_closed()


def new_metrics() -> FleetMetrics:
    return FleetMetrics(
        namespace="T", service="s", task_id="t", active_connections=lambda: 1, out=io.StringIO()
    )


def runner_settings(store: FakeStore, handler: Recorder, **overrides: Any) -> ConnectionSettings:
    """A test worker's connection settings; ``overrides``: fields to set (metrics,
    rng, ping_interval, secrets, plugins...)."""
    settings = ConnectionSettings(
        store=store,  # type: ignore[arg-type]
        handler=handler,
        protocol=JsonSeqProtocol(),
        metrics=new_metrics(),
        timing=TIMING,
        worker_id="w-test",
        wall_ms=lambda: time.time_ns() // 1_000_000,
        rng=random.Random(1),
        ping_interval=1.0,
    )
    return dataclasses.replace(settings, **overrides)


def make_runner(
    store: FakeStore,
    handler: Recorder,
    url: str,
    *,
    deadline: float | None = None,
    **overrides: Any,
) -> ConnectionRunner:
    """``deadline``: the session's fence deadline at the acquire (by default, as if the
    session had been renewed this instant); ``overrides``: ConnectionSettings fields
    to set (metrics, rng, ping_interval...)."""
    settings = runner_settings(store, handler, **overrides)
    lease = Lease("c1", "w-test", EPOCH, 1, url, 0, session_gen=1, seq_gen=SEQ_GEN)
    loop = asyncio.get_running_loop()
    return ConnectionRunner(
        settings, lease, loop.time() + TIMING.fence_after if deadline is None else deadline
    )


def start(runner: ConnectionRunner, *, renew: bool = True) -> asyncio.Task[Outcome]:
    """Run the connection. With ``renew``, a stand-in for the worker's session keeper
    reports a renew that landed (sent that instant) every heartbeat until it ends."""
    task = asyncio.create_task(runner.run(), name="run:c1")
    if renew:

        async def keep() -> None:
            loop = asyncio.get_running_loop()
            while not task.done():
                await asyncio.sleep(TIMING.heartbeat)
                runner.session_renewed(loop.time())

        keeper = asyncio.create_task(keep(), name="session-keeper")
        task.add_done_callback(lambda _: keeper.cancel())
    return task


async def wait_for(predicate: Callable[[], object], within: float) -> None:
    """Poll a condition that other tasks make true, with a deadline."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - the state has no event to wait on
            await asyncio.sleep(0.01)


# --- running, and how it ends ----------------------------------------------------------


async def test_session_renews_keep_it_running_past_the_first_deadline(feed_url):
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url)
    first_deadline = runner.fence_deadline
    task = start(runner)
    await wait_for(lambda: any(t > first_deadline + 0.2 for t, _ in handler.entered), 5)
    assert runner.fence_deadline > first_deadline
    outcome = await stop_and_wait(runner, task)
    assert (outcome.ending, outcome.released, outcome.restarted) == (Ending.SHUTDOWN, True, False)
    assert handler.finished == list(range(1, len(handler.finished) + 1))
    assert store.releases == [(EPOCH, handler.finished[-1])]


async def test_a_graceful_stop_drains_the_call_in_flight_then_releases_with_it(feed_url):
    store = FakeStore()
    handler = Recorder(delay=0.3)
    runner = make_runner(store, handler, feed_url)
    task = start(runner)
    await wait_for(lambda: len(handler.entered) >= 2, 5)  # the second call is in flight
    assert store.releases == []
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert handler.finished == handler.entered_seqs()  # none cut short
    assert outcome.last_seq == handler.finished[-1] == 2
    assert store.releases == [(EPOCH, 2)]  # released after the drain, with its checkpoint


@pytest.mark.parametrize(
    ("ending", "release_saw_restart", "released", "restarted", "leases_lost"),
    [
        (Ending.SHUTDOWN, False, True, False, 0),
        (Ending.STOPPED, False, True, False, 0),
        (Ending.STOPPED, True, True, True, 0),  # started again after the stop
        (Ending.RESTARTED, False, True, True, 0),
        (Ending.LOST, False, False, False, 1),
        (Ending.GONE, False, False, False, 0),
    ],
)
async def test_what_each_ending_does_and_reports(
    feed_url, ending, release_saw_restart, released, restarted, leases_lost
):
    metrics = new_metrics()
    store = FakeStore(release_restarted=release_saw_restart)
    handler = Recorder()
    runner = make_runner(store, handler, feed_url, metrics=metrics)
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 3, 5)
    runner.stop(ending)
    outcome = await asyncio.wait_for(task, 3)
    assert outcome.ending is ending
    assert (outcome.released, outcome.restarted) == (released, restarted)
    assert outcome.last_seq == handler.finished[-1]
    assert store.releases == ([(EPOCH, outcome.last_seq)] if released else [])
    counts = metrics.snapshot()
    assert counts[m.LEASES_LOST] == leases_lost
    assert counts[m.LEASES_RELEASED] == int(released)
    assert counts[m.RENEW_FAILURES] == 0  # session renews are the worker's to count


async def test_the_first_ending_decided_wins(feed_url):
    store = FakeStore()
    runner = make_runner(store, Recorder(), feed_url)
    task = start(runner)
    runner.stop(Ending.LOST)
    runner.stop(Ending.SHUTDOWN)
    outcome = await asyncio.wait_for(task, 3)
    assert (outcome.ending, outcome.released) == (Ending.LOST, False)
    assert store.releases == []


async def test_a_lost_session_cuts_the_call_in_flight_without_a_handler_error(feed_url):
    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder(delay=30.0, slow_from=3)
    runner = make_runner(store, handler, feed_url, metrics=metrics)
    task = start(runner)
    await wait_for(lambda: len(handler.entered) >= 3, 5)
    loop = asyncio.get_running_loop()
    lost_at = loop.time()
    runner.stop(Ending.LOST)
    outcome = await asyncio.wait_for(task, 3)
    assert loop.time() - lost_at < 1.0  # at once: no drain for a lost session
    await asyncio.wait_for(runner.wait_closed(), 3)
    assert (outcome.ending, outcome.last_seq, outcome.released) == (Ending.LOST, 2, False)
    assert handler.finished == [1, 2]
    assert store.releases == []
    assert metrics.snapshot()[m.HANDLER_ERRORS] == 0


@pytest.mark.parametrize("ending", [Ending.LOST, Ending.GONE, Ending.FENCED])
async def test_an_ending_that_is_not_graceful_stops_new_calls_in_the_same_step(feed_url, ending):
    """Decided while more frames are already buffered: not one more handler call may
    start, not even before ``run`` wakes up to act on the ending."""
    runner: ConnectionRunner | None = None

    async def lose_it() -> None:
        await asyncio.sleep(0.2)  # let frames 4, 5, ... pile up in the socket
        assert runner is not None
        runner.stop(ending)  # what the worker does when its session was reaped

    store = FakeStore()
    handler = Recorder(on_seq={3: lose_it})
    runner = make_runner(store, handler, feed_url)
    outcome = await asyncio.wait_for(start(runner), 3)
    assert outcome.ending is ending
    assert handler.entered_seqs() == [1, 2, 3]


async def test_a_stop_bounds_the_call_in_flight_by_the_deadline_of_that_moment(feed_url):
    """Session renews go on during a graceful ending; they must not stretch the
    deadline of the call in flight, or a slow handler holds the shutdown open."""
    store = FakeStore()
    handler = Recorder(delay=30.0, slow_from=3)
    runner = make_runner(store, handler, feed_url)
    task = start(runner)
    await wait_for(lambda: len(handler.entered) >= 3, 5)  # seq 3 is in flight, slowly
    loop = asyncio.get_running_loop()
    stopped_at = loop.time()
    deadline_at_stop = runner.fence_deadline
    runner.stop()
    outcome = await asyncio.wait_for(task, 2 * TIMING.fence_after)
    assert runner.fence_deadline > deadline_at_stop  # renews did land meanwhile
    assert loop.time() <= deadline_at_stop + 0.5
    assert loop.time() - stopped_at < 2 * TIMING.fence_after
    assert handler.finished == [1, 2]  # seq 3 was cut short, so it is not checkpointed
    assert (outcome.ending, outcome.last_seq, outcome.released) == (Ending.SHUTDOWN, 2, True)
    assert store.releases == [(EPOCH, 2)]


async def test_cancelling_run_still_releases_with_the_final_checkpoint(feed_url):
    """A shutdown that runs out of patience cancels the runner: the lease must still
    be given back with the checkpoint, not left to the next owner's takeover."""
    store = FakeStore()
    handler = Recorder(delay=30.0, slow_from=4)
    runner = make_runner(store, handler, feed_url)
    task = start(runner)
    await wait_for(lambda: len(handler.entered) >= 4, 5)
    runner.stop()  # draining seq 4 ...
    await asyncio.sleep(0)
    task.cancel()  # ... and cancelled while draining
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 3)
    assert store.releases == [(EPOCH, 3)]


# --- the handler's failures -----------------------------------------------------------


async def test_a_handler_raising_cancelled_error_is_a_handler_failure_not_a_silent_hold(
    feed_url,
):
    """A handler that raises CancelledError on its own (a pool cancelling its futures)
    must not end the reader as "cancelled" and leave the lease held with nothing
    delivered: it is a handler failure, retried, and the connection keeps flowing."""

    async def cancelled() -> None:
        raise asyncio.CancelledError

    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder(on_seq={3: cancelled})
    runner = make_runner(store, handler, feed_url, metrics=metrics)
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 8, 5)
    assert handler.entered_seqs().count(3) == 2  # failed once, then retried
    assert handler.finished[:8] == list(range(1, 9))
    assert metrics.snapshot()[m.HANDLER_ERRORS] == 1
    outcome = await stop_and_wait(runner, task)
    assert outcome.ending is Ending.SHUTDOWN


async def test_a_handler_that_raises_timeout_error_itself_is_retried_not_paused(feed_url):
    async def times_out() -> None:
        raise TimeoutError("the handler's own call timed out")

    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder(on_seq={2: times_out})
    runner = make_runner(store, handler, feed_url, metrics=metrics, rng=MaxJitter())
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 4, 5)
    outcome = await stop_and_wait(runner, task)
    entries = [t for t, seq in handler.entered if seq == 2]
    assert len(entries) == 2
    assert 0.1 <= entries[1] - entries[0] < 0.1 + 0.3  # the first retry waits 0.1 s
    assert handler.finished[:4] == [1, 2, 3, 4]
    counts = metrics.snapshot()
    assert (counts[m.HANDLER_ERRORS], counts[m.UPSTREAM_RECONNECTS]) == (1, 0)
    assert outcome.ending is Ending.SHUTDOWN


async def test_skip_mode_moves_past_a_failed_message_once(feed_url):
    async def fails() -> None:
        raise ValueError("bad message")

    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder(on_seq={3: fails})
    runner = make_runner(store, handler, feed_url, metrics=metrics, skip_failed_messages=True)
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 5, 5)
    outcome = await stop_and_wait(runner, task)
    entered = handler.entered_seqs()
    assert entered == list(range(1, len(entered) + 1))  # 3 was called once, then left
    assert 3 not in handler.finished
    counts = metrics.snapshot()
    assert (counts[m.HANDLER_ERRORS], counts[m.UPSTREAM_RECONNECTS]) == (1, 0)
    assert outcome.last_seq >= 6


async def test_a_slow_handler_runs_on_while_the_session_is_renewed(feed_url):
    """A call longer than the fence span is not cut while renews keep moving the
    deadline of the call in flight."""
    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder(delay=TIMING.fence_after + 0.3, slow_from=2)
    runner = make_runner(store, handler, feed_url + "?count=2", metrics=metrics)
    task = start(runner)
    await wait_for(lambda: handler.finished == [1, 2], 5)
    assert handler.entered_seqs() == [1, 2]  # seq 2 called once, not cut and retried
    assert not task.done()
    outcome = await stop_and_wait(runner, task)
    assert (outcome.ending, outcome.last_seq) == (Ending.SHUTDOWN, 2)
    assert metrics.snapshot()[m.HANDLER_ERRORS] == 0


# --- the page entry ------------------------------------------------------------------


async def test_the_page_entry_reports_only_handled_seqs(feed_url):
    release_three = asyncio.Event()
    store = FakeStore()
    handler = Recorder(on_seq={3: release_three.wait})
    runner = make_runner(store, handler, feed_url)
    loop = asyncio.get_running_loop()

    def entry() -> PageEntry:
        return runner.page_entry(loop.time(), time.time_ns() // 1_000_000)

    before = entry()
    assert (before.epoch, before.seq_gen, before.seq, before.advanced_at_ms) == (
        EPOCH,
        SEQ_GEN,
        0,
        None,
    )
    task = start(runner)
    await wait_for(lambda: handler.entered_seqs()[-1:] == [3], 5)  # 3 in flight
    await asyncio.sleep(0.1)
    now, now_ms = loop.time(), time.time_ns() // 1_000_000
    during = runner.page_entry(now, now_ms)
    assert (during.epoch, during.seq_gen, during.seq) == (EPOCH, SEQ_GEN, 2)
    # When seq moved to 2 (its call returned), on the wall clock of the page write.
    [handled_two_at] = [t for t, seq in handler.finished_at if seq == 2]
    assert during.advanced_at_ms == pytest.approx(now_ms - (now - handled_two_at) * 1000, abs=50)
    assert during.advanced_at_ms is not None
    assert during.advanced_at_ms <= now_ms - 100
    # How the upstream is doing: streaming on its first connection, and the rate of
    # what was handled since the previous entry (seqs 1 and 2 since `before`).
    assert (during.status, during.reconnects, during.last_error) == (STREAMING, 0, None)
    assert during.rate is not None
    assert 0 < during.rate <= 2 / 0.1
    release_three.set()
    await wait_for(lambda: 3 in handler.finished, 5)
    assert entry().seq >= 3
    outcome = await stop_and_wait(runner, task)
    assert entry().seq == outcome.last_seq


# --- crashes and cancellations from outside --------------------------------------------


async def test_a_reader_cancelled_from_outside_fences_and_releases(feed_url, caplog):
    """Whenever the reader ends while the connection is not ending, even cancelled by
    something other than the runner, the connection fences and releases."""
    caplog.set_level(logging.INFO, logger="worker.connection")
    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url, metrics=metrics)
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 2, 5)
    (reader,) = [t for t in asyncio.all_tasks() if t.get_name() == "read:c1"]
    reader.cancel()
    outcome = await asyncio.wait_for(task, 3)
    assert (outcome.ending, outcome.released) == (Ending.FENCED, True)
    assert store.releases == [(EPOCH, outcome.last_seq)]
    assert outcome.last_seq == handler.finished[-1]
    assert metrics.snapshot()[m.LEASES_LOST] == 1
    records = {r.getMessage(): r for r in caplog.records}
    assert records["connection task ended unexpectedly"].error == "cancelled"
    fenced = [r for r in caplog.records if r.getMessage() == "fenced: stop handling"]
    assert len(fenced) == 1  # said once, when it happened
    assert records["connection ended"].released is True


class CrashingProtocol(JsonSeqProtocol):
    """Its resume URL raises a bug on the second connection."""

    def __init__(self) -> None:
        self.urls = 0

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        self.urls += 1
        if self.urls > 1:
            raise _Crash("a bug, not an upstream error")
        return super().resume_url(ws_url, last_seq)


async def test_a_crashed_reader_fences_releases_and_says_what_ended_it(feed_url, caplog):
    caplog.set_level(logging.INFO, logger="worker.connection")
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url + "?close_after=3", protocol=CrashingProtocol())
    outcome = await asyncio.wait_for(start(runner), 3)
    assert (outcome.ending, outcome.last_seq, outcome.released) == (Ending.FENCED, 3, True)
    assert store.releases == [(EPOCH, 3)]
    records = {r.getMessage(): r for r in caplog.records}
    assert records["connection task ended unexpectedly"].error == repr(
        _Crash("a bug, not an upstream error")
    )


# --- the release -----------------------------------------------------------------------


async def stop_after(store: FakeStore, url: str, handled: int) -> Outcome:
    """Run a connection until ``handled`` messages were handled, stop it and wait
    (for up to twice the release budget) for its outcome."""
    handler = Recorder()
    runner = make_runner(store, handler, url)
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= handled, 5)
    runner.stop()
    return await asyncio.wait_for(task, 2 * TIMING.release_budget)


async def test_a_failed_release_is_retried(feed_url):
    store = FakeStore(release_errors=2)
    outcome = await stop_after(store, feed_url, 3)
    assert store.release_attempts == 3
    assert outcome.released
    assert store.releases == [(EPOCH, outcome.last_seq)]
    assert outcome.last_seq >= 3


async def test_a_release_that_keeps_failing_gives_up_within_its_budget(feed_url):
    store = FakeStore(release_errors=1_000)
    outcome = await stop_after(store, feed_url, 1)
    assert not outcome.released
    assert store.release_attempts > 2
    assert store.releases == []


async def test_release_retries_back_off_from_fifty_ms_up_to_half_a_heartbeat(feed_url):
    store = FakeStore(release_errors=5)
    runner = make_runner(store, Recorder(), feed_url, rng=MaxJitter())
    task = start(runner)
    await asyncio.sleep(0.1)
    outcome = await stop_and_wait(runner, task)
    assert outcome.released
    attempts = store.release_attempted_at
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    # 0.05, 0.1, then capped at heartbeat / 2 = 0.125 (a gap is never shorter than its wait)
    waits = [0.05, 0.1, 0.125, 0.125, 0.125]
    assert all(gap >= wait - 0.005 for gap, wait in zip(gaps, waits, strict=True)), gaps


async def test_release_retries_stop_within_the_release_budget(feed_url):
    store = FakeStore(release_errors=1_000)
    runner = make_runner(store, Recorder(), feed_url, rng=MaxJitter())
    task = start(runner)
    await asyncio.sleep(0.1)
    outcome = await stop_and_wait(runner, task, within=2 * TIMING.release_budget)
    assert not outcome.released
    # No attempt is sent once the next wait would end past the budget (a retry sent
    # after it would end 0.125 s or more past it); the last ones come near its end.
    attempts = store.release_attempted_at
    assert TIMING.release_budget - 0.25 < attempts[-1] - attempts[0] < TIMING.release_budget + 0.06


async def test_a_handler_that_ignores_cancellation_cannot_hold_the_release(feed_url, monkeypatch):
    """A stop with a call in flight waits for it until the drain deadline, and for a
    cancelled call only a short while: the lease is released, and the close of the
    connection gives up on the stuck task."""
    monkeypatch.setattr(connection, "TASK_STOP_SECONDS", 0.2)
    let_go = asyncio.Event()

    async def stubborn() -> None:
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                continue

    store = FakeStore()
    handler = Recorder(on_seq={2: stubborn})
    runner = make_runner(store, handler, feed_url)
    task = start(runner)
    try:
        await wait_for(lambda: len(handler.entered) >= 2, 5)
        runner.stop()
        # The drain budget, then 0.2 s for the cancelled call, then the release.
        outcome = await asyncio.wait_for(asyncio.shield(task), TIMING.drain_budget + 1.5)
        assert (outcome.ending, outcome.last_seq, outcome.released) == (Ending.SHUTDOWN, 1, True)
        assert store.releases == [(EPOCH, 1)]
        await asyncio.wait_for(asyncio.shield(runner.wait_closed()), 1.5)
    finally:
        let_go.set()
    (reader,) = [t for t in asyncio.all_tasks() if t.get_name() == "read:c1"]
    await asyncio.wait_for(asyncio.shield(reader), 3)


# --- the reader against upstreams that misbehave, and the retry schedules -------------


class MaxJitter(random.Random):
    """Every backoff delay at its cap, so retry schedules are exact."""

    def random(self) -> float:
        return 1.0


def feed_frame(seq: int) -> str:
    return json.dumps({"seq": seq, "value": seq * 7})


@dataclass
class Upstream:
    """An in-process upstream on loopback whose every connection runs ``script``; it
    records when each connection came (loop time), with which ``from_seq``, and every
    frame the worker sent."""

    script: Callable[[ServerConnection, int], Awaitable[None]]
    url: str = ""
    connections: list[tuple[float, int]] = field(default_factory=list)
    received: list[str | bytes] = field(default_factory=list)

    async def _serve(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        from_seq = int(parse_qs(urlsplit(ws.request.path).query)["from_seq"][0])
        self.connections.append((asyncio.get_running_loop().time(), from_seq))
        await self.script(ws, from_seq)

    async def read_all(self, ws: ServerConnection) -> None:
        async for data in ws:
            self.received.append(data)

    def gaps(self) -> list[float]:
        times = [t for t, _ in self.connections]
        return [b - a for a, b in itertools.pairwise(times)]


@asynccontextmanager
async def upstream(script: Callable[[ServerConnection, int], Awaitable[None]]):
    up = Upstream(script)
    async with serve(up._serve, "127.0.0.1", 0) as server:
        up.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/scripted"
        yield up


@asynccontextmanager
async def raw_listener(*, handshake: bool) -> AsyncIterator[tuple[str, list[float]]]:
    """A TCP listener that never says a word after accepting (``handshake=False``), or
    that completes the WebSocket handshake and then goes silent: no pong, no close."""
    accepted: list[float] = []
    writers = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(asyncio.get_running_loop().time())
        writers.append(writer)
        if handshake:
            request = await reader.readuntil(b"\r\n\r\n")
            key = next(
                line.split(b":", 1)[1].strip()
                for line in request.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key:")
            )
            accept = base64.b64encode(
                hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
            )
            writer.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
            )
        while await reader.read(65536):  # swallow whatever comes, answer nothing
            pass

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/silent", accepted
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def stop_and_wait(runner: ConnectionRunner, task: asyncio.Task[Any], within: float = 3):
    runner.stop()
    outcome = await asyncio.wait_for(task, within)
    await asyncio.wait_for(runner.wait_closed(), 3)
    return outcome


async def test_a_healthy_upstream_is_read_on_one_connection_and_payloads_pass_through(feed_url):
    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url, metrics=metrics)
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 12, 5)
    outcome = await stop_and_wait(runner, task)
    assert outcome.ending is Ending.SHUTDOWN
    counts = metrics.snapshot()
    assert counts[m.UPSTREAM_RECONNECTS] == 0
    assert counts[m.MESSAGES_PROCESSED] == len(handler.finished) == outcome.last_seq
    first = handler.deliveries[0]
    assert (first.connection_id, first.epoch, first.seq_gen, first.seq) == ("c1", EPOCH, SEQ_GEN, 1)
    assert first.payload["seq"] == 1
    assert first.payload["feed"] == "runner"  # the upstream's JSON object, as sent
    assert all(
        d.worker_id == "w-test" and d.epoch == EPOCH and d.seq_gen == SEQ_GEN
        for d in handler.deliveries
    )


async def test_pings_unreadable_frames_and_duplicates_do_not_leave_the_connection():
    async def noisy(ws: ServerConnection, from_seq: int) -> None:
        for frame in (
            json.dumps({"type": "ping", "n": 1}),
            feed_frame(from_seq),
            "not json",
            feed_frame(from_seq),  # a duplicate
            json.dumps({"seq": 0}),
            feed_frame(from_seq + 1),
            feed_frame(from_seq + 2),
        ):
            await ws.send(frame)
        await up.read_all(ws)

    async with upstream(noisy) as up:
        store = FakeStore()
        handler = Recorder()
        runner = make_runner(store, handler, up.url)
        task = start(runner)
        # Had the runner left the connection at any of the noise, the last message
        # would come on a second connection.
        await wait_for(lambda: len(handler.finished) >= 3, 5)
        await wait_for(lambda: len(up.received) >= 1, 5)
        outcome = await stop_and_wait(runner, task)
    assert [seq for _, seq in handler.entered] == [1, 2, 3]
    assert json.loads(up.received[0]) == {"type": "pong", "n": 1}
    assert [from_seq for _, from_seq in up.connections] == [1]
    assert outcome.last_seq == 3


async def test_a_gap_reconnects_from_the_checkpoint_instead_of_skipping(feed_url):
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(store, handler, feed_url + "?gap_after=2")
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 7, 5)
    outcome = await stop_and_wait(runner, task)
    assert outcome.ending is Ending.SHUTDOWN  # a gap is the upstream's fault, not a fence
    assert handler.finished == list(range(1, len(handler.finished) + 1))


@pytest.mark.parametrize(
    ("max_bytes", "leaves"),
    [
        (256, True),  # the feed's 2 MiB frame is over the limit: the connection is left
        (4 << 20, False),  # under it: read, found to carry no seq, skipped
    ],
)
async def test_the_frame_size_limit_is_the_configured_one(feed_url, max_bytes, leaves):
    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(
        store,
        handler,
        feed_url + "?oversize_after=1",
        metrics=metrics,
        max_message_bytes=max_bytes,
        rng=MaxJitter(),
    )
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 3, 5)
    outcome = await stop_and_wait(runner, task)
    assert handler.finished == list(range(1, len(handler.finished) + 1))
    assert (metrics.snapshot()[m.UPSTREAM_RECONNECTS] > 0) is leaves
    assert outcome.ending is Ending.SHUTDOWN


async def test_reconnects_back_off_from_a_quarter_second_and_reset_after_progress():
    """Connections that fail at once wait 0.25, 0.5, ... s (jitter at its cap); one
    that delivered something is followed after 0.25 s again."""
    progress_on = {3}  # the third connection delivers one message before closing

    async def flaky(ws: ServerConnection, from_seq: int) -> None:
        if len(up.connections) in progress_on:
            await ws.send(feed_frame(from_seq))
            await asyncio.sleep(0.05)
        await ws.close()

    async with upstream(flaky) as up:
        store = FakeStore()
        runner = make_runner(store, Recorder(), up.url, rng=MaxJitter())
        task = start(runner)
        await wait_for(lambda: len(up.connections) >= 4, 5)
        outcome = await stop_and_wait(runner, task)
    gaps = up.gaps()  # each is the wait, plus a connect (and a little noise)
    assert 0.25 <= gaps[0] < 0.25 + 0.2
    assert 0.5 <= gaps[1] < 0.5 + 0.4  # doubled (but not twice)
    assert 0.25 <= gaps[2] - 0.05 < 0.25 + 0.2  # progress on the third: back to 0.25 s
    assert outcome.last_seq == 1


async def test_an_upstream_that_never_answers_the_handshake_is_retried():
    async with raw_listener(handshake=False) as (url, accepted):
        store = FakeStore()
        runner = make_runner(store, Recorder(), url, open_timeout=0.2)
        task = start(runner)
        await wait_for(lambda: len(accepted) >= 2, 2)
        outcome = await stop_and_wait(runner, task)
    assert outcome.ending is Ending.SHUTDOWN


async def test_an_upstream_that_stops_answering_pings_is_left_and_resumed(feed_url):
    metrics = new_metrics()
    store = FakeStore()
    handler = Recorder()
    runner = make_runner(
        store,
        handler,
        feed_url + "?mute_after=3",
        metrics=metrics,
        ping_interval=0.2,
        ping_timeout=0.3,
    )
    task = start(runner)
    await wait_for(lambda: len(handler.finished) >= 5, 5)
    outcome = await stop_and_wait(runner, task)
    assert metrics.snapshot()[m.UPSTREAM_RECONNECTS] >= 1
    assert handler.finished == list(range(1, len(handler.finished) + 1))
    assert outcome.ending is Ending.SHUTDOWN


async def test_the_upstream_close_goes_on_in_the_background_and_is_bounded():
    """An upstream that never answers the close: the release does not wait for it,
    and the close gives up after its one-second timeout."""
    async with raw_listener(handshake=True) as (url, _):
        store = FakeStore()
        runner = make_runner(store, Recorder(), url, ping_interval=30.0)
        task = start(runner)
        await asyncio.sleep(0.2)  # connected, and idle: no frame ever comes
        loop = asyncio.get_running_loop()
        runner.stop()
        outcome = await asyncio.wait_for(task, 1)
        stopped = loop.time()
        assert store.releases == [(EPOCH, 0)]  # released before the upstream closed
        pending = {t.get_name(): t for t in asyncio.all_tasks()}
        assert {"close:c1", "read:c1"} <= set(pending)  # the reader is still closing
        await asyncio.wait_for(runner.wait_closed(), 3)
        assert loop.time() - stopped < 1.6  # the 1 s close timeout, not the 2 s task bound
        assert pending["read:c1"].done()
    assert outcome.ending is Ending.SHUTDOWN


async def test_the_readers_clock_is_the_loops_own():
    from worker.event_loops import clock as clock_of

    loop = asyncio.get_running_loop()
    clock = clock_of(loop)
    assert abs(clock() - loop.time()) < 0.05

    class ShiftedLoop(asyncio.SelectorEventLoop):
        def time(self) -> float:
            return super().time() + 1000.0

    shifted = ShiftedLoop()
    try:
        assert clock_of(shifted)() - loop.time() > 999  # a loop's own time() is kept
    finally:
        shifted.close()


async def test_the_page_entry_of_a_refused_upstream_says_so():
    with socket.socket() as closed:  # a port nobody listens on: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    runner = make_runner(FakeStore(), Recorder(), f"ws://127.0.0.1:{port}/nothing")
    task = start(runner)
    await wait_for(lambda: runner.health.reconnects >= 2, 5)
    loop = asyncio.get_running_loop()
    entry = runner.page_entry(loop.time(), time.time_ns() // 1_000_000)
    assert entry.status in (BACKING_OFF, CONNECTING)
    assert entry.reconnects >= 2
    assert entry.last_error == "connection refused"
    assert entry.rate == 0
    assert entry.seq == 0
    await stop_and_wait(runner, task)


@pytest.mark.parametrize(
    ("failing_since_ms", "on_item", "clear"),
    [
        (None, False, False),  # no streak: nothing to do
        (123, False, False),  # a streak not written yet: it ends, nothing to remove
        (123, True, True),  # a streak on the item: the mark must go
        (None, True, True),
    ],
)
async def test_a_handled_message_ends_the_failing_streak(failing_since_ms, on_item, clear):
    runner = make_runner(FakeStore(), Recorder(), "ws://127.0.0.1:9/unused")
    runner.failing.failing_since_ms = failing_since_ms
    runner.failing.on_item = on_item
    assert runner.pump._handled(5, 1) is clear
    assert runner.failing.failing_since_ms is None
    assert runner.checkpoint == 5
