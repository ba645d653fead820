"""Start latency: from the API call to the first handled message.

``python -m benchmarks.start_latency [--starts 200] [--workers 2]``

The router's Lambda handler is served over HTTP by the local adapter
(``python -m local_stack.api_server``, its own process), exactly as ``run-local.sh``
serves it, and called with :class:`fleetctl.client.FleetClient`. Workers run with the
project's defaults (lease 20 s, SQS long poll 10 s). For each start, one after the
other: ``POST /connections`` with a new id and a feed URL, then wait for the recording
handler's first record of that connection. Reported: the API call's own round trip and
the whole start latency (call sent -> handler entered), p50 and p99. The feed sends a
connection's first message as soon as it is opened.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.profiles import ours
from benchmarks.report import emit, machine, summary, table
from local_stack.clock import wait_until
from local_stack.recording import DeliveryTracker
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from worker import config as worker_settings

FIRST_DELIVERY_TIMEOUT_S = 30.0
LEASE_SECONDS = 20.0


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    with LocalServers(work_dir, feeds=1, feed_rate=1.0) as stack:
        deployment = stack.deployment("latency")
        deployment.start_workers(
            [f"w{i}" for i in range(1, args.workers + 1)],
            {**ours(LEASE_SECONDS).env, worker_settings.SQS_WAIT_SECONDS: "10"},
        )
        tracker = DeliveryTracker(deployment.record_dir)
        api: list[float] = []
        total: list[float] = []
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
    return {
        "benchmark": "start_latency",
        "starts": args.starts,
        "workers": args.workers,
        "lease_s": LEASE_SECONDS,
        "api_call_s": summary(api, 4),
        "start_to_first_message_s": summary(total, 4),
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    for label, key in (
        ("API call (POST /connections round trip)", "api_call_s"),
        ("API call -> first handled message", "start_to_first_message_s"),
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
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="latency-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"start latency, {args.starts} starts, {args.workers} workers (defaults: lease 20 s)",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
