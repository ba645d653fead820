"""End to end through the built-in sinks: the fleet writes every message through the
Kinesis, SQS FIFO and Firehose sinks, each behind an endpoint that refuses, throttles,
delays and fails their requests; a consumer per sink takes each message once with the
deduper, and the run counts, against what the feed sent, what was lost, applied twice
or applied out of order, while workers are killed and stopped all along. Exits 0 when
nothing was, 1 when something was, 2 when the run could not be carried out, 130 when
interrupted.

``python -m benchmarks.sink_e2e [--sink all] [--minutes 10] [--workers 3]
[--connections 20] [--rate 2] [--message-bytes 2048] [--fault-every 30] [--refuse 0.03]
[--throttle R] [--delay 0.05] [--request-errors 0.01] [--failed-calls 0.005]``

Everything runs on loopback: DynamoDB Local, moto (its Kinesis serialised,
:mod:`local_stack.moto_server`), the demo feed, the router and ``--workers`` workers
with the shipped timings. ``--sink`` picks the sinks (``kinesis``, ``firehose``,
``sqs_fifo`` or ``all``, the default); with more than one, each worker runs them side by
side (:mod:`benchmarks.sink_mux`), each connection's messages going to the sink its id
names. Kinesis writes to a stream of 4 shards, SQS FIFO to a queue (one message group
per connection), Firehose to a delivery stream into an S3 bucket, all in moto.

The workers' ``AWS_ENDPOINT_URL_KINESIS``, ``_FIREHOSE`` and ``_SQS`` point at the fault
endpoint (:mod:`benchmarks.faulty_aws`, a process of its own) in front of moto. Of the
sinks' batch writes it refuses ``--refuse`` of the records one by one (seeded by
``--seed``), throttles each destination to ``--throttle`` records/s (by default 1.5
times what its connections offer, in a bucket of ``--burst`` seconds), holds
``--delay`` of the requests for ``--delay-min`` to ``--delay-max`` seconds (below the
sinks' 10 s read timeout: when the worker is killed meanwhile, the request lands after
the new owner's, a superseded owner's late request), fails ``--request-errors`` of the
requests whole (HTTP 500, half of them after forwarding: the answer lost), and every
attempt of ``--failed-calls`` of the calls, so the worker sends the batch again. Each
worker names itself in its requests (``AWS_SDK_UA_APP_ID``), so the endpoint counts
the delayed requests that landed after their sender exited.

``--connections`` connections per sink run on the demo feed (resumable ``json-seq``),
each ``count=N`` with N = ``--rate`` x the run's seconds and ``pad=--message-bytes``
(frames of that size; 0: the feed's small messages): the feed sends seqs 1..N of each
and never more, so what it sent is known exactly. A consumer per sink reads its
destination as it goes (:mod:`benchmarks.sink_consumers`: Kinesis and SQS FIFO in
order through the ordered deduper, Firehose's objects in a shuffled order through the
unordered one with :mod:`wsfleet.firehose_objects`) and keeps an effect log: each
APPLY, in order.

Faults of the fleet, every ``--fault-every`` seconds (30), each a half period apart:
SIGKILL a worker (its connections fail over from their last checkpoints: the
destinations get copies), then SIGTERM another (its connections are handed over
gracefully); each is replaced one second later. The victim is drawn (``--seed``)
among the started workers that hold connections, never the last one.

After ``--minutes``, the run waits until every message of every connection is applied,
stops every connection through the API, stops the workers, waits for the requests the
endpoint still holds, reads every destination to its end and checks, per sink and
connection, against seqs 1..S, S the last seq the feed sent (N, or the connection's
final checkpoint if the fleet did not get that far):

- **lost**: a seq of 1..S never applied;
- **applied twice**: a seq in the effect log more than once (the deduper forbids it;
  the log is the consumer's own evidence);
- **applied out of order** (Kinesis, SQS FIFO; Firehose is read in no order): a seq
  applied after a higher one of the same ``seq_gen``. The deduper holds back a record
  written ahead of the one before it (a partly refused request) as EARLY, so this
  happens only after a superseded owner's late request landed a higher seq first and
  the successor's lower ones were applied late: counted, and a violation only when no
  higher seq of an older owner was applied before it;
- **unfinished**: a connection the fleet did not get through N by the deadline;
- no worker exited on its own, every SIGTERM ended with status 0, no lease left held.

Printed: the figures per sink (with what the endpoint injected, and the batches the
workers sent again after a failed call), then one JSON line with all of them.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.faulty_aws import Counts, FaultEndpoint, Faults, FaultyAwsProcess
from benchmarks.report import machine, percentile, table
from benchmarks.sink_consumers import (
    DecisionLog,
    Effect,
    FirehoseConsumer,
    KinesisConsumer,
    SinkConsumer,
    SqsFifoConsumer,
)
from benchmarks.sink_mux import SINK_MUX_SINKS, SINK_NAMES, connection_prefix, sink_of
from local_stack import services
from local_stack import sink as local_sink
from local_stack.clock import wait_until
from local_stack.fleet import CLIENT_CONFIG, Deployment
from local_stack.process_env import Endpoints
from local_stack.recording import RECORD_DIR
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WorkerProcess, wait_ready
from worker import config as worker_settings
from wsfleet.deduper import create_dedup_table
from wsfleet.item import ConnectionItem

__all__ = ["ConnectionAudit", "Effect", "Options", "audit", "audit_connection", "main", "run"]

EXIT_OK, EXIT_VIOLATION, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
DEDUP_TABLE: Final = "sink-e2e-dedup"
REPLACE_AFTER_S: Final = 1.0
FIRST_APPLY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 60.0
DRAIN_TIMEOUT_S: Final = 180.0
HELD_REQUESTS_TIMEOUT_S: Final = 30.0
PROGRESS_EVERY_S: Final = 30.0
POLL_S: Final = 0.1
THROTTLE_SHARE: Final = 1.5
"""The default throttle of a destination, as a multiple of what its connections offer:
above the steady rate, below the bursts of a failover's resends."""
SENDER_ID: Final = "AWS_SDK_UA_APP_ID"
"""botocore's setting that puts ``app/<id>`` in every request's ``User-Agent``."""
RETRIED_BATCH: Final = "handler failed; retrying"
"""The worker's log line for a batch sent again after a failed call."""
FACTORIES: Final = {
    "kinesis": "worker.sinks.kinesis:factory",
    "firehose": "worker.sinks.firehose:factory",
    "sqs_fifo": "worker.sinks.sqs_fifo:factory",
}
MUX_FACTORY: Final = "benchmarks.sink_mux:factory"
ENDPOINT_VARIABLES: Final = {
    "kinesis": "AWS_ENDPOINT_URL_KINESIS",
    "firehose": "AWS_ENDPOINT_URL_FIREHOSE",
    "sqs_fifo": "AWS_ENDPOINT_URL_SQS",
}
SERVICE_OF: Final = {"kinesis": "kinesis", "firehose": "firehose", "sqs_fifo": "sqs"}
"""The fault endpoint's name of each sink's service."""


