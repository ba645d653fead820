"""End to end through the Kinesis sink: the fleet writes every message into a stream,
a consumer takes each once with the deduper, and the run counts, against what the feed
sent, what was lost, applied twice or applied out of order, while workers are killed
and stopped all along. Exits 0 when nothing was, 1 when something was, 2 when the run
could not be carried out, 130 when interrupted.

``python -m benchmarks.sink_e2e [--minutes 10] [--workers 3] [--connections 60]
[--rate 2] [--fault-every 30]``

Everything runs on loopback: DynamoDB Local, moto (its Kinesis serialised,
:mod:`local_stack.moto_server`), the demo feed, the router and ``--workers`` workers
with the shipped timings and ``HANDLER=worker.sinks.kinesis:factory`` writing to a
stream of 4 shards. ``--connections`` connections run on the demo feed (resumable
``json-seq``), each ``count=N`` with N = ``--rate`` x the run's seconds: the feed sends
seqs 1..N of each and never more, so what it sent is known exactly. A consumer thread
reads every shard as it goes (:mod:`local_stack.sink_consumer`) and keeps an effect
log: each APPLY of :meth:`wsfleet.deduper.Deduper.decide`, in order.

Faults, every ``--fault-every`` seconds (30), each a half period apart: SIGKILL a
worker (its connections fail over from their last checkpoints: the stream gets copies),
then SIGTERM another (its connections are handed over gracefully); each is replaced one
second later. The victim is drawn (``--seed``) among the started workers that hold
connections, never the last one.

After ``--minutes``, the run waits until the consumer has applied N of every
connection, stops every connection through the API, stops the workers, drains the
stream to its end and checks, per connection, against seqs 1..S, S the last seq the
feed sent (N, or the connection's final checkpoint if the fleet did not get that far):

- **lost**: a seq of 1..S never applied;
- **applied twice**: a seq in the effect log more than once (the deduper forbids it;
  the log is the consumer's own evidence);
- **applied out of order**: a seq applied after a higher one of the same ``seq_gen``
  (the deduper holds back a record that a partly refused ``PutRecords`` wrote ahead of
  the one before it, as EARLY, and applies both in order when they come again; moto
  never refuses a record anyway);
- **unfinished**: a connection the fleet did not get through N by the deadline;
- no worker exited on its own, every SIGTERM ended with status 0, no lease left held.

Printed: the figures, then one JSON line with all of them.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.report import machine, percentile, table
from local_stack import services
from local_stack import sink as local_sink
from local_stack.clock import now_ms, wait_until
from local_stack.fleet import CLIENT_CONFIG, Deployment
from local_stack.recording import RECORD_DIR
from local_stack.server_group import LocalServers
from local_stack.sink_consumer import (
    Applied,
    EnvelopeApplier,
    StreamReader,
    consume,
    drain,
)
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, wait_ready
from wsfleet.deduper import Deduper, create_dedup_table

EXIT_OK, EXIT_VIOLATION, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
DEDUP_TABLE: Final = "sink-e2e-dedup"
REPLACE_AFTER_S: Final = 1.0
FIRST_APPLY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 60.0
DRAIN_TIMEOUT_S: Final = 180.0
PROGRESS_EVERY_S: Final = 30.0
POLL_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class Options:
    minutes: float = 10.0
    workers: int = 3
    connections: int = 60
    rate: float = 2.0
    """Messages per second per connection."""
    fault_every: float = 30.0
    """Seconds between two SIGKILLs (and between two SIGTERMs)."""
    seed: int = 7
    work_dir: Path | None = None
    keep: bool = False

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    @property
    def count(self) -> int:
        """N: the last seq the feed sends on each connection."""
        return max(1, round(self.rate * self.seconds))


# --- the audit (pure) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Effect:
    """One APPLY, as the consumer made it."""

    connection_id: str
    seq_gen: int
    seq: int
    epoch: int
    lag_ms: int
    """From the worker handing the batch to the sink to the consumer's apply."""


