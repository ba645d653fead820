"""Slow sink: one worker's memory while its sink takes half of what the feeds offer.

``python -m benchmarks.slow_sink [--handler kinesis] [--minutes 17] [--warmup-minutes 7]
[--connections 200] [--rate 20] [--message-bytes 2048] [--set NAME=VALUE ...]``
(``--set``: a worker setting of the run, e.g. ``MAX_BATCH_MESSAGES=100``)

The embedded stack (DynamoDB Local, moto, demo feed processes) and one worker at the
shipped defaults, running ``--connections`` demo feed connections (json-seq,
resumable) at ``--rate`` messages/s each, frames of ``--message-bytes`` (the feed's
``pad``; 0: its small messages), with a sink that takes at most half of the offered
messages per second over the whole worker:

- ``--handler kinesis`` (the default): the real Kinesis sink
  (``HANDLER=worker.sinks.kinesis:factory``) writing to the fault endpoint
  (:mod:`benchmarks.faulty_aws`), which throttles the stream to that rate, refusing
  the records beyond it as Kinesis does, and takes the rest itself (``absorb``: moto
  could not store that many), noting each record it took. So the memory measured is
  the worker's with its real sink: envelopes, requests and the sink's sending again of
  throttled records;
- ``--handler throttled``: :mod:`benchmarks.throttled_sink`, a token bucket in the
  handler itself that records each batch it handled (no requests at all).

A handler slower than its feeds must slow the reading of each connection (websockets
stops reading a socket once ``max_queue`` frames wait, and TCP pushes back on the
feed) rather than buffer without bound. So, once every connection is open:

- the worker's RSS (``/proc``) every ``--sample-every`` seconds, and its growth after
  the warm-up (``--warmup-minutes``): what the buffers hold once they are full;
- at the end, each connection's lag: the feed's latest seq (what a feed with a clock
  of its own has published by then: ``rate`` a second from the connection's first
  upstream connect) minus the last seq handled, in messages and in seconds;
- then, the worker stopped (graceful: final checkpoints), the seqs lost (never handled
  although a later one was; must be 0) and handled twice (with the Kinesis sink, the
  copies it sends again after a throttle: a consumer's deduper drops them);
- the upstream reconnects and why, and the fence pauses, from the worker's log.

Reading the RSS: the buffers take a while to fill. Each lagging connection ends up
holding its socket's read that crossed websockets' ``max_queue`` as parsed frames and
a batch of decoded messages in the handler's call; at 10 messages/s of backlog per
connection that took about 6.5 minutes here with the throttled handler and the feed's
small messages, hence the 7-minute warm-up, after which 10 minutes are measured (with
the Kinesis sink and 2 KB frames the RSS levelled within about a minute). The RSS then
rises in rare steps: it is the allocator's high-water mark of a heap whose size swings
as connections pause and resume together, not a heap that grows (``--trace-memory``
shows the live heap smaller at the end than after the warm-up). A pong waiting behind
unread frames is not a lost pong: the worker's keepalive judges the wait only while the
reading runs (``worker.patient_connection``), so no connection is dropped for lagging.

``--trace-memory`` (a diagnostic, with ``--handler throttled``: tracemalloc slows the
worker and adds to its RSS) runs the worker with tracemalloc on and reports where its
Python heap grew between the end of the warm-up and the end, by allocating line.

The readable report, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from benchmarks import throttled_sink
from benchmarks.faulty_aws import Faults, FaultyAws, Item, kinesis_data
from benchmarks.procfs import CpuSample, rss_bytes
from benchmarks.profiles import ours
from benchmarks.report import emit, machine, summary, table
from local_stack.clock import wait_until
from local_stack.fleet import Deployment
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, parse_log_time
from worker import config as worker_settings
from wsfleet.envelope import Envelope, EnvelopeError

HANDLER = "benchmarks.throttled_sink:factory"
KINESIS_HANDLER: Final = "worker.sinks.kinesis:factory"
HANDLERS: Final = ("kinesis", "throttled")
STREAM: Final = "slow-sink"
STATS_INTERVAL_S = 5
BURST_S: Final = 1.0
"""Seconds of the throttle rate the endpoint's bucket holds."""


class Handled(Protocol):
    """What the sink took so far."""

    def seqs(self) -> dict[str, list[int]]:
        """Connection id -> every seq taken, in the order taken."""
        ...

    def count(self) -> int: ...