@dataclass(frozen=True, slots=True)
class Options:
    minutes: float = 10.0
    workers: int = 3
    connections: int = 20
    """Per sink (60 in all with the three)."""
    rate: float = 2.0
    """Messages per second per connection."""
    fault_every: float = 30.0
    """Seconds between two SIGKILLs (and between two SIGTERMs)."""
    seed: int = 7
    work_dir: Path | None = None
    keep: bool = False
    sinks: tuple[str, ...] = SINK_NAMES
    message_bytes: int = 2048
    """The feed's frames (``pad``); 0: its small messages."""
    refuse: float = 0.03
    throttle: float | None = None
    """Records/s per destination; None: :data:`THROTTLE_SHARE` x what it is offered;
    0: none."""
    burst: float = 0.5
    delay: float = 0.05
    delay_min: float = 3.0
    delay_max: float = 7.0
    request_errors: float = 0.01
    failed_calls: float = 0.005

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    @property
    def count(self) -> int:
        """N: the last seq the feed sends on each connection."""
        return max(1, round(self.rate * self.seconds))

    @property
    def throttle_rate(self) -> float | None:
        """Records/s each destination takes (None: no limit)."""
        if self.throttle is None:
            return THROTTLE_SHARE * self.connections * self.rate
        return self.throttle or None

    def faults(self) -> Faults:
        return Faults(
            refuse=self.refuse,
            throttle=self.throttle_rate,
            burst=self.burst,
            delay=self.delay,
            delay_seconds=(self.delay_min, self.delay_max),
            request_errors=self.request_errors,
            failed_calls=self.failed_calls,
            seed=self.seed,
        )


