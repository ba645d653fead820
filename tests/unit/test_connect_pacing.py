"""Connect pacing per upstream host: the token bucket's rule as tables (given ``now``,
no clock), the pacer's buckets per host, its jitter and its forgetting, and the
runner's use of it (every connect attempt waits for a slot; a stop ends the wait)."""

from __future__ import annotations

import asyncio
import logging
import math
import random

import pytest
from websockets.asyncio.server import ServerConnection

from tests.unit.test_connection_runner import (
    EPOCH,
    FakeStore,
    Recorder,
    make_runner,
    start,
    stop_and_wait,
    upstream,
    wait_for,
)
from worker.connect_pacing import (
    FORGET_SECONDS,
    ConnectPacer,
    TokenBucket,
    host_of,
)
from worker.connection_state import Ending

pytestmark = pytest.mark.timeout(30)


def reservations(bucket: TokenBucket, times: list[float]) -> list[float]:
    """The wait of one reservation at each of ``times``, in order."""
    return [bucket.reserve(now) for now in times]


# --- the bucket ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("burst", "rate", "times", "waits"),
    [
        # a fresh bucket: the burst at once, then one slot every 1 / rate
        (3, 4.0, [10.0] * 6, [0, 0, 0, 0.25, 0.5, 0.75]),
        (1, 2.0, [0.0] * 4, [0, 0.5, 1.0, 1.5]),
        # spread out at the rate or slower: never a wait
        (1, 2.0, [0.0, 0.5, 1.0, 1.5, 3.0], [0, 0, 0, 0, 0]),
        (2, 10.0, [0.0, 0.1, 0.2, 0.3], [0, 0, 0, 0]),
        # faster than the rate: the burst absorbs the first ones, then the rate holds
        (2, 10.0, [0.0, 0.05, 0.1, 0.15, 0.2], [0, 0, 0, 0.05, 0.1]),
        # a reservation made while slots are booked gets the next free one
        (2, 10.0, [0.0, 0.0, 0.0, 0.05, 0.05], [0, 0, 0.1, 0.15, 0.25]),
    ],
)
def test_the_burst_goes_at_once_then_the_rate_holds(burst, rate, times, waits):
    assert reservations(TokenBucket(burst, rate), times) == pytest.approx(waits)


@pytest.mark.parametrize(
    ("idle", "waits"),
    [
        (0.25, [0, 0.25, 0.5]),  # one token back
        (0.5, [0, 0, 0.25]),  # two back
        (0.75, [0, 0, 0, 0.25]),  # all three: full
        (1000.0, [0, 0, 0, 0.25]),  # refilled at most up to the burst
    ],
)
def test_tokens_come_back_at_the_rate_after_idle_capped_at_the_burst(idle, waits):
    bucket = TokenBucket(3, 4.0)
    assert reservations(bucket, [0.0] * 3) == [0, 0, 0]
    assert reservations(bucket, [idle] * len(waits)) == pytest.approx(waits)


def test_booked_slots_are_paid_back_before_tokens_build_up_again():
    bucket = TokenBucket(2, 10.0)
    reservations(bucket, [0.0] * 6)  # four booked past the burst: the last at 0.4
    assert bucket.reserve(0.4) == pytest.approx(0.1)  # still none free at 0.4
    assert not bucket.full(0.6)
    assert bucket.full(0.7)  # 0.5 + two tokens
    assert bucket.reserve(0.7) == 0


@pytest.mark.parametrize("count", [1, 10, 200])
def test_n_reservations_at_once_get_n_slots_one_interval_apart(count):
    burst, rate = 10, 20.0
    waits = reservations(TokenBucket(burst, rate), [5.0] * (burst + count))
    assert waits[:burst] == [0] * burst
    assert waits[burst:] == pytest.approx([k / rate for k in range(1, count + 1)])


