"""Command line: ``python -m fleetctl [options] {start,stop,get,list,watch,check-handler}
...``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final, Protocol, TextIO

from fleetctl import check_handler, rates, render
from fleetctl.client import (
    API_URL_ENV,
    DEFAULT_API_URL,
    ApiError,
    ClientError,
    ConfigError,
    FleetClient,
    Signer,
    UnreachableError,
    needs_signing,
    signer_from_session,
)
from wsfleet.version import VERSION

EXIT_OK: Final = 0
EXIT_API_ERROR: Final = 1
"""The API answered with an error (the message names the HTTP status and error code)."""
EXIT_USAGE: Final = 2
"""Bad arguments, or signing needed without credentials or region."""
EXIT_UNREACHABLE: Final = 3
"""No answer from the API (for the local stack: it is probably not running)."""

_EPILOG = """\
target: --api URL, else $FLEET_API_URL, else http://127.0.0.1:8080 (the local stack,
started by ./scripts/run-local.sh). An https URL that is not this machine is a deployed
API: requests are signed with SigV4 (service execute-api), credentials and region come
from the usual AWS settings (--profile, AWS_PROFILE, AWS_REGION, ...).

exit status: 0 done, 1 the API refused or failed, 2 usage or missing credentials,
3 the API could not be reached.

examples:
  python -m fleetctl start ws://127.0.0.1:8765/demo --id demo-1
  python -m fleetctl start wss://feed.example.com/v1 --auth-secret websocket-fleet/acme
      --protocol '{"name": "json-field", "options": {"sequence": "/seq"}}'   (one line)
  python -m fleetctl list --state STARTED --all
  python -m fleetctl --json get demo-1
  python -m fleetctl watch --interval 0.5
  python -m fleetctl --api https://abc123.execute-api.eu-west-1.amazonaws.com stop demo-1
  python -m fleetctl check-handler examples/s3_archive/handler trade_archive.sink:factory