# --- the audit (pure) ----------------------------------------------------------------------


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
    out_of_order_after_superseded: int = 0
    """Of ``out_of_order``: applied after a higher seq of an older owner (a lower
    epoch), which a superseded owner's late request left ahead of them."""


def audit_connection(
    connection_id: str, effects: Iterable[Effect], sent_through: int
) -> ConnectionAudit:
    """What the effect log of one connection says against seqs 1..``sent_through``."""
    seen: Counter[tuple[int, int]] = Counter()
    highest: dict[int, int] = {}
    applied: dict[int, list[Effect]] = defaultdict(list)
    out_of_order = after_superseded = 0
    for effect in effects:
        name = (effect.seq_gen, effect.seq)
        first_time = seen[name] == 0
        seen[name] += 1
        top = highest.get(effect.seq_gen)
        if first_time and top is not None and effect.seq < top:
            out_of_order += 1
            after_superseded += any(
                e.seq > effect.seq and e.epoch < effect.epoch for e in applied[effect.seq_gen]
            )
        highest[effect.seq_gen] = max(effect.seq, top or 0)
        applied[effect.seq_gen].append(effect)
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
        out_of_order_after_superseded=after_superseded,
    )


def audit(effects: Iterable[Effect], sent_through: Mapping[str, int]) -> dict[str, ConnectionAudit]:
    """Every connection of ``sent_through`` audited on its part of the effect log."""
    mine: dict[str, list[Effect]] = defaultdict(list)
    for effect in effects:
        mine[effect.connection_id].append(effect)
    return {cid: audit_connection(cid, mine[cid], last) for cid, last in sent_through.items()}


def sink_figures(
    audits: Mapping[str, ConnectionAudit], *, ordered: bool, count: int
) -> tuple[dict[str, Any], list[str]]:
    """One sink's totals over its connections, and its violations: anything lost,
    applied twice or never sent, a connection unfinished or on more than one
    ``seq_gen``, and (read in order) a seq applied out of order with no older owner's
    higher seq applied before it. Out of order is None for a sink read in no order."""
    totals: dict[str, Any] = {
        name: sum(getattr(a, name) for a in audits.values())
        for name in (
            "lost",
            "applied_twice",
            "out_of_order",
            "out_of_order_after_superseded",
            "beyond",
        )
    }
    unfinished = sorted(cid for cid, a in audits.items() if a.sent_through < count)
    totals["unfinished"] = len(unfinished)
    unexplained = totals["out_of_order"] - totals["out_of_order_after_superseded"]
    if not ordered:
        totals["out_of_order"] = totals["out_of_order_after_superseded"] = None
        unexplained = 0
    violations = [
        *(
            f"{totals[k]} {k.replace('_', ' ')}"
            for k in ("lost", "applied_twice", "beyond")
            if totals[k]
        ),
        *(
            [f"{unexplained} applied out of order without an older owner's seq before"]
            if unexplained
            else []
        ),
        *([f"{len(unfinished)} connections unfinished"] if unfinished else []),
        *[f"{cid}: {a.seq_gens} seq_gens" for cid, a in audits.items() if a.seq_gens > 1],
    ]
    return totals, violations


