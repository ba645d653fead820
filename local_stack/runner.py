"""``python -m local_stack``: the whole system on this machine, from nothing, with a live
view of the fleet (docs/DESIGN.md §7).

Order of things:

1. DynamoDB Local, moto (SQS and CloudWatch) and the demo feed start as child processes
   in their own sessions (:mod:`local_stack.services`), so a Ctrl-C in the terminal
   reaches only this runner, which decides the order in which everything stops.
2. The table ``connections``, the queue ``websocket-fleet-starts`` (with its DLQ) and
   the demo secret ``websocket-fleet/demo-feed`` (the feed's key for this run) are
   created, and the router's Lambda handler is served on the API port
   (:mod:`local_stack.api_server`) with ``ws://``, loopback upstreams and secrets under
   ``websocket-fleet/`` allowed. With ``--sink kinesis``, also the stream
   ``websocket-fleet-envelopes`` in moto and the dedup table ``websocket-fleet-dedup``,
   and the consumer that reads the one into the other (:mod:`local_stack.sink`).
3. N ``python -m worker`` processes start, also in their own sessions, configured
   through the environment exactly as a deployment configures them. With
   ``--handler-dir DIR --handler pkg.mod:factory`` they run that handler directory as
   the worker image would: on the interpreter of a virtualenv with the worker's pins
   and the directory's requirements (built before anything starts, kept in the state
   directory), the directory on their path after the repository. Each
   ``--upstream-protocol NAME=pkg.mod:factory`` registers a plug-in protocol: the
   workers and the router get the same ``UPSTREAM_PROTOCOLS``, as a deployment sets it.
4. The demo connections ``demo-1..demo-N`` are started through the router's HTTP API
   (``POST /connections``), as a user would.
5. The live view (or a summary line every few seconds) runs until SIGINT, SIGTERM or
   ``--duration``.
6. Shutdown: SIGTERM to every worker, wait for them (they release their leases with
   final checkpoints), report the leases still held (0 after a clean shutdown), then
   stop the router, the feed, moto and DynamoDB Local last.

Exit status: 0 when startup succeeded and, at shutdown, every worker still running
exited with status 0 after SIGTERM and no lease is left held; 1 otherwise (startup
failure, a port in use, a worker that had to be killed, a lease left behind); 2 for a
bad option or a handler directory whose requirements do not install; 130 when a second
signal aborted the startup. A worker that died while the stack ran is reported in the
view and at shutdown but does not by itself fail the run: killing workers to watch the
failover is part of the demo.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from fleetctl import check_handler, render
from fleetctl import client as fleet_api
from local_stack import fleet_view, services
from local_stack import sink as local_sink
from local_stack.clock import now_ms
from local_stack.fleet import Deployment, scan_raw
from local_stack.options import (
    Options,
    Ports,
    choose_ports,
    parse_args,
    port_unavailable,
)
from local_stack.process_env import (
    QUEUE_NAME,
    TABLE_NAME,
    Endpoints,
    demo_url,
    format_number,
)
from local_stack.resources import DEMO_KEY_HEADER, DEMO_SECRET
from local_stack.services import LOCAL_CREDENTIALS, LOCAL_REGION, LOOPBACK, ManagedProcess
from local_stack.stop_requests import Phase, StopRequests
from local_stack.workers import WORKER_READY_TIMEOUT_S, WorkerProcess, WorkerStartError, wait_ready
from worker import config as worker_settings
from worker.config import timing_from_env

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

#: How often the view reads the table and redraws.
REFRESH_S: Final = 1.0
#: How often a summary line is printed when there is no live view.
SUMMARY_EVERY_S: Final = 5.0
#: Least time workers get to release their leases after SIGTERM before SIGKILL; a
#: worker's own shutdown is bounded by its shutdown budget (docs/DESIGN.md §4.8), and the
#: deployment allows that plus a margin when it is longer.
WORKER_STOP_TIMEOUT_S: Final = 30.0
# Clients of the local servers fail fast: a dead server must not freeze the view.
_CLIENT_CONFIG = Config(
    connect_timeout=1, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"}
)
_POLL_S = 0.05
#: Worker settings the runner always sets: metrics every 10 s keep the logs readable,
#: and a short SQS long poll makes a worker's shutdown quick.
METRICS_INTERVAL_S: Final = 10
SQS_WAIT_S: Final = 2


class StartupError(RuntimeError):
    """The stack could not be brought up; the message says what and where to look."""


# --- options ---------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# --- the stack -------------------------------------------------------------------------


class LocalStack:
    """One run: start everything, watch, shut down. Use :meth:`run` once."""

    def __init__(self, options: Options, ports: Ports, stops: StopRequests) -> None:
        self.options = options
        self.ports = ports
        self.stops = stops
        self._servers: list[ManagedProcess] = []
        """DynamoDB Local, moto and the feed, as started."""
        self.deployment: Deployment | None = None
        """The table, queue, router and workers, once the servers run."""
        self.timing = timing_from_env(
            {} if options.lease_seconds is None else {"LEASE_SECONDS": repr(options.lease_seconds)}
        )
        self._ddb: DynamoDBClient | None = None
        self._table_ready = False
        self._queue_url = ""
        self._info: list[str] = []
        self._reported_dead: set[str] = set()
        self._stdout_open = True
        self._consumer: ManagedProcess | None = None
        """The sink consumer, with ``--sink``."""
        self._consumer_read = 0
        self._tally: str | None = None
        self._demo_key = secrets.token_urlsafe(18)
        """The demo feed's key for this run (require_key=1 streams), also held by the
        demo secret; never printed."""

    @property
    def servers(self) -> list[ManagedProcess]:
        """Started servers in start order, the router last (they stop in reverse)."""
        router = None if self.deployment is None else self.deployment.router
        return [*self._servers, *([] if router is None else [router])]

    @property
    def workers(self) -> list[WorkerProcess]:
        return [] if self.deployment is None else self.deployment.workers

    # -- output

    def _say(self, text: str, *, err: bool = False) -> None:
        stream = sys.stderr if err else sys.stdout
        if not err and not self._stdout_open:
            return
        try:
            print(text, file=stream, flush=True)
        except OSError:
            # A closed pipe (`| head`) must not stop the shutdown half-way.
            if not err:
                self._stdout_open = False

    def _write_raw(self, text: str) -> None:
        if not self._stdout_open:
            return
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError:
            self._stdout_open = False

    # -- run

    def run(self) -> int:
        """Bring the stack up, watch it until asked to stop, shut it down; the exit
        status (see the module docstring). Everything started is stopped on the way
        out, whatever happens in between."""
        failed = False
        try:
            try:
                self._start()
            except (
                StartupError,
                services.ServiceStartError,
                WorkerStartError,
                TimeoutError,
                OSError,
            ) as error:
                hint = " (choose other ports with --base-port)" if "in use" in str(error) else ""
                self._say(f"local stack: startup failed: {error}{hint}", err=True)
                failed = True
            except (BotoCoreError, ClientError) as error:
                self._say(f"local stack: setting up the table or queue failed: {error}", err=True)
                failed = True
            else:
                self.stops.phase = Phase.RUNNING
                if not self.stops.requested():
                    self._watch()
        finally:
            self.stops.phase = Phase.STOPPING
            clean = self._shutdown()
        return 0 if clean and not failed else 1

    # -- startup

    def _start(self) -> None:
        started = time.monotonic()
        log_dir = self.options.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self._say(f"local stack: state in {self.options.state_dir}, logs in {log_dir}")

        self._say(f"starting DynamoDB Local on {services.endpoint_url(self.ports.dynamodb)}")
        with self.stops.abortable():
            self._servers.append(services.start_dynamodb_local(self.ports.dynamodb, log_dir))
        if self.stops.requested():
            return
        services_of_moto = "SQS, CloudWatch" + (", Kinesis" if self.options.sink else "")
        self._say(f"starting moto ({services_of_moto}) on {services.endpoint_url(self.ports.moto)}")
        with self.stops.abortable():
            self._servers.append(
                services.start_moto_server(
                    self.ports.moto, log_dir, kinesis=self.options.sink is not None
                )
            )
        if self.stops.requested():
            return
        self._say(f"starting the demo feed on ws://{LOOPBACK}:{self.ports.feed}")
        with self.stops.abortable():
            self._servers.append(
                services.start_feed(
                    self.ports.feed, log_dir, self.options.rate, api_key=self._demo_key
                )
            )
        if self.stops.requested():
            return

        lease = self.options.lease_seconds
        endpoints = Endpoints.on_ports(self.ports.dynamodb, self.ports.moto)
        deployment = self.deployment = Deployment(
            endpoints,
            log_dir,
            table=TABLE_NAME,
            queue=QUEUE_NAME,
            health_dir=self.options.state_dir / "health",
            worker_defaults={
                worker_settings.METRICS_INTERVAL_SECONDS: str(METRICS_INTERVAL_S),
                worker_settings.SQS_WAIT_SECONDS: str(SQS_WAIT_S),
                # None: the worker's own default, whatever this shell sets.
                worker_settings.LEASE_SECONDS: None if lease is None else repr(lease),
                **handler_settings(self.options),
                **(local_sink.worker_settings_for(endpoints) if self.options.sink else {}),
            },
            client_config=_CLIENT_CONFIG,
            worker_python=worker_python(self.options),
            upstream_protocols=self.options.upstream_protocols,
        )
        self._ddb = deployment.ddb
        self._queue_url = deployment.create_resources().queue_url
        self._table_ready = True
        deployment.create_demo_secret(self._demo_key)
        if self.stops.requested():
            return
        if self.options.sink is not None:
            self._start_sink(endpoints)
            if self.stops.requested():
                return
        self._say(f"starting the router API on {self._api_url}")
        with self.stops.abortable():
            deployment.start_router(self.ports.api)
        if self.stops.requested():
            return

        self._say(f"starting {self.options.workers} workers")
        for index in range(1, self.options.workers + 1):
            worker_id = f"local-worker-{index}"
            deployment.launch_worker(
                worker_id, deployment.worker_env(worker_id), log_name=f"worker-{index}"
            )
        wait_ready(deployment.workers, WORKER_READY_TIMEOUT_S, give_up=self.stops.requested)
        if self.stops.requested():
            return

        self._start_demo_connections()
        self._info = self._describe(time.monotonic() - started)
        for line in self._info:
            self._say(line)

    def _start_sink(self, endpoints: Endpoints) -> None:
        """The stream in moto, and the consumer reading it into the dedup table (which
        it creates), stopped with the servers, after the workers: it reads what they
        wrote last before it exits."""
        kinesis = services.local_client("kinesis", endpoints.kinesis, config=_CLIENT_CONFIG)
        try:
            local_sink.create_stream(kinesis)
        finally:
            kinesis.close()
        self._say(
            f"starting the sink consumer on {local_sink.STREAM_NAME} "
            f"(dedup table {local_sink.DEDUP_TABLE})"
        )
        with self.stops.abortable():
            self._consumer = services.start_sink_consumer(
                self.options.log_dir,
                local_sink.consumer_env(os.environ, endpoints),
                stream=local_sink.STREAM_NAME,
                dedup_table=local_sink.DEDUP_TABLE,
            )
            self._servers.append(self._consumer)

    def _sink_tally(self) -> str | None:
        """The consumer's last ``tally`` line, if it printed one. Its log is read on
        from where the last call stopped: a busy consumer's tally lines are far apart."""
        if self._consumer is None:
            return self._tally
        try:
            with self._consumer.log_path.open("rb") as log:
                log.seek(self._consumer_read)
                chunk = log.read()
        except OSError:
            return self._tally
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._consumer_read += len(complete)
        for line in reversed(complete.decode(errors="replace").splitlines()):
            if line.startswith("tally "):
                self._tally = line
                break
        return self._tally

    @property
    def _api_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.api}"

    def _start_demo_connections(self) -> None:
        """Start demo-1..demo-N through the router's HTTP API, as a user would."""
        for index in range(1, self.options.connections + 1):
            if self.stops.requested():
                return
            connection_id = f"demo-{index}"
            url = demo_url(self.ports.feed, index, self.options.rate)
            assert self.deployment is not None
            try:
                self.deployment.start_connection(connection_id, url)
            except fleet_api.ClientError as error:
                raise StartupError(f"the router refused {connection_id}: {error}") from None

    def _describe(self, startup_s: float) -> list[str]:
        dynamodb = services.endpoint_url(self.ports.dynamodb)
        moto = services.endpoint_url(self.ports.moto)
        feed = f"ws://{LOOPBACK}:{self.ports.feed}"
        lease = self.timing
        count = self.options.connections
        connections = (
            "none" if count == 0 else ("demo-1" if count == 1 else f"demo-1..demo-{count}")
        )
        sink = []
        if self.options.sink is not None and self._consumer is not None:
            sink = [
                f"sink: {self.options.sink}, every message into the stream "
                f"{local_sink.STREAM_NAME} ({local_sink.SHARDS} shards, moto); the consumer "
                f"applies each once (dedup table {local_sink.DEDUP_TABLE}): "
                f"grep '^applied ' {self._consumer.log_path}",
            ]
        protocols = self.options.upstream_protocols
        plugins = (
            [
                "protocols: "
                + ", ".join(f"{name} ({factory})" for name, factory in sorted(protocols.items()))
                + ' registered; a start names one with "protocol": {"name": ..., "options": {...}}'
            ]
            if protocols
            else []
        )
        return [
            f"local stack up in {startup_s:.1f} s",
            # One machine-readable line: tests and scripts take the ports from here.
            f"endpoints: dynamodb={dynamodb} sqs={moto} cloudwatch={moto} feed={feed} "
            f"api={self._api_url}",
            f"table: {TABLE_NAME} | queue: {self._queue_url} (DLQ {QUEUE_NAME}-dlq)",
            f"workers: {self.options.workers} (lease {lease.lease:g} s, heartbeat "
            f"{lease.heartbeat:g} s) | connections: {connections} at "
            f"{format_number(self.options.rate)} msg/s each",
            f"logs: {self.options.log_dir} (worker-<i>.log, and one per server)",
            *sink,
            *plugins,
            f"credentials: the secret {DEMO_SECRET} holds the demo feed's {DEMO_KEY_HEADER} "
            f"for streams with require_key=1 (start them with "
            f'"auth": {{"secret": "{DEMO_SECRET}"}})',
            f"inspect: aws --endpoint-url {dynamodb} --region {LOCAL_REGION} dynamodb scan "
            f"--table-name {TABLE_NAME} (credentials {LOCAL_CREDENTIALS}/{LOCAL_CREDENTIALS})",
            f"try: curl -s -X POST {self._api_url}/connections -d "
            f'\'{{"ws_url": "ws://{LOOPBACK}:{self.ports.feed}/mine?rate=10"}}\'',
            "stop: Ctrl-C (workers release their leases first, the servers stop last)",
        ]

    # -- watching

    def _worker_statuses(self) -> list[fleet_view.WorkerStatus]:
        return [fleet_view.WorkerStatus(w.name, w.process.poll()) for w in self.workers]

    def _deaths(self, live: bool) -> list[str]:
        """Notes on workers and servers that ended while the stack runs; each is
        printed once (without a live view) and shown in every frame (with one)."""
        notes = []
        for process in [*self.workers, *self.servers]:
            status = process.process.poll()
            if status is None:
                continue
            note = f"! {process.name} exited unexpectedly (status {status}); see {process.log_path}"
            notes.append(note)
            if process.name not in self._reported_dead:
                self._reported_dead.add(process.name)
                if not live:
                    self._say(note)
        return notes

    def _scan(self) -> tuple[list[dict[str, Any]] | None, str]:
        """Every item of the table (connections, sessions, checkpoint pages) as views
        of the connections, the way the API shows them."""
        if self._ddb is None or not self._table_ready:
            return None, "the table was never created"
        try:
            raw = scan_raw(self._ddb, TABLE_NAME)
        except (BotoCoreError, ClientError) as error:
            return None, f"reading the table failed: {error}"
        return fleet_view.views_of_table(raw, now_ms()), ""

    def _watch(self) -> None:
        live = self.options.view and sys.stdout.isatty()
        began = time.monotonic()
        deadline = None if self.options.duration is None else began + self.options.duration
        next_summary = began + SUMMARY_EVERY_S
        if live:
            self._write_raw("\x1b[2J")
        while True:
            tick = time.monotonic()
            if self.stops.requested():
                assert self.stops.signal is not None
                reason = f"{self.stops.signal.name} received"
                break
            if deadline is not None and tick >= deadline:
                reason = f"--duration {format_number(self.options.duration or 0.0)} s elapsed"
                break
            notes = self._deaths(live)
            tally = self._sink_tally()
            views, error = self._scan()
            statuses = self._worker_statuses()
            if live:
                if views is None:
                    notes.append(f"! {error}")
                if tally is not None:
                    notes.insert(0, f"sink consumer: {tally}")
                body = [] if views is None else fleet_view.render_lines(views, statuses)
                self._draw(tick - began, notes, body)
            elif tick >= next_summary:
                next_summary += SUMMARY_EVERY_S
                if views is None:
                    self._say(f"! {error}")
                else:
                    up = _duration(tick - began)
                    sunk = "" if tally is None else f" | sink consumer: {tally}"
                    self._say(f"[{up}] {fleet_view.summary(views, statuses)}{sunk}")
            wake = tick + REFRESH_S if deadline is None else min(tick + REFRESH_S, deadline)
            while not self.stops.requested() and time.monotonic() < wake:
                time.sleep(min(_POLL_S * 2, max(0.0, wake - time.monotonic())))
        self._say(f"stopping: {reason}")

    def _draw(self, uptime_s: float, notes: list[str], body: list[str]) -> None:
        title = (
            f"websocket fleet, local | up {_duration(uptime_s)} | table {TABLE_NAME} | "
            f"refresh {REFRESH_S:g} s | Ctrl-C to stop"
        )
        frame = [title, *self._info[1:], "", *notes, *body]
        size = shutil.get_terminal_size()
        # A pseudo-terminal nobody sized reports 0 x 0: draw uncut rather than nothing.
        columns = size.columns if size.columns > 0 else 1000
        rows = size.lines if size.lines > 0 else 1000
        # One row short of the terminal: the cursor rests on the line after the frame, and
        # a frame as tall as the screen would scroll it and break the redraw in place.
        fitted = render.fit(frame, columns, rows - 1)
        # Home, rewrite each line clearing its old tail, clear below: no flicker.
        lines = "".join(f"{line}\x1b[K\n" for line in fitted)
        self._write_raw(f"\x1b[H{lines}\x1b[J")

    # -- shutdown

    def _shutdown(self) -> bool:
        """docs/DESIGN.md §7: workers first (they release their leases), servers last. Returns
        whether it was clean. Never raises before every server has been told to stop."""
        clean = True
        try:
            clean = self._stop_workers()
            if self._table_ready and self.workers:
                clean = self._report_leases() and clean
        finally:
            for server in reversed(self.servers):
                clean = self._stop_server(server) and clean
            tally = self._sink_tally()
            if tally is not None:
                self._say(f"sink consumer: {tally}")
            if self.deployment is not None:
                self.deployment.close_clients()
        if self.servers or self.workers:
            self._say("local stack stopped" + ("" if clean else " (not cleanly: see above)"))
        return clean

    def _stop_workers(self) -> bool:
        for worker in self.workers:
            if not worker.alive():
                self._say(
                    f"{worker.name} had already exited (status {worker.process.returncode}); "
                    f"see {worker.log_path}"
                )
        running = [worker for worker in self.workers if worker.alive()]
        if not running or self.deployment is None:
            return True
        bound = max(WORKER_STOP_TIMEOUT_S, self.deployment.stop_timeout)
        self._say(
            f"stopping {len(running)} workers: SIGTERM, then they release their leases with "
            f"final checkpoints (up to {bound:g} s; Ctrl-C again to kill them now)"
        )
        result = self.deployment.stop_workers(bound, hurry=lambda: self.stops.hurry)
        if result.killed:
            why = "interrupted again" if self.stops.hurry else f"still running after {bound:g} s"
            names = ", ".join(result.killed)
            self._say(f"{why}: SIGKILL to {names} (their leases lapse on their own)")
        statuses = ", ".join(f"{name}={status}" for name, status in result.statuses.items())
        self._say(f"workers stopped in {result.seconds:.1f} s (exit status: {statuses})")
        return result.clean

    def _report_leases(self) -> bool:
        views, error = self._scan()
        if views is None:
            self._say(f"leases still held: unknown ({error})")
            return False
        statuses = self._worker_statuses()
        self._say(f"after shutdown: {fleet_view.summary(views, statuses)}")
        held = [view for view in views if view.get("owner")]
        detail = ", ".join(f"{view['connection_id']} by {view['owner']}" for view in held)
        self._say(f"leases still held: {len(held)}" + (f" ({detail})" if detail else ""))
        return not held

    def _stop_server(self, server: ManagedProcess) -> bool:
        timeout = 2.0 if self.stops.hurry else 10.0
        try:
            status = server.stop(timeout=timeout)
        except Exception as error:
            self._say(f"stopping {server.name} failed: {error!r}", err=True)
            return False
        if status is None:
            self._say(f"{server.name} survived SIGKILL (pid {server.process.pid})", err=True)
            return False
        self._say(f"stopped {server.name}")
        return True


