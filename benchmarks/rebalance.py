"""Fleet balance: a scale-out spreads the connections over the new workers, moving only
what it must, with no loss, no duplicate and a short pause per connection moved; a
worker that drains at SIGTERM hands everything it runs to the others.

``python -m benchmarks.rebalance [--scenario scale-out|drain|both] [--steady 600]``

Real worker processes with the recording handler, the demo feed, the router and
DynamoDB Local, at the shipped defaults (lease 2.2 s, heartbeat and reconcile 0.594 s;
balance rounds every 5 s, tolerance 0.05, at most 10% of the fleet's connections
moved per round) unless an option says otherwise.

**scale-out**: 2 workers; ``--connections`` (400) connections at ``--rate`` (10) msg/s
started through the router; once every one flows and no owner has changed for two
balance rounds, 2 more workers are launched. From that moment the owners are read
from the table every 0.25 s until max/mean connections per worker (mean: all the
connections over the 4 workers) is at most 1.10 with every connection held by one of
them. Reported: that time; the connections moved (owner changes between the table
before the launch and at convergence, lease epochs gained, and the ``ConnectionsMoved``
of the workers' EMF lines); for each moved connection the longest time between
consecutive deliveries around its move, and how long each step of the move took (from
the workers' logs); then ``--steady`` seconds (600 by default) of the balanced fleet
and the moves made in them (0 expected); duplicates, lost seqs and stale deliveries of
the whole run (recording audit).

**drain**: every worker ``MAX_CONNECTIONS=1000`` and balance rounds off
(``BALANCE_ROUND_SECONDS=0``: the drain at SIGTERM still hands over through offers).
The big worker starts alone and takes 1,000 connections; then the three others start
and 600 more connections are started through the router, which go to whichever of the
three receives their start messages (the split is reported). At ``--drain-rate`` (1)
msg/s per connection. The big worker is SIGTERMed: the time until each of its
connections has a delivery by another worker, how long it took to exit, the lost seqs
and duplicates of its connections, their split among the three and the steps of the
drain (from the logs).

The load: the delivery lag of every message against its stream's own schedule (the
feed sends seq ``s`` at ``(s - from_seq) / rate`` after the stream opened) is reported
per phase with the machine's CPU use and load average; a p99 above
:data:`LAG_LIMIT_S` means the feed or the workers fell behind, and the output says so.
Nothing is asserted: the targets are printed beside the figures.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import signal
import sys
import tempfile
import time
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.procfs import SystemCpuSample
from benchmarks.profiles import ours
from benchmarks.report import emit, machine, percentile, table
from fleetctl.client import ApiError, UnreachableError
from local_stack.audit import Record, duplicate_count, lost_seqs, stale_deliveries
from local_stack.clock import wait_until
from local_stack.fleet import Deployment
from local_stack.recording import DeliveryTracker
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, parse_log_time
from worker import config as worker_settings
from wsfleet import metric_names as m
from wsfleet.balance_rules import BalanceSettings

SCENARIOS: Final = ("scale-out", "drain")
BALANCE: Final = BalanceSettings()
"""The worker's shipped balance settings (the workers run without any balance variable)."""

# Targets, printed beside the figures.
TARGET_CONVERGE_S: Final = 60.0
TARGET_MOVED_MIN: Final = 200
TARGET_MOVED_MAX: Final = 220
TARGET_GAP_S: Final = 1.0
TARGET_DRAIN_S: Final = 30.0

BALANCED_RATIO: Final = 1.10
"""Converged: max/mean connections per worker at or below this."""
OWNER_POLL_S: Final = 0.25
MIN_SCAN_PAUSE_S: Final = 0.1
STEADY_DELIVERY_POLL_S: Final = 1.0
STEADY_OWNER_POLL_S: Final = 5.0
QUIET_S: Final = 2 * BALANCE.round_seconds
"""Before the scale-out: no owner change for this long (two balance rounds)."""
SETTLE_TIMEOUT_S: Final = 180.0
CONVERGE_TIMEOUT_S: Final = 300.0
DRAIN_TIMEOUT_S: Final = 180.0
MOVE_MARGIN_S: Final = 1.0
"""The window of a move: from this long before the last delivery by the old owner to
this long after the first by the new one."""
LAG_LIMIT_S: Final = 0.5
"""Delivery lag p99 above this in a phase: the feed or the workers fell behind."""
FENCE_PAUSE: Final = "session fence deadline passed: pausing"
UPSTREAM_FAILED: Final = "upstream connection failed"
UPSTREAM_CONNECTED: Final = "upstream connected"
START_THREADS: Final = 4
"""Parallel ``POST /connections`` calls while starting connections."""
START_ATTEMPTS: Final = 5
METRICS_FLUSH_TIMEOUT_S: Final = 20.0

DRAIN_BIG: Final = 1000
DRAIN_SMALL_WORKERS: Final = 3
DRAIN_SMALL_EACH: Final = 200
DRAIN_CAPACITY: Final = 1000


# --- pure helpers ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a connection in the table (None: nobody, between a release and the next
    acquire) and its lease epoch (one more at every acquire or takeover)."""

    owner: str | None
    epoch: int


def counts_per_worker(holders: Mapping[str, Holder], workers: Sequence[str]) -> dict[str, int]:
    """Connections held by each of ``workers`` (0 for one holding none)."""
    held = Counter(h.owner for h in holders.values())
    return {worker: held.get(worker, 0) for worker in workers}


def imbalance(holders: Mapping[str, Holder], workers: Sequence[str]) -> float | None:
    """Max over mean connections per worker, the mean being every connection over the
    number of ``workers``; None while a connection is not held by one of them (released
    and not yet taken, or held by someone else)."""
    if not workers or not holders:
        return None
    counts = counts_per_worker(holders, workers)
    if sum(counts.values()) != len(holders):
        return None
    return max(counts.values()) * len(workers) / len(holders)


def owner_changes(before: Mapping[str, Holder], after: Mapping[str, Holder]) -> list[str]:
    """Connections, listed in both, whose owner differs (sorted)."""
    return sorted(
        cid for cid in before.keys() & after.keys() if before[cid].owner != after[cid].owner
    )


def epochs_gained(before: Mapping[str, Holder], after: Mapping[str, Holder]) -> int:
    """Acquires in between, summed over the connections listed in both: a connection
    moved away and back has the same owner but two more epochs."""
    return sum(max(0, after[cid].epoch - before[cid].epoch) for cid in before.keys() & after.keys())


def move_gap(
    deliveries: Iterable[tuple[float, int]],
    old_epoch: int,
    new_epoch: int,
    margin: float = MOVE_MARGIN_S,
) -> float | None:
    """The longest time between consecutive deliveries ``(t, epoch)`` of one connection
    around its move: from ``margin`` s before its last delivery under ``old_epoch`` to
    ``margin`` s after its first under ``new_epoch``. None when either epoch has none."""
    ordered = sorted(deliveries)
    last_old = max((t for t, epoch in ordered if epoch == old_epoch), default=None)
    first_new = min((t for t, epoch in ordered if epoch == new_epoch), default=None)
    if last_old is None or first_new is None:
        return None
    inside = [t for t, _ in ordered if last_old - margin <= t <= first_new + margin]
    return max((after - before for before, after in itertools.pairwise(inside)), default=0.0)


def schedule_lags(
    deliveries: Iterable[tuple[float, int, int]], rate: float
) -> list[tuple[float, float]]:
    """``(t, lag)`` for each delivery ``(t, stream, seq)`` of one connection: how late it
    came against its stream's schedule. ``stream`` tells the upstream streams apart
    (each owner, and each reconnect, opens a new one). On a stream the feed sends seq
    ``s`` at ``(s - from_seq) / rate`` after it opened and catches up when it falls
    behind; the delivery that came earliest against that schedule stands for it, so
    the lag is ``t - s / rate`` less its smallest value on the stream."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, not {rate}")
    by_stream: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for t, stream, seq in deliveries:
        by_stream[stream].append((t, seq))
    lags: list[tuple[float, float]] = []
    for rows in by_stream.values():
        base = min(t - seq / rate for t, seq in rows)
        lags.extend((t, t - seq / rate - base) for t, seq in rows)
    return lags