# --- the fleet ------------------------------------------------------------------------------


@dataclass
class Fleet:
    """Workers started, signalled and replaced, and what became of them."""

    deployment: Deployment
    rng: random.Random
    log: Callable[[str], None]
    desired: int
    endpoint: FaultEndpoint | None = None
    """Told when a worker exits, to count its delayed requests that land later."""
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
        env = self.deployment.worker_env(worker_id, {SENDER_ID: worker_id})
        worker = self.deployment.launch_worker(worker_id, env)
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
        if kind == "sigkill" and self.endpoint is not None:
            self.endpoint.note_exit(victim.worker_id)  # gone as the signal lands
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
            if self.endpoint is not None:
                self.endpoint.note_exit(worker.worker_id)
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

    def batches_sent_again(self) -> Counter[str]:
        """Per sink, the batches the workers sent again after a failed call."""
        again: Counter[str] = Counter()
        for worker in self.workers:
            for event in worker.logged(RETRIED_BATCH):
                again[sink_of(str(event.get("connection_id", ""))) or "?"] += 1
        return again


# --- the destinations ---------------------------------------------------------------------


@dataclass
class Destinations:
    """Each sink's destination in moto, the workers' settings that write to it, and
    its consumer."""

    settings: dict[str, str | None] = field(default_factory=dict)
    consumers: dict[str, SinkConsumer] = field(default_factory=dict)
    decisions: dict[str, DecisionLog] = field(default_factory=dict)
    clients: list[Any] = field(default_factory=list)

    def write_decisions(self, work_dir: Path) -> None:
        """Every consumer's decisions, ``decisions-<sink>.jsonl`` in ``work_dir``."""
        for sink, log in self.decisions.items():
            log.write(work_dir / f"decisions-{sink}.jsonl")

    def close(self) -> None:
        for client in self.clients:
            client.close()


def create_destinations(
    options: Options, endpoints: Endpoints, fault_endpoint: str, dynamodb: Any
) -> Destinations:
    made = Destinations()
    suffix = str(int(time.time()))
    sinks = options.sinks
    made.settings[worker_settings.HANDLER] = FACTORIES[sinks[0]] if len(sinks) == 1 else MUX_FACTORY
    if len(sinks) > 1:
        made.settings[SINK_MUX_SINKS] = ",".join(sinks)
    rng = random.Random(options.seed)
    for sink in sinks:
        table_name = f"{DEDUP_TABLE}-{sink}"
        create_dedup_table(dynamodb, table_name)
        deduper = made.decisions[sink] = DecisionLog(
            dynamodb, table_name, ordered=sink != "firehose"
        )
        made.settings[ENDPOINT_VARIABLES[sink]] = fault_endpoint
        if sink == "kinesis":
            kinesis = services.local_client("kinesis", endpoints.kinesis, config=CLIENT_CONFIG)
            made.clients.append(kinesis)
            stream = f"sink-e2e-{suffix}"
            local_sink.create_stream(kinesis, stream)
            made.settings[local_sink.SINK_STREAM_NAME] = stream
            made.consumers[sink] = KinesisConsumer(kinesis, deduper, stream)
        elif sink == "sqs_fifo":
            sqs = services.local_client("sqs", endpoints.sqs, config=CLIENT_CONFIG)
            made.clients.append(sqs)
            url: str = sqs.create_queue(
                QueueName=f"sink-e2e-{suffix}.fifo", Attributes={"FifoQueue": "true"}
            )["QueueUrl"]
            made.settings["SINK_QUEUE_URL"] = url
            made.consumers[sink] = SqsFifoConsumer(sqs, deduper, url)
        else:
            s3 = services.local_client("s3", endpoints.sqs, config=CLIENT_CONFIG)
            firehose = services.local_client("firehose", endpoints.sqs, config=CLIENT_CONFIG)
            made.clients += [s3, firehose]
            bucket, name = f"sink-e2e-{suffix}", f"sink-e2e-{suffix}"
            local_sink.create_delivery_stream(firehose, s3, name, bucket)
            made.settings["SINK_DELIVERY_STREAM"] = name
            made.consumers[sink] = FirehoseConsumer(s3, deduper, bucket, rng=rng)
    return made


