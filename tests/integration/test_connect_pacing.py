"""Connect pacing against real processes: a worker that takes over 100 connections of
one upstream host at once opens them at the pace it is given, as the upstream sees
it (the feed's log of stream opens), and every one of them streams again.

Also the figure of docs/BENCHMARKS.md ("Connect pacing"): run with ``-s`` to see it."""

from __future__ import annotations

import bisect
import signal
import time

import pytest

from local_stack.audit import lost_seqs, stale_deliveries
from tests.support.feed_log import FeedService, stream_events
from tests.support.fleet import TIMING, Fleet, wait_until
from tests.support.timing import scaled

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(180))]

CONNECTIONS = 100
BURST = 10
RATE = 20.0
FEED_RATE = 5  # messages/s per connection: enough to see each one stream, light to record
CRASH_BOUND = TIMING.crash_failover_bound()
PACING_BOUND = (CONNECTIONS - BURST) / RATE + 1 / RATE  # the last slot, and its jitter
HANDSHAKE_ALLOWANCE = scaled(0.25)
"""The bucket's bound holds for the connect starts (test_connect_pacing in tests/unit);
the feed logs a stream once its handshake is done. Right after the takeover the
worker's loop is busy starting the runners (and the next takeover transaction holds the
GIL): the first handshakes, started over some 60 ms, all finish together 60 to 140 ms
after the first start, while a later single connect takes a few ms. A window as the
feed sees it can be that much shorter than the same window of starts (up to 5 slots at
20/s); a connect schedule without pacing would still be off by far more (100 connects
in well under a second)."""


def most_in_a_window(times: list[float], window: float) -> int:
    """The most of ``times`` (sorted) that fall in any closed interval ``window`` long."""
    return max(
        (bisect.bisect_right(times, start + window) - i for i, start in enumerate(times)),
        default=0,
    )


def test_a_takeover_of_100_connections_is_paced_per_host(fleet: Fleet, feed_service: FeedService):
    # Shipped pacing (burst 200: all 100 at once), and no balance round that could move
    # some of them to the second worker before the kill.
    first = fleet.start_worker("first", BALANCE_ROUND_SECONDS="0")
    ids = [f"pace-{i}" for i in range(CONNECTIONS)]
    for cid in ids:
        fleet.start_connection(cid, fleet.feed(cid, rate=FEED_RATE))

    def all_streaming(worker_id: str, after: float) -> bool:
        seen = {r.connection_id for r in fleet.records() if r.worker == worker_id and r.t > after}
        return seen >= set(ids)

    wait_until(
        lambda: all_streaming(first.worker_id, 0.0), scaled(30), "100 connections", interval=0.25
    )
    second = fleet.start_worker(
        "second", UPSTREAM_CONNECT_BURST=str(BURST), UPSTREAM_CONNECTS_PER_SECOND=str(RATE)
    )
    killed_at = time.time()
    first.signal(signal.SIGKILL)
    first.wait(timeout=scaled(10))

    # Every connection streams again, from the second worker, within about twice the
    # crash bound plus the pacing of 100 connects.
    wait_until(
        lambda: all_streaming(second.worker_id, killed_at),
        scaled(2 * (CRASH_BOUND + PACING_BOUND)),
        "the second worker to stream all 100 connections",
        interval=0.25,
    )
    took = time.time() - killed_at

    # The connects as the upstream saw them, reconnects included (none, normally).
    opened = {
        cid: [t for t in stream_events(feed_service.log_path, cid, "open") if t > killed_at]
        for cid in ids
    }
    assert all(opened.values())
    opens = sorted(t for times in opened.values() for t in times)
    # No window of t seconds holds more than burst + rate x t connects, +1 for the
    # jitter (a connect goes up to one interval after its slot), with t measured at the
    # feed, give or take the handshake time.
    for i, start in enumerate(opens):
        for j in range(i, len(opens)):
            window = opens[j] - start
            assert j - i + 1 <= BURST + RATE * (window + HANDSHAKE_ALLOWANCE) + 1, (i, j, window)
    firsts = sorted(min(times) for times in opened.values())  # the takeover's connects
    span = firsts[-1] - firsts[0]
    in_one_second = most_in_a_window(opens, 1.0)
    print(
        f"connect pacing, {CONNECTIONS} connections taken over, burst {BURST}, {RATE:g}/s "
        f"({len(opens) - CONNECTIONS} reconnects): "
        f"first to last connect {span:.2f} s (slots: {(CONNECTIONS - BURST) / RATE:.2f} s), "
        f"most connects in 1 s: {in_one_second} (burst + rate + 1 = {BURST + RATE + 1:g}); "
        f"kill to all streaming {took:.2f} s"
    )
    assert span >= (CONNECTIONS - BURST - 1) / RATE - HANDSHAKE_ALLOWANCE  # not at once
    assert in_one_second <= BURST + RATE * (1 + HANDSHAKE_ALLOWANCE) + 1
    records = fleet.records()
    assert stale_deliveries(records) == []
    assert lost_seqs(records) == {}