def streams(
    deliveries: Iterable[tuple[float, int, int]], connects: Sequence[float]
) -> list[tuple[float, int, int]]:
    """``(t, stream, seq)`` for deliveries ``(t, epoch, seq)`` of one connection, given
    the times its upstream was opened (``connects``, sorted): a delivery belongs to the
    stream opened last before it (and to its epoch: a new owner opens a new stream)."""
    numbered = []
    for t, epoch, seq in deliveries:
        opened = bisect.bisect_right(connects, t)
        numbered.append((t, epoch * (len(connects) + 1) + opened, seq))
    return numbered


def emf_values(event: Mapping[str, Any], metric: str) -> float:
    """The sum of ``metric``'s values in one EMF document (0 when absent)."""
    value = event.get(metric)
    if isinstance(value, list):
        return float(sum(value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return 0.0


def emf_timestamps(events: Iterable[Mapping[str, Any]]) -> list[int]:
    """The ``_aws.Timestamp`` (epoch ms) of every EMF document, in log order."""
    stamps = []
    for event in events:
        aws = event.get("_aws")
        if isinstance(aws, dict) and isinstance(aws.get("Timestamp"), int):
            stamps.append(int(aws["Timestamp"]))
    return stamps


def flush_at_or_after(events: Iterable[Mapping[str, Any]], at_ms: int) -> int | None:
    """The first EMF flush (its timestamp, ms) at or after ``at_ms``: it counts what
    happened up to ``at_ms`` and a little after. None before there is one."""
    return min((ts for ts in emf_timestamps(events) if ts >= at_ms), default=None)


def flush_before(events: Iterable[Mapping[str, Any]], at_ms: int) -> int | None:
    """The last EMF flush (its timestamp, ms) before ``at_ms``; None before there is one."""
    return max((ts for ts in emf_timestamps(events) if ts < at_ms), default=None)


def emf_sum(
    events: Iterable[Mapping[str, Any]], metric: str, after_ms: int | None, until_ms: int | None
) -> int:
    """``metric`` summed over the EMF documents stamped in ``(after_ms, until_ms]``
    (None: unbounded on that side)."""
    total = 0.0
    for event in events:
        aws = event.get("_aws")
        if not isinstance(aws, dict) or not isinstance(aws.get("Timestamp"), int):
            continue
        stamp = int(aws["Timestamp"])
        if after_ms is not None and stamp <= after_ms:
            continue
        if until_ms is not None and stamp > until_ms:
            continue
        total += emf_values(event, metric)
    return round(total)


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """n, p50, p99 and max (n = 0 alone for no values)."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits),
        "p99": round(percentile(values, 99), digits),
        "max": round(max(values), digits),
    }


# --- what the harness collects -----------------------------------------------------------


class DeliveryLog:
    """Every delivery record, kept per connection in compact arrays: a 10-minute run at
    4,000 msg/s holds millions of them."""

    def __init__(self) -> None:
        self._t: dict[str, array[float]] = {}
        self._epoch: dict[str, array[int]] = {}
        self._seq: dict[str, array[int]] = {}
        self._failed: dict[str, array[int]] = {}
        self._worker: dict[str, array[int]] = {}
        self._workers: list[str] = []
        self._worker_index: dict[str, int] = {}

    def add(self, records: Iterable[Record]) -> int:
        """Keep ``records``; returns how many."""
        added = 0
        for r in records:
            cid = r.connection_id
            if cid not in self._t:
                self._t[cid] = array("d")
                self._epoch[cid] = array("q")
                self._seq[cid] = array("q")
                self._failed[cid] = array("b")
                self._worker[cid] = array("H")
            index = self._worker_index.get(r.worker)
            if index is None:
                index = self._worker_index[r.worker] = len(self._workers)
                self._workers.append(r.worker)
            self._t[cid].append(r.t)
            self._epoch[cid].append(r.epoch)
            self._seq[cid].append(r.seq)
            self._failed[cid].append(int(r.failed))
            self._worker[cid].append(index)
            added += 1
        return added

    def connection_ids(self) -> list[str]:
        return sorted(self._t)

    def records(self, connection_id: str) -> list[Record]:
        """The connection's records, in the order they were added."""
        if connection_id not in self._t:
            return []
        return [
            Record(
                worker=self._workers[w],
                connection_id=connection_id,
                epoch=epoch,
                seq=seq,
                t=t,
                failed=bool(failed),
            )
            for t, epoch, seq, failed, w in zip(
                self._t[connection_id],
                self._epoch[connection_id],
                self._seq[connection_id],
                self._failed[connection_id],
                self._worker[connection_id],
                strict=True,
            )
        ]

    def timed(self, connection_id: str) -> list[tuple[float, int, int]]:
        """``(t, epoch, seq)`` of the connection's successful deliveries."""
        if connection_id not in self._t:
            return []
        return [
            (t, epoch, seq)
            for t, epoch, seq, failed in zip(
                self._t[connection_id],
                self._epoch[connection_id],
                self._seq[connection_id],
                self._failed[connection_id],
                strict=True,
            )
            if not failed
        ]

    def first_elsewhere(self, connection_id: str, not_by: str, after: float) -> Record | None:
        """The connection's first delivery after ``after`` by a worker other than
        ``not_by``."""
        best: Record | None = None
        for record in self.records(connection_id):
            if record.worker != not_by and record.t > after and (best is None or record.t < best.t):
                best = record
        return best

    def count_between(self, start: float, end: float) -> int:
        return sum(1 for times in self._t.values() for t in times if start <= t < end)


@dataclass(frozen=True, slots=True)
class Audit:
    duplicates: int
    lost: int
    stale: int
    connections_with_duplicates: int
    connections_with_lost: int

    def as_dict(self) -> dict[str, int]:
        return {
            "duplicates": self.duplicates,
            "lost_seqs": self.lost,
            "stale_deliveries": self.stale,
            "connections_with_duplicates": self.connections_with_duplicates,
            "connections_with_lost_seqs": self.connections_with_lost,
        }


def audit(log: DeliveryLog, connection_ids: Iterable[str]) -> Audit:
    """The recording audit (:mod:`local_stack.audit`) of these connections, one at a time."""
    duplicates = lost = stale = with_duplicates = with_lost = 0
    for cid in connection_ids:
        records = log.records(cid)
        dup = sum(duplicate_count(records).values())
        gone = sum(len(seqs) for seqs in lost_seqs(records).values())
        duplicates += dup
        lost += gone
        stale += len(stale_deliveries(records))
        with_duplicates += dup > 0
        with_lost += gone > 0
    return Audit(duplicates, lost, stale, with_duplicates, with_lost)


@dataclass
class Phase:
    """A stretch of a scenario, with the machine's CPU use and load over it."""

    name: str
    start: float
    cpu_start: SystemCpuSample
    end: float | None = None
    cpu_end: SystemCpuSample | None = None
    load_average: list[float] = field(default_factory=list)
    judged: bool = True
    """Whether a lag here counts as falling behind (not while connections start)."""


class Phases:
    def __init__(self) -> None:
        self.done: list[Phase] = []
        self._open: Phase | None = None

    def begin(self, name: str, *, judged: bool = True) -> None:
        self.end()
        self._open = Phase(name, time.time(), SystemCpuSample.take(), judged=judged)

    def end(self) -> None:
        phase, self._open = self._open, None
        if phase is None:
            return
        phase.end, phase.cpu_end = time.time(), SystemCpuSample.take()
        phase.load_average = load_average()
        self.done.append(phase)
        print(
            f"  {phase.name}: {phase.end - phase.start:.1f} s, load average "
            + " ".join(f"{x:.2f}" for x in phase.load_average),
            flush=True,
        )


def load_average() -> list[float]:
    with contextlib.suppress(OSError, ValueError):
        return [round(float(x), 2) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return []


def load_report(
    phases: Sequence[Phase],
    log: DeliveryLog,
    connection_ids: Sequence[str],
    rate: float,
    workers: Sequence[WorkerProcess],
) -> list[dict[str, Any]]:
    """Per phase: messages delivered per second against the nominal rate, the delivery
    lag against each stream's schedule, the workers' renew lateness (event loop lag),
    their connections paused at the session's fence deadline (a renew that did not
    land in time) and their failed upstream connections, the machine's CPU use and its
    load average at the end; ``behind`` when the lag's p99 passes :data:`LAG_LIMIT_S`."""
    connects: dict[str, list[float]] = defaultdict(list)
    for t, _, e in log_times(workers, UPSTREAM_CONNECTED, lambda e: True):
        connects[str(e.get("connection_id"))].append(t)
    lags: dict[str, array[float]] = {p.name: array("d") for p in phases}
    for cid in connection_ids:
        for t, lag in schedule_lags(streams(log.timed(cid), connects[cid]), rate):
            for phase in phases:
                if phase.end is not None and phase.start <= t < phase.end:
                    lags[phase.name].append(lag)
                    break
    stats = [
        (parse_log_time(e["timestamp"]), e)
        for worker in workers
        for e in worker.logged("worker stats")
    ]
    pauses = [t for t, _, _ in log_times(workers, FENCE_PAUSE, lambda e: True)]
    failures = [t for t, _, _ in log_times(workers, UPSTREAM_FAILED, lambda e: True)]
    report = []
    for phase in phases:
        if phase.end is None or phase.cpu_end is None:
            continue
        seconds = phase.end - phase.start
        values = sorted(lags[phase.name])
        lateness = [
            float(e.get("renew_lateness", {}).get("max_ms", 0.0))
            for at, e in stats
            if phase.start < at <= phase.end + 5.0
        ]
        delivered = len(values)
        entry: dict[str, Any] = {
            "phase": phase.name,
            "seconds": round(seconds, 1),
            "delivered_per_s": round(delivered / seconds, 1) if seconds > 0 else 0.0,
            "nominal_per_s": round(len(connection_ids) * rate, 1),
            "lag_s": spread(values),
            "renew_lateness_max_ms": max(lateness, default=None),
            "fence_pauses": sum(1 for t in pauses if phase.start <= t < phase.end),
            "upstream_failures": sum(1 for t in failures if phase.start <= t < phase.end),
            "machine_busy_percent": round(phase.cpu_start.busy_percent_until(phase.cpu_end), 1),
            "load_average_at_end": phase.load_average,
        }
        entry["judged"] = phase.judged
        entry["behind"] = bool(values) and percentile(values, 99) > LAG_LIMIT_S
        report.append(entry)
    return report


def log_times(
    workers: Iterable[WorkerProcess], message: str, keep: Callable[[dict[str, Any]], bool]
) -> list[tuple[float, str, dict[str, Any]]]:
    """``(time, worker, line)`` of the log lines ``message`` that ``keep`` accepts."""
    return sorted(
        (
            (parse_log_time(e["timestamp"]), worker.worker_id, e)
            for worker in workers
            for e in worker.logged(message)
            if keep(e)
        ),
        key=lambda row: row[0],
    )


# --- driving the fleet -----------------------------------------------------------------


class Harness:
    """One deployment on its servers, its delivery records and its table."""

    def __init__(self, stack: LocalServers, deployment: Deployment, rate: float) -> None:
        self.stack = stack
        self.deployment = deployment
        self.rate = rate
        self.tracker = DeliveryTracker(deployment.record_dir)
        self.log = DeliveryLog()
        self.phases = Phases()

    def pump(self) -> None:
        """Take in the records written since the last call."""
        self.log.add(self.tracker.poll())

    def holders(self, connection_ids: Collection[str]) -> dict[str, Holder]:
        """The owner and epoch of each of ``connection_ids`` (a consistent Scan)."""
        wanted = set(connection_ids)
        return {
            item.connection_id: Holder(item.lease_owner, item.lease_epoch)
            for item in self.deployment.items()
            if item.connection_id in wanted
        }

    def start_connections(self, connection_ids: Sequence[str], feeds: int) -> float:
        """Start them through the router, :data:`START_THREADS` calls at a time, spread
        over the feed processes; returns the seconds it took."""
        began = time.monotonic()

        def start(indexed: tuple[int, str]) -> None:
            index, cid = indexed
            url = self.stack.feed_url(cid, {"rate": self.rate}, index=index % feeds)
            for attempt in itertools.count(1):
                try:
                    self.deployment.start_connection(cid, url)
                    return
                except (UnreachableError, ApiError) as error:
                    # A start is idempotent: a call that timed out on a busy machine,
                    # or met a concurrent write, is simply made again.
                    retry = isinstance(error, UnreachableError) or (
                        error.code == "concurrent_change" or error.status in (429, 500, 503)
                    )
                    if not retry or attempt >= START_ATTEMPTS:
                        raise
                    time.sleep(0.5 * attempt)

        with ThreadPoolExecutor(START_THREADS) as pool:
            list(pool.map(start, enumerate(connection_ids)))
        return time.monotonic() - began

    def wait_flowing(self, connection_ids: Sequence[str], timeout: float, what: str) -> float:
        """Until each connection had a delivery within the last two message intervals
        (and half a second); returns the seconds it took."""
        began = time.monotonic()
        within = 2.0 / self.rate + 0.5

        def flowing() -> bool:
            self.pump()
            since = time.time() - within
            latest = self.tracker.latest
            return all(cid in latest and latest[cid].t >= since for cid in connection_ids)

        wait_until(flowing, timeout, what, 0.25)
        return time.monotonic() - began

    def wait_quiet(
        self, connection_ids: Sequence[str], workers: Sequence[str], quiet: float, timeout: float
    ) -> dict[str, Holder]:
        """Until no epoch changed for ``quiet`` seconds and every connection is held by
        one of ``workers``; the holders then."""
        deadline = time.monotonic() + timeout
        last = self.holders(connection_ids)
        since = time.monotonic()
        while True:
            time.sleep(1.0)
            self.pump()
            now = self.holders(connection_ids)
            if now != last or imbalance(now, workers) is None:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(f"owners still changing after {timeout:g} s")

    def emf_flushed_after(self, workers: Sequence[WorkerProcess], at: float) -> None:
        """Wait until every live worker of ``workers`` flushed its metrics after ``at``."""
        at_ms = round(at * 1000)

        def flushed() -> bool:
            return all(
                flush_at_or_after(w.events(), at_ms) is not None for w in workers if w.alive()
            )

        with contextlib.suppress(TimeoutError):
            wait_until(flushed, METRICS_FLUSH_TIMEOUT_S, "an EMF flush", 0.5)


def split_text(counts: Mapping[str, int]) -> str:
    return " / ".join(str(n) for n in counts.values())


# --- scenario 1: scale-out -----------------------------------------------------------------


def run_scale_out(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    env = dict(ours(None).env)
    n = args.connections
    ids = [f"c{i}" for i in range(n)]
    first_names, new_names = ["w1", "w2"], ["w3", "w4"]
    names = first_names + new_names
    with LocalServers(work_dir, feeds=args.feeds, feed_rate=args.rate) as stack:
        h = Harness(stack, stack.deployment("scale-out"), args.rate)
        deployment = h.deployment
        h.phases.begin("start", judged=False)
        first = deployment.start_workers(first_names, env)
        started_s = h.start_connections(ids, args.feeds)
        flowing_s = h.wait_flowing(ids, 60 + n / 10, f"all {n} connections to flow")
        print(
            f"  {n} connections started in {started_s:.1f} s, all flowing {flowing_s:.1f} s later",
            flush=True,
        )
        initial = h.holders(ids)
        initial_split = counts_per_worker(initial, first_names)
        h.phases.begin("2 workers, before the scale-out")
        pre = h.wait_quiet(ids, first_names, QUIET_S, SETTLE_TIMEOUT_S)
        pre_split = counts_per_worker(pre, first_names)
        print(
            f"  split at 2 workers: {split_text(initial_split)} when all flowed, "
            f"{split_text(pre_split)} at the scale-out",
            flush=True,
        )

        h.phases.begin("scale-out to convergence")
        launched = time.time()
        new = deployment.start_workers(new_names, env)
        ready = time.time()
        workers = [*first, *new]
        timeline: list[dict[str, Any]] = []
        converged_at: float | None = None
        after = pre
        next_poll = time.monotonic()
        scans: list[float] = []
        while True:
            scan_began = time.monotonic()
            after = h.holders(ids)
            scans.append(time.monotonic() - scan_began)
            now = time.time()
            h.pump()
            ratio = imbalance(after, names)
            counts = counts_per_worker(after, names)
            balanced_now = ratio is not None and ratio <= BALANCED_RATIO
            if not timeline or now - launched >= timeline[-1]["t"] + 1.0 or balanced_now:
                timeline.append(
                    {
                        "t": round(now - launched, 2),
                        "counts": list(counts.values()),
                        "unheld": n - sum(counts.values()),
                    }
                )
            if balanced_now:
                converged_at = now
                break
            if now - launched > CONVERGE_TIMEOUT_S:
                break
            # Every OWNER_POLL_S, but never back to back: a slow Scan must not turn
            # the harness into a steady load on DynamoDB Local.
            next_poll = max(next_poll + OWNER_POLL_S, time.monotonic() + MIN_SCAN_PAUSE_S)
            time.sleep(max(0.0, next_poll - time.monotonic()))
        converge_s = None if converged_at is None else converged_at - launched
        print(
            "  "
            + (
                f"max/mean <= {BALANCED_RATIO} {converge_s:.2f} s after the launch"
                if converge_s is not None
                else f"not balanced {CONVERGE_TIMEOUT_S:g} s after the launch"
            )
            + f": {split_text(counts_per_worker(after, names))}",
            flush=True,
        )
        converged = converged_at if converged_at is not None else time.time()

        h.phases.begin(f"steady {args.steady:g} s")
        steady_from = time.time()
        steady_changes: list[dict[str, Any]] = []
        previous = after
        next_owner_poll = time.monotonic() + STEADY_OWNER_POLL_S
        while time.time() - steady_from < args.steady:
            time.sleep(
                min(STEADY_DELIVERY_POLL_S, max(0.0, steady_from + args.steady - time.time()))
            )
            h.pump()
            if time.monotonic() >= next_owner_poll:
                next_owner_poll += STEADY_OWNER_POLL_S
                now_holders = h.holders(ids)
                for cid in owner_changes(previous, now_holders):
                    steady_changes.append(
                        {
                            "t": round(time.time() - steady_from, 1),
                            "connection_id": cid,
                            "from": previous[cid].owner,
                            "to": now_holders[cid].owner,
                        }
                    )
                previous = now_holders
        end = h.holders(ids)
        steady_until = time.time()
        h.phases.end()
        h.emf_flushed_after(workers, steady_until)
        time.sleep(1.0)
        h.pump()
    # The fleet is stopped: the figures come from what was collected and the logs.
    moved = owner_changes(pre, after)
    result = {
        "workers_before": len(first_names),
        "workers_after": len(names),
        "connections": n,
        "rate": args.rate,
        "split_when_flowing": initial_split,
        "split_at_scale_out": pre_split,
        "moves_before_scale_out": {
            "owner_changes": len(owner_changes(initial, pre)),
            "epochs_gained": epochs_gained(initial, pre),
        },
        "workers_ready_s": round(ready - launched, 2),
        "converged": converged_at is not None,
        "converge_s": None if converge_s is None else round(converge_s, 2),
        "split_at_convergence": counts_per_worker(after, names),
        "ratio_at_convergence": imbalance(after, names),
        "moved": {
            "owner_changes": len(moved),
            "epochs_gained": epochs_gained(pre, after),
            "connections_moved_emf": emf_moves(workers, launched, converged, open_start=True),
            "balance_rounds": balance_rounds(workers, launched, converged),
        },
        "move_gaps_s": move_gaps(h.log, moved, pre, after),
        "move_steps_s": move_steps(h.log, workers, moved, pre, after, launched),
        "steady": {
            "seconds": round(steady_until - steady_from, 1),
            "owner_changes": len(owner_changes(after, end)),
            "epochs_gained": epochs_gained(after, end),
            "connections_moved_emf": emf_moves(workers, converged, steady_until),
            "balance_rounds": balance_rounds(workers, converged, steady_until),
            "changes_seen": steady_changes[:20],
            "split_at_end": counts_per_worker(end, names),
        },
        "audit": audit(h.log, ids).as_dict(),
        "timeline": timeline,
        "owner_scan_s": spread(scans),
        "load": load_report(h.phases.done, h.log, ids, args.rate, workers),
    }
    print(f"  audit: {json.dumps(result['audit'])}", flush=True)
    return result


def emf_moves(
    workers: Sequence[WorkerProcess], start: float, end: float, *, open_start: bool = False
) -> dict[str, int]:
    """ConnectionsMoved per worker over the EMF flushes that close the periods from
    ``start`` to ``end``: a flush counts the moves since the previous one, so the last
    flush counted is each worker's first at or after ``end``, and the first one counted
    is the one after its first at or after ``start`` or, with ``open_start``, the one
    after its last before ``start`` (the period holding ``start`` counts in full: the
    fleet was still before it)."""
    result = {}
    for worker in workers:
        events = worker.events()
        start_ms = round(start * 1000)
        if open_start:
            after_ms = flush_before(events, start_ms)
        else:
            after_ms = flush_at_or_after(events, start_ms)
        until_ms = flush_at_or_after(events, round(end * 1000))
        result[worker.worker_id] = emf_sum(events, m.CONNECTIONS_MOVED, after_ms, until_ms)
    result["total"] = sum(result.values())
    return result


def balance_rounds(workers: Sequence[WorkerProcess], start: float, end: float) -> dict[str, Any]:
    """The "balance round" log lines between ``start`` and ``end``."""
    rounds = log_times(workers, "balance round", lambda e: True)
    inside = [(t, w, e) for t, w, e in rounds if start <= t <= end]
    return {
        "rounds": len(inside),
        "moved": sum(int(e.get("moved", 0)) for _, _, e in inside),
        "planned": sum(int(e.get("planned", 0)) for _, _, e in inside),
        "lines": [
            {
                "t": round(t - start, 2),
                "worker": w,
                "planned": e.get("planned"),
                "moved": e.get("moved"),
                "receivers": e.get("receivers"),
                "imbalance_before": e.get("imbalance_before"),
            }
            for t, w, e in inside[:40]
        ],
    }


def move_gaps(
    log: DeliveryLog,
    moved: Sequence[str],
    before: Mapping[str, Holder],
    after: Mapping[str, Holder],
) -> dict[str, Any]:
    """Per moved connection, the longest time between consecutive deliveries around its
    move (:func:`move_gap`): p50, p99 and max over them, and the worst ones."""
    gaps: dict[str, float] = {}
    missing = 0
    for cid in moved:
        gap = move_gap(
            [(t, epoch) for t, epoch, _ in log.timed(cid)], before[cid].epoch, after[cid].epoch
        )
        if gap is None:
            missing += 1
        else:
            gaps[cid] = gap
    worst = sorted(gaps.items(), key=lambda kv: -kv[1])[:5]
    return {
        **spread(list(gaps.values())),
        "over_target": sum(1 for g in gaps.values() if g > TARGET_GAP_S),
        "without_deliveries_on_both_sides": missing,
        "worst": [{"connection_id": cid, "gap_s": round(g, 3)} for cid, g in worst],
    }


def move_steps(
    log: DeliveryLog,
    workers: Sequence[WorkerProcess],
    moved: Sequence[str],
    before: Mapping[str, Holder],
    after: Mapping[str, Holder],
    since: float,
) -> dict[str, Any]:
    """Where the pause of a move goes, per moved connection, from the logs and records:

    - ``release``: the last delivery by the old owner to its "connection ended" (the
      handler call finished, the release with the final checkpoint written);
    - ``group_and_offer``: released to the giver's "balance round" line, logged once
      every connection of the round was released (or the wait for them timed out) and
      offered, one write per receiver;
    - ``renew_and_acquire``: that line to the new owner's "lease acquired": the
      receiver's next session renew returns the offer, then the acquire;
    - ``offer_to_acquire``: the last two together (released to acquired), also for a
      connection not offered that another worker found in the ``unowned`` index;
    - ``connect_and_first_message``: acquired to the first delivery by the new owner.
    """
    wanted = set(moved)
    ended = {
        (e["connection_id"], int(e.get("epoch", -1))): (t, w)
        for t, w, e in log_times(
            workers,
            "connection ended",
            lambda e: e.get("connection_id") in wanted and e.get("ending") == "handed_off",
        )
        if t >= since
    }
    acquired = {
        (e["connection_id"], int(e.get("epoch", -1))): t
        for t, _, e in log_times(
            workers, "lease acquired", lambda e: e.get("connection_id") in wanted
        )
        if t >= since
    }
    rounds: dict[str, list[float]] = defaultdict(list)
    for t, w, _ in log_times(workers, "balance round", lambda e: True):
        if t >= since:
            rounds[w].append(t)
    steps: dict[str, list[float]] = {
        "release": [],
        "group_and_offer": [],
        "renew_and_acquire": [],
        "offer_to_acquire": [],
        "connect_and_first_message": [],
    }
    for cid in moved:
        timed = log.timed(cid)
        old, new = before[cid].epoch, after[cid].epoch
        last_old = max((t for t, e, _ in timed if e == old), default=None)
        first_new = min((t for t, e, _ in timed if e == new), default=None)
        t_ended, giver = ended.get((cid, old), (None, ""))
        t_acquired = acquired.get((cid, new))
        if last_old is not None and t_ended is not None:
            steps["release"].append(t_ended - last_old)
        if t_ended is not None and t_acquired is not None:
            steps["offer_to_acquire"].append(t_acquired - t_ended)
            t_round = next((t for t in rounds[giver] if t >= t_ended), None)
            if t_round is not None and t_round <= t_acquired:
                steps["group_and_offer"].append(t_round - t_ended)
                steps["renew_and_acquire"].append(t_acquired - t_round)
        if t_acquired is not None and first_new is not None:
            steps["connect_and_first_message"].append(first_new - t_acquired)
    return {name: spread(values) for name, values in steps.items()}


# --- scenario 2: drain ---------------------------------------------------------------------


def run_drain(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    env = {
        **ours(None).env,
        worker_settings.MAX_CONNECTIONS: str(DRAIN_CAPACITY),
        worker_settings.BALANCE_ROUND_SECONDS: "0",
    }
    rate = args.drain_rate
    big_ids = [f"big-{i}" for i in range(DRAIN_BIG)]
    more_ids = [f"more-{i}" for i in range(DRAIN_SMALL_WORKERS * DRAIN_SMALL_EACH)]
    ids = big_ids + more_ids
    small_names = [f"s{i}" for i in range(1, DRAIN_SMALL_WORKERS + 1)]
    with LocalServers(work_dir, feeds=args.feeds, feed_rate=rate) as stack:
        h = Harness(stack, stack.deployment("drain"), rate)
        deployment = h.deployment
        h.phases.begin("start", judged=False)
        [big] = deployment.start_workers(["big"], env)
        started_s = h.start_connections(big_ids, args.feeds)
        h.wait_flowing(big_ids, 120, f"the big worker's {DRAIN_BIG} connections to flow")
        print(f"  big: {DRAIN_BIG} connections started in {started_s:.1f} s", flush=True)
        small = deployment.start_workers(small_names, env)
        started_s = h.start_connections(more_ids, args.feeds)
        h.wait_flowing(ids, 120, f"all {len(ids)} connections to flow")
        print(f"  {len(more_ids)} more started in {started_s:.1f} s", flush=True)
        h.phases.begin("all flowing, before SIGTERM")
        time.sleep(args.hold)
        h.pump()
        before = h.holders(ids)
        names = ["big", *small_names]
        split_before = counts_per_worker(before, names)
        theirs = sorted(cid for cid, holder in before.items() if holder.owner == "big")
        print(f"  before SIGTERM: {split_text(split_before)} (big first)", flush=True)

        h.phases.begin("drain")
        signalled = time.time()
        big.signal(signal.SIGTERM)
        exited_at: float | None = None
        first: dict[str, Record] = {}

        def all_elsewhere() -> bool:
            nonlocal exited_at
            h.pump()
            if exited_at is None and big.process.poll() is not None:
                exited_at = time.time()
            for cid in theirs:
                if cid not in first:
                    latest = h.tracker.latest.get(cid)
                    if latest is not None and latest.worker != "big" and latest.t > signalled:
                        found = h.log.first_elsewhere(cid, "big", signalled)
                        if found is not None:
                            first[cid] = found
            return len(first) == len(theirs)

        handed_over = True
        try:
            wait_until(all_elsewhere, DRAIN_TIMEOUT_S, "the drained connections elsewhere", 0.05)
        except TimeoutError:
            handed_over = False
        done_at = time.time()
        with contextlib.suppress(Exception):
            big.process.wait(60)
        if exited_at is None and big.process.poll() is not None:
            exited_at = time.time()
        time.sleep(2.0 / rate + 1.0)  # the new owners' next deliveries
        h.pump()
        h.phases.end()
        after = h.holders(ids)
    everyone = [big, *small]
    drained_by = Counter(r.worker for r in first.values())
    result = {
        "big_capacity": DRAIN_CAPACITY,
        "rate": rate,
        "how_the_600_were_placed": (
            "the three workers started together, then the 600 connections through the"
            " router: each went to whichever worker received its start message"
        ),
        "split_before": split_before,
        "big_held": len(theirs),
        "handed_over": handed_over,
        "all_elsewhere_s": round(max(r.t for r in first.values()) - signalled, 3)
        if handed_over and first
        else None,
        "seen_all_elsewhere_s": round(done_at - signalled, 3),
        "first_elsewhere_s": spread([r.t - signalled for r in first.values()]),
        "big_exit_s": None if exited_at is None else round(exited_at - signalled, 3),
        "big_exit_status": big.process.returncode,
        "split_of_the_drained": {name: drained_by.get(name, 0) for name in small_names},
        "split_after": counts_per_worker(after, small_names),
        "audit_drained": audit(h.log, theirs).as_dict(),
        "audit_all": audit(h.log, ids).as_dict(),
        "steps": drain_steps(big, small, theirs, signalled, done_at + 5.0),
        "load": load_report(h.phases.done, h.log, ids, rate, everyone),
    }
    print(f"  audit of the drained: {json.dumps(result['audit_drained'])}", flush=True)
    return result


def drain_steps(
    big: WorkerProcess,
    small: Sequence[WorkerProcess],
    theirs: Sequence[str],
    signalled: float,
    until: float,
) -> dict[str, Any]:
    """The drain's steps from the logs, in seconds after the SIGTERM (lines up to
    ``until``): the big worker's releases ("connection ended", handed off or not), its
    "drain handed over" and "worker stopped" lines; the receivers' "offers" lines
    (logged once their acquires answered), their passes over the ``unowned`` index
    ("connections taken") and their acquires of the drained connections."""
    wanted = set(theirs)

    def rel(t: float) -> float:
        return round(t - signalled, 3)

    def inside(
        rows: list[tuple[float, str, dict[str, Any]]],
    ) -> list[tuple[float, str, dict[str, Any]]]:
        return [row for row in rows if signalled <= row[0] <= until]

    ended = inside(log_times([big], "connection ended", lambda e: e.get("connection_id") in wanted))
    by_ending = Counter(str(e.get("ending")) for _, _, e in ended)
    drain_lines = inside(log_times([big], "drain handed over", lambda e: True))
    stopped = inside(log_times([big], "worker stopped", lambda e: True))
    offers = inside(log_times(small, "offers", lambda e: True))
    taken = inside(log_times(small, "connections taken", lambda e: True))
    acquired = inside(
        log_times(small, "lease acquired", lambda e: e.get("connection_id") in wanted)
    )
    reassigns = inside(
        log_times(
            small,
            "start message",
            lambda e: e.get("connection_id") in wanted and bool(e.get("reassign")),
        )
    )
    return {
        "releases": {
            "count": len(ended),
            "by_ending": dict(by_ending),
            "first_s": rel(ended[0][0]) if ended else None,
            "last_s": rel(ended[-1][0]) if ended else None,
        },
        "drain_handed_over": [
            {"t_s": rel(t), **{k: e.get(k) for k in ("planned", "handed", "receivers")}}
            for t, _, e in drain_lines
        ],
        "worker_stopped": [
            {"t_s": rel(t), **{k: e.get(k) for k in ("seconds", "handed_over", "handed_back")}}
            for t, _, e in stopped
        ],
        "offers": {
            "lines": [
                {"t_s": rel(t), "worker": w, **{k: e.get(k) for k in ("offered", "room", "won")}}
                for t, w, e in offers
            ],
            "offered": sum(int(e.get("offered", 0)) for _, _, e in offers),
            "won": sum(int(e.get("won", 0)) for _, _, e in offers),
        },
        "unowned_passes": {
            "passes": len(taken),
            "taken": sum(int(e.get("taken", 0)) for _, _, e in taken),
            "lines": [
                {"t_s": rel(t), "worker": w, "taken": e.get("taken")} for t, w, e in taken[:40]
            ],
        },
        "acquired": {
            "count": len(acquired),
            "first_s": rel(acquired[0][0]) if acquired else None,
            "last_s": rel(acquired[-1][0]) if acquired else None,
            "by_second": acquired_by_second([t - signalled for t, _, _ in acquired]),
        },
        "reassign_messages": len(reassigns),
    }


def acquired_by_second(offsets: Sequence[float], step: float = 5.0) -> list[list[float]]:
    """``[s, how many by s]`` every ``step`` seconds, up to the last offset."""
    if not offsets:
        return []
    ordered = sorted(offsets)
    marks = []
    mark = step
    while True:
        marks.append([mark, sum(1 for x in ordered if x <= mark)])
        if mark >= ordered[-1]:
            return marks
        mark += step


# --- output ----------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "MISSED")


def render_scale_out(r: dict[str, Any]) -> str:
    moved = r["moved"]
    gaps = r["move_gaps_s"]
    steps = r["move_steps_s"]
    steady = r["steady"]
    aud = r["audit"]
    owner_moves = moved["owner_changes"]
    steady_moves = max(
        steady["owner_changes"], steady["epochs_gained"], steady["connections_moved_emf"]["total"]
    )
    rows = [
        [
            "split at 2 workers: when all flowed; at the scale-out",
            f"{split_text(r['split_when_flowing'])}; {split_text(r['split_at_scale_out'])}",
            "about 200 / 200",
            "",
        ],
        [
            f"time to max/mean <= {BALANCED_RATIO} from the launch of 2 workers",
            f"{_fmt(r['converge_s'])} s"
            + ("" if r["converged"] else f" (not within {CONVERGE_TIMEOUT_S:g} s)"),
            f"<= {TARGET_CONVERGE_S:g} s",
            _verdict(r["converged"] and r["converge_s"] <= TARGET_CONVERGE_S),
        ],
        [
            "split at convergence",
            f"{split_text(r['split_at_convergence'])}"
            f" (max/mean {_fmt(r['ratio_at_convergence'], 3)})",
            "",
            "",
        ],
        [
            "connections moved: owner changes / epochs gained / ConnectionsMoved (EMF)",
            f"{owner_moves} / {moved['epochs_gained']} / {moved['connections_moved_emf']['total']}",
            f"<= {TARGET_MOVED_MAX} (min {TARGET_MOVED_MIN})",
            _verdict(
                max(owner_moves, moved["epochs_gained"], moved["connections_moved_emf"]["total"])
                <= TARGET_MOVED_MAX
            ),
        ],
        [
            "balance rounds (log lines) / moved in them",
            f"{moved['balance_rounds']['rounds']} / {moved['balance_rounds']['moved']}",
            "",
            "",
        ],
        [
            "longest delivery gap of a moved connection, p50 / max",
            f"{_fmt(gaps.get('p50'), 3)} / {_fmt(gaps.get('max'), 3)} s"
            f" ({gaps.get('over_target', 0)} of {gaps['n']} over 1 s)",
            f"<= {TARGET_GAP_S:g} s",
            _verdict(gaps["n"] > 0 and gaps["max"] <= TARGET_GAP_S) if gaps["n"] else "",
        ],
        [
            "  a move's steps, p50 / max: last delivery -> released",
            f"{_fmt(steps['release'].get('p50'), 3)} / {_fmt(steps['release'].get('max'), 3)} s",
            "",
            "",
        ],
        [
            "  released -> acquired by the new owner",
            f"{_fmt(steps['offer_to_acquire'].get('p50'), 3)}"
            f" / {_fmt(steps['offer_to_acquire'].get('max'), 3)} s",
            "",
            "",
        ],
        [
            "    of which released -> round logged (rest of the group, offer write)",
            f"{_fmt(steps['group_and_offer'].get('p50'), 3)}"
            f" / {_fmt(steps['group_and_offer'].get('max'), 3)} s"
            f" (n {steps['group_and_offer']['n']})",
            "",
            "",
        ],
        [
            "    and round logged -> acquired (receiver's renew, acquire)",
            f"{_fmt(steps['renew_and_acquire'].get('p50'), 3)}"
            f" / {_fmt(steps['renew_and_acquire'].get('max'), 3)} s",
            "",
            "",
        ],
        [
            "  acquired -> first delivery (connect, first message)",
            f"{_fmt(steps['connect_and_first_message'].get('p50'), 3)}"
            f" / {_fmt(steps['connect_and_first_message'].get('max'), 3)} s",
            "",
            "",
        ],
        [
            "duplicates / lost seqs / stale deliveries, whole run",
            f"{aud['duplicates']} / {aud['lost_seqs']} / {aud['stale_deliveries']}",
            "0 / 0 / 0",
            _verdict(
                aud["duplicates"] == 0 and aud["lost_seqs"] == 0 and aud["stale_deliveries"] == 0
            ),
        ],
        [
            f"moves in {steady['seconds']:g} s steady: owner changes / epochs gained"
            " / ConnectionsMoved (EMF)",
            f"{steady['owner_changes']} / {steady['epochs_gained']}"
            f" / {steady['connections_moved_emf']['total']}",
            "0",
            _verdict(steady_moves == 0),
        ],
        ["split at the end", split_text(steady["split_at_end"]), "", ""],
    ]
    return table(["scale-out", "measured", "target", ""], rows)


def render_drain(r: dict[str, Any]) -> str:
    aud = r["audit_drained"]
    steps = r["steps"]
    first = r["first_elsewhere_s"]
    rows = [
        [
            "split before SIGTERM (big / s1 / s2 / s3)",
            split_text(r["split_before"]),
            "1000 / ~200 x 3",
            "",
        ],
        [
            f"SIGTERM -> every one of the big worker's {r['big_held']} delivered elsewhere",
            f"{_fmt(r['all_elsewhere_s'], 3)} s"
            + ("" if r["handed_over"] else f" (not within {DRAIN_TIMEOUT_S:g} s)"),
            f"<= {TARGET_DRAIN_S:g} s",
            _verdict(r["handed_over"] and r["all_elsewhere_s"] <= TARGET_DRAIN_S),
        ],
        [
            "  first delivery elsewhere, p50 / max",
            f"{_fmt(first.get('p50'), 3)} / {_fmt(first.get('max'), 3)} s",
            "",
            "",
        ],
        [
            "  releases by the big worker (first / last), by ending",
            f"{_fmt(steps['releases']['first_s'], 3)} / {_fmt(steps['releases']['last_s'], 3)} s, "
            + ", ".join(f"{k} {v}" for k, v in steps["releases"]["by_ending"].items()),
            "",
            "",
        ],
        [
            "  acquires by the three (first / last), reassign messages",
            f"{_fmt(steps['acquired']['first_s'], 3)} / {_fmt(steps['acquired']['last_s'], 3)} s, "
            f"{steps['reassign_messages']}",
            "",
            "",
        ],
        [
            "  drain handed over (big): planned / released in time and offered",
            ", ".join(f"{d['planned']} / {d['handed']}" for d in steps["drain_handed_over"]) or "-",
            "",
            "",
        ],
        [
            "  offers acted on by the three: offered / won",
            f"{steps['offers']['offered']} / {steps['offers']['won']}"
            f" ({len(steps['offers']['lines'])} lines)",
            "",
            "",
        ],
        [
            "  taken from the unowned index: passes / connections",
            f"{steps['unowned_passes']['passes']} / {steps['unowned_passes']['taken']}",
            "",
            "",
        ],
        [
            "big worker exited after SIGTERM",
            f"{_fmt(r['big_exit_s'], 3)} s (status {r['big_exit_status']})",
            "",
            "",
        ],
        [
            "split of the drained connections (s1 / s2 / s3)",
            split_text(r["split_of_the_drained"]),
            "",
            "",
        ],
        [
            "lost seqs / duplicates of the drained connections",
            f"{aud['lost_seqs']} / {aud['duplicates']} (stale {aud['stale_deliveries']})",
            "0 / 0",
            _verdict(aud["lost_seqs"] == 0 and aud["duplicates"] == 0),
        ],
    ]
    return table(["drain", "measured", "target", ""], rows)


def render_load(load: Sequence[dict[str, Any]]) -> str:
    rows = [
        [
            p["phase"],
            p["seconds"],
            f"{p['delivered_per_s']:,.0f} / {p['nominal_per_s']:,.0f}",
            f"{_fmt(p['lag_s'].get('p50'), 3)} / {_fmt(p['lag_s'].get('p99'), 3)}"
            f" / {_fmt(p['lag_s'].get('max'), 3)}",
            _fmt(p["renew_lateness_max_ms"], 1),
            f"{p['fence_pauses']} / {p['upstream_failures']}",
            f"{p['machine_busy_percent']:.0f}%",
            " ".join(f"{x:.2f}" for x in p["load_average_at_end"]),
            ("BEHIND" if p["behind"] else "ok")
            + ("" if p["judged"] else " (starting: not judged)"),
        ]
        for p in load
    ]
    return table(
        [
            "phase",
            "s",
            "msg/s delivered / nominal",
            "lag p50 / p99 / max s",
            "renew lateness max ms",
            "fence pauses / upstream failures",
            "CPU busy",
            "load average at end",
            "kept up",
        ],
        rows,
    )


def load_verdict(load: Sequence[dict[str, Any]]) -> str:
    judged = [p for p in load if p["judged"]]
    behind = [p["phase"] for p in judged if p["behind"]]
    pauses = sum(p["fence_pauses"] for p in judged)
    paused = (
        f"; {pauses} connection pauses at the session's fence deadline (renews that did"
        " not land in time)"
        if pauses
        else ""
    )
    if not behind:
        return (
            "the feed and the workers kept up"
            f" (delivery lag p99 <= {LAG_LIMIT_S:g} s in every phase after the starts)" + paused
        )
    return (
        "THE FEED OR THE WORKERS FELL BEHIND in: "
        + ", ".join(behind)
        + f" (delivery lag p99 > {LAG_LIMIT_S:g} s){paused}: the timings of those phases"
        " measure a starved machine as much as the fleet"
    )


def render(result: dict[str, Any]) -> str:
    parts = []
    scenarios = result["scenarios"]
    if "scale-out" in scenarios:
        r = scenarios["scale-out"]
        parts += [
            f"scale-out: {r['workers_before']} -> {r['workers_after']} workers, "
            f"{r['connections']} connections at {r['rate']:g} msg/s, shipped defaults",
            render_scale_out(r),
            render_load(r["load"]),
            "load: " + load_verdict(r["load"]),
        ]
    if "drain" in scenarios:
        r = scenarios["drain"]
        parts += [
            f"drain: SIGTERM a worker holding {r['big_held']} connections; 3 others hold "
            f"{DRAIN_SMALL_WORKERS * DRAIN_SMALL_EACH}; {r['rate']:g} msg/s per connection, "
            f"MAX_CONNECTIONS={r['big_capacity']}, balance rounds off",
            "how the 600 were placed: " + r["how_the_600_were_placed"],
            render_drain(r),
            render_load(r["load"]),
            "load: " + load_verdict(r["load"]),
        ]
    parts.append(
        "load average at the end: "
        + " ".join(f"{x:.2f}" for x in result["machine"].get("load_average", []))
    )
    return "\n\n".join(parts)


# --- entry point -----------------------------------------------------------------------------


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    chosen = SCENARIOS if args.scenario == "both" else (args.scenario,)
    scenarios: dict[str, Any] = {}
    load_at_start = load_average()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in load_at_start)}", flush=True)
    for scenario in chosen:
        began = time.monotonic()
        print(f"{scenario}:", flush=True)
        if scenario == "scale-out":
            scenarios[scenario] = run_scale_out(args, work_dir / "scale-out")
        else:
            scenarios[scenario] = run_drain(args, work_dir / "drain")
        scenarios[scenario]["wall_s"] = round(time.monotonic() - began, 1)
    return {
        "benchmark": "rebalance",
        "balance": {
            "round_s": BALANCE.round_seconds,
            "tolerance": BALANCE.tolerance,
            "move_fraction": BALANCE.move_fraction,
        },
        "load_average_at_start": load_at_start,
        "lag_limit_s": LAG_LIMIT_S,
        "scenarios": scenarios,
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rebalance", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--scenario", choices=[*SCENARIOS, "both"], default="both")
    parser.add_argument(
        "--steady", type=float, default=600.0, help="seconds of the balanced fleet (scale-out)"
    )
    parser.add_argument("--connections", type=int, default=400, help="scale-out connections")
    parser.add_argument("--rate", type=float, default=10.0, help="scale-out msg/s per connection")
    parser.add_argument("--drain-rate", type=float, default=1.0, help="drain msg/s per connection")
    parser.add_argument(
        "--hold", type=float, default=10.0, help="drain: seconds all flowing before the SIGTERM"
    )
    parser.add_argument("--feeds", type=int, default=2, help="demo feed processes")
    parser.add_argument("--work-dir", type=Path, help="keep the logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.connections < 4 or args.rate <= 0 or args.drain_rate <= 0 or args.feeds < 1:
        parser.error("need --connections >= 4, --rate and --drain-rate > 0, --feeds >= 1")
    if args.steady < 0 or args.hold < 0:
        parser.error("--steady and --hold must be >= 0")
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="rebalance-") as tmp:
            result = run(args, args.work_dir or Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit("fleet balance (shipped defaults)", render(result), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
