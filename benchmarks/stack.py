"""The embedded local stack for benchmarks and the chaos run: servers on free loopback
ports, one table and queue per deployment, worker processes, connections, and readers
of what the workers write (delivery records, JSON logs).

Everything started here is stopped by :meth:`LocalStack.close` (workers first, then the
feeds, moto and DynamoDB Local), which the context managers call on every way out,
Ctrl-C included. Servers and workers run in their own sessions, so a Ctrl-C reaches only
the benchmark, which then stops them in that order (DESIGN section 7).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
from botocore.config import Config

from local_stack import services
from local_stack.audit import Record, record_from_json
from local_stack.resources import create_connection_table, create_start_queue
from local_stack.services import LOCAL_CREDENTIALS, LOCAL_REGION, LOOPBACK, ManagedProcess
from wsfleet.desired_state import DesiredStateStore, StartOutcome
from wsfleet.start_messages import START, StartMessage

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

REPO_ROOT = services.REPO_ROOT
WORKER_START_TIMEOUT_S = 30.0
WORKER_STOP_TIMEOUT_S = 20.0
_POLL_S = 0.05
# The benchmark's own clients fail fast; they are not the system under test.
_CLIENT_CONFIG = Config(
    connect_timeout=2,
    read_timeout=10,
    retries={"mode": "standard", "max_attempts": 3},
    max_pool_connections=32,
)
# Environment the workers must not inherit (a profile or a global endpoint override
# would compete with the per-service endpoints set here).
_DROPPED_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
)

T = TypeVar("T")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_until(
    predicate: Callable[[], T | None], timeout: float, what: str, interval: float = _POLL_S
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; raise
    TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like a Ctrl-C does, so the
    ``finally`` blocks that stop child processes run on either."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- timing profiles -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Profile:
    """A named timing choice for workers: environment variables on top of the base."""

    name: str
    env: Mapping[str, str]


def ours(lease_seconds: float) -> Profile:
    """The project's defaults: only the lease is set; heartbeat and reconcile are
    lease/4, and a released lease is announced with a ``reassign`` message."""
    return Profile("ours", {"LEASE_SECONDS": repr(lease_seconds)})


def seed(lease_seconds: float) -> Profile:
    """The seed's timings scaled to ``lease_seconds``: reconcile every 3 x lease (60 s at
    a 20 s lease) and no ``reassign`` message on release."""
    return Profile(
        "seed",
        {
            "LEASE_SECONDS": repr(lease_seconds),
            "RECONCILE_SECONDS": repr(3 * lease_seconds),
            "REASSIGN_ON_RELEASE": "false",
        },
    )


# --- worker processes ------------------------------------------------------------------


def parse_log_time(raw: str) -> float:
    """Epoch seconds of a Powertools log ``timestamp`` (``2026-01-01 12:00:00,123+0000``)."""
    return datetime.strptime(raw.replace(",", "."), "%Y-%m-%d %H:%M:%S.%f%z").timestamp()


class JsonLinesTail:
    """Reads JSON lines appended to files since the last call; a line still being
    written (no newline yet) waits for the next call."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}

    def read(self, path: Path) -> list[dict[str, Any]]:
        """New complete JSON object lines of ``path`` (other lines are skipped)."""
        offset = self._offsets.get(path, 0)
        try:
            with path.open("rb") as stream:
                stream.seek(offset)
                chunk = stream.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offsets[path] = offset + end + 1
        found: list[dict[str, Any]] = []
        for line in chunk[: end + 1].splitlines():
            if not line.startswith(b"{"):
                continue
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
        return found