# --- the run ----------------------------------------------------------------------------


def run(options: Options) -> int:
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="sink-e2e-"))
    began = time.monotonic()

    def log(text: str) -> None:
        print(f"{time.monotonic() - began:7.1f} s  {text}", flush=True)

    log(f"work dir {work_dir}; machine {json.dumps(machine())}")
    result: dict[str, Any] | None = None
    with LocalServers(work_dir, feeds=1, feed_rate=options.rate, kinesis=True) as stack:
        endpoints = stack.endpoints
        dynamodb = services.local_client("dynamodb", endpoints.dynamodb, config=CLIENT_CONFIG)
        faults = options.faults()
        log(f"fault endpoint: {json.dumps(asdict(faults))}")
        with FaultyAwsProcess(endpoints.sqs, faults, stack.log_dir) as endpoint:
            destinations = create_destinations(options, endpoints, endpoint.endpoint, dynamodb)
            deployment = stack.deployment(
                "sink",
                worker_defaults={
                    **destinations.settings,
                    RECORD_DIR: None,  # the sinks are the handler; nothing is recorded
                },
            )
            fleet = Fleet(deployment, random.Random(options.seed), log, options.workers, endpoint)
            try:
                result = _drive(options, stack, fleet, endpoint, destinations.consumers, log)
            finally:
                fleet.stop_all()
                destinations.write_decisions(work_dir)
                destinations.close()
                dynamodb.close()
    status = EXIT_ERROR if result is None else EXIT_VIOLATION if result["violations"] else EXIT_OK
    if status == EXIT_OK and not options.keep and options.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        log(f"logs kept in {work_dir}")
    if result is not None:
        # The JSON line last, for whoever reads the output.
        print()
        print(render(result))
        print(json.dumps(result, separators=(",", ":"), sort_keys=True))
    return status