def handler_settings(options: Options) -> dict[str, str]:
    """``HANDLER``, and the handler directory on the workers' path after the
    repository (the image's order: the worker's packages first)."""
    settings = {} if options.handler is None else {worker_settings.HANDLER: options.handler}
    if options.handler_dir is not None:
        settings["PYTHONPATH"] = os.pathsep.join(
            [str(services.REPO_ROOT), str(options.handler_dir)]
        )
    return settings


#: What the workers are started with instead of an interpreter (``<it> -m worker``):
#: ``run-local.sh --containers`` sets a shim that runs each worker in the image.
WORKER_PYTHON_ENV: Final = "LOCAL_STACK_WORKER_PYTHON"


def worker_python(options: Options) -> str:
    """$LOCAL_STACK_WORKER_PYTHON, the handler directory's virtualenv, or this
    interpreter."""
    override = os.environ.get(WORKER_PYTHON_ENV)
    if override:
        return override
    if options.handler_dir is None:
        return sys.executable
    return str(check_handler.venv_python(options.handler_venv))


def prepare_handler(options: Options) -> bool:
    """Build (or reuse) the handler directory's virtualenv: the worker's pins and the
    handler's requirements, as the image installs them. False when that fails."""
    if options.handler_dir is None or os.environ.get(WORKER_PYTHON_ENV):
        return True  # (in the image, with its requirements, for --containers)
    print(
        f"local stack: handler {options.handler} from {options.handler_dir}; its virtualenv "
        f"is {options.handler_venv}",
        file=sys.stderr,
    )
    started = time.monotonic()
    try:
        built = check_handler.ensure_requirements(options.handler_venv, options.handler_dir)
    except check_handler.CheckFailedError as error:
        print(f"local stack: {error}", file=sys.stderr)
        return False
    if built:
        print(
            f"local stack: handler virtualenv built in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m local_stack``; returns the exit status (see the module docstring)."""
    options = parse_args(argv)
    if not prepare_handler(options):
        return 2
    ports = choose_ports(options.base_port)
    for port, what in ports.described():
        reason = port_unavailable(port)
        if reason is not None:
            print(
                f"local stack: port {LOOPBACK}:{port} for {what} is not available ({reason}). "
                "Stop whatever uses it, or choose other ports with --base-port P "
                "(P .. P+3 for DynamoDB Local, moto, the feed and the router API; "
                "--base-port 0 picks "
                "free ones).",
                file=sys.stderr,
            )
            return 1
    stops = StopRequests()
    stops.install()
    try:
        return LocalStack(options, ports, stops).run()
    except KeyboardInterrupt:
        # A second signal aborted a server's startup: that server stopped itself, and the
        # shutdown above stopped everything started before it.
        print("local stack: startup aborted; nothing is left running", file=sys.stderr)
        return 130
    finally:
        stops.restore()