@dataclass(frozen=True, slots=True)
class ConnectionAudit:
    connection_id: str
    sent_through: int
    """S: the feed sent seqs 1..S."""
    applied: int
    lost: int
    applied_twice: int
    out_of_order: int
    beyond: int
    """Seqs applied that the feed never sent (above S)."""
    seq_gens: int


def audit_connection(
    connection_id: str, effects: Iterable[Effect], sent_through: int
) -> ConnectionAudit:
    """What the effect log of one connection says against seqs 1..``sent_through``."""
    seen: Counter[tuple[int, int]] = Counter()
    highest: dict[int, int] = {}
    out_of_order = 0
    for effect in effects:
        name = (effect.seq_gen, effect.seq)
        first_time = seen[name] == 0
        seen[name] += 1
        top = highest.get(effect.seq_gen)
        if first_time and top is not None and effect.seq < top:
            out_of_order += 1
        highest[effect.seq_gen] = max(effect.seq, top or 0)
    seqs = {seq for _, seq in seen}
    return ConnectionAudit(
        connection_id=connection_id,
        sent_through=sent_through,
        applied=len(seen),
        lost=sum(1 for seq in range(1, sent_through + 1) if seq not in seqs),
        applied_twice=sum(n - 1 for n in seen.values()),
        out_of_order=out_of_order,
        beyond=sum(1 for seq in seqs if seq > sent_through),
        seq_gens=len(highest),
    )


def audit(effects: Iterable[Effect], sent_through: Mapping[str, int]) -> dict[str, ConnectionAudit]:
    """Every connection of ``sent_through`` audited on its part of the effect log."""
    mine: dict[str, list[Effect]] = defaultdict(list)
    for effect in effects:
        mine[effect.connection_id].append(effect)
    return {cid: audit_connection(cid, mine[cid], last) for cid, last in sent_through.items()}


# --- the consumer ------------------------------------------------------------------------


class Consumer:
    """The stream read on a thread of its own as the fleet writes it; the effect of
    an APPLY is an entry in :attr:`effects` (and the connection's highest seq)."""

    def __init__(self, kinesis: Any, dynamodb: Any, stream: str) -> None:
        self.effects: list[Effect] = []
        self.highest: dict[str, int] = {}
        self.reader = StreamReader(kinesis, stream)
        self.applier = EnvelopeApplier(Deduper(dynamodb, DEDUP_TABLE), self._apply)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sink-consumer", daemon=True)

    def _apply(self, applied: Applied) -> None:
        e = applied.envelope
        self.effects.append(
            Effect(e.connection_id, e.seq_gen, e.seq, e.epoch, now_ms() - e.received_at_ms)
        )
        self.highest[e.connection_id] = max(self.highest.get(e.connection_id, 0), e.seq)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            consume(
                self.reader,
                self.applier,
                stop=self._stop.is_set,
                idle_seconds=0.2,
                sleep=self._pause,
            )
        except BaseException as error:  # reported by the main thread
            self.error = error

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)  # stopping ends the pause at once

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the consumer failed: {self.error!r}") from self.error

    def stop_and_drain(self, timeout: float) -> bool:
        """Stop the thread, then read the stream to its end here; whether it got there."""
        self._stop.set()
        self._thread.join()
        self.check()
        return drain(self.reader, self.applier, timeout=timeout)


# --- the fleet ------------------------------------------------------------------------------


@dataclass
class Victim:
    process: WorkerProcess
    signal_name: str
    at: float


