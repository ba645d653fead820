"""One simulated fleet, decided by its seed: the real workers and the router's real
service, on simulated AWS services, upstreams, network and clocks, under a schedule of
faults, with the invariants of :mod:`sim.invariants` checked as it runs."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lambdas.router.service import ConnectionService
from lambdas.router.settings import RouterSettings
from local_stack.resources import create_connection_table
from sim import upstreams
from sim.aws import Caller, HotKeys, Link, Retries, SimDynamoDB, SimQueue, SimSQS
from sim.dynamodb import DynamoDBEngine, SimDynamoDBClient
from sim.invariants import Monitor
from sim.network import Network
from sim.runtime import SimLoop, SimThreads, World, install_asyncgen_hooks
from worker import aws_clients
from worker.__main__ import AWS_THREADS
from worker.config import DEFAULT_PING_TIMEOUT, WorkerConfig
from worker.delivery import Delivery
from worker.fleet_worker import Worker, WorkerDeps
from worker.reconciler import sweep_bound
from worker.upstream_protocol import load_protocol
from wsfleet import schema
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

TABLE = "connections"
QUEUE_URL = "https://sqs.sim.invalid/000000000000/start"
EPOCH = 1_800_000_000.0
"""The wall clock's reading at virtual time 0."""


TIGHT = 1.7
"""A tight fleet's slots per worker, against its connections per worker."""


@dataclass(frozen=True)
class Shape:
    """What a seed draws before the faults."""

    workers: int
    connections: int
    rate: float
    max_connections: int
    duration: float
    faults: int
    batch: bool
    """The handler takes batches (``handle_batch``)."""
    ping_interval: float | None = None
    """``PING_INTERVAL_SECONDS`` if not the default."""

    @classmethod
    def draw(cls, rng: random.Random, *, duration: float, faults: int) -> Shape:
        workers = rng.randint(3, 8)
        # Log-uniform: small fleets are cheap and many, every size is drawn often.
        connections = round(math.exp(rng.uniform(math.log(20), math.log(300))))
        # Room for everything even with two workers gone, and some seeds with little
        # to spare (full workers, the start queue handing messages back). A quarter
        # are as tight as the crash failover's promise allows (docs/DESIGN.md §3.11,
        # the shape of its benchmark): a dead worker holds more than any one
        # survivor's room, so the reap's plan must split its connections.
        spare = rng.choice((1.2, 1.5, 2.5, TIGHT))
        if spare == TIGHT:
            max_connections = max(8, math.ceil(connections * TIGHT / workers))
        else:
            max_connections = max(8, math.ceil(connections * spare / max(workers - 2, 1)))
        rate = min(1.0, round(rng.uniform(30, 90) / connections, 3))
        batch = rng.random() < 0.3
        # The keepalive is a setting users change; a ping a second per connection is
        # also most of a run's events, so the default is one draw of three.
        ping_interval = rng.choice((None, 5.0, 20.0))
        return cls(
            workers, connections, rate, max_connections, duration, faults, batch, ping_interval
        )

    def silence_noticed_within(self, timing: LeaseTiming) -> float:
        """A silent upstream is left within a ping interval and the pong's timeout."""
        interval = self.ping_interval or max(timing.heartbeat, 1.0)
        return interval + DEFAULT_PING_TIMEOUT

    def worker_settings(self) -> dict[str, str]:
        settings = {"MAX_CONNECTIONS": str(self.max_connections)}
        if self.ping_interval is not None:
            settings["PING_INTERVAL_SECONDS"] = str(self.ping_interval)
        return settings


def token_source(rng: random.Random) -> Callable[[int], str]:
    def tokens(n: int) -> str:
        return rng.getrandbits(8 * n).to_bytes(n, "big").hex()

    return tokens


