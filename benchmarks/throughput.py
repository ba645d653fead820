"""Throughput of one worker with a no-op handler, against a bare ``websockets`` client
reading the same feed the same way, in the same run.

``python -m benchmarks.throughput [--connections 8] [--window 10] [--rounds 3]
[--handler-mode single|batch|both] [--rate 0] [--event-loop L] [--json-decoder D]``

Feed processes serve every connection at ``rate=0`` (as fast as the reader reads), or
at ``--rate`` messages/s per connection (a fixed load: the readers keep up, and what
differs is the CPU each spends per message). Each round runs, one after the other,
the same measurement on fresh connections:

- the bare client (:mod:`benchmarks.bare_client`, its own process) reads ``K``
  connections, as a user would write it (asyncio's loop, ``json.loads``); it counts
  messages over the window; then the same client on uvloop with ``orjson`` (``bare
  fast``), so that the ratio against it shows the worker's own machinery;
- one worker per handler mode (the shipped default timings) owns ``K`` connections:
  ``single``, a no-op ``handle`` (``benchmarks.handlers:noop_factory``, one call per
  message, the default), and ``batch``, a no-op ``handle_batch``
  (``benchmarks.handlers:noop_batch_factory``, one call per batch of what is buffered);
  its own ``messages_processed`` counts, logged every second with "worker stats", are
  summed over the window.

CPU of the reader and of the feed is read from ``/proc`` over the same window: a
reader near 100% of one core while the feed has CPU to spare shows that the reader,
not the feed, sets the pace. Reported: messages/s of each, the ratio worker / bare
client (median over rounds), CPU%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.procfs import CpuSample, SystemCpuSample
from benchmarks.profiles import ours
from benchmarks.report import emit, machine, table
from local_stack.clock import wait_until
from local_stack.server_group import LocalServers
from local_stack.services import REPO_ROOT
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, parse_log_time
from worker import config as worker_settings
from wsfleet.accelerators import EVENT_LOOPS, JSON_DECODERS

STATS_INTERVAL_S = 1


def bare_round(
    stack: LocalServers, urls: list[str], warmup: float, window: float, *, fast: bool = False
) -> dict[str, Any]:
    """Run the bare client over ``urls`` (``fast``: on uvloop with orjson); its rate and
    CPU, and the feed's CPU."""
    feed_pids = [feed.process.pid for feed in stack.feed_processes]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.bare_client",
            "--warmup",
            repr(warmup),
            "--window",
            repr(window),
            *(["--fast"] if fast else []),
            *urls,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        lines = iter(process.stdout.readline, "")
        if next(lines).strip() != "window start":
            raise RuntimeError("the bare client did not start its window")
        client_0, feed_0 = CpuSample.take(process.pid), [CpuSample.take(p) for p in feed_pids]
        system_0 = SystemCpuSample.take()
        if next(lines).strip() != "window end":
            raise RuntimeError("the bare client did not end its window")
        client_1, feed_1 = CpuSample.take(process.pid), [CpuSample.take(p) for p in feed_pids]
        system_1 = SystemCpuSample.take()
        result: dict[str, Any] = json.loads(next(lines))
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return {
        **figures(
            result["messages"] / result["seconds"],
            client_0.percent_until(client_1),
            [a.percent_until(b) for a, b in zip(feed_0, feed_1, strict=True)],
            system_0.busy_percent_until(system_1),
        ),
        "out_of_order": result["out_of_order"],
    }


def figures(
    rate: float, reader_cpu: float, feed_cpu: list[float], machine_busy: float
) -> dict[str, Any]:
    """The figures of one measurement; ``messages_per_cpu_s`` is the reader's cost per
    message, which holds even when the machine is too busy for the reader to use a
    whole core."""
    return {
        "messages_per_s": round(rate, 1),
        "reader_cpu_percent": round(reader_cpu, 1),
        "feed_cpu_percent": [round(cpu, 1) for cpu in feed_cpu],
        "machine_busy_percent": round(machine_busy, 1),
        "messages_per_cpu_s": round(rate / (reader_cpu / 100), 1) if reader_cpu > 0 else 0.0,
    }