@dataclass
class Fleet:
    """Workers started, signalled and replaced, and what became of them."""

    deployment: Deployment
    rng: random.Random
    log: Callable[[str], None]
    desired: int
    workers: list[WorkerProcess] = field(default_factory=list)
    ending: dict[str, str] = field(default_factory=dict)
    """Workers the run signalled, and with what."""
    replacements: list[float] = field(default_factory=list)
    """When each pending replacement is due (monotonic)."""
    faults: Counter[str] = field(default_factory=Counter)
    skipped: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    unclean_exits: list[str] = field(default_factory=list)
    _exited: set[str] = field(default_factory=set)
    _ids: int = 0

    def launch(self) -> WorkerProcess:
        self._ids += 1
        worker_id = f"sink-w{self._ids}"
        worker = self.deployment.launch_worker(worker_id, self.deployment.worker_env(worker_id))
        self.workers.append(worker)
        return worker

    def running(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive() and w.worker_id not in self.ending]

    def started(self, worker: WorkerProcess) -> bool:
        return bool(worker.logged("worker started"))

    def fault(self, kind: str) -> None:
        """SIGKILL or SIGTERM a started worker that holds connections, if another
        started worker remains; its replacement is due a second later."""
        owners = Counter(item.lease_owner for item in self.deployment.items())
        healthy = sorted((w for w in self.running() if self.started(w)), key=lambda w: w.worker_id)
        holders = [w for w in healthy if owners.get(w.worker_id)]
        if len(healthy) < 2 or not holders:
            self.skipped += 1
            self.log(f"{kind} skipped: {len(healthy)} started workers")
            return
        victim = self.rng.choice(holders)
        self.ending[victim.worker_id] = kind
        victim.signal(signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
        self.faults[kind] += 1
        self.replacements.append(time.monotonic() + REPLACE_AFTER_S)
        self.log(f"{kind} {victim.worker_id} (held {owners[victim.worker_id]})")

    def replace_due(self, *, now: float | None = None) -> None:
        """Start the replacements that are due (all of them with ``now=inf``)."""
        moment = time.monotonic() if now is None else now
        due = [t for t in self.replacements if t <= moment]
        self.replacements = [t for t in self.replacements if t > moment]
        for _ in due:
            if len(self.running()) < self.desired:
                self.log(f"start {self.launch().worker_id} (replacement)")

    def check_exits(self) -> None:
        for worker in self.workers:
            status = worker.poll()
            if status is None or worker.worker_id in self._exited:
                continue
            self._exited.add(worker.worker_id)
            kind = self.ending.get(worker.worker_id)
            if kind is None:
                self.unexpected_exits.append(f"{worker.worker_id} exited with {status}")
                self.log(f"UNEXPECTED: {worker.worker_id} exited with {status}")
            elif kind in ("sigterm", "final") and status != 0:
                self.unclean_exits.append(f"{worker.worker_id} exited with {status} after SIGTERM")

    def stop_all(self) -> None:
        for worker in self.running():
            self.ending[worker.worker_id] = "final"
        self.deployment.stop_workers()
        self.check_exits()


# --- the run ----------------------------------------------------------------------------


def run(options: Options) -> int:
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="sink-e2e-"))
    began = time.monotonic()

    def log(text: str) -> None:
        print(f"{time.monotonic() - began:7.1f} s  {text}", flush=True)

    log(f"work dir {work_dir}; machine {json.dumps(machine())}")
    status = EXIT_ERROR
    with LocalServers(work_dir, feeds=1, feed_rate=options.rate, kinesis=True) as stack:
        endpoints = stack.endpoints
        kinesis = services.local_client("kinesis", endpoints.kinesis, config=CLIENT_CONFIG)
        dynamodb = services.local_client("dynamodb", endpoints.dynamodb, config=CLIENT_CONFIG)
        stream = f"sink-e2e-{int(time.time())}"
        local_sink.create_stream(kinesis, stream)
        create_dedup_table(dynamodb, DEDUP_TABLE)
        deployment = stack.deployment(
            "sink",
            worker_defaults={
                **local_sink.worker_settings_for(endpoints, stream),
                RECORD_DIR: None,  # the sink is the handler; nothing is recorded
            },
        )
        fleet = Fleet(deployment, random.Random(options.seed), log, options.workers)
        consumer = Consumer(kinesis, dynamodb, stream)
        try:
            status = _drive(options, stack, fleet, consumer, log)
        finally:
            fleet.stop_all()
            kinesis.close()
            dynamodb.close()
    if status == EXIT_OK and not options.keep and options.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        log(f"logs kept in {work_dir}")
    return status