@dataclass
class WorkerProcess:
    """One ``python -m worker`` child process; its stdout (EMF) and stderr (JSON logs)
    go to ``log_path``."""

    worker_id: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    _tail: JsonLinesTail = field(default_factory=JsonLinesTail)
    _events: list[dict[str, Any]] = field(default_factory=list)
    _terminated: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` unless the process has already been reaped."""
        if signum == signal.SIGTERM:
            self._terminated = True
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    def terminate(self) -> None:
        """SIGCONT (it may be paused), then SIGTERM unless one was already sent: a
        second SIGTERM that arrives after the worker's event loop has closed (its
        handlers gone) would kill it on its way out."""
        self.signal(signal.SIGCONT)
        if not self._terminated:
            self.signal(signal.SIGTERM)

    def events(self) -> list[dict[str, Any]]:
        """Every JSON log line so far (read incrementally), oldest first."""
        self._events.extend(self._tail.read(self.log_path))
        return self._events

    def logged(self, message: str) -> list[dict[str, Any]]:
        return [event for event in self.events() if event.get("message") == message]

    def wait_started(self, timeout: float = WORKER_START_TIMEOUT_S) -> None:
        """Return once the worker logged "worker started"; raise if it exited first."""

        def ready() -> bool:
            if self.logged("worker started"):
                return True
            if not self.alive():
                raise RuntimeError(
                    f"worker {self.worker_id} exited with {self.popen.returncode}: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            return False

        wait_until(ready, timeout, f"worker {self.worker_id} to start")

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT_S) -> int | None:
        """:meth:`terminate`, wait ``timeout``, then SIGKILL. Returns the exit status
        (negative: killed by that signal)."""
        if self.popen.poll() is None:
            self.terminate()
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.popen.wait(timeout)


# --- the stack -------------------------------------------------------------------------


@dataclass
class Deployment:
    """One table and start queue, and the workers that serve them."""

    stack: LocalStack
    name: str
    table: str
    queue_url: str
    dlq_url: str
    work_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def record_dir(self) -> Path:
        return self.work_dir / "records"

    @property
    def control(self) -> DesiredStateStore:
        return DesiredStateStore(self.stack.ddb, self.table)

    def worker_env(
        self,
        worker_id: str,
        profile: Profile,
        *,
        handler: str = "benchmarks.handlers:recording_factory",
        dynamodb_endpoint: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The environment of one worker: local endpoints and credentials, this
        deployment's table and queue, the profile's timing, then ``extra``."""
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update(
            {
                "AWS_ACCESS_KEY_ID": LOCAL_CREDENTIALS,
                "AWS_SECRET_ACCESS_KEY": LOCAL_CREDENTIALS,
                "AWS_DEFAULT_REGION": LOCAL_REGION,
                "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint or self.stack.dynamodb_endpoint,
                "AWS_ENDPOINT_URL_SQS": self.stack.sqs_endpoint,
                "AWS_ENDPOINT_URL_CLOUDWATCH": self.stack.sqs_endpoint,
                "TABLE_NAME": self.table,
                "QUEUE_URL": self.queue_url,
                "WORKER_ID": worker_id,
                "SQS_WAIT_SECONDS": "1",
                "METRICS_INTERVAL_SECONDS": "5",
                "HEALTH_FILE": str(self.work_dir / f"{worker_id}.alive"),
                "HANDLER": handler,
                "RECORD_DIR": str(self.record_dir),
                "PYTHONPATH": str(REPO_ROOT),
                "PYTHONUNBUFFERED": "1",
                **profile.env,
                **(extra or {}),
            }
        )
        return env

    def launch_worker(self, worker_id: str, env: Mapping[str, str]) -> WorkerProcess:
        """Start a worker without waiting for it (see :meth:`WorkerProcess.wait_started`)."""
        log_path = self.work_dir / f"{worker_id}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "worker"],
                cwd=REPO_ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = WorkerProcess(worker_id, popen, log_path, time.time())
        self.workers.append(process)
        return process

    def start_workers(
        self, worker_ids: list[str], profile: Profile, **env_options: Any
    ) -> list[WorkerProcess]:
        """Launch several workers at once, then wait until each has started."""
        launched = [
            self.launch_worker(wid, self.worker_env(wid, profile, **env_options))
            for wid in worker_ids
        ]
        for process in launched:
            process.wait_started()
        return launched

    def live_workers(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def start_connection(self, connection_id: str, ws_url: str) -> StartOutcome:
        """What the router does: write the desired state, then send one start hint."""
        outcome = self.control.start(connection_id, ws_url, now_ms()).outcome
        if outcome.sends_start_message:
            self.stack.sqs.send_message(
                QueueUrl=self.queue_url, MessageBody=StartMessage(START, connection_id).to_body()
            )
        return outcome

    def stop_workers(self, timeout: float = WORKER_STOP_TIMEOUT_S) -> dict[str, int | None]:
        """Stop every worker still running (all signalled first, then waited for)."""
        running = [w for w in self.workers if w.alive()]
        for process in running:
            process.terminate()
        return {process.worker_id: process.stop(timeout) for process in running}


class LocalStack:
    """DynamoDB Local, moto (SQS) and ``feeds`` demo feed processes on free loopback
    ports, all started at once. Use as a context manager; :meth:`close` stops every
    worker of every deployment, then the servers."""

    def __init__(
        self, work_dir: Path, *, feeds: int = 1, feed_rate: float = 5.0, dynamodb: bool = True
    ) -> None:
        self.work_dir = work_dir
        self._feed_count = feeds
        self._feed_rate = feed_rate
        self._with_dynamodb = dynamodb
        self._servers: list[ManagedProcess] = []
        self.deployments: list[Deployment] = []
        self.dynamodb_endpoint = ""
        self.sqs_endpoint = ""
        self.feed_urls: list[str] = []
        self._ddb: DynamoDBClient | None = None
        self._sqs: SQSClient | None = None

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "servers"

    @property
    def ddb(self) -> DynamoDBClient:
        if self._ddb is None:
            raise RuntimeError("the stack has not been started")
        return self._ddb

    @property
    def sqs(self) -> SQSClient:
        if self._sqs is None:
            raise RuntimeError("the stack has not been started")
        return self._sqs

    @property
    def feed_processes(self) -> list[ManagedProcess]:
        return [s for s in self._servers if s.name.startswith("feed-")]

    def start(self) -> None:
        """Start the servers in parallel; raise (after stopping any that did start) if
        one fails."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        ddb_port, moto_port = services.free_port(), services.free_port()
        feed_ports = [services.free_port() for _ in range(self._feed_count)]
        with ThreadPoolExecutor(max_workers=2 + self._feed_count) as pool:
            futures: list[Future[ManagedProcess]] = []
            if self._with_dynamodb:
                futures.append(pool.submit(services.start_dynamodb_local, ddb_port, self.log_dir))
            futures.append(pool.submit(services.start_moto_server, moto_port, self.log_dir))
            futures.extend(
                pool.submit(services.start_feed, port, self.log_dir, self._feed_rate)
                for port in feed_ports
            )
            errors: list[BaseException] = []
            for future in futures:
                # Wait for every start, even after a failure or a Ctrl-C, so no server
                # is left running unrecorded.
                while True:
                    try:
                        self._servers.append(future.result())
                        break
                    except KeyboardInterrupt as error:
                        errors.append(error)
                    except Exception as error:
                        errors.append(error)
                        break
            if errors:
                raise errors[0]
        self.dynamodb_endpoint = services.endpoint_url(ddb_port)
        self.sqs_endpoint = services.endpoint_url(moto_port)
        self.feed_urls = [f"ws://{LOOPBACK}:{port}" for port in feed_ports]
        self._ddb = boto3.session.Session().client(
            "dynamodb",
            endpoint_url=self.dynamodb_endpoint,
            region_name=LOCAL_REGION,
            aws_access_key_id=LOCAL_CREDENTIALS,
            aws_secret_access_key=LOCAL_CREDENTIALS,
            config=_CLIENT_CONFIG,
        )
        self._sqs = boto3.session.Session().client(
            "sqs",
            endpoint_url=self.sqs_endpoint,
            region_name=LOCAL_REGION,
            aws_access_key_id=LOCAL_CREDENTIALS,
            aws_secret_access_key=LOCAL_CREDENTIALS,
            config=_CLIENT_CONFIG,
        )

    def deployment(self, name: str) -> Deployment:
        """A fresh table and start queue (names made unique) with a work directory."""
        suffix = uuid.uuid4().hex[:8]
        table = f"connections-{name}-{suffix}"
        create_connection_table(self.ddb, table)
        queues = create_start_queue(
            self.sqs, f"starts-{name}-{suffix}", max_receive_count=5, visibility_timeout=10
        )
        work_dir = self.work_dir / name
        work_dir.mkdir(parents=True, exist_ok=True)
        deployment = Deployment(self, name, table, queues.queue_url, queues.dlq_url, work_dir)
        self.deployments.append(deployment)
        return deployment

    def feed_url(
        self, name: str, params: Mapping[str, object] | None = None, *, index: int = 0
    ) -> str:
        """``ws://.../<name>?<params>`` on feed number ``index`` (modulo the count)."""
        params = params or {}
        query = "&".join(f"{key}={value}" for key, value in params.items())
        base = self.feed_urls[index % len(self.feed_urls)]
        return f"{base}/{name}" + (f"?{query}" if query else "")

    def close(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after a grace period), then the
        feeds, moto and DynamoDB Local. Idempotent; runs through a Ctrl-C."""
        pending: list[BaseException] = []
        for deployment in self.deployments:
            try:
                deployment.stop_workers()
            except BaseException as error:
                pending.append(error)
                for process in deployment.workers:
                    with contextlib.suppress(Exception):
                        process.popen.kill()
                        process.popen.wait(5)
        # Feeds first, DynamoDB Local last: workers are gone by now.
        for server in sorted(self._servers, key=_server_stop_order):
            try:
                server.stop()
            except BaseException as error:
                pending.append(error)
        self._servers = []
        for client in (self._ddb, self._sqs):
            if client is not None:
                client.close()
        self._ddb = self._sqs = None
        if pending:
            raise pending[0]


def _server_stop_order(server: ManagedProcess) -> int:
    for rank, prefix in enumerate(("feed-", "moto-", "dynamodb-local-")):
        if server.name.startswith(prefix):
            return rank
    return 0


def records_of(tail: JsonLinesTail, directory: Path) -> list[Record]:
    """New delivery records under ``directory`` since the last call with ``tail``."""
    found: list[Record] = []
    for path in sorted(directory.glob("*.jsonl")):
        found.extend(record_from_json(raw) for raw in tail.read(path))
    return found


class DeliveryTracker:
    """Follows the delivery records of one deployment as they are written: who handled
    each connection last, and when."""

    def __init__(self, record_dir: Path) -> None:
        self._dir = record_dir
        self._tail = JsonLinesTail()
        self.latest: dict[str, Record] = {}
        """Connection id -> its latest delivery."""

    def poll(self) -> list[Record]:
        """Records written since the last call (oldest first); updates :attr:`latest`."""
        found = sorted(records_of(self._tail, self._dir), key=lambda r: r.t)
        for record in found:
            self.latest[record.connection_id] = record
        return found

    def handled_by(self, worker_id: str) -> list[str]:
        """Connections whose latest delivery came from ``worker_id``."""
        return sorted(cid for cid, r in self.latest.items() if r.worker == worker_id)

    def flowing(self, connection_ids: list[str], within: float) -> bool:
        """Whether each of ``connection_ids`` had a delivery in the last ``within`` s."""
        self.poll()
        since = time.time() - within
        return all(cid in self.latest and self.latest[cid].t >= since for cid in connection_ids)
