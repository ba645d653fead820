"""Session-renew health: does one busy worker keep its session safely renewed while it
takes over and releases hundreds of connections, and through short DynamoDB stalls?

``python -m benchmarks.session_health [--duration 600] [--connections 500] [--stalls 5]``

At the shipped default timings (lease 2.2 s, session renew every 0.594 s, fence window
1.98 s), with a no-op handler and every connection at 1 message/s:

1. worker ``victim`` (``MAX_CONNECTIONS`` = N) takes N connections;
2. worker ``holder`` (``MAX_CONNECTIONS`` = 2N; its DynamoDB traffic goes through a
   proxy) starts and takes N more;
3. ``victim`` is SIGKILLed: ``holder`` reaps its session and takes its N connections
   over (2N held);
4. N of them are stopped through the API: ``holder`` releases them;
5. for the rest of ``--duration``, every ``duration / (stalls + 1)`` the proxy stalls
   ``holder``'s DynamoDB traffic for ``--stall`` seconds (1.2 s by default), then heals.

Reported from ``holder``'s "worker stats" lines (one every 5 s): the gaps between
successful session renews (p50, p99, max), the smallest slack left to the fence
deadline when a renew landed, renews that failed, and whether any connection paused at
the fence or the session was reaped (it must not be, for stalls shorter than the fence
window minus a heartbeat). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import emit, machine, table
from benchmarks.tcp_proxy import ProxyThread
from local_stack.clock import wait_until
from local_stack.fleet import Deployment
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, parse_log_time, wait_ready
from worker import config as worker_settings
from wsfleet.timing import LeaseTiming

STATS_INTERVAL_S = 5
START_RATE = 100.0
NOOP_HANDLER = "benchmarks.handlers:noop_factory"


def start_connections(
    stack: LocalServers, deployment: Deployment, prefix: str, count: int
) -> list[str]:
    ids = [f"{prefix}-{n}" for n in range(count)]
    began = time.monotonic()
    for n, cid in enumerate(ids):
        pause = began + n / START_RATE - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        deployment.start_connection(cid, stack.feed_url(cid, {"rate": 1}, index=n))
    return ids


def active(worker: WorkerProcess) -> int:
    stats = worker.logged("worker stats")
    return int(stats[-1].get("active_connections", 0)) if stats else 0


def wait_active(worker: WorkerProcess, count: int, timeout: float, what: str) -> float:
    began = time.monotonic()
    wait_until(lambda: active(worker) == count, timeout, what, 0.5)
    return time.monotonic() - began


def during_stall(at: float, stalls: list[float], stall: float) -> bool:
    """A stats line logged at ``at`` covers the 5 s before it: does that touch a stall
    (or the few seconds after it, while renews catch up)?"""
    return any(at - STATS_INTERVAL_S <= began + stall + 2.0 and at >= began for began in stalls)


def summarise(
    holder: WorkerProcess, since: float, stalls: list[float], stall: float
) -> dict[str, Any]:
    stats = [e for e in holder.logged("worker stats") if parse_log_time(e["timestamp"]) > since]
    calm = [e for e in stats if not during_stall(parse_log_time(e["timestamp"]), stalls, stall)]
    stalled = [e for e in stats if e not in calm]

    def min_slack(lines: list[dict[str, Any]]) -> float | None:
        values = [
            float(e["session_renews"]["min_slack_ms"])
            for e in lines
            if "min_slack_ms" in e.get("session_renews", {})
        ]
        return min(values) if values else None

    def max_gap(lines: list[dict[str, Any]]) -> float | None:
        values = [
            float(e["session_renews"]["gap_max_ms"])
            for e in lines
            if "gap_max_ms" in e.get("session_renews", {})
        ]
        return max(values) if values else None

    sessions = [e.get("session_renews", {}) for e in stats]
    lateness = [e.get("renew_lateness", {}) for e in stats]
    gaps_p50 = sorted(float(s["gap_p50_ms"]) for s in sessions if "gap_p50_ms" in s)
    return {
        "stats_lines": len(stats),
        "renews_landed": sum(int(s.get("renews_landed", 0)) for s in sessions),
        "renews_attempted": sum(int(x.get("renews", 0)) for x in lateness),
        "gap_p50_ms_median": gaps_p50[len(gaps_p50) // 2] if gaps_p50 else None,
        "gap_p99_ms_worst": max(
            (float(s["gap_p99_ms"]) for s in sessions if "gap_p99_ms" in s), default=None
        ),
        "gap_max_ms": max(
            (float(s["gap_max_ms"]) for s in sessions if "gap_max_ms" in s), default=None
        ),
        "min_slack_ms": min_slack(stats),
        "min_slack_ms_outside_stalls": min_slack(calm),
        "gap_max_ms_outside_stalls": max_gap(calm),
        "min_slack_ms_in_stalls": min_slack(stalled),
        "gap_max_ms_in_stalls": max_gap(stalled),
        "pauses": len(holder.logged("session fence deadline passed: pausing")),
        "reaped": len(holder.logged("session reaped: its connections are lost")),
        "sessions_opened": len(holder.logged("session opened")),
    }


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    n = args.connections
    timing = LeaseTiming.from_lease()
    with LocalServers(work_dir, feeds=2, feed_rate=1.0) as stack, ProxyThread() as proxies:
        deployment = stack.deployment(
            "health",
            worker_defaults={
                worker_settings.HANDLER: NOOP_HANDLER,
                worker_settings.METRICS_INTERVAL_SECONDS: str(STATS_INTERVAL_S),
                worker_settings.REASSIGN_ON_RELEASE: "false",
                # The scenario places the connections itself (the holder's own, then the
                # victim's): a balance round would move them and the counts never settle.
                worker_settings.BALANCE_ROUND_SECONDS: "0",
            },
        )
        began = time.time()
        [victim] = deployment.start_workers(["victim"], {worker_settings.MAX_CONNECTIONS: str(n)})
        start_connections(stack, deployment, "a", n)
        wait_active(victim, n, 120, "the victim to hold its connections")
        proxy = proxies.add(int(deployment.endpoints.dynamodb.rsplit(":", 1)[1]))
        holder = deployment.launch_worker(
            "holder",
            deployment.worker_env(
                "holder",
                {worker_settings.MAX_CONNECTIONS: str(2 * n)},
                dynamodb_endpoint=proxy.endpoint,
            ),
        )
        wait_ready([holder], 60)
        ids_b = start_connections(stack, deployment, "b", n)
        wait_active(holder, n, 120, "the holder to hold its own connections")
        print(f"  {time.time() - began:6.1f} s  {n} + {n} held; SIGKILL victim", flush=True)
        victim.signal(signal.SIGKILL)
        took = wait_active(holder, 2 * n, 120, "the takeover of the victim's connections")
        print(
            f"  {time.time() - began:6.1f} s  takeover of {n} seen after {took:.1f} s", flush=True
        )
        for cid in ids_b:
            deployment.stop_connection(cid)
        released = wait_active(holder, n, 120, "the release of the stopped connections")
        print(f"  {time.time() - began:6.1f} s  {n} released after {released:.1f} s", flush=True)
        end_at = began + args.duration
        stall_every = max(10.0, (end_at - time.time()) / (args.stalls + 1))
        stall_times: list[float] = []
        while time.time() + stall_every < end_at and len(stall_times) < args.stalls:
            time.sleep(stall_every)
            stall_times.append(time.time())
            proxy.blackhole()
            time.sleep(args.stall)
            proxy.heal()
            print(
                f"  {time.time() - began:6.1f} s  stall {len(stall_times)} of {args.stall} s"
                " healed",
                flush=True,
            )
        time.sleep(max(0.0, end_at - time.time()) + 2 * STATS_INTERVAL_S)
        result = {
            "benchmark": "session_health",
            "duration_s": args.duration,
            "connections_moved": n,
            "stall_s": args.stall,
            "stalls": len(stall_times),
            "fence_window_s": timing.fence_after,
            "heartbeat_s": timing.heartbeat,
            "holder": summarise(holder, began, stall_times, args.stall),
            "machine": machine(),
        }
        deployment.stop_workers()
        return result


def render(result: dict[str, Any]) -> str:
    h = result["holder"]
    rows = [
        ["session renews landed / attempted", f"{h['renews_landed']} / {h['renews_attempted']}"],
        ["gap between renews, p50 (median period)", h["gap_p50_ms_median"]],
        ["gap between renews, p99 (worst period)", h["gap_p99_ms_worst"]],
        ["gap between renews, max, outside stalls", h["gap_max_ms_outside_stalls"]],
        ["smallest slack to the fence deadline, outside stalls", h["min_slack_ms_outside_stalls"]],
        ["gap between renews, max, around stalls", h["gap_max_ms_in_stalls"]],
        ["smallest slack to the fence deadline, around stalls", h["min_slack_ms_in_stalls"]],
        [f"stalls of {result['stall_s']} s", result["stalls"]],
        ["connections paused at the fence", h["pauses"]],
        ["session reaped", h["reaped"]],
    ]
    return table(["figure", "value"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.session_health", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--stalls", type=int, default=5)
    parser.add_argument("--stall", type=float, default=1.2, help="seconds per DynamoDB stall")
    parser.add_argument("--work-dir", type=Path, help="keep the logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="health-") as tmp:
            result = run(args, args.work_dir or Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"session-renew health, {args.duration:g} s, {args.connections} taken over and "
        f"released, stalls of {args.stall:g} s",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