def _drive(
    options: Options,
    stack: LocalServers,
    fleet: Fleet,
    consumer: Consumer,
    log: Callable[[str], None],
) -> int:
    deployment = fleet.deployment
    wait_ready([fleet.launch() for _ in range(options.workers)])
    log(f"{options.workers} workers started")
    consumer.start()
    ids = [f"sink-{n:03d}" for n in range(1, options.connections + 1)]
    for cid in ids:
        deployment.start_connection(
            cid, stack.feed_url(cid, {"rate": options.rate, "count": options.count})
        )

    def every_connection_applied(at_least: Callable[[str], int]) -> bool:
        consumer.check()
        fleet.check_exits()
        return all(consumer.highest.get(cid, 0) >= at_least(cid) for cid in ids)

    wait_until(
        lambda: every_connection_applied(lambda _: 1),
        FIRST_APPLY_TIMEOUT_S,
        "a first message of every connection through the stream",
    )
    log(
        f"{len(ids)} connections flowing ({options.rate:g} msg/s each, seqs 1..{options.count}); "
        f"faults for {options.seconds:g} s"
    )
    _fault_phase(options, fleet, consumer, log)

    fleet.replace_due(now=float("inf"))
    settle = max(120.0, 0.5 * options.seconds)
    log(f"faults over; waiting up to {settle:g} s for seq {options.count} of every connection")
    try:
        wait_until(
            lambda: every_connection_applied(lambda _: options.count),
            settle,
            f"seq {options.count} of every connection",
            interval=0.5,
        )
    except TimeoutError as error:
        log(str(error))  # reported as unfinished
    log("stopping every connection")
    for cid in ids:
        deployment.stop_connection(cid)
    try:
        wait_until(
            lambda: all(i.lease_owner is None for i in deployment.items()),
            STOP_TIMEOUT_S,
            "every connection to be released",
            interval=0.25,
        )
    except TimeoutError as error:
        log(str(error))
    fleet.stop_all()
    final = {item.connection_id: item for item in deployment.items()}
    held = sorted(cid for cid, item in final.items() if item.lease_owner is not None)
    log("draining the stream")
    drained = consumer.stop_and_drain(DRAIN_TIMEOUT_S)
    sent_through = {
        cid: options.count
        if consumer.highest.get(cid, 0) >= options.count
        else max(consumer.highest.get(cid, 0), final[cid].last_seq if cid in final else 0)
        for cid in ids
    }
    result = _result(options, fleet, consumer, sent_through, held, drained)
    print()
    print(render(result))
    print(json.dumps(result, separators=(",", ":"), sort_keys=True))
    return EXIT_VIOLATION if result["violations"] else EXIT_OK


def _fault_phase(
    options: Options, fleet: Fleet, consumer: Consumer, log: Callable[[str], None]
) -> None:
    start = time.monotonic()
    end = start + options.seconds
    half = options.fault_every / 2
    next_fault, kinds = start + half, ["sigkill", "sigterm"]
    next_progress = start + PROGRESS_EVERY_S
    while True:
        now = time.monotonic()
        if now >= end:
            return
        consumer.check()
        fleet.check_exits()
        fleet.replace_due()
        if now >= next_progress:  # before a fault due at the same time: the fleet as it was
            next_progress += PROGRESS_EVERY_S
            tally = consumer.applier.tally
            log(
                f"{len(fleet.running())} workers; applied {tally.applied:,}, skipped "
                f"{tally.skipped:,}; faults {dict(fleet.faults)}"
            )
        if now >= next_fault:
            fleet.fault(kinds[0])
            kinds.reverse()
            next_fault += half
        time.sleep(POLL_S)