class SimHandler:
    """Reports every call to the monitor; misbehaves when the schedule says so."""

    def __init__(self, process: WorkerProcess) -> None:
        self._process = process

    async def handle(self, delivery: Delivery) -> None:
        await self._call(delivery, delivery)

    async def _call(self, first: Delivery, last: Delivery) -> None:
        process = self._process
        fleet = process.fleet
        payload = first.payload
        stream = payload.get("stream", "") if isinstance(payload, dict) else ""
        cid = first.connection_id
        fleet.monitor.call_started(process.name, cid, first.epoch, stream, first.seq, last.seq)
        returned = False
        try:
            misbehaviour = process.misbehaviour
            if misbehaviour is not None and fleet.rng.random() < 0.3:
                if getattr(misbehaviour, "ignores_cancellation", False):
                    fleet.monitor.ignores_cancellation(process.name, cid)
                await misbehaviour(fleet.rng)
            returned = True
        finally:
            fleet.monitor.call_ended(process.name, cid, returned=returned)


class SimBatchHandler(SimHandler):
    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        await self._call(deliveries[0], deliveries[-1])


class WorkerProcess:
    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.name = name
        world = fleet.world
        self.loop = world.loop(name)
        self.link = fleet.new_link()
        self.wall_offset = 0.0
        self.misbehaviour: Callable[[random.Random], Any] | None = None
        timing = fleet.timing
        env = {
            "TABLE_NAME": TABLE,
            "QUEUE_URL": QUEUE_URL,
            "WORKER_ID": name,
            "METRICS_INTERVAL_SECONDS": "3600",
            **fleet.shape.worker_settings(),
        }
        self.config = WorkerConfig.from_env(env)
        # The production clients' timeouts and attempts (worker.aws_clients).
        loop, link = self.loop, self.link
        dynamodb_retries = Retries.of(aws_clients.dynamodb_config(timing, AWS_THREADS))
        patient_retries = Retries.of(aws_clients.patient_config(timing, AWS_THREADS))
        dynamodb = aws_clients.patient_dynamodb(
            SimDynamoDB(fleet.engine, Caller(loop, link, dynamodb_retries), fleet.hot),
            SimDynamoDB(fleet.engine, Caller(loop, link, patient_retries), fleet.hot),
            timing,
            loop.time,
        )
        renew_retries = Retries.of(aws_clients.renew_config(timing))
        renewals = SimDynamoDB(fleet.engine, Caller(loop, link, renew_retries), fleet.hot)
        sqs_calls = Retries.of(aws_clients.sqs_config(AWS_THREADS))
        sqs_poll = Retries.of(aws_clients.sqs_poll_config(self.config.sqs_wait_seconds))
        sqs = SimSQS(
            fleet.queue,
            Caller(loop, link, sqs_calls),
            fleet.hint_lost,
            poll=Caller(loop, link, sqs_poll),
        )
        self.sqs = sqs
        tokens = token_source(random.Random(fleet.rng.getrandbits(64)))
        self.deps = WorkerDeps(
            store=LeaseStore(dynamodb, TABLE, timing, tokens=tokens),  # type: ignore[arg-type]
            sessions=SessionStore(dynamodb, TABLE, timing),  # type: ignore[arg-type]
            renewals=SessionStore(renewals, TABLE, timing),  # type: ignore[arg-type]
            sqs=sqs,  # type: ignore[arg-type]
            handler=SimBatchHandler(self) if fleet.shape.batch else SimHandler(self),
            protocol=load_protocol("json-seq"),
            wall_ms=self.wall_ms,
            rng=random.Random(fleet.rng.getrandbits(64)),
            threads=SimThreads(self.loop),
            stamp_health=lambda: None,
            lag_probe_seconds=None,
            metrics_out=io.StringIO(),
            tokens=tokens,
            dynamodb_path=dynamodb.trips,
        )
        self.worker: Worker | None = None
        # Made now, not when the process first runs: a worker counts as room (and may
        # be terminated) from the instant it starts.
        self.stop = asyncio.Event()
        self.exited = False
        self.terminated_at: float | None = None
        self.task = world.run_task(self.loop, self._main())

    def wall_ms(self) -> int:
        return int((EPOCH + self.fleet.world.now + self.wall_offset) * 1000)

    async def _main(self) -> None:
        self.worker = Worker(self.config, self.deps)
        self.deps.metrics_out.truncate(0)  # type: ignore[union-attr]
        try:
            await self.worker.run(self.stop)
        except Exception as error:
            self.fleet.monitor.violated(5, f"{self.name} exited with {error!r}")
        else:
            # Every exit, mid-run drains included: each slot given back, but those of
            # handler calls that would not end (a handler that ignores cancellation
            # holds its slot; the process exits without it).
            free, slots = self.worker.capacity.free, self.config.max_connections
            if free + self.fleet.monitor.calls_in_flight(self.name) < slots:
                self.fleet.monitor.violated(
                    5, f"{self.name} exited with {free} of {slots} slots free"
                )
        finally:
            self.exited = True
            self.sqs.exited()
            if self.terminated_at is not None:
                # A drain hands connections to the others until the process exits: a
                # crash meanwhile is not a clean failover (invariant 7).
                self.fleet.monitor.disturbance(self.terminated_at, self.fleet.world.now)

    @property
    def alive(self) -> bool:
        return not self.loop.crashed and not self.exited

    def _releasing(self) -> set[str]:
        """The connections this worker has decided to give back (a stop, a hand-off):
        a release in flight at a crash lands after it, and no reap moves them."""
        if self.worker is None:
            return set()
        return {
            cid
            for cid, runner in self.worker.holdings.runners.items()
            if runner.state.ending is not None and runner.state.ending.releases
        }

    def terminate(self) -> None:
        if self.terminated_at is None:
            self.terminated_at = self.fleet.world.now
        self.stop.set()
        self.fleet.capacity_changed()

    def crash(self) -> None:
        self.loop.crash()
        self.fleet.network.crash(self.loop)
        self.sqs.crashed()
        room = sum(
            p.worker.capacity.free
            for p in self.fleet.alive()
            if p is not self and p.worker is not None
        )
        monitor = self.fleet.monitor
        streamed = monitor.streamed_by(self.name)
        given_back = set(self.fleet.not_held_by(self.name, streamed)) | self._releasing()
        monitor.crashed(self.name, room, given_back)
        self.fleet.capacity_changed()