class RecordedBatches:
    """The batches :mod:`benchmarks.throttled_sink` recorded under ``record_dir``."""

    def __init__(self, record_dir: Path) -> None:
        self.record_dir = record_dir

    def seqs(self) -> dict[str, list[int]]:
        return handled_seqs(self.record_dir)

    def count(self) -> int:
        return sum(len(b.seqs) for b in throttled_sink.read_records(self.record_dir))


class LandedRecords:
    """The Kinesis records the fault endpoint took (its ``landed``; thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seqs: dict[str, list[int]] = {}
        self._count = 0
        self.not_envelopes = 0

    def __call__(self, service: str, destination: str, items: Sequence[Item]) -> None:
        taken: list[tuple[str, int]] = []
        bad = 0
        for item in items:
            try:
                envelope = Envelope.from_bytes(kinesis_data(item))
            except EnvelopeError:
                bad += 1
                continue
            taken.append((envelope.connection_id, envelope.seq))
        with self._lock:
            for cid, seq in taken:
                self._seqs.setdefault(cid, []).append(seq)
            self._count += len(taken)
            self.not_envelopes += bad

    def seqs(self) -> dict[str, list[int]]:
        with self._lock:
            return {cid: list(seqs) for cid, seqs in self._seqs.items()}

    def count(self) -> int:
        with self._lock:
            return self._count


def start_connections(
    stack: LocalServers,
    deployment: Deployment,
    ids: list[str],
    rate: float,
    per_second: float,
    message_bytes: int = 0,
) -> None:
    """Start ``ids`` at ``per_second``, alternating feed processes; frames of
    ``message_bytes`` (0: the feed's small messages)."""
    began = time.monotonic()
    params: dict[str, object] = {"rate": rate}
    if message_bytes:
        params["pad"] = message_bytes
    for index, cid in enumerate(ids):
        pause = began + index / per_second - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        deployment.start_connection(cid, stack.feed_url(cid, params, index=index))


def first_connects(worker: WorkerProcess) -> dict[str, float]:
    """Connection id -> epoch seconds of its first upstream connect, per the log."""
    first: dict[str, float] = {}
    for event in worker.logged("upstream connected"):
        cid = event.get("connection_id")
        if isinstance(cid, str) and cid not in first:
            first[cid] = parse_log_time(event["timestamp"])
    return first


def handled_seqs(record_dir: Path) -> dict[str, list[int]]:
    """Connection id -> every seq the handler handled, in record order."""
    seqs: dict[str, list[int]] = {}
    for batch in throttled_sink.read_records(record_dir):
        seqs.setdefault(batch.connection_id, []).extend(batch.seqs)
    return seqs


def lags(
    first: dict[str, float], handled: dict[str, list[int]], at: float, rate: float
) -> list[dict[str, Any]]:
    """Each connection's lag at ``at`` (epoch seconds): the feed's latest seq then
    (seq n is due ``(n - 1) / rate`` s after the first connect) minus the highest seq
    handled, and how old the oldest message not yet handled is."""
    rows = []
    for cid, connected_at in sorted(first.items()):
        latest = math.floor((at - connected_at) * rate) + 1
        top = max(handled.get(cid, [0]))
        rows.append(
            {
                "connection_id": cid,
                "latest_seq": latest,
                "handled_seq": top,
                "lag_messages": latest - top,
                "lag_seconds": round(at - connected_at - top / rate, 2),
            }
        )
    return rows


def losses(handled: dict[str, list[int]]) -> tuple[int, int, list[str]]:
    """Seqs never handled below a handled one, seqs handled more than once (over every
    connection), and the connections with a loss."""
    lost = duplicates = 0
    lossy = []
    for cid, seqs in sorted(handled.items()):
        unique = set(seqs)
        duplicates += len(seqs) - len(unique)
        missing = max(unique) - len(unique)  # seqs start at 1
        if missing:
            lost += missing
            lossy.append(cid)
    return lost, duplicates, lossy


def log_counts(worker: WorkerProcess) -> dict[str, Any]:
    """What the worker's log says of its upstreams and its fence."""
    failures = Counter(
        str(e.get("error", e.get("error_class", "?")))[:60]
        for e in worker.logged("upstream connection failed")
    )
    return {
        "upstream_connects": len(worker.logged("upstream connected")),
        "upstream_failures": sum(failures.values()),
        "upstream_failure_kinds": dict(failures.most_common(5)),
        "fence_pauses": len(worker.logged("session fence deadline passed: pausing")),
        "calls_cut_at_the_fence": len(
            worker.logged("handler call cut at the session's fence deadline; waiting for a renew")
        ),
    }


def sample_rss(
    worker: WorkerProcess,
    handled: Handled,
    minutes: float,
    every: float,
    at_warmup: tuple[float, Callable[[], None]] | None = None,
) -> list[dict[str, Any]]:
    """The worker's RSS, CPU and handled messages every ``every`` seconds for
    ``minutes``; ``at_warmup``: a call made once, after the first sample at or past
    that minute."""
    samples: list[dict[str, Any]] = []
    began = time.monotonic()
    cpu = CpuSample.take(worker.pid)
    for n in range(int(minutes * 60 / every) + 1):
        pause = began + n * every - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        rss = rss_bytes(worker.pid)
        later = CpuSample.take(worker.pid)
        minute = round(n * every / 60, 2)
        sample: dict[str, Any] = {
            "minute": minute,
            "rss_mib": round(rss / 2**20, 1),
            "cpu_percent": round(cpu.percent_until(later), 1) if n else None,
            "handled": handled.count(),
            "upstream_failures": len(worker.logged("upstream connection failed")),
        }
        cpu = later
        print(f"  {sample}", flush=True)
        samples.append(sample)
        if at_warmup is not None and minute >= at_warmup[0]:
            at_warmup[1]()
            at_warmup = None
    return samples


def heap_growth(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int = 10
) -> dict[str, Any]:
    """The traced heap at both snapshots, and the lines whose allocations grew most."""
    return {
        "traced_before_mib": round(sum(s.size for s in before.statistics("filename")) / 2**20, 1),
        "traced_after_mib": round(sum(s.size for s in after.statistics("filename")) / 2**20, 1),
        "top_growth": [
            {
                "where": f"{stat.traceback[0].filename}:{stat.traceback[0].lineno}",
                "kib": round(stat.size_diff / 1024, 1),
                "count": stat.count_diff,
            }
            for stat in after.compare_to(before, "lineno")[:top]
        ],
    }


def rss_figures(samples: list[dict[str, Any]], warmup_minutes: float) -> dict[str, Any]:
    after = [s for s in samples if s["minute"] >= warmup_minutes] or samples[-1:]
    start, end = after[0]["rss_mib"], samples[-1]["rss_mib"]
    return {
        "rss_first_mib": samples[0]["rss_mib"],
        "rss_after_warmup_mib": start,
        "rss_end_mib": end,
        "rss_max_mib": max(s["rss_mib"] for s in samples),
        "rss_growth_after_warmup_mib": round(end - start, 1),
        "rss_growth_after_warmup_percent": round(100 * (end - start) / start, 1),
    }


def sink_settings(accepted: float, record_dir: Path, endpoint: FaultyAws | None) -> dict[str, str]:
    """The worker's handler settings: the Kinesis sink writing to ``endpoint``, or
    (None) the throttled handler taking ``accepted`` messages/s."""
    if endpoint is not None:
        return {
            worker_settings.HANDLER: KINESIS_HANDLER,
            "SINK_STREAM_NAME": STREAM,
            "AWS_ENDPOINT_URL_KINESIS": endpoint.endpoint,
        }
    return {
        worker_settings.HANDLER: HANDLER,
        throttled_sink.THROTTLE_MESSAGES_PER_SECOND: repr(accepted),
        throttled_sink.THROTTLE_RECORD_DIR: str(record_dir),
    }


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    offered = args.connections * args.rate
    accepted = offered / 2
    with (
        LocalServers(work_dir, feeds=args.feeds, feed_rate=args.rate) as stack,
        contextlib.ExitStack() as exits,
    ):
        deployment = stack.deployment("slow-sink")
        record_dir = deployment.work_dir / "handled"
        endpoint: FaultyAws | None = None
        handled: Handled = RecordedBatches(record_dir)
        if args.handler == "kinesis":
            landed = LandedRecords()
            faults = Faults(throttle=accepted, burst=BURST_S, absorb=True)
            endpoint = exits.enter_context(FaultyAws(stack.endpoints.sqs, faults, landed=landed))
            handled = landed
        [worker] = deployment.start_workers(
            ["slow-sink"],
            {
                **ours(None).env,
                **sink_settings(accepted, record_dir, endpoint),
                worker_settings.MAX_CONNECTIONS: str(max(500, args.connections)),
                worker_settings.METRICS_INTERVAL_SECONDS: str(STATS_INTERVAL_S),
                # Only the shutdown differs: no flood of reassign messages at the end.
                worker_settings.REASSIGN_ON_RELEASE: "false",
                **({"PYTHONTRACEMALLOC": "1"} if args.trace_memory else {}),
                **args.settings,
            },
        )
        base_rss = rss_bytes(worker.pid)
        ids = [f"slow-{i}" for i in range(args.connections)]
        start_connections(stack, deployment, ids, args.rate, args.start_rate, args.message_bytes)
        wait_until(
            lambda: len(first_connects(worker)) >= args.connections,
            60 + args.connections / args.start_rate,
            f"{args.connections} open upstream connections",
            0.5,
        )
        print(
            f"  {args.connections} connections open; worker RSS before any: "
            f"{base_rss / 2**20:.1f} MiB",
            flush=True,
        )
        snapshots: list[tracemalloc.Snapshot] = []

        def snapshot_at_warmup() -> None:
            snapshots.append(throttled_sink.request_snapshot(record_dir, "warm"))

        began = time.time()
        samples = sample_rss(
            worker,
            handled,
            args.minutes,
            args.sample_every,
            (args.warmup_minutes, snapshot_at_warmup) if args.trace_memory else None,
        )
        ended = time.time()
        if snapshots:
            snapshots.append(throttled_sink.request_snapshot(record_dir, "end"))
        first = first_connects(worker)
        lag_rows = lags(first, handled.seqs(), ended, args.rate)
        counts = log_counts(worker)
        stop = deployment.stop_workers(timeout=120)
        taken = handled.seqs()
        injected = endpoint.counts()["kinesis"] if endpoint is not None else None
    lost, duplicates, lossy = losses(taken)
    total = sum(len(seqs) for seqs in taken.values())
    lag_messages = [float(r["lag_messages"]) for r in lag_rows]
    lag_seconds = [float(r["lag_seconds"]) for r in lag_rows]
    rss = rss_figures(samples, args.warmup_minutes)
    return {
        "benchmark": "slow_sink",
        "handler": args.handler,
        "connections": args.connections,
        "rate_per_connection": args.rate,
        "message_bytes": args.message_bytes,
        "offered_messages_per_s": offered,
        "handler_limit_messages_per_s": accepted,
        "minutes": args.minutes,
        "warmup_minutes": args.warmup_minutes,
        "worker_settings": args.settings,
        "base_rss_mib": round(base_rss / 2**20, 1),
        "rss_samples": samples,
        **rss,
        "rss_per_connection_kib": round(
            (rss["rss_end_mib"] - base_rss / 2**20) * 1024 / args.connections, 1
        ),
        "handled_messages_per_s": round(
            (samples[-1]["handled"] - samples[0]["handled"]) / (ended - began), 1
        ),
        "lag_messages": summary(lag_messages, 1),
        "lag_seconds": summary(lag_seconds, 2),
        "handled_total": total,
        "connections_handled": len(taken),
        "lost_seqs": lost,
        "connections_with_a_loss": lossy[:10],
        "duplicate_seqs": duplicates,
        "endpoint": (
            None
            if injected is None
            else {
                "requests": injected.requests,
                "records": injected.records,
                "taken": injected.forwarded,
                "throttled": injected.throttled,
            }
        ),
        "worker_stopped_cleanly": stop.clean,
        "heap": heap_growth(snapshots[0], snapshots[1]) if len(snapshots) == 2 else None,
        **counts,
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    rows = [
        [s["minute"], s["rss_mib"], s["cpu_percent"], s["handled"], s["upstream_failures"]]
        for s in result["rss_samples"]
    ]
    lag_m, lag_s = result["lag_messages"], result["lag_seconds"]
    return "\n".join(
        [
            table(["minute", "RSS MiB", "CPU %", "handled", "upstream failures"], rows),
            f"RSS before any connection {result['base_rss_mib']} MiB; after the warm-up "
            f"({result['warmup_minutes']:g} min) {result['rss_after_warmup_mib']} MiB, at the "
            f"end {result['rss_end_mib']} MiB: {result['rss_growth_after_warmup_mib']:+g} MiB "
            f"({result['rss_growth_after_warmup_percent']:+g}%); max {result['rss_max_mib']} MiB; "
            f"{result['rss_per_connection_kib']:g} KiB per connection at the end",
            f"handled {result['handled_messages_per_s']} msg/s of "
            f"{result['offered_messages_per_s']:g} offered (handler limit "
            f"{result['handler_limit_messages_per_s']:g})",
            f"lag at the end, per connection: messages p50 {lag_m.get('p50')} p99 "
            f"{lag_m.get('p99')} max {lag_m.get('max')}; seconds p50 {lag_s.get('p50')} p99 "
            f"{lag_s.get('p99')} max {lag_s.get('max')}",
            f"lost seqs {result['lost_seqs']}, duplicate seqs {result['duplicate_seqs']} "
            f"({result['handled_total']} handled over {result['connections_handled']} "
            "connections)",
            *endpoint_lines(result["endpoint"]),
            f"upstream connects {result['upstream_connects']}, failures "
            f"{result['upstream_failures']} {result['upstream_failure_kinds']}; fence pauses "
            f"{result['fence_pauses']}, calls cut at the fence "
            f"{result['calls_cut_at_the_fence']}",
            *heap_lines(result["heap"]),
        ]
    )


def endpoint_lines(endpoint: dict[str, Any] | None) -> list[str]:
    if endpoint is None:
        return []
    return [
        f"the endpoint took {endpoint['taken']:,} of {endpoint['records']:,} records in "
        f"{endpoint['requests']:,} requests, throttled {endpoint['throttled']:,} (each sent "
        "again by the sink)"
    ]


def heap_lines(heap: dict[str, Any] | None) -> list[str]:
    if heap is None:
        return []
    return [
        f"traced Python heap {heap['traced_before_mib']} MiB after the warm-up, "
        f"{heap['traced_after_mib']} MiB at the end; grew most at:",
        *(f"  {g['kib']:+g} KiB ({g['count']:+d} blocks) {g['where']}" for g in heap["top_growth"]),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.slow_sink", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--handler",
        choices=HANDLERS,
        default="kinesis",
        help="the Kinesis sink behind a throttling endpoint (default), or a throttled handler",
    )
    parser.add_argument(
        "--minutes", type=float, default=17.0, help="after all open, the warm-up included"
    )
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="messages/s per connection")
    parser.add_argument(
        "--message-bytes",
        type=int,
        default=2048,
        help="the feed's frames, in bytes (2048; 0: its small messages)",
    )
    parser.add_argument("--feeds", type=int, default=2, help="feed processes")
    parser.add_argument("--start-rate", type=float, default=50.0, help="connection starts/s")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--warmup-minutes", type=float, default=7.0)
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="diagnostic: where the worker's Python heap grew after the warm-up (tracemalloc)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a worker setting for this run (repeatable)",
    )
    args = parser.parse_args(argv)
    if not (args.minutes > 0 and args.connections > 0 and args.rate > 0):
        parser.error("--minutes, --connections and --rate must be > 0")
    if not 0 <= args.message_bytes <= 1 << 20:
        parser.error("--message-bytes must be from 0 to 1048576")
    if args.trace_memory and args.handler != "throttled":
        parser.error("--trace-memory needs --handler throttled (it answers the snapshots)")
    pairs = [raw.partition("=") for raw in args.set]
    if any(not name or not sep for name, sep, _ in pairs):
        parser.error("--set takes NAME=VALUE")
    args.settings = {name: value for name, _, value in pairs}
    try:
        worker_settings.check_names(args.settings)
        worker_settings.WorkerConfig.from_env(
            {"TABLE_NAME": "t", "QUEUE_URL": "q", **args.settings}
        )
    except worker_settings.ConfigError as error:
        parser.error(str(error))
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="slow-sink-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"slow sink, one worker, {args.connections} connections at {args.rate:g} msg/s of "
        f"~{args.message_bytes} bytes, "
        + (
            "the Kinesis sink throttled to half of that"
            if args.handler == "kinesis"
            else "a batch handler limited to half of that"
        )
        + f", {args.minutes:g} min"
        + "".join(f", {name}={value}" for name, value in args.settings.items()),
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
