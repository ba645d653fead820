"""One connection runner in-process against a real feed on loopback and a scripted
lease store: fencing when DynamoDB is unreachable, and the ending order."""

from __future__ import annotations

import asyncio
import io
import random
import threading
import time
from dataclasses import dataclass, field

import pytest

from local_stack.feed import serve_feed
from worker.connection import ConnectionRunner, ConnectionSettings, Ending
from worker.delivery import Delivery
from worker.metrics import FleetMetrics
from worker.upstream_protocol import JsonSeqProtocol
from wsfleet.lease_rules import Lease, RenewRefusal
from wsfleet.lease_store import Renewed
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

    def release(self, lease: Lease, last_seq: int, now_ms: int) -> bool:
        self.releases.append((lease.epoch, last_seq))
        return True


class Recorder:
    def __init__(self, delay: float = 0.0) -> None:
        self.entered: list[tuple[float, int]] = []
        self.finished: list[int] = []
        self.delay = delay

    async def handle(self, delivery: Delivery) -> None:
        self.entered.append((asyncio.get_running_loop().time(), delivery.seq))
        if self.delay:
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