class Router:
    """The router's service, one request at a time per connection."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.loop = fleet.world.loop("router")
        link = fleet.new_link()
        settings = RouterSettings.from_env(
            {
                "TABLE_NAME": TABLE,
                "QUEUE_URL": QUEUE_URL,
                "ALLOWED_UPSTREAM_HOSTS": upstreams.HOST,
                "ALLOW_INSECURE_WS": "true",
            }
        )
        self.service = ConnectionService(
            dynamodb=SimDynamoDB(  # type: ignore[arg-type]
                fleet.engine, Caller(self.loop, link, Retries(2.0, 3)), fleet.hot
            ),
            sqs=SimSQS(fleet.queue, Caller(self.loop, link, Retries(2.0, 3))),  # type: ignore[arg-type]
            settings=settings,
            wall_ms=lambda: int((EPOCH + fleet.world.now) * 1000),
            tokens=token_source(random.Random(fleet.rng.getrandbits(64))),
        )
        self._busy: dict[str, asyncio.Task[None]] = {}
        self.streams: dict[str, int] = {}

    def url(self, connection_id: str) -> str:
        generation = self.streams.get(connection_id, 0)
        return upstreams.url(f"{connection_id}-s{generation}", self.fleet.shape.rate)

    def start(self, connection_id: str, *, new_stream: bool = False) -> None:
        self._submit(connection_id, self._start(connection_id, new_stream))

    def stop(self, connection_id: str) -> None:
        self._submit(connection_id, self._stop(connection_id))

    def _submit(self, connection_id: str, operation: Any) -> None:
        async def after(previous: asyncio.Task[None] | None) -> None:
            if previous is not None:
                await asyncio.wait([previous])
            await operation

        previous = self._busy.get(connection_id)
        self._busy[connection_id] = self.fleet.world.run_task(self.loop, after(previous))

    async def _start(self, connection_id: str, new_stream: bool) -> None:
        if new_stream:
            await self._stop(connection_id)
            self.streams[connection_id] = self.streams.get(connection_id, 0) + 1
        url = self.url(connection_id)
        loop = asyncio.get_running_loop()
        self.fleet.monitor.starting(connection_id)
        try:
            await loop.run_in_executor(None, self.service.start, connection_id, url)
        except Exception as error:
            self.fleet.monitor.event(f"router: start {connection_id} failed: {error!r}")
            return
        self.fleet.monitor.started(connection_id)

    async def _stop(self, connection_id: str) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(5):
            try:
                await loop.run_in_executor(None, self.service.stop, connection_id)
            except Exception as error:
                self.fleet.monitor.event(f"router: stop {connection_id} failed: {error!r}")
                await asyncio.sleep(0.5)
                continue
            self.fleet.monitor.stopped(connection_id)
            return


@dataclass
class Weather:
    """Faults that hold for every process at once."""

    index_lag: float = 0.0
    stale_by: float = 0.0


@dataclass
class Fleet:
    seed: int
    shape: Shape
    timing: LeaseTiming = field(default_factory=lambda: LeaseTiming.from_lease())

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.world = World(self.rng.getrandbits(64))
        install_asyncgen_hooks(self.world)
        self.network = Network(self.world, lambda: self.rng.uniform(0.0005, 0.003))
        self.engine = DynamoDBEngine()
        self.hot = HotKeys()
        setup = SimDynamoDBClient(self.engine, lambda: self.world.now)
        create_connection_table(setup, TABLE)  # type: ignore[arg-type]
        self.queue = SimQueue(self.world)
        self.weather = Weather()
        self.links: list[Link] = []
        self.monitor = Monitor(
            self.world,
            stop_bound=self.timing.heartbeat + 1.0,
            # The bound, a message interval of the feed, and a second to connect.
            dark_bound=self.timing.crash_failover_bound() + 1.0 / self.shape.rate + 1.0,
            # A page is written every checkpoint interval; two seconds for its write.
            checkpoint_bound=self.timing.checkpoint + 2.0,
            failover_bound=self.timing.crash_failover_bound(),
        )
        self.feeds = upstreams.Feeds(
            self.world.loop("upstreams"),
            self.network,
            accepted=self._accepted,
            closed=self._closed,
        )
        self.router = Router(self)
        self.processes: list[WorkerProcess] = []
        self._names = 0
        self.short_since: float | None = None
        self.last_fault_end = 0.0
        self.malformed: list[str] = []
        self.impaired: dict[str, float] = {}
        """Worker name -> until when it cannot be counted on to take connections: its
        process paused, its DynamoDB slowed or cut off."""
        self.log_triggers: list[tuple[str, str, Callable[[], None]]] = []
        """One-shot (process name, text, action): ``action`` runs, in the process's
        step, when that process logs a warning or an error containing ``text``."""
        """Connection items put malformed (the fault of that name)."""

    def hint_lost(self, body: str) -> None:
        """A start queue message received and never acted on: invisible for the
        visibility timeout, its connection waits for the sweep (docs/DESIGN.md
        §3.11), whose bound excuses its darkness."""
        connection_id = str(json.loads(body).get("connection_id", ""))
        now = self.world.now
        self.monitor.event(f"hint for {connection_id} lost", connection_id)
        self.monitor.excuse(now, now + sweep_bound(self.timing), connection_id)

    def _accepted(self, path: str, peer: str) -> None:
        connection_id, _, _ = path.rpartition("-s")
        self.monitor.streaming(connection_id, peer)

    def _closed(self, path: str, peer: str) -> None:
        connection_id, _, _ = path.rpartition("-s")
        self.monitor.stream_closed(connection_id, peer)

    def new_link(self) -> Link:
        rng = self.rng
        link = Link(self.world, lambda: rng.uniform(0.002, 0.012))
        link.index_lag = self.weather.index_lag
        link.stale_by = self.weather.stale_by
        self.links.append(link)
        return link

    def start_worker(self) -> WorkerProcess:
        self._names += 1
        process = WorkerProcess(self, f"w{self._names}")
        self.processes.append(process)
        self.monitor.event(f"worker {process.name} starts")
        self.capacity_changed()
        return process

    def pause(self, process: WorkerProcess, seconds: float) -> None:
        """Stop the process for ``seconds`` (SIGSTOP, a long collector pause)."""
        now = self.world.now
        self.world.pause(process.loop, seconds)
        self.monitor.paused(process.name, now, now + seconds)
        self.impair(process, now + seconds)

    def impair(self, process: WorkerProcess, until: float) -> None:
        """``process`` cannot be counted on to take connections until ``until``."""
        self.impaired[process.name] = max(self.impaired.get(process.name, 0.0), until)
        self.capacity_changed()
        self.world.at(until, self.capacity_changed)

    def not_held_by(self, worker: str, connection_ids: Sequence[str]) -> list[str]:
        """Those of ``connection_ids`` whose item ``worker`` does not hold now (read
        from the table's truth, outside every fault)."""
        client = SimDynamoDBClient(self.engine, lambda: self.world.now)
        found = []
        for connection_id in connection_ids:
            key = {
                schema.PARTITION_KEY: {"S": schema.partition_key(connection_id)},
                schema.SORT_KEY: {"S": schema.CONNECTION_SORT_KEY},
            }
            item = client.get_item(TableName=TABLE, Key=key, ConsistentRead=True).get("Item", {})
            if item.get(schema.LEASE_OWNER, {}).get("S") != worker:
                found.append(connection_id)
        return found

    def capacity_changed(self) -> None:
        """While the workers that can take connections have no room for every one, a
        connection may wait for room: darkness is excused until room is back. A
        worker paused, or whose DynamoDB is slow or cut off, is not counted: it may
        lose its session and be slow to keep a new one (a slow worker's connections
        are its own to keep running while the others have room, §3.11)."""
        now = self.world.now
        able = [p for p in self.alive() if self.impaired.get(p.name, 0.0) <= now]
        room = len(able) * self.shape.max_connections
        if room < self.shape.connections:
            if self.short_since is None:
                self.short_since = now
                self.monitor.event(f"fleet short of room: {room} slots")
        elif self.short_since is not None:
            self.monitor.excuse(self.short_since, now)
            self.monitor.event("fleet has room again")
            self.short_since = None
        self.monitor.short_since = self.short_since

    def alive(self) -> list[WorkerProcess]:
        return [p for p in self.processes if p.alive and not p.stop.is_set()]


def capture_logs(fleet: Fleet) -> logging.Handler:
    """Warnings and errors of the simulated processes go into the monitor's trail."""

    class ToTrail(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            loop = fleet.world.current
            who = loop.name if isinstance(loop, SimLoop) else "-"
            extra = record.__dict__
            about = " ".join(
                f"{key}={extra[key]}"
                for key in ("connection_id", "session_gen", "epoch", "error")
                if key in extra
            )
            message = record.getMessage()
            fleet.monitor.note(
                f"{who} {record.levelname} {message} {about}", extra.get("connection_id")
            )
            for trigger in fleet.log_triggers:
                if trigger[0] == who and trigger[1] in message:
                    fleet.log_triggers.remove(trigger)
                    trigger[2]()
                    break

    handler = ToTrail(logging.WARNING)
    return handler


@contextlib.contextmanager
def watched(fleet: Fleet) -> Iterator[None]:
    """While a run goes: the processes' warnings and errors go into the monitor's
    trail (:func:`capture_logs`), and the metrics' timestamps, the simulated wall
    clock's in another year, warn nothing."""
    handler = capture_logs(fleet)
    root = logging.getLogger()
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This metric doesn't meet")
            yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