def _drive(
    options: Options,
    stack: LocalServers,
    fleet: Fleet,
    endpoint: FaultEndpoint,
    consumers: Mapping[str, SinkConsumer],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The run once the stack is up; its result."""
    deployment = fleet.deployment
    wait_ready([fleet.launch() for _ in range(options.workers)])
    log(f"{options.workers} workers started")
    for consumer in consumers.values():
        consumer.start()
    ids = {
        sink: [f"{connection_prefix(sink)}{n:03d}" for n in range(1, options.connections + 1)]
        for sink in options.sinks
    }
    params: dict[str, object] = {"rate": options.rate, "count": options.count}
    if options.message_bytes:
        params["pad"] = options.message_bytes
    # Sinks interleaved: every worker gets connections of each.
    for n in range(options.connections):
        for sink in options.sinks:
            cid = ids[sink][n]
            deployment.start_connection(cid, stack.feed_url(cid, params))

    def every_connection_applied(at_least: int) -> bool:
        for consumer in consumers.values():
            consumer.check()
        fleet.check_exits()
        return all(
            consumers[sink].applied_count(cid) >= at_least
            for sink, cids in ids.items()
            for cid in cids
        )

    wait_until(
        lambda: every_connection_applied(1),
        FIRST_APPLY_TIMEOUT_S,
        "a first message of every connection through its sink",
    )
    total = options.connections * len(options.sinks)
    log(
        f"{total} connections flowing ({options.connections} per sink: "
        f"{', '.join(options.sinks)}; {options.rate:g} msg/s each of ~{options.message_bytes} "
        f"bytes, seqs 1..{options.count}); faults for {options.seconds:g} s"
    )
    _fault_phase(options, fleet, endpoint, consumers, log)

    fleet.replace_due(now=float("inf"))
    settle = max(120.0, 0.5 * options.seconds)
    log(f"faults over; waiting up to {settle:g} s for seqs 1..{options.count} of every connection")
    try:
        wait_until(
            lambda: every_connection_applied(options.count),
            settle,
            f"seqs 1..{options.count} of every connection",
            interval=0.5,
        )
    except TimeoutError as error:
        log(str(error))  # reported as unfinished
    log("stopping every connection")
    for cids in ids.values():
        for cid in cids:
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
    # Requests of killed workers the endpoint still holds land before the last read.
    if not endpoint.wait_idle(HELD_REQUESTS_TIMEOUT_S):
        log(f"the fault endpoint still handles requests after {HELD_REQUESTS_TIMEOUT_S:g} s")
    log("reading every destination to its end")
    drained = {sink: c.stop_and_drain(DRAIN_TIMEOUT_S) for sink, c in consumers.items()}
    sent_through = {
        sink: {cid: _sent_through(options.count, consumers[sink], cid, final) for cid in cids}
        for sink, cids in ids.items()
    }
    return _result(options, fleet, consumers, sent_through, held, drained, endpoint.counts())


def _sent_through(
    count: int, consumer: SinkConsumer, cid: str, final: Mapping[str, ConnectionItem]
) -> int:
    """S: N if the consumer applied it, else what the fleet got to (the higher of the
    seq applied and the final checkpoint)."""
    highest = consumer.highest.get(cid, 0)
    if highest >= count:
        return count
    item = final.get(cid)
    return max(highest, item.last_seq if item is not None else 0)


def _fault_phase(
    options: Options,
    fleet: Fleet,
    endpoint: FaultEndpoint,
    consumers: Mapping[str, SinkConsumer],
    log: Callable[[str], None],
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
        for consumer in consumers.values():
            consumer.check()
        fleet.check_exits()
        fleet.replace_due()
        if now >= next_progress:  # before a fault due at the same time: the fleet as it was
            next_progress += PROGRESS_EVERY_S
            log(f"{len(fleet.running())} workers; faults {dict(fleet.faults)}")
            counts = endpoint.counts()
            for sink, consumer in consumers.items():
                c = counts[SERVICE_OF[sink]]
                log(
                    f"  {sink}: applied {consumer.tally.applied:,}, skipped "
                    f"{consumer.tally.skipped:,}; refused {c.refused:,}, throttled "
                    f"{c.throttled:,}, delayed {c.delayed:,} (late {c.late}), failed requests "
                    f"{c.request_errors:,}"
                )
        if now >= next_fault:
            fleet.fault(kinds[0])
            kinds.reverse()
            next_fault += half
        time.sleep(POLL_S)


INJECTED: Final = {
    "refused": "refused",
    "throttled": "throttled",
    "delayed_requests": "delayed",
    "late_requests": "late",
    "late_request_records": "late_records",
    "failed_requests": "request_errors",
    "answers_lost": "answers_lost",
    "failed_calls": "failed_calls",
    "upstream_errors": "upstream_errors",
}
"""The result's name of each count of the endpoint it reports per sink."""


def _result(
    options: Options,
    fleet: Fleet,
    consumers: Mapping[str, SinkConsumer],
    sent_through: Mapping[str, Mapping[str, int]],
    held: list[str],
    drained: Mapping[str, bool],
    counts: Mapping[str, Counts],
) -> dict[str, Any]:
    again = fleet.batches_sent_again()
    sinks: dict[str, Any] = {}
    violations: list[str] = []
    for sink, consumer in consumers.items():
        audits = audit(consumer.effects, sent_through[sink])
        totals, found = sink_figures(audits, ordered=consumer.ordered, count=options.count)
        if not drained[sink]:
            found.append("its destination was not read to its end")
        violations += [f"{sink}: {v}" for v in found]
        tally = consumer.tally
        lags = [float(e.lag_ms) for e in consumer.effects]
        c = counts[SERVICE_OF[sink]]
        sinks[sink] = {
            "messages_sent": sum(sent_through[sink].values()),
            "applied": tally.applied,
            "skipped_copies": tally.skipped,
            "early": tally.early,
            "malformed": tally.malformed,
            "late": tally.late,
            "gaps": tally.gaps,
            "records_read": tally.applied + tally.skipped + tally.early + tally.malformed,
            **totals,
            "superseded_reads": (
                consumer.superseded.count if consumer.superseded is not None else None
            ),
            "batches_sent_again": again.get(sink, 0),
            "requests": c.requests,
            "records_sent": c.records,
            **{name: getattr(c, counted) for name, counted in INJECTED.items()},
            "apply_lag_ms": {
                "p50": percentile(lags, 50) if lags else None,
                "p99": percentile(lags, 99) if lags else None,
                "max": max(lags) if lags else None,
            },
            **(
                {"objects_read": consumer.objects_read}
                if isinstance(consumer, FirehoseConsumer)
                else {}
            ),
        }
    violations += [
        *([f"{len(held)} leases held after shutdown"] if held else []),
        *fleet.unexpected_exits,
        *fleet.unclean_exits,
    ]
    options_json = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()}
    options_json["throttle_rate"] = options.throttle_rate
    return {
        "benchmark": "sink_e2e",
        "options": options_json,
        "per_connection": options.count,
        "sinks": sinks,
        **{
            name: sum(s[name] for s in sinks.values())
            for name in ("messages_sent", "applied", "lost", "applied_twice", "unfinished")
        },
        "faults": dict(fleet.faults),
        "faults_skipped": fleet.skipped,
        "workers_started": len(fleet.workers),
        "leases_held_after_shutdown": len(held),
        "violations": violations,
    }


