"""Density: how many connections one worker process carries, and what each costs.

``python -m benchmarks.density [--levels 250,500,1000] [--hold 20]``

One worker (the shipped default timings: session lease 2.5 s, renew every 0.6 s;
``MAX_CONNECTIONS`` raised above
the top level; no-op handler) takes connections at 1 message/s each from two feed
processes (1,000 simultaneous opening handshakes against one busy server time out, so
starts are spread at ``--start-rate`` per second over both feeds). At each level, after
a settling pause, over ``--hold`` seconds:

- memory: the worker's RSS (``/proc``) against its RSS before any connection, per
  connection;
- CPU: the worker's share of one core;
- heartbeat lateness: how late session renews were sent against their schedule (the
  renew runs on its own thread, so this is that thread's lateness), the p50/p99/max the
  worker logs with each "worker stats" line (every 5 s); the table shows the worst
  period's p99 and the overall max;
- messages/s handled and session renews/s sent (one worker: about 1.7/s whatever the
  number of connections).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.procfs import CpuSample, SystemCpuSample, rss_bytes
from benchmarks.profiles import ours
from benchmarks.report import emit, machine, table
from local_stack.clock import wait_until
from local_stack.fleet import Deployment
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, parse_log_time
from worker import config as worker_settings
from wsfleet.timing import LeaseTiming

TIMING = LeaseTiming.from_lease()
STATS_INTERVAL_S = 5
SETTLE_S = 5.0


def add_connections(
    stack: LocalServers, deployment: Deployment, first: int, last: int, per_second: float
) -> None:
    """Start connections ``first`` .. ``last - 1`` at ``per_second``, alternating feeds."""
    began = time.monotonic()
    for n, index in enumerate(range(first, last)):
        due = began + n / per_second
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        cid = f"dense-{index}"
        deployment.start_connection(cid, stack.feed_url(cid, {"rate": 1}, index=index))


def connected(worker: WorkerProcess) -> int:
    """Connections that have opened their upstream at least once, per the worker's log."""
    return len({e.get("connection_id") for e in worker.logged("upstream connected")})


def measure_level(worker: WorkerProcess, level: int, hold: float, base_rss: int) -> dict[str, Any]:
    """Figures of the worker over ``hold`` seconds at ``level`` connections."""
    start, cpu_0, system_0 = time.time(), CpuSample.take(worker.pid), SystemCpuSample.take()
    time.sleep(hold)
    end, cpu_1, system_1 = time.time(), CpuSample.take(worker.pid), SystemCpuSample.take()
    rss = rss_bytes(worker.pid)
    wait_until(
        lambda: any(parse_log_time(e["timestamp"]) > end for e in worker.logged("worker stats")),
        2 * STATS_INTERVAL_S + 5,
        "the stats line after the window",
    )
    stats = [
        e
        for e in worker.logged("worker stats")
        if start < parse_log_time(e["timestamp"]) <= end + STATS_INTERVAL_S
    ]
    lateness = [e.get("renew_lateness", {}) for e in stats]
    renews = sum(int(x.get("renews", 0)) for x in lateness)
    covered = STATS_INTERVAL_S * len(stats)
    return {
        "connections": level,
        "active_connections": stats[-1].get("active_connections") if stats else None,
        "rss_mib": round(rss / 2**20, 1),
        "rss_per_connection_kib": round((rss - base_rss) / level / 1024, 1),
        "cpu_percent": round(cpu_0.percent_until(cpu_1), 1),
        "machine_busy_percent": round(system_0.busy_percent_until(system_1), 1),
        "messages_per_s": round(
            sum(int(e.get("messages_processed", 0)) for e in stats) / covered, 1
        )
        if covered
        else 0.0,
        "renews_per_s": round(renews / covered, 1) if covered else 0.0,
        "renew_lateness_p50_ms": max((float(x.get("p50_ms", 0)) for x in lateness), default=0),
        "renew_lateness_p99_ms": max((float(x.get("p99_ms", 0)) for x in lateness), default=0),
        "renew_lateness_max_ms": max((float(x.get("max_ms", 0)) for x in lateness), default=0),
    }


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    levels = sorted(args.levels)
    with LocalServers(work_dir, feeds=args.feeds, feed_rate=1.0) as stack:
        deployment = stack.deployment("density")
        [worker] = deployment.start_workers(
            ["dense"],
            {
                **ours(None).env,
                worker_settings.HANDLER: args.handler,
                worker_settings.MAX_CONNECTIONS: str(levels[-1] + 100),
                worker_settings.METRICS_INTERVAL_SECONDS: str(STATS_INTERVAL_S),
                # Only the shutdown differs: no flood of reassign messages at the end.
                worker_settings.REASSIGN_ON_RELEASE: "false",
            },
        )
        time.sleep(SETTLE_S)
        base_rss = rss_bytes(worker.pid)
        print(f"  worker RSS before any connection: {base_rss / 2**20:.1f} MiB", flush=True)
        results = []
        have = 0
        for level in levels:
            add_connections(stack, deployment, have, level, args.start_rate)
            have = level

            def all_open(level: int = level) -> bool:
                return connected(worker) >= level

            wait_until(
                all_open,
                60 + level / args.start_rate,
                f"{level} open upstream connections",
                0.5,
            )
            time.sleep(SETTLE_S)
            figures = measure_level(worker, level, args.hold, base_rss)
            print(f"  {figures}", flush=True)
            results.append(figures)
        reconnects = len(worker.logged("upstream connection failed"))
        deployment.stop_workers(timeout=60)
    return {
        "benchmark": "density",
        "lease_s": TIMING.lease,
        "heartbeat_s": TIMING.heartbeat,
        "feeds": args.feeds,
        "handler": args.handler,
        "base_rss_mib": round(base_rss / 2**20, 1),
        "levels": results,
        "upstream_connection_failures": reconnects,
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    rows = [
        [
            r["connections"],
            r["active_connections"],
            r["rss_mib"],
            r["rss_per_connection_kib"],
            r["cpu_percent"],
            r["machine_busy_percent"],
            r["messages_per_s"],
            r["renews_per_s"],
            r["renew_lateness_p50_ms"],
            r["renew_lateness_p99_ms"],
            r["renew_lateness_max_ms"],
        ]
        for r in result["levels"]
    ]
    headers = [
        "connections",
        "active",
        "RSS MiB",
        "KiB/conn",
        "CPU %",
        "machine busy %",
        "msg/s",
        "renews/s",
        "late p50 ms",
        "late p99 ms",
        "late max ms",
    ]
    return (
        table(headers, rows)
        + f"\nRSS before any connection: {result['base_rss_mib']} MiB; "
        + f"upstream connection failures: {result['upstream_connection_failures']}; "
        + f"HANDLER={result['handler']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.density", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--levels",
        type=lambda raw: [int(x) for x in raw.split(",")],
        default=[250, 500, 1000],
        help="connection counts, comma-separated (default 250,500,1000)",
    )
    parser.add_argument("--hold", type=float, default=20.0, help="seconds measured per level")
    parser.add_argument("--start-rate", type=float, default=50.0, help="connection starts/s")
    parser.add_argument("--feeds", type=int, default=2)
    parser.add_argument(
        "--handler",
        default="benchmarks.handlers:noop_factory",
        help="the worker's HANDLER; benchmarks.handlers:noop_without_gc_factory also turns "
        "off the cyclic garbage collector (a diagnostic of renew lateness)",
    )
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="density-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"density, one worker, 1 msg/s per connection, heartbeat {TIMING.heartbeat:g} s",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