@pytest.mark.parametrize(("burst", "rate"), [(0, 10.0), (5, 0.0), (0, 0.0)])
def test_zero_in_either_is_unlimited(burst, rate):
    bucket = TokenBucket(burst, rate)
    assert bucket.unlimited
    assert reservations(bucket, [0.0] * 1000) == [0] * 1000
    assert bucket.full(0.0)


def test_a_clock_that_goes_back_refills_nothing():
    bucket = TokenBucket(1, 1.0)
    assert bucket.reserve(10.0) == 0
    assert bucket.reserve(9.0) == pytest.approx(2.0)  # the next slot is at 11.0
    assert bucket.reserve(11.0) == pytest.approx(1.0)  # and the one after at 12.0


@pytest.mark.parametrize(("burst", "rate"), [(-1, 1.0), (1, -1.0), (1, math.inf), (1, math.nan)])
def test_bad_limits_are_refused(burst, rate):
    with pytest.raises(ValueError, match="must be"):
        TokenBucket(burst, rate)
    with pytest.raises(ValueError, match="must be"):
        ConnectPacer(burst, rate)


# --- the pacer: hosts, jitter, forgetting ----------------------------------------------


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("wss://Feed.Example.COM/stream?from_seq=3", "feed.example.com"),
        ("ws://feed.example.com:8080/x", "feed.example.com"),
        ("ws://127.0.0.1:9000/x", "127.0.0.1"),
        ("ws://[::1]:9000/x", "::1"),
        ("not a url", ""),
        ("ws://[::1/x", ""),  # malformed: urlsplit raises
    ],
)
def test_the_host_is_the_lowercased_hostname_without_the_port(url, host):
    assert host_of(url) == host


class NoJitter(random.Random):
    def random(self) -> float:
        return 0.0


def test_each_host_has_its_own_bucket():
    pacer = ConnectPacer(1, 2.0, rng=NoJitter())
    assert pacer.delay("wss://a.example.com/1", 0.0) == 0
    assert pacer.delay("wss://b.example.com/1", 0.0) == 0  # another host: its own burst
    # The same host, whatever the case, port, path or query: the same bucket.
    assert pacer.delay("WSS://A.EXAMPLE.COM:8443/2?from_seq=9", 0.0) == 0.5
    assert pacer.delay("wss://a.example.com/3", 0.0) == 1.0
    assert pacer.delay("wss://b.example.com/2", 0.0) == 0.5
    assert pacer.hosts == 2


def test_jitter_is_a_fraction_of_one_interval_and_only_for_connects_that_wait():
    burst, rate = 5, 10.0
    pacer = ConnectPacer(burst, rate, rng=random.Random(7))
    delays = [pacer.delay("ws://feed/x", 100.0) for _ in range(burst + 200)]
    assert delays[:burst] == [0] * burst  # at once: no jitter, no draw from the rng
    expected_rng = random.Random(7)
    for k, delay in enumerate(delays[burst:], start=1):
        jitter = delay - k / rate
        assert 0 <= jitter < 1 / rate
        assert jitter == pytest.approx(expected_rng.random() / rate)
    jitters = [d - k / rate for k, d in enumerate(delays[burst:], start=1)]
    assert max(jitters) - min(jitters) > 0.5 / rate  # spread over the interval


def test_unlimited_pacer_never_waits_and_keeps_no_buckets():
    pacer = ConnectPacer()  # the default of ConnectionSettings
    assert pacer.unlimited
    assert [pacer.delay(f"ws://h{i % 3}/x", 0.0) for i in range(1000)] == [0] * 1000
    assert pacer.hosts == 0