ROWS: Final = (
    ("messages the feed sent", "messages_sent"),
    ("records read", "records_read"),
    ("applied", "applied"),
    ("skipped (copies)", "skipped_copies"),
    ("early (held back, applied from a later copy)", "early"),
    ("late / gaps", ("late", "gaps")),
    ("lost", "lost"),
    ("applied twice", "applied_twice"),
    (
        "applied out of order (after an older owner's)",
        ("out_of_order", "out_of_order_after_superseded"),
    ),
    ("records of a superseded owner read after its successor's", "superseded_reads"),
    ("applied, never sent", "beyond"),
    ("unfinished connections", "unfinished"),
    ("batch requests / records sent to the endpoint", ("requests", "records_sent")),
    ("records refused / throttled", ("refused", "throttled")),
    (
        "requests delayed / late (landed after the sender exited)",
        ("delayed_requests", "late_requests"),
    ),
    ("requests failed whole / of them after landing", ("failed_requests", "answers_lost")),
    ("calls failed on every attempt", "failed_calls"),
    ("batches the workers sent again", "batches_sent_again"),
    ("apply lag p50 / p99 (ms)", None),
)


def _cell(figures: Mapping[str, Any], key: str | tuple[str, str] | None) -> str:
    if key is None:
        lag = figures["apply_lag_ms"]
        return f"{lag['p50']} / {lag['p99']}"
    if isinstance(key, tuple):
        first, second = (figures[k] for k in key)
        if first is None:
            return "n/a (unordered)"
        return f"{first:,} / {second:,}"
    value = figures[key]
    return "n/a (unordered)" if value is None else f"{value:,}"


