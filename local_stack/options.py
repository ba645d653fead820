"""Command line of ``python -m local_stack``: options, ports, their validation."""

from __future__ import annotations

import argparse
import errno
import math
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from local_stack import services
from local_stack.services import LOOPBACK
from local_stack.sink import SINKS, Sink
from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.handler import WorkerHandler
from worker.config import ConfigError, timing_from_env
from wsfleet.protocol_registry import InvalidRegistryError, check_registry

DEFAULT_STATE_DIR: Final = services.REPO_ROOT / ".local"
DEFAULT_WORKERS: Final = 3
DEFAULT_CONNECTIONS: Final = 6
DEFAULT_RATE: Final = 5.0


@dataclass(frozen=True, slots=True)
class Ports:
    """Loopback ports of the four servers."""

    dynamodb: int
    moto: int
    feed: int
    api: int

    def described(self) -> list[tuple[int, str]]:
        return [
            (self.dynamodb, "DynamoDB Local"),
            (self.moto, "moto (SQS, CloudWatch)"),
            (self.feed, "the demo feed"),
            (self.api, "the router API"),
        ]


DEFAULT_PORTS: Final = Ports(dynamodb=8000, moto=5000, feed=8765, api=8080)


@dataclass(frozen=True, slots=True)
class Options:
    """The command line, validated."""

    workers: int = DEFAULT_WORKERS
    connections: int = DEFAULT_CONNECTIONS
    rate: float = DEFAULT_RATE
    lease_seconds: float | None = None
    """None: the worker's own default (2.2 s)."""
    state_dir: Path = DEFAULT_STATE_DIR
    view: bool = True
    duration: float | None = None
    base_port: int | None = None
    """None: the fixed ports; 0: four free ports; P: P, P+1, P+2, P+3."""
    handler: str | None = None
    """The workers' ``HANDLER``; None: the caller's environment decides."""
    handler_dir: Path | None = None
    """A handler directory the workers run ``handler`` from, as the worker image does:
    on their path, with its requirements installed next to the worker's pins in a
    virtualenv of its own (:attr:`handler_venv`)."""
    sink: Sink | None = None
    """A built-in sink the workers write every message to, on the local servers, with
    a consumer that takes each message once (:mod:`local_stack.sink`)."""
    upstream_protocols: Mapping[str, str] = field(default_factory=dict)
    """Plug-in protocols by name (``UPSTREAM_PROTOCOLS``), for the workers and the
    router alike."""

    @property
    def handler_venv(self) -> Path:
        """Kept between runs, rebuilt when the requirements change."""
        return self.state_dir / "handler-venv"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"