def stats_between(worker: WorkerProcess, start: float, end: float) -> tuple[int, float]:
    """Messages and seconds covered by the worker's "worker stats" lines logged within
    ``[start, end]`` (epoch seconds): the first line in the window only marks its start."""
    lines = [
        (parse_log_time(e["timestamp"]), int(e.get("messages_processed", 0)))
        for e in worker.logged("worker stats")
    ]
    inside = [(t, n) for t, n in lines if start <= t <= end]
    if len(inside) < 2:
        raise RuntimeError("fewer than two stats lines in the window")
    return sum(n for _, n in inside[1:]), inside[-1][0] - inside[0][0]


HANDLERS = {
    "single": "benchmarks.handlers:noop_factory",
    "batch": "benchmarks.handlers:noop_batch_factory",
}
"""The no-op handler of each handler mode."""


def worker_round(
    stack: LocalServers,
    round_no: int,
    connections: int,
    warmup: float,
    window: float,
    mode: str = "single",
    rate: float = 0.0,
    accelerators: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One worker owning ``connections`` connections, with the no-op handler of
    ``mode`` (or what ``extra_env`` sets: a sink); its rate and CPU."""
    deployment = stack.deployment(f"throughput{round_no}{mode}")
    [worker] = deployment.start_workers(
        [f"tp{round_no}{mode}"],
        {
            **ours(None).env,
            worker_settings.HANDLER: HANDLERS[mode],
            worker_settings.METRICS_INTERVAL_SECONDS: str(STATS_INTERVAL_S),
            **(accelerators or {}),
            **(extra_env or {}),
        },
    )
    feed_pids = [feed.process.pid for feed in stack.feed_processes]
    ids = [f"worker{round_no}{mode}-{i}" for i in range(connections)]
    for index, cid in enumerate(ids):
        deployment.start_connection(cid, stack.feed_url(cid, {"rate": rate}, index=index))
    wait_until(
        lambda: len(worker.logged("upstream connected")) >= connections,
        30,
        "every connection to be open",
    )
    time.sleep(warmup)
    start, worker_0 = time.time(), CpuSample.take(worker.pid)
    feed_0 = [CpuSample.take(p) for p in feed_pids]
    system_0 = SystemCpuSample.take()
    time.sleep(window)
    end, worker_1 = time.time(), CpuSample.take(worker.pid)
    feed_1 = [CpuSample.take(p) for p in feed_pids]
    system_1 = SystemCpuSample.take()
    # The stats line that closes the window is logged up to one interval later.
    wait_until(
        lambda: any(parse_log_time(e["timestamp"]) > end for e in worker.logged("worker stats")),
        10,
        "the stats line after the window",
    )
    messages, seconds = stats_between(worker, start, end + STATS_INTERVAL_S)
    deployment.stop_workers()
    return figures(
        messages / seconds,
        worker_0.percent_until(worker_1),
        [a.percent_until(b) for a, b in zip(feed_0, feed_1, strict=True)],
        system_0.busy_percent_until(system_1),
    )


BARE_CLIENTS = {"bare": False, "bare_fast": True}
"""Each round's bare clients: as a user would write one, and on uvloop with orjson."""


def accelerator_settings(args: argparse.Namespace) -> dict[str, str]:
    """The worker's EVENT_LOOP and JSON_DECODER where the command line chose them."""
    chosen = {
        worker_settings.EVENT_LOOP: args.event_loop,
        worker_settings.JSON_DECODER: args.json_decoder,
    }
    return {name: value for name, value in chosen.items() if value}


def modes(choice: str) -> list[str]:
    return ["single", "batch"] if choice == "both" else [choice]


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    chosen = modes(args.handler_mode)
    with LocalServers(work_dir, feeds=args.feeds, feed_rate=0.0) as stack:
        for round_no in range(1, args.rounds + 1):
            entry: dict[str, Any] = {"load_average": list(os.getloadavg())}
            for key, fast in BARE_CLIENTS.items():
                urls = [
                    stack.feed_url(f"{key}{round_no}-{i}", {"rate": args.rate}, index=i)
                    for i in range(args.connections)
                ]
                entry[key] = bare_round(stack, urls, args.warmup, args.window, fast=fast)
                print(f"  round {round_no} {key} client {entry[key]}", flush=True)
            for mode in chosen:
                worker = worker_round(
                    stack,
                    round_no,
                    args.connections,
                    args.warmup,
                    args.window,
                    mode,
                    args.rate,
                    accelerator_settings(args),
                )
                print(f"  round {round_no} worker, {mode:6} {worker}", flush=True)
                entry[mode] = {"worker": worker}
                for key, suffix in (("bare", ""), ("bare_fast", "_fast")):
                    bare = entry[key]
                    entry[mode]["ratio" + suffix] = round(
                        worker["messages_per_s"] / bare["messages_per_s"], 3
                    )
                    entry[mode]["cpu_cost_ratio" + suffix] = round(
                        bare["messages_per_cpu_s"] / worker["messages_per_cpu_s"], 3
                    )
            rounds.append(entry)
    result: dict[str, Any] = {
        "benchmark": "throughput",
        "connections": args.connections,
        "rate_per_connection": args.rate,
        "worker_accelerators": accelerator_settings(args),
        "window_s": args.window,
        "handler_modes": chosen,
        "rounds": rounds,
        "bare_messages_per_s": statistics.median(r["bare"]["messages_per_s"] for r in rounds),
        "bare_fast_messages_per_s": statistics.median(
            r["bare_fast"]["messages_per_s"] for r in rounds
        ),
    }
    for mode in chosen:
        result[mode] = {
            "worker_messages_per_s": statistics.median(
                r[mode]["worker"]["messages_per_s"] for r in rounds
            ),
            "ratio_worker_over_bare": statistics.median(r[mode]["ratio"] for r in rounds),
            "cpu_per_message_worker_over_bare": statistics.median(
                r[mode]["cpu_cost_ratio"] for r in rounds
            ),
            "ratio_worker_over_bare_fast": statistics.median(r[mode]["ratio_fast"] for r in rounds),
            "cpu_per_message_worker_over_bare_fast": statistics.median(
                r[mode]["cpu_cost_ratio_fast"] for r in rounds
            ),
        }
    result["machine"] = machine()
    return result


def render(result: dict[str, Any]) -> str:
    rows = []
    for number, entry in enumerate(result["rounds"], 1):
        readers = [
            ("bare websockets client", entry["bare"], ""),
            ("bare client, uvloop + orjson", entry["bare_fast"], ""),
        ]
        readers += [
            (f"worker, no-op {mode} handler", entry[mode]["worker"], entry[mode]["ratio"])
            for mode in result["handler_modes"]
        ]
        for name, r, ratio in readers:
            rows.append(
                [
                    number,
                    name,
                    r["messages_per_s"],
                    r["reader_cpu_percent"],
                    r["messages_per_cpu_s"],
                    " + ".join(f"{cpu:g}" for cpu in r["feed_cpu_percent"]),
                    r["machine_busy_percent"],
                    ratio,
                ]
            )
    headers = [
        "round",
        "reader",
        "messages/s",
        "reader CPU %",
        "messages/CPU-s",
        "feed CPU %",
        "machine busy %",
        "worker / bare",
    ]
    lines = [table(headers, rows)]
    for mode in result["handler_modes"]:
        figures = result[mode]
        lines.append(
            f"{mode} handler: median throughput ratio worker / bare "
            f"{figures['ratio_worker_over_bare']}, median CPU per message worker / bare "
            f"{figures['cpu_per_message_worker_over_bare']}; against the bare client on "
            f"uvloop + orjson: {figures['ratio_worker_over_bare_fast']}, "
            f"{figures['cpu_per_message_worker_over_bare_fast']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--feeds", type=int, default=2, help="feed processes, connections spread over them"
    )
    parser.add_argument(
        "--handler-mode",
        choices=["single", "batch", "both"],
        default="both",
        help="the worker's no-op handler: handle (single), handle_batch (batch), or both "
        "measured after the same bare client in each round",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="messages/s per connection; 0 (the default): as fast as the reader reads",
    )
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, help="the worker's; default: its own")
    parser.add_argument(
        "--json-decoder", choices=JSON_DECODERS, help="the worker's; default: its own"
    )
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"throughput, {args.connections} connections at rate={args.rate:g} over {args.feeds} feed "
        f"processes, {args.window:g} s windows",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
