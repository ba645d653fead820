"""Density: how many connections one worker process carries, and what each costs.

``python -m benchmarks.density [--levels 250,500,1000] [--hold 20]``

One worker (the shipped default timings: session lease 2.2 s, renew every 0.594 s;
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
- event-loop lag: how late the worker's 20 ms probe timer fired (worker.loop_watch),
  the worst period's p99 and the overall max; beside it the same probe alone in a
  process of its own (:mod:`benchmarks.lag_control`: the machine's share, when other
  work keeps the CPUs busy); and the garbage collector's full collections (count, the
  longest in CPU ms);
- messages/s handled and session renews/s sent (one worker: about 1.7/s whatever the
  number of connections).

``--rss-minutes N`` then holds the top level for ``N`` minutes and samples the RSS
every ``--rss-every`` seconds (default 60): start, end, growth in percent, and the
event-loop lag of each sample's minute.
"""

from __future__ import annotations

import argparse
import json
import subprocess
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
from local_stack.services import REPO_ROOT
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


def start_control(seconds: float) -> subprocess.Popen[str]:
    """The lag probe alone in a process of its own (:mod:`benchmarks.lag_control`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.lag_control", "--seconds", repr(seconds)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def control_figures(control: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = control.communicate(timeout=30)
    figures = json.loads(out.strip().splitlines()[-1])
    return {"control_lag_p99_ms": figures["p99_ms"], "control_lag_max_ms": figures["max_ms"]}


def measure_level(worker: WorkerProcess, level: int, hold: float, base_rss: int) -> dict[str, Any]:
    """Figures of the worker over ``hold`` seconds at ``level`` connections."""
    start, cpu_0, system_0 = time.time(), CpuSample.take(worker.pid), SystemCpuSample.take()
    control = start_control(hold)
    time.sleep(hold)
    end, cpu_1, system_1 = time.time(), CpuSample.take(worker.pid), SystemCpuSample.take()
    control_lag = control_figures(control)
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
    loop = [e.get("loop", {}) for e in stats]
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
        **loop_figures(loop),
        **control_lag,
    }


def loop_figures(loop: list[dict[str, Any]]) -> dict[str, Any]:
    """Event-loop lag and full collections over some "worker stats" periods."""
    return {
        "loop_lag_p50_ms": max((float(x.get("lag_p50_ms", 0)) for x in loop), default=0),
        "loop_lag_p99_ms": max((float(x.get("lag_p99_ms", 0)) for x in loop), default=0),
        "loop_lag_max_ms": max((float(x.get("lag_max_ms", 0)) for x in loop), default=0),
        "full_collections": sum(int(x.get("gc2", 0)) for x in loop),
        "full_collection_max_cpu_ms": max((float(x.get("gc2_max_ms", 0)) for x in loop), default=0),
    }


def hold_rss(worker: WorkerProcess, minutes: float, every: float) -> dict[str, Any]:
    """RSS of the worker sampled every ``every`` seconds for ``minutes``, with the
    event-loop lag of the time since the previous sample."""
    samples = []
    began = time.monotonic()
    last = time.time()
    for n in range(int(minutes * 60 / every) + 1):
        pause = began + n * every - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        now = time.time()
        rss = rss_bytes(worker.pid)
        stats = [
            e.get("loop", {})
            for e in worker.logged("worker stats")
            if last < parse_log_time(e["timestamp"]) <= now
        ]
        last = now
        sample = {"minute": round(n * every / 60, 2), "rss_mib": round(rss / 2**20, 1)}
        sample |= loop_figures(stats) if n else {}
        print(f"  {sample}", flush=True)
        samples.append(sample)
    start, end = samples[0]["rss_mib"], samples[-1]["rss_mib"]
    return {
        "minutes": minutes,
        "samples": samples,
        "rss_start_mib": start,
        "rss_end_mib": end,
        "rss_max_mib": max(s["rss_mib"] for s in samples),
        "rss_growth_percent": round(100 * (end - start) / start, 1),
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
        rss_run = hold_rss(worker, args.rss_minutes, args.rss_every) if args.rss_minutes else None
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
        "rss_run": rss_run,
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
            r["loop_lag_p50_ms"],
            r["loop_lag_p99_ms"],
            r["loop_lag_max_ms"],
            r["control_lag_p99_ms"],
            r["control_lag_max_ms"],
            r["full_collections"],
            r["full_collection_max_cpu_ms"],
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
        "lag p50 ms",
        "lag p99 ms",
        "lag max ms",
        "control p99 ms",
        "control max ms",
        "full GCs",
        "full GC max CPU ms",
    ]
    rss = result["rss_run"]
    rss_text = (
        ""
        if rss is None
        else f"\nRSS over {rss['minutes']:g} min at {result['levels'][-1]['connections']} "
        f"connections: {rss['rss_start_mib']} -> {rss['rss_end_mib']} MiB "
        f"({rss['rss_growth_percent']:+g}%), max {rss['rss_max_mib']} MiB"
    )
    return (
        table(headers, rows)
        + f"\nRSS before any connection: {result['base_rss_mib']} MiB; "
        + f"upstream connection failures: {result['upstream_connection_failures']}; "
        + f"HANDLER={result['handler']}"
        + rss_text
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
    parser.add_argument(
        "--rss-minutes",
        type=float,
        default=0.0,
        help="then hold the top level this long, sampling the worker's RSS",
    )
    parser.add_argument("--rss-every", type=float, default=60.0, help="seconds between samples")
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
