"""One worker's DynamoDB slowed down: how long does any connection of the fleet go
without deliveries?

``python -m benchmarks.slow_dynamodb [--connections 20] [--rate 10] [--hold 20]
[--round-trips 0.3,0.6,1.5,2.5]``

At the shipped default timings (lease 2.2 s, heartbeat 0.594 s, fence window 1.98 s), two
workers, ``slow`` (its DynamoDB traffic goes through a proxy) and ``other``, share
``--connections`` connections at ``--rate`` msg/s (balancing splits them). For each
round trip in turn, once every connection flows and ``slow`` runs about half of them
(balancing has converged):

1. the proxy delays every chunk of ``slow``'s DynamoDB traffic by half the round trip,
   each way, for ``--hold`` seconds, then heals;
2. the deliveries are followed until 5 s after the heal.

Meanwhile the slow worker is sent work: 3 s into the slowdown two of the connections
it runs are stopped, and one of them is started again 3 s later; and 2 s in, two new
connections are started (whoever takes them, the slow worker has no room to publish).

Reported per round trip: the longest time any connection went without a delivery (by
any worker) from the start of the slowdown to the end of the window, against the crash
failover bound of docs/DESIGN.md §3.11; from each stop answered to the last delivery
of its connection, against the stop bound; from the start again and the new starts to
their first delivery; the connections ``slow`` ran before the slowdown and at its
end; ``slow``'s fence pauses and sessions given up in the window. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import emit, machine, table
from benchmarks.tcp_proxy import ProxyThread
from local_stack.clock import wait_until
from local_stack.recording import DeliveryTracker
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, wait_ready
from wsfleet.timing import LeaseTiming

AFTER_HEAL_S = 5.0
SETTLE_TIMEOUT_S = 90.0
PAUSED = "session fence deadline passed: pausing"
GIVEN_UP = (
    "session given up: no renew landed for its fence window; its connections go to the others"
)


def settled(tracker: DeliveryTracker, worker_id: str, ids: list[str]) -> bool:
    """Every connection flows and ``worker_id`` runs about half of them (balancing has
    converged: no move is under way when the slowdown begins)."""
    return tracker.flowing(ids, 0.5) and len(tracker.handled_by(worker_id)) >= len(ids) // 2 - 1


STOP_AT_S, RESTART_AFTER_S, NEW_STARTS_AT_S = 3.0, 3.0, 2.0


@dataclass
class Work:
    """What the slow worker is sent during one slowdown, and when each answer came."""

    stopped: dict[str, float] = field(default_factory=dict)
    """Connection -> when its stop was answered."""
    started: dict[str, float] = field(default_factory=dict)
    """Connection (started again, or new) -> when its start was answered."""
    last_after_stop: dict[str, float] = field(default_factory=dict)
    first_after_start: dict[str, float] = field(default_factory=dict)

    def saw(self, cid: str, t: float) -> None:
        if cid in self.stopped and t > self.stopped[cid] - 1.0:
            self.last_after_stop[cid] = max(self.last_after_stop.get(cid, t), t)
        if cid in self.started and t >= self.started[cid] and cid not in self.first_after_start:
            self.first_after_start[cid] = t


def measure(
    deployment: Any,
    stack: Any,
    tracker: DeliveryTracker,
    proxy: Any,
    slow: WorkerProcess,
    ids: list[str],
    round_trip: float,
    hold: float,
    rate: float,
) -> dict[str, Any]:
    wait_until(lambda: settled(tracker, slow.worker_id, ids), SETTLE_TIMEOUT_S, "settling")
    ran_before = len(tracker.handled_by(slow.worker_id))
    last = {cid: tracker.latest[cid].t for cid in ids}
    paused_before, given_up_before = len(slow.logged(PAUSED)), len(slow.logged(GIVEN_UP))
    longest = dict.fromkeys(ids, 0.0)
    began = time.time()
    proxy.delay(round_trip / 2)
    healed_at = began + hold
    end = healed_at + AFTER_HEAL_S
    healed, ran_at_end = False, 0
    work = Work()
    to_stop = sorted(tracker.handled_by(slow.worker_id))[:2]
    new = [f"new-{round_trip:g}-{n}" for n in range(2)]
    steps = [
        (began + NEW_STARTS_AT_S, "new"),
        (began + STOP_AT_S, "stop"),
        (began + STOP_AT_S + RESTART_AFTER_S, "restart"),
    ]
    while time.time() < end:
        for record in tracker.poll():
            cid = record.connection_id
            work.saw(cid, record.t)
            if cid in last and cid not in work.stopped and record.t > last[cid]:
                longest[cid] = max(longest[cid], record.t - last[cid])
                last[cid] = record.t
        while steps and time.time() >= steps[0][0]:
            _, step = steps.pop(0)
            if step == "new":
                for cid in new:
                    deployment.start_connection(cid, stack.feed_url(cid, {"rate": rate}))
                    work.started[cid] = time.time()
            elif step == "stop":
                for cid in to_stop:
                    deployment.stop_connection(cid)
                    work.stopped[cid] = time.time()
            elif to_stop:
                again = to_stop[0]
                deployment.start_connection(again, stack.feed_url(again, {"rate": rate}))
                work.started[again] = time.time()
        if not healed and time.time() >= healed_at:
            ran_at_end = len(tracker.handled_by(slow.worker_id))
            proxy.heal()
            healed = True
        time.sleep(0.05)
    for cid in ids:  # a connection still dark at the end counts up to now
        if cid not in work.stopped:
            longest[cid] = max(longest[cid], end - last[cid])
    for cid in to_stop:  # back in the measured set for the next round trip
        deployment.start_connection(cid, stack.feed_url(cid, {"rate": rate}))
    for cid in new:
        deployment.stop_connection(cid)
    stop_to_last = [
        work.last_after_stop.get(cid, at) - at
        for cid, at in work.stopped.items()
        if cid not in work.started or work.last_after_stop.get(cid, at) < work.started[cid]
    ]
    start_to_first = [work.first_after_start.get(cid, end) - at for cid, at in work.started.items()]
    return {
        "round_trip_s": round_trip,
        "longest_without_deliveries_s": round(max(longest.values()), 3),
        "median_connection_longest_s": round(sorted(longest.values())[len(ids) // 2], 3),
        "stop_to_last_delivery_max_s": round(max(stop_to_last, default=0.0), 3),
        "start_to_first_delivery_max_s": round(max(start_to_first, default=0.0), 3),
        "slow_ran_before": ran_before,
        "slow_ran_at_end_of_hold": ran_at_end,
        "fence_pauses": len(slow.logged(PAUSED)) - paused_before,
        "sessions_given_up": len(slow.logged(GIVEN_UP)) - given_up_before,
    }


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    timing = LeaseTiming.from_lease()
    with LocalServers(work_dir, feeds=1, feed_rate=args.rate) as stack, ProxyThread() as proxies:
        deployment = stack.deployment("slow-ddb")
        proxy = proxies.add(int(deployment.endpoints.dynamodb.rsplit(":", 1)[1]))
        slow = deployment.launch_worker(
            "slow", deployment.worker_env("slow", {}, dynamodb_endpoint=proxy.endpoint)
        )
        wait_ready([slow], 60)
        deployment.start_workers(["other"], {})
        tracker = DeliveryTracker(deployment.record_dir)
        ids = [f"c{i}" for i in range(args.connections)]
        for cid in ids:
            deployment.start_connection(cid, stack.feed_url(cid, {"rate": args.rate}))
        results = []
        for round_trip in args.round_trips:
            result = measure(
                deployment, stack, tracker, proxy, slow, ids, round_trip, args.hold, args.rate
            )
            print(f"  {result}", flush=True)
            results.append(result)
        deployment.stop_workers()
    return {
        "benchmark": "slow_dynamodb",
        "connections": args.connections,
        "rate": args.rate,
        "hold_s": args.hold,
        "crash_failover_bound_s": round(timing.crash_failover_bound(), 3),
        "stop_bound_s": round(timing.heartbeat + 1.0, 3),
        "results": results,
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    rows = [
        [
            r["round_trip_s"],
            r["longest_without_deliveries_s"],
            r["median_connection_longest_s"],
            r["stop_to_last_delivery_max_s"],
            r["start_to_first_delivery_max_s"],
            f"{r['slow_ran_before']} / {r['slow_ran_at_end_of_hold']}",
            r["fence_pauses"],
            r["sessions_given_up"],
        ]
        for r in result["results"]
    ]
    return (
        table(
            [
                "round trip (s)",
                "longest dark (s)",
                "median connection's longest (s)",
                "stop to last delivery, max (s)",
                "start to first delivery, max (s)",
                "slow ran before / at end",
                "pauses",
                "given up",
            ],
            rows,
        )
        + f"\ncrash failover bound: {result['crash_failover_bound_s']} s;"
        f" stop bound: {result['stop_bound_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.slow_dynamodb", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds of each slowdown")
    parser.add_argument(
        "--round-trips",
        type=lambda raw: [float(v) for v in raw.split(",")],
        default=[0.3, 0.6, 1.5, 2.5],
        help="comma-separated round trips in seconds",
    )
    parser.add_argument("--work-dir", type=Path, help="keep the logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="slow-ddb-") as tmp:
            result = run(args, args.work_dir or Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"one worker's DynamoDB slowed, {args.connections} connections at {args.rate:g} msg/s,"
        f" {args.hold:g} s per round trip",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