def test_buckets_full_again_are_forgotten_and_booked_ones_kept():
    pacer = ConnectPacer(2, 1.0, rng=NoJitter())
    for i in range(100):
        pacer.delay(f"ws://host-{i}/x", 0.0)
    for _ in range(int(FORGET_SECONDS) * 2):  # this one is booked far ahead
        pacer.delay("ws://busy/x", 0.0)
    assert pacer.hosts == 101
    pacer.delay("ws://host-0/x", FORGET_SECONDS - 1)  # not yet time to look
    assert pacer.hosts == 101
    assert pacer.delay("ws://other/x", FORGET_SECONDS) == 0
    assert pacer.hosts == 2  # "busy" (still booked) and "other" (just used)
    # A forgotten host starts again with its whole burst, as it would have anyway.
    assert [pacer.delay("ws://host-1/x", FORGET_SECONDS) for _ in range(3)] == [0, 0, 1.0]


async def test_wait_sleeps_for_the_delay_on_the_injected_clock():
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    pacer = ConnectPacer(1, 4.0, rng=NoJitter(), clock=lambda: 50.0, sleep=sleep)
    for _ in range(3):
        await pacer.wait("ws://feed/x")
    assert slept == [0.25, 0.5]  # the first one went at once, without sleeping


async def test_a_wait_over_a_second_is_logged_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="worker.connect_pacing")

    async def sleep(seconds: float) -> None:
        pass

    pacer = ConnectPacer(1, 1.0, rng=NoJitter(), clock=lambda: 0.0, sleep=sleep)
    await pacer.wait("ws://Feed/x")
    await pacer.wait("ws://feed/x")  # 1.0 s: not more than a second
    assert caplog.records == []
    await pacer.wait("ws://feed/x")
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG
    assert (record.host, record.wait_seconds) == ("feed", 2.0)


async def test_a_cancelled_wait_ends_at_once():
    pacer = ConnectPacer(1, 0.01)  # a slot every 100 s
    await pacer.wait("ws://feed/x")
    waiting = asyncio.create_task(pacer.wait("ws://feed/x"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 0.5)


# --- the runner: every connect attempt is paced, and a stop ends the wait -------------


class CountingPacer(ConnectPacer):
    def __init__(self, burst: int, rate: float) -> None:
        super().__init__(burst, rate, rng=random.Random(3))
        self.waits: list[str] = []

    async def wait(self, url: str) -> None:
        self.waits.append(url)
        await super().wait(url)


async def test_every_connect_attempt_waits_for_a_slot_reconnects_included():
    async def close_at_once(ws: ServerConnection, from_seq: int) -> None:
        await ws.close()

    async with upstream(close_at_once) as up:
        pacer = CountingPacer(1, 2.0)  # burst 1, then a slot every 0.5 s
        runner = make_runner(FakeStore(), Recorder(), up.url, pacer=pacer)
        task = start(runner)
        await wait_for(lambda: len(up.connections) >= 3, 5)
        await stop_and_wait(runner, task)
    assert len(pacer.waits) >= len(up.connections) >= 3
    assert all(host_of(url) == "127.0.0.1" for url in pacer.waits)
    # The backoff alone would allow 0.25 s then 0.5 s (jittered down); the k-th connect
    # has the slot k x 0.5 s after the first one (plus its jitter, never minus).
    first = up.connections[0][0]
    for k, (at, _) in enumerate(up.connections):
        assert at - first >= k * 0.5 - 0.02


async def test_a_stop_during_the_wait_ends_it_without_connecting():
    async def serve_forever(ws: ServerConnection, from_seq: int) -> None:
        await ws.wait_closed()

    async with upstream(serve_forever) as up:
        pacer = ConnectPacer(1, 0.01)  # the next slot is 100 s away
        assert pacer.delay(up.url, asyncio.get_running_loop().time()) == 0
        store = FakeStore()
        runner = make_runner(store, Recorder(), up.url, pacer=pacer)
        task = start(runner)
        await asyncio.sleep(0.2)
        outcome = await stop_and_wait(runner, task, within=1.0)
    assert up.connections == []
    assert (outcome.ending, outcome.released) == (Ending.SHUTDOWN, True)
    assert store.releases == [(EPOCH, 0)]
