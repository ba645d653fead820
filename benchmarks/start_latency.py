"""Start latency: from the API call to the first handled message; stop latency: from
the API call to the upstream socket closed.

``python -m benchmarks.start_latency [--starts 200] [--workers 2] [--stops-at-once]``

The router's Lambda handler is served over HTTP by the local adapter
(``python -m local_stack.api_server``, its own process), exactly as ``run-local.sh``
serves it, and called with :class:`fleetctl.client.FleetClient`. Workers run with the
project's shipped defaults (session lease 2.2 s, heartbeat 0.594 s, SQS long poll 10 s).
For each start, one after the other: ``POST /connections`` with a new id and a feed
URL, then wait for the recording handler's first record of that connection. Then each
connection is stopped (``DELETE``) and the feed's log tells when its socket closed.
Reported: the API call's own round trip, the whole start latency (call sent -> handler
entered) and the stop latency (``DELETE`` sent -> the feed saw the socket close), p50,
p99 and max; and the stop split at the ``DELETE``'s answer (its round trip, then
answered -> closed: what docs/DESIGN.md §3.11 bounds). The feed sends a connection's
first message as soon as it is opened.
With ``--stops-at-once`` the stops are sent together (from 50 threads) instead of one
after the other: a burst of stops reaching their owners in one session renew.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.profiles import ours
from benchmarks.report import emit, machine, summary, table
from local_stack.clock import wait_until
from local_stack.feed_events import stream_events
from local_stack.recording import DeliveryTracker
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from worker import config as worker_settings
from wsfleet.timing import LeaseTiming

FIRST_DELIVERY_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 30.0
TIMING = LeaseTiming.from_lease()


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    with LocalServers(work_dir, feeds=1, feed_rate=1.0) as stack:
        deployment = stack.deployment("latency")
        deployment.start_workers(
            [f"w{i}" for i in range(1, args.workers + 1)],
            {**ours(None).env, worker_settings.SQS_WAIT_SECONDS: "10"},
        )
        tracker = DeliveryTracker(deployment.record_dir)
        api: list[float] = []
        total: list[float] = []
        started: list[str] = []
        # One unmeasured start warms the router (imports, clients) and the workers.
        for i in range(-1, args.starts):
            cid = f"start-{i + 1}" if i >= 0 else "warm-up"
            url = stack.feed_url(cid, {"rate": 1})
            sent = time.time()
            deployment.start_connection(cid, url)
            answered = time.time()

            def first_delivery(cid: str = cid) -> float | None:
                tracker.poll()
                record = tracker.latest.get(cid)
                return record.t if record else None

            handled = wait_until(first_delivery, FIRST_DELIVERY_TIMEOUT_S, cid, 0.005)
            if i >= 0:
                api.append(answered - sent)
                total.append(handled - sent)
                started.append(cid)
        feed_log = stack.feed_processes[0].log_path

        def stop(cid: str) -> tuple[float, float]:
            sent = time.time()
            deployment.stop_connection(cid)
            return sent, time.time()

        def closed_after(cid: str, sent: float) -> float:
            def closed() -> float | None:
                done = [t for t in stream_events(feed_log, cid, "done") if t >= sent - 0.01]
                return done[0] if done else None

            return wait_until(closed, CLOSE_TIMEOUT_S, f"{cid} closed", 0.01) - sent

        if args.stops_at_once:
            with ThreadPoolExecutor(50) as pool:
                calls = dict(zip(started, pool.map(stop, started), strict=True))
        else:
            calls = {}
            for cid in started:
                calls[cid] = stop(cid)
                closed_after(cid, calls[cid][0])
        stops = [closed_after(cid, sent) for cid, (sent, _) in calls.items()]
        # The promise (docs/DESIGN.md §3.11) runs from the DELETE's answer: a burst's
        # own queueing at the API is the API's, reported on its own.
        delete_calls = [answered - sent for sent, answered in calls.values()]
        answered_to_closed = [s - (a - t) for s, (t, a) in zip(stops, calls.values(), strict=True)]
    return {
        "benchmark": "start_latency",
        "starts": args.starts,
        "workers": args.workers,
        "stops_at_once": args.stops_at_once,
        "lease_s": TIMING.lease,
        "heartbeat_s": TIMING.heartbeat,
        "api_call_s": summary(api, 4),
        "start_to_first_message_s": summary(total, 4),
        "stop_to_socket_closed_s": summary(stops, 4),
        "delete_call_s": summary(delete_calls, 4),
        "answered_to_socket_closed_s": summary(answered_to_closed, 4),
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    for label, key in (
        ("API call (POST /connections round trip)", "api_call_s"),
        ("API call -> first handled message", "start_to_first_message_s"),
        ("DELETE sent -> upstream socket closed", "stop_to_socket_closed_s"),
        ("API call (DELETE round trip)", "delete_call_s"),
        ("DELETE answered -> upstream socket closed", "answered_to_socket_closed_s"),
    ):
        s = result[key]
        rows.append([label, s["n"], s["p50"], s["p99"], s["max"]])
    return table(["measure", "n", "p50 s", "p99 s", "max s"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.start_latency", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--stops-at-once", action="store_true", help="send every stop together, not in turn"
    )
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="latency-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"start and stop latency, {args.starts} connections, {args.workers} workers"
        f"{', stops at once' if args.stops_at_once else ''}"
        " (shipped defaults: lease 2.2 s, heartbeat 0.594 s)",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