def render(result: Mapping[str, Any]) -> str:
    o = result["options"]
    faults = result["faults"]
    sinks: Mapping[str, Any] = result["sinks"]
    head = (
        f"sink e2e: {o['minutes']:g} min, {o['workers']} workers, {o['connections']} connections "
        f"per sink at {o['rate']:g} msg/s of ~{o['message_bytes']} bytes (seqs "
        f"1..{result['per_connection']} each), {faults.get('sigkill', 0)} SIGKILL + "
        f"{faults.get('sigterm', 0)} SIGTERM ({result['workers_started']} workers started); "
        f"endpoint: refuse {o['refuse']:g}, throttle {o['throttle_rate']} records/s, delay "
        f"{o['delay']:g} ({o['delay_min']:g}-{o['delay_max']:g} s), request errors "
        f"{o['request_errors']:g}, failed calls {o['failed_calls']:g}"
    )
    rows = [[label, *(_cell(sinks[s], key) for s in sinks)] for label, key in ROWS]
    verdict = "violations: " + (
        "0"
        if not result["violations"]
        else f"{len(result['violations'])}: " + "; ".join(result["violations"])
    )
    fleet = f"leases held after shutdown: {result['leases_held_after_shutdown']}"
    return "\n".join([head, table(["figure", *sinks], rows), fleet, verdict])


def _sinks(raw: str) -> tuple[str, ...]:
    if raw == "all":
        return SINK_NAMES
    if raw not in SINK_NAMES:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(SINK_NAMES)} or all")
    return (raw,)


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sink_e2e", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--sink",
        type=_sinks,
        default=SINK_NAMES,
        help="kinesis, firehose, sqs_fifo or all (the default: side by side)",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="of faults (default 10)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--connections", type=int, default=20, help="per sink (20)")
    parser.add_argument("--rate", type=float, default=2.0, help="msg/s per connection (2)")
    parser.add_argument(
        "--message-bytes",
        type=int,
        default=2048,
        help="the feed's frames, in bytes (2048; 0: its small messages)",
    )
    parser.add_argument(
        "--fault-every",
        type=float,
        default=30.0,
        help="seconds between two SIGKILLs, and between two SIGTERMs (30)",
    )
    defaults = Options()
    faults = parser.add_argument_group("the fault endpoint")
    faults.add_argument("--refuse", type=float, default=defaults.refuse, help="share of records")
    faults.add_argument(
        "--throttle",
        type=float,
        default=None,
        help=f"records/s per destination (default {THROTTLE_SHARE:g} x what it is offered; "
        "0: none)",
    )
    faults.add_argument("--burst", type=float, default=defaults.burst, help="seconds of throttle")
    faults.add_argument("--delay", type=float, default=defaults.delay, help="share of requests")
    faults.add_argument("--delay-min", type=float, default=defaults.delay_min, help="seconds")
    faults.add_argument("--delay-max", type=float, default=defaults.delay_max, help="seconds")
    faults.add_argument(
        "--request-errors", type=float, default=defaults.request_errors, help="share of requests"
    )
    faults.add_argument(
        "--failed-calls", type=float, default=defaults.failed_calls, help="share of calls"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be >= 2 (a fault always leaves one worker)")
    if min(args.minutes, args.rate, args.fault_every) <= 0 or args.connections < 1:
        parser.error("--minutes, --rate, --fault-every and --connections must be positive")
    if not 0 <= args.message_bytes <= 1 << 20:
        parser.error("--message-bytes must be from 0 to 1048576")
    if args.throttle is not None and args.throttle < 0:
        parser.error("--throttle must be >= 0")
    options = Options(
        minutes=args.minutes,
        workers=args.workers,
        connections=args.connections,
        rate=args.rate,
        fault_every=args.fault_every,
        seed=args.seed,
        work_dir=args.work_dir,
        keep=args.keep,
        sinks=args.sink,
        message_bytes=args.message_bytes,
        refuse=args.refuse,
        throttle=args.throttle,
        burst=args.burst,
        delay=args.delay,
        delay_min=args.delay_min,
        delay_max=args.delay_max,
        request_errors=args.request_errors,
        failed_calls=args.failed_calls,
    )
    try:
        options.faults()
    except ValueError as error:
        parser.error(str(error))
    return options


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
