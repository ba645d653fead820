"""The simulator's runtime: virtual time, processes, greenlet threads, the network."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage, InvalidStatus

from sim import upstreams
from sim.network import Network
from sim.runtime import SimThreads, await_only, install_asyncgen_hooks
from sim.runtime import World as _World
from worker.threads import MailboxEmptyError

_worlds: list[World] = []


@pytest.fixture(autouse=True)
def _close_worlds() -> object:
    yield
    while _worlds:
        _worlds.pop().close()


def World(seed: int) -> _World:  # noqa: N802 - stands for the class in these tests
    world = _World(seed)
    _worlds.append(world)
    return world


def test_an_hour_of_sleeps_takes_no_real_time_and_lands_on_virtual_instants() -> None:
    world = World(1)
    loop = world.loop("p")
    woke: list[float] = []

    async def sleeper(seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append(asyncio.get_running_loop().time())

    for seconds in (3600.0, 5.0, 0.25):
        world.run_task(loop, sleeper(seconds))
    world.run_until(world.now + 4000)
    assert woke == [1000.25, 1005.0, 4600.0]


def test_blocking_code_in_the_executor_waits_in_virtual_time_and_can_be_abandoned() -> None:
    world = World(1)
    loop = world.loop("p")
    seen: list[tuple[str, float]] = []

    def blocking(label: str, seconds: float) -> str:
        await_only(asyncio.sleep(seconds))
        seen.append((label, world.now))
        return label

    async def main() -> None:
        running = asyncio.get_running_loop()
        assert await running.run_in_executor(None, blocking, "a", 2.0) == "a"
        abandoned = running.run_in_executor(None, blocking, "b", 1.0)
        abandoned.cancel()
        await asyncio.sleep(5)

    world.run_task(loop, main())
    world.run_until(world.now + 10)
    # The cancelled future abandons the result; the call itself goes on, as a thread's.
    assert seen == [("a", 1002.0), ("b", 1003.0)]


def test_a_mailbox_times_out_in_virtual_time_and_a_thread_can_be_joined() -> None:
    world = World(1)
    loop = world.loop("p")
    threads = SimThreads(loop)
    got: list[object] = []

    async def main() -> None:
        box = threads.mailbox()

        def consumer() -> None:
            try:
                box.get(timeout=1.5)
            except MailboxEmptyError:
                got.append(("empty", world.now))
            got.append((box.get(timeout=10), world.now))

        thread = threads.start(consumer, "consumer")
        await asyncio.sleep(3)
        box.put("hello")
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 1.0)
        got.append(("joined", world.now))

    world.run_task(loop, main())
    world.run_until(world.now + 10)
    assert got == [("empty", 1001.5), ("hello", 1003.0), ("joined", 1003.0)]


def test_a_paused_process_runs_its_timers_late_and_a_crashed_one_never() -> None:
    world = World(1)
    paused, crashed = world.loop("paused"), world.loop("crashed")
    fired: list[tuple[str, float]] = []
    for loop in (paused, crashed):
        loop.call_at(1001.0, lambda name=loop.name: fired.append((name, world.now)))
    world.pause(paused, 4.0)
    crashed.crash()
    world.run_until(1010.0)
    assert fired == [("paused", 1004.0)]


def _interleaving(seed: int) -> list[str]:
    world = World(seed)
    order: list[str] = []
    for name in "abcde":
        loop = world.loop(name)
        loop.call_at(1001.0, order.append, name)
    world.run_until(1002.0)
    return order


def test_the_seed_decides_the_order_of_processes_at_one_instant() -> None:
    assert _interleaving(7) == _interleaving(7)
    assert len({tuple(_interleaving(seed)) for seed in range(20)}) > 1


def _feed_world() -> tuple[_World, upstreams.Feeds]:
    world = World(3)
    install_asyncgen_hooks(world)
    network = Network(world, lambda: 0.001)
    return world, upstreams.Feeds(world.loop("upstreams"), network)


def test_websockets_reads_a_resumable_feed_over_the_simulated_network() -> None:
    world, _ = _feed_world()
    client = world.loop("client")
    got: list[tuple[int, float]] = []

    async def read(url: str, count: int) -> None:
        async with connect(url, open_timeout=5) as ws:
            async for data in ws:
                message = json.loads(data)
                got.append((message["seq"], round(world.now - 1000.0, 3)))
                if len(got) == count:
                    return

    world.run_task(client, read(upstreams.url("s1", 2.0), 3))
    world.run_until(1010.0)
    assert [seq for seq, _ in got] == [1, 2, 3]
    assert got[-1][1] == pytest.approx(1.5, abs=0.01)

    # Resumed later with from_seq: the backlog at once, in order.
    got.clear()
    world.run_task(client, read(upstreams.url("s1", 2.0, from_seq=4), 5))
    world.run_until(1020.0)
    assert [seq for seq, _ in got] == [4, 5, 6, 7, 8]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"refuse": 503}, InvalidStatus),
        ({"refuse": 403}, InvalidStatus),
        ({"http10": 1}, InvalidMessage),
    ],
)
def test_refusing_feeds_fail_the_real_handshake(options: dict[str, object], error: type) -> None:
    world, _ = _feed_world()
    client = world.loop("client")
    raised: list[BaseException] = []

    async def attempt() -> None:
        try:
            async with connect(upstreams.url("s2", 1.0, **options), open_timeout=5):
                pass
        except Exception as exc:
            raised.append(exc)

    world.run_task(client, attempt())
    world.run_until(1010.0)
    assert len(raised) == 1
    assert isinstance(raised[0], error), raised


def test_a_silent_feed_is_left_by_the_keepalive() -> None:
    world, feeds = _feed_world()
    client = world.loop("client")
    ends: list[tuple[str, float]] = []

    async def read() -> None:
        try:
            async with connect(
                upstreams.url("s3", 1.0), ping_interval=1, ping_timeout=2, close_timeout=1
            ) as ws:
                async for _ in ws:
                    pass
        except Exception as exc:
            ends.append((type(exc).__name__, round(world.now - 1000.0, 1)))

    world.run_task(client, read())
    world.at(1005.0, lambda: feeds.silence("s3", 60))
    world.run_until(1030.0)
    assert ends
    assert ends[0][0] == "ConnectionClosedError"
    assert 7.0 <= ends[0][1] <= 10.0


def test_a_crash_reports_no_task_it_left_pending_but_an_error_raised_before_it() -> None:
    """A crashed process's tasks are dropped with it; asyncio reports each one still
    pending when it is collected, which is the crash, not an error of the process (a
    report of it failed seed 35 with restarts on new streams during a failover)."""
    world = World(1)
    loop = world.loop("p")

    async def waits() -> None:
        await asyncio.get_running_loop().create_future()

    async def fails() -> None:
        raise RuntimeError("before the crash")

    world.run_task(loop, waits())
    failing = world.run_task(loop, fails())
    world.run_until(world.now + 1)
    loop.crash()
    del failing
    gc.collect()
    assert len(world.errors) == 1
    assert "Task exception was never retrieved" in world.errors[0]
    assert "before the crash" in world.errors[0]