"""


_WATCH_COLUMNS = (
    "STATUS: streaming, connecting, backing_off (as the owner's checkpoint page says), "
    "failed (parked), pending (no live worker runs it yet), stopped. LAST MSG: time since "
    "the owner last handled a message of it. ERROR: what ended its last upstream "
    "connection, or why it was parked (xN: reconnects under this owner)."
)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _add_common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Options accepted before and after the command (``--json`` reads well at the end)."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--api",
        metavar="URL",
        default=default(None),
        help=f"router API base URL (default: ${API_URL_ENV}, else {DEFAULT_API_URL})",
    )
    parser.add_argument("--profile", default=default(None), help="AWS profile for signing")
    parser.add_argument("--region", default=default(None), help="AWS region for signing")
    parser.add_argument(
        "--sign",
        choices=("auto", "always", "never"),
        default=default("auto"),
        help="SigV4-sign requests: auto = for https URLs that are not loopback",
    )
    parser.add_argument(
        "--timeout", type=_positive_float, default=default(10.0), help="seconds per request"
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print the raw JSON answer"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Start, stop, inspect and watch fleet connections.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(parser, top=True)
    parser.add_argument(
        "--version", action="version", version=f"fleetctl (websocket-fleet) {VERSION}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        _add_common(sub, top=False)
        return sub

    start = command("start", "start a connection (idempotent)")
    start.add_argument("ws_url", metavar="URL", help="upstream WebSocket URL")
    start.add_argument("--id", dest="connection_id", help="connection id (default: generated)")
    start.add_argument("--metadata", type=_json_object, help="a JSON object stored with it")
    start.add_argument(
        "--auth-secret",
        metavar="NAME_OR_ARN",
        help="credentials by reference: a Secrets Manager secret under the deployment's "
        "ALLOWED_SECRET_PREFIX (sent as auth.secret)",
    )
    start.add_argument(
        "--protocol",
        type=_json_object,
        help='the upstream protocol, a JSON object: {"name": ..., "options": {...}}',
    )

    for name, text in (("stop", "stop a connection (idempotent)"), ("get", "show a connection")):
        command(name, text).add_argument("connection_id", metavar="ID")

    listing = command("list", "list connections")
    listing.add_argument("--state", choices=("STARTED", "STOPPED"))
    listing.add_argument("--limit", type=int, help="page size (the API allows 1-100)")
    listing.add_argument("--next-token", help="continue a listing where a page ended")
    listing.add_argument("--all", action="store_true", help="follow next_token to the end")

    watch = command("watch", "live view of the fleet (Ctrl-C quits)")
    watch.epilog = _WATCH_COLUMNS + " " + rates.RATE_LEGEND
    watch.add_argument("--interval", type=_positive_float, default=1.0, help="seconds")
    watch.add_argument("--state", choices=("STARTED", "STOPPED"))
    watch.add_argument("--count", type=int, default=0, help="stop after N refreshes")
    check_handler.add_parser(commands)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "check-handler":
        return check_handler.run(args, out)
    api_url = args.api or os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    try:
        client = FleetClient(api_url, signer=_signer(args, api_url), timeout=args.timeout)
        if args.command == "watch":
            return watch(client, args, out)
        answer = run(client, args)
    except ApiError as error:
        print(f"fleetctl: error: {error}", file=err)
        return EXIT_API_ERROR
    except UnreachableError as error:
        print(f"fleetctl: error: {error}", file=err)
        return EXIT_UNREACHABLE
    except ConfigError as error:
        print(f"fleetctl: error: {error}", file=err)
        return EXIT_USAGE
    _print(
        out, json.dumps(answer, indent=2, ensure_ascii=False) if args.json else show(args, answer)
    )
    return EXIT_OK


def _signer(args: argparse.Namespace, api_url: str) -> Signer | None:
    if args.sign == "never" or (args.sign == "auto" and not needs_signing(api_url)):
        return None
    return signer_from_session(api_url, profile=args.profile, region=args.region)


def run(client: FleetClient, args: argparse.Namespace) -> dict[str, Any]:
    if args.command == "start":
        return client.start(
            args.ws_url,
            connection_id=args.connection_id,
            metadata=args.metadata,
            auth=None if args.auth_secret is None else {"secret": args.auth_secret},
            protocol=args.protocol,
        )
    if args.command == "stop":
        return client.stop(args.connection_id)
    if args.command == "get":
        return client.get(args.connection_id)
    if args.all:
        return client.list_all(state=args.state, page_size=args.limit or 100)
    return client.list_page(state=args.state, limit=args.limit, next_token=args.next_token)


def show(args: argparse.Namespace, answer: dict[str, Any]) -> str:
    if args.command == "start":
        lines = [render.start_summary(answer), *render.connection_details(answer)]
    elif args.command == "stop":
        lines = [render.stop_summary(answer)]
    elif args.command == "get":
        lines = render.connection_details(answer)
    else:
        lines = render.connection_table(answer.get("connections", []))
        if answer.get("next_token"):
            lines.append(f"more: --all, or --next-token {answer['next_token']}")
    return "\n".join(lines)


def _print(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


class FleetListing(Protocol):
    """What ``watch`` needs of a client: :class:`FleetClient`, or a stand-in in tests."""

    @property
    def api_url(self) -> str: ...

    def list_all(self, *, state: str | None = None) -> dict[str, Any]: ...


def watch(
    client: FleetListing,
    args: argparse.Namespace,
    out: TextIO,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall_clock: Callable[[], datetime] = datetime.now,
) -> int:
    """Poll every ``--interval`` seconds and redraw (in place on a terminal, as plain
    blocks otherwise). The first failure ends it; later ones are shown and retried.
    Every column, MSG/S included, is what the API's views say (:mod:`fleetctl.rates`)."""
    tty = out.isatty()
    views: list[dict[str, Any]] = []
    frames = 0
    try:
        while True:
            polled_at = monotonic()
            error: str | None = None
            try:
                answer = client.list_all(state=args.state)
                views = list(answer.get("connections", []))
            except ClientError as failure:
                if frames == 0:
                    raise
                error = str(failure)
            if args.json:
                if error is None:
                    _print(out, json.dumps(answer, separators=(",", ":"), ensure_ascii=False))
            else:
                frame = render.WatchFrame(
                    api_url=client.api_url,
                    clock=wall_clock().strftime("%H:%M:%S"),
                    interval_s=args.interval,
                    views=views,
                    error=error,
                )
                _draw(out, tty, frame)
            frames += 1
            if args.count and frames >= args.count:
                return EXIT_OK
            sleep(max(0.0, args.interval - (monotonic() - polled_at)))
    except KeyboardInterrupt:
        if tty:
            out.write("\n")
        return EXIT_OK


def _draw(out: TextIO, tty: bool, frame: render.WatchFrame) -> None:
    lines = render.watch_lines(frame)
    if tty:
        size = shutil.get_terminal_size()
        # Home the cursor and clear the screen: the frame replaces the last one.
        out.write("\x1b[H\x1b[J" + "\n".join(render.fit(lines, size.columns, size.lines)))
        out.flush()
    else:
        _print(out, "\n".join(lines) + "\n")