def whole_number(raw: str, *, minimum: int = 0) -> int:
    """An argparse type: a whole number of at least ``minimum``."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {raw!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def _finite(raw: str, *, minimum: float, inclusive: bool) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
        bound = ">=" if inclusive else ">"
        raise argparse.ArgumentTypeError(
            f"must be a finite number {bound} {minimum:g}, got {raw!r}"
        )
    return value


def _rate(raw: str) -> float:
    return _finite(raw, minimum=0.0, inclusive=True)


def _seconds(raw: str) -> float:
    return _finite(raw, minimum=0.0, inclusive=False)


def _lease_seconds(raw: str) -> float:
    value = _seconds(raw)
    # The same validation the workers apply at start, so a bad value fails here and not
    # as N workers exiting with a configuration error.
    try:
        timing_from_env({"LEASE_SECONDS": repr(value)})
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _protocol_entry(raw: str) -> tuple[str, str]:
    """``NAME=PKG.MOD:FACTORY``, one entry of ``UPSTREAM_PROTOCOLS``."""
    name, sep, factory = raw.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=PKG.MOD:FACTORY, got {raw!r}")
    try:
        check_registry({name.strip(): factory.strip()})
    except InvalidRegistryError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return name.strip(), factory.strip()


def _base_port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {raw!r}") from None
    if value != 0 and not 1 <= value <= 65535 - 3:
        raise argparse.ArgumentTypeError(f"must be 0 or 1..65532 (P+3 must be a port), got {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Parse the command line; argparse exits with status 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m local_stack",
        description=(
            "Run the WebSocket worker fleet locally: DynamoDB Local, moto (SQS, CloudWatch), "
            "a demo feed and N workers, with demo connections and a live view of the table. "
            "Ctrl-C stops everything in order: workers first (they release their leases), "
            "servers last."
        ),
    )
    parser.add_argument(
        "--workers", type=whole_number, default=DEFAULT_WORKERS, help="worker processes (default 3)"
    )
    parser.add_argument(
        "--connections",
        type=whole_number,
        default=DEFAULT_CONNECTIONS,
        help="demo connections demo-1..demo-N (default 6)",
    )
    parser.add_argument(
        "--rate",
        type=_rate,
        default=DEFAULT_RATE,
        help="feed messages per second per connection (default 5; 0 = as fast as possible)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=_lease_seconds,
        default=None,
        help="LEASE_SECONDS for the workers (default: the worker's own, 2.2); "
        "e.g. 6 makes failover quick enough to watch",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where logs and health stamps go (default: .local/ at the repository root)",
    )
    parser.add_argument(
        "--no-view",
        dest="view",
        action="store_false",
        help="no live table: print a one-line summary every 5 s instead",
    )
    parser.add_argument(
        "--duration",
        type=_seconds,
        default=None,
        help="run this many seconds once everything is up, then shut down as on Ctrl-C",
    )
    parser.add_argument(
        "--base-port",
        type=_base_port,
        default=None,
        help="use ports P, P+1, P+2, P+3 for DynamoDB Local, moto, the feed and the router "
        "API instead of 8000, 5000, 8765, 8080; 0 picks four free ports",
    )
    parser.add_argument(
        "--handler",
        metavar="PKG.MOD:FACTORY",
        help="HANDLER of the workers (default: $HANDLER, else each message is logged)",
    )
    parser.add_argument(
        "--handler-dir",
        type=Path,
        metavar="DIR",
        help="a handler directory (its packages and an optional requirements.txt) the "
        "workers run --handler from, as the worker image would: its requirements go into "
        "a virtualenv of their own with the worker's pins (STATE_DIR/handler-venv)",
    )
    parser.add_argument(
        "--sink",
        choices=SINKS,
        help="the workers write every message to this built-in sink (kinesis: a stream in "
        "moto), and a consumer process takes each one once through the deduper, printing "
        "one line per message applied (STATE_DIR/logs/sink-consumer.log)",
    )
    parser.add_argument(
        "--upstream-protocol",
        dest="upstream_protocols",
        type=_protocol_entry,
        action="append",
        default=[],
        metavar="NAME=PKG.MOD:FACTORY",
        help="register a plug-in protocol that starts may name (repeat for more): "
        "UPSTREAM_PROTOCOLS of the workers and of the router; the factory is imported "
        "from the repository or from --handler-dir",
    )
    args = parser.parse_args(argv)
    protocols = dict(args.upstream_protocols)
    if len(protocols) < len(args.upstream_protocols):
        parser.error("--upstream-protocol: a name is registered twice")
    try:
        check_registry(protocols)
    except InvalidRegistryError as error:
        parser.error(f"--upstream-protocol: {error}")
    if args.sink is not None and (args.handler is not None or args.handler_dir is not None):
        parser.error("--sink sets the workers' handler: give --sink or --handler, not both")
    if args.handler_dir is not None:
        if args.handler is None:
            parser.error("--handler-dir needs --handler, the factory (pkg.module:factory)")
        try:
            WorkerHandler.from_directory(args.handler_dir, args.handler)
        except FleetOptionsError as error:
            parser.error(f"--handler-dir: {error.reason}")
    return Options(
        workers=args.workers,
        connections=args.connections,
        rate=args.rate,
        lease_seconds=args.lease_seconds,
        state_dir=args.state_dir.resolve(),
        view=args.view,
        duration=args.duration,
        base_port=args.base_port,
        handler=args.handler,
        handler_dir=None if args.handler_dir is None else args.handler_dir.resolve(),
        sink=args.sink,
        upstream_protocols=protocols,
    )


# --- pure helpers ----------------------------------------------------------------------


def choose_ports(base_port: int | None) -> Ports:
    """The fixed ports for None, four distinct free ports for 0, else P .. P+3."""
    if base_port is None:
        return DEFAULT_PORTS
    if base_port == 0:
        picked: list[int] = []
        while len(picked) < 4:
            port = services.free_port()
            if port not in picked:  # the OS may hand the same one out twice
                picked.append(port)
        return Ports(*picked)
    return Ports(base_port, base_port + 1, base_port + 2, base_port + 3)


def port_unavailable(port: int) -> str | None:
    """Why a server could not listen on ``127.0.0.1:port``, or None if it could.

    Binds with SO_REUSEADDR, as the servers do, so the TIME_WAIT leftovers of a previous
    run do not count as busy while a live listener (on any local address) does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as error:
            return (
                "already in use"
                if error.errno == errno.EADDRINUSE
                else (error.strerror or str(error))
            )
    return None