def _result(
    options: Options,
    fleet: Fleet,
    consumer: Consumer,
    sent_through: Mapping[str, int],
    held: list[str],
    drained: bool,
) -> dict[str, Any]:
    audits = audit(consumer.effects, sent_through)
    tally = consumer.applier.tally
    lags = [float(e.lag_ms) for e in consumer.effects]
    totals = {
        name: sum(getattr(a, name) for a in audits.values())
        for name in ("lost", "applied_twice", "out_of_order", "beyond")
    }
    unfinished = sorted(cid for cid, last in sent_through.items() if last < options.count)
    violations = [
        *(f"{totals[k]} {k.replace('_', ' ')}" for k in totals if totals[k]),
        *([f"{len(unfinished)} connections unfinished"] if unfinished else []),
        *([f"{len(held)} leases held after shutdown"] if held else []),
        *([] if drained else ["the stream was not drained"]),
        *fleet.unexpected_exits,
        *fleet.unclean_exits,
        *[f"{cid}: {a.seq_gens} seq_gens" for cid, a in audits.items() if a.seq_gens > 1],
    ]
    return {
        "benchmark": "sink_e2e",
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "messages_sent": sum(sent_through.values()),
        "per_connection": options.count,
        "applied": tally.applied,
        "skipped_copies": tally.skipped,
        "early": tally.early,
        "malformed": tally.malformed,
        "late": tally.late,
        "gaps": tally.gaps,
        "records_read": (tally.applied + tally.skipped + tally.early + tally.malformed),
        **totals,
        "unfinished": len(unfinished),
        "faults": dict(fleet.faults),
        "faults_skipped": fleet.skipped,
        "workers_started": len(fleet.workers),
        "leases_held_after_shutdown": len(held),
        "apply_lag_ms": {
            "p50": percentile(lags, 50) if lags else None,
            "p99": percentile(lags, 99) if lags else None,
            "max": max(lags) if lags else None,
        },
        "violations": violations,
    }


def render(result: Mapping[str, Any]) -> str:
    o = result["options"]
    faults = result["faults"]
    lag = result["apply_lag_ms"]
    rows = [
        ("messages the feed sent", result["messages_sent"]),
        ("records read from the stream", result["records_read"]),
        ("applied", result["applied"]),
        ("skipped (copies)", result["skipped_copies"]),
        ("early (held back, applied from a later copy)", result["early"]),
        ("late / gaps", f"{result['late']} / {result['gaps']}"),
        ("lost", result["lost"]),
        ("applied twice", result["applied_twice"]),
        ("applied out of order", result["out_of_order"]),
        ("applied, never sent", result["beyond"]),
        ("unfinished connections", result["unfinished"]),
        ("leases held after shutdown", result["leases_held_after_shutdown"]),
        (
            "apply lag p50 / p99 (ms)",
            f"{lag['p50']} / {lag['p99']}",
        ),
    ]
    head = (
        f"sink e2e: {o['minutes']:g} min, {o['workers']} workers, {o['connections']} connections "
        f"at {o['rate']:g} msg/s (seqs 1..{result['per_connection']} each), "
        f"{faults.get('sigkill', 0)} SIGKILL + {faults.get('sigterm', 0)} SIGTERM "
        f"({result['workers_started']} workers started)"
    )
    verdict = "violations: " + (
        "0"
        if not result["violations"]
        else f"{len(result['violations'])}: " + "; ".join(result["violations"])
    )
    return "\n".join([head, table(["figure", "value"], rows), verdict])


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sink_e2e", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="of faults (default 10)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--connections", type=int, default=60)
    parser.add_argument("--rate", type=float, default=2.0, help="msg/s per connection (2)")
    parser.add_argument(
        "--fault-every",
        type=float,
        default=30.0,
        help="seconds between two SIGKILLs, and between two SIGTERMs (30)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be >= 2 (a fault always leaves one worker)")
    if min(args.minutes, args.rate, args.fault_every) <= 0 or args.connections < 1:
        parser.error("--minutes, --rate, --fault-every and --connections must be positive")
    return Options(
        minutes=args.minutes,
        workers=args.workers,
        connections=args.connections,
        rate=args.rate,
        fault_every=args.fault_every,
        seed=args.seed,
        work_dir=args.work_dir,
        keep=args.keep,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        with sigterm_as_interrupt():
            return run(options)
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print("sink e2e run failed; every child process has been stopped", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
