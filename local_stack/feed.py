"""Demo upstream WebSocket feed: sequenced, deterministic, resumable JSON messages, with
per-connection fault injection so tests can make an upstream misbehave on demand.

Run ``python -m local_stack.feed --host 127.0.0.1 --port 8765 [--rate 5]
[--api-key KEY | --api-key-file PATH]``. It prints ``feed listening on ws://HOST:PORT``
once listening and serves until SIGTERM or SIGINT, then closes every connection and
exits 0.

A client connects to ``ws://HOST:PORT/<feed name>?<query>``; the query parameters are
described on :func:`parse_request`. Each message is one JSON text frame::

    {"seq": 7, "feed": "feed-a", "sent_at_ms": 1767225600000, "value": 2893410213}

where ``value`` depends only on the feed name and ``seq``, so a client that resumes with
``from_seq`` sees exactly the messages it would have seen without the interruption.

Streams may also ask for what real upstreams do: a credential in the handshake
(``require_key=1``: the header ``X-Demo-Key`` must carry the feed's key, from
``--api-key``, ``--api-key-file`` (read at every handshake, so writing the file
rotates it) or ``DEMO_FEED_API_KEY``; otherwise HTTP 401), a subscribe frame before
anything is sent (``subscribe=1``), the sequence number in a field of another name
(``seq_field``), or a live stream that cannot resume (``live=1``). ``pad=N`` makes each
message a frame of about N bytes (a ``pad`` field of filler), for the sizes real feeds
send.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import math
import os
import re
import signal
import socket
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from local_stack.clock import now_ms

# Named explicitly: under `python -m` the module is `__main__`.
logger = logging.getLogger("local_stack.feed")

#: The frame ``garbage_after`` injects: text, but not JSON.
GARBAGE_FRAME = "\x00not json{"
#: Size in bytes (all ASCII, so also in characters) of the frame ``oversize_after`` injects.
OVERSIZE_BYTES = 2 * 1024 * 1024
#: Largest message a client may send. Clients are only expected to send control frames
#: (pongs, close), so anything bigger is a misbehaving client and gets closed with 1009.
CLIENT_MAX_SIZE = 1024
#: How often a muted connection checks whether it should go away, in seconds.
MUTE_POLL_S = 0.25
#: The header ``require_key=1`` streams must carry, with the feed's key.
KEY_HEADER = "X-Demo-Key"
#: The environment variable the feed's key may come from (``--api-key`` wins over it).
KEY_ENV = "DEMO_FEED_API_KEY"
#: How long a ``subscribe=1`` stream waits for the client's subscribe frame.
SUBSCRIBE_TIMEOUT_S = 10.0
#: The largest frame ``pad`` may ask for: the worker's default message limit.
MAX_PAD_BYTES = 1 << 20
#: The field ``pad`` fills.
PAD_FIELD = "pad"

_FAULT_PARAMS = (
    "drop_after",
    "close_after",
    "garbage_after",
    "oversize_after",
    "gap_after",
    "mute_after",
)
_KNOWN_PARAMS = frozenset(
    (
        "from_seq",
        "rate",
        "count",
        "refuse",
        "require_key",
        "subscribe",
        "seq_field",
        "live",
        "pad",
        *_FAULT_PARAMS,
    )
)
_FLAGS = {"1": True, "true": True, "0": False, "false": False}
_FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}(\.[A-Za-z_][A-Za-z0-9_]{0,31}){0,2}$")
_HTTP_STATUSES = frozenset(status.value for status in HTTPStatus)
_DIGITS = re.compile(r"[0-9]+")
# A close reason travels in a control frame of at most 125 bytes, two of them the code.
_MAX_REASON_BYTES = 123
# Linux `tcp_info.tcpi_state` value for an established connection (include/net/tcp_states.h).
_TCP_ESTABLISHED = 1


class FeedRequestError(ValueError):
    """The connection URL asks for something the feed cannot serve; the text says what."""


@dataclass(frozen=True, slots=True)
class FeedRequest:
    """What one connection asked for. Fault counters count feed messages (frames that
    carry a ``seq``) sent on this connection; ``None`` means the fault is off."""

    feed: str
    from_seq: int = 1
    rate: float = 5.0
    count: int | None = None
    drop_after: int | None = None
    close_after: int | None = None
    garbage_after: int | None = None
    oversize_after: int | None = None
    gap_after: int | None = None
    mute_after: int | None = None
    refuse: int | None = None
    """An HTTP status (400-599) that answers the handshake instead of a stream."""
    require_key: bool = False
    """The handshake must carry :data:`KEY_HEADER` with the feed's key (else HTTP 401)."""
    subscribe: bool = False
    """Nothing is sent before the client's subscribe frame (a JSON object; its integer
    ``from_seq``, if any, is where the stream starts)."""
    seq_field: str = "seq"
    """Where each message carries its number: a field name, or up to three names
    joined by dots for nested objects (``meta.n``: ``{"meta": {"n": 7}, ...}``)."""
    live: bool = False
    """A live stream: it starts at the current time's number (``now x rate``), not at
    ``from_seq``, so what was sent while a client was away is gone."""
    pad: int | None = None
    """Each message filled to a frame of this many bytes (:func:`message`)."""


def _parse_int(name: str, raw: str, minimum: int) -> int:
    # Only plain decimal digits: int() would also take "+5", " 5" and "5_000".
    if not _DIGITS.fullmatch(raw):
        raise FeedRequestError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    value = int(raw)
    if value < minimum:
        raise FeedRequestError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return value


def _parse_rate(raw: str) -> float:
    try:
        rate = float(raw)
    except ValueError:
        raise FeedRequestError(f"rate must be a number >= 0, got {raw!r}") from None
    if not math.isfinite(rate) or rate < 0:
        raise FeedRequestError(f"rate must be a finite number >= 0, got {raw!r}")
    return rate


def parse_request(path: str, default_rate: float) -> FeedRequest:
    """Validate a request target such as ``/feed-a?from_seq=3&rate=0``.

    The path, percent-decoded and without its leading ``/``, is the feed name; it must
    not be empty. Query parameters, each given at most once:

    - ``from_seq`` (int >= 1, default 1): first seq to send.
    - ``rate`` (float >= 0, default ``default_rate``): messages per second on this
      connection; 0 sends as fast as the client reads.
    - ``count`` (int >= 0): last seq to send; afterwards the connection stays open, idle.
    - ``drop_after=N``: abort the TCP connection (no close frame) after N messages.
    - ``close_after=N``: close normally (code 1000) after N messages.
    - ``garbage_after=N``: send one non-JSON text frame after N messages, then go on.
    - ``oversize_after=N``: send one 2 MiB text frame after N messages, then go on.
    - ``gap_after=N``: skip one seq after N messages, then go on.
    - ``mute_after=N``: after N messages stop reading the socket (pings go unanswered)
      and stop sending, keeping the TCP connection open.
    - ``refuse=STATUS`` (a known HTTP status 400-599): answer the opening handshake with this HTTP
      status instead of upgrading, as an upstream that refuses the path would.
    - ``require_key=1``: answer the handshake with HTTP 401 unless it carries the
      header ``X-Demo-Key`` with the feed's key.
    - ``subscribe=1``: send nothing until the client's first frame, a JSON object (its
      integer ``from_seq``, if any, replaces the URL's); close with 1008 without one
      within 10 s.
    - ``seq_field=NAME``: carry the number in ``NAME`` (``a.b`` nests) instead of ``seq``.
    - ``live=1``: start at the current time's number (``now x rate``, rate > 0),
      whatever ``from_seq`` says.
    - ``pad=N`` (int 0..1 MiB): a ``pad`` field of filler in each message, so its frame
      is N bytes (a message already that long gets none); ``seq_field`` must then
      not be ``pad``.

    All fault counts are ints >= 0. Raises :class:`FeedRequestError` for an unknown,
    repeated or malformed parameter, so a typo never silently turns a fault off.
    """
    parts = urlsplit(path)
    feed = unquote(parts.path).lstrip("/")
    if not feed:
        raise FeedRequestError("missing feed name: connect to /<feed name>")
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise FeedRequestError(f"malformed query {parts.query!r}") from None
    params: dict[str, str] = {}
    for name, raw in pairs:
        if name not in _KNOWN_PARAMS:
            raise FeedRequestError(f"unknown parameter {name!r}")
        if name in params:
            raise FeedRequestError(f"parameter {name!r} given twice")
        params[name] = raw

    def optional_int(name: str, minimum: int) -> int | None:
        return _parse_int(name, params[name], minimum) if name in params else None

    return FeedRequest(
        feed=feed,
        from_seq=optional_int("from_seq", 1) or 1,
        rate=_parse_rate(params["rate"]) if "rate" in params else default_rate,
        count=optional_int("count", 0),
        drop_after=optional_int("drop_after", 0),
        close_after=optional_int("close_after", 0),
        garbage_after=optional_int("garbage_after", 0),
        oversize_after=optional_int("oversize_after", 0),
        gap_after=optional_int("gap_after", 0),
        mute_after=optional_int("mute_after", 0),
        refuse=_parse_status(params["refuse"]) if "refuse" in params else None,
        require_key=_parse_flag(params, "require_key"),
        subscribe=_parse_flag(params, "subscribe"),
        seq_field=_parse_field(params.get("seq_field", "seq")),
        live=_parse_live(params, default_rate),
        pad=_parse_pad(params),
    )


def _parse_flag(params: dict[str, str], name: str) -> bool:
    raw = params.get(name, "0")
    if raw not in _FLAGS:
        raise FeedRequestError(f"{name} must be 1 or 0, got {raw!r}")
    return _FLAGS[raw]


def _parse_field(raw: str) -> str:
    if not _FIELD_PATH.match(raw) or raw.split(".")[0] in ("feed", "sent_at_ms", "value"):
        raise FeedRequestError(
            "seq_field must be a field name other than feed, sent_at_ms and value (up to "
            f"three joined by dots), got {raw!r}"
        )
    return raw


def _parse_live(params: dict[str, str], default_rate: float) -> bool:
    live = _parse_flag(params, "live")
    rate = _parse_rate(params["rate"]) if "rate" in params else default_rate
    if live and rate <= 0:
        raise FeedRequestError("live needs a rate > 0")
    return live


def _parse_pad(params: dict[str, str]) -> int | None:
    if "pad" not in params:
        return None
    pad = _parse_int("pad", params["pad"], 0)
    if pad > MAX_PAD_BYTES:
        raise FeedRequestError(f"pad must be at most {MAX_PAD_BYTES}, got {params['pad']!r}")
    if params.get("seq_field", "seq").split(".")[0] == PAD_FIELD:
        raise FeedRequestError("seq_field must not be pad when pad is given")
    return pad


def _parse_status(raw: str) -> int:
    status = _parse_int("refuse", raw, 400)
    # websockets answers only the statuses http.HTTPStatus names.
    if status > 599 or status not in _HTTP_STATUSES:
        raise FeedRequestError(f"refuse must be a known HTTP status 400-599, got {raw!r}")
    return status


def _refusal(
    connection: ServerConnection,
    request: Request,
    default_rate: float,
    api_key: Callable[[], str | None],
) -> Response | None:
    """The handshake's answer for ``refuse=STATUS`` or a missing or wrong key; None
    lets the handshake go on (a malformed request is refused by the handler, with a
    close reason)."""
    try:
        parsed = parse_request(request.path, default_rate)
    except FeedRequestError:
        return None
    if parsed.refuse is not None:
        logger.info("refused %r with HTTP %d", request.path, parsed.refuse)
        return connection.respond(parsed.refuse, f"refused: {parsed.refuse}\n")
    if parsed.require_key and not key_matches(request.headers.get(KEY_HEADER), api_key()):
        # The key itself is never logged, given or expected.
        logger.info("refused %r with HTTP 401: no valid %s", parsed.feed, KEY_HEADER)
        return connection.respond(401, f"{KEY_HEADER} missing or wrong\n")
    return None


def key_matches(given: str | None, expected: str | None) -> bool:
    """Whether the header ``given`` carries the feed's key (never without a key)."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def key_source(*, key: str | None = None, key_file: Path | None = None) -> Callable[[], str | None]:
    """Where the feed's key comes from: ``key_file`` (read at every handshake, so
    rewriting it rotates the key; None while it does not exist), else ``key``."""
    if key_file is None:
        return lambda: key or None

    def read() -> str | None:
        try:
            return key_file.read_text().strip() or None
        except OSError:
            return None

    return read


def feed_value(feed: str, seq: int) -> int:
    """The payload of message ``seq`` of ``feed``: the same for every connection, ever."""
    return zlib.crc32(f"{feed}\n{seq}".encode())


def message(
    feed: str, seq: int, now_ms: int, seq_field: str = "seq", pad: int | None = None
) -> str:
    """The JSON text of message ``seq`` of ``feed``, stamped with ``now_ms``; the number
    is in ``seq_field`` (dots nest). ``pad``: the text filled to that many bytes with a
    last field ``pad`` of ``x``s, when it is shorter than that with the field empty."""
    if seq_field == "seq":
        body: dict[str, Any] = {
            "seq": seq,
            "feed": feed,
            "sent_at_ms": now_ms,
            "value": feed_value(feed, seq),
        }
    else:
        *outer, last = seq_field.split(".")
        holder = body = {}
        for name in outer:
            holder = holder.setdefault(name, {})
        holder[last] = seq
        body.update(feed=feed, sent_at_ms=now_ms, value=feed_value(feed, seq))
    text = json.dumps(body, separators=(",", ":"))
    if pad is None:
        return text
    # The text is ASCII (json.dumps escapes the rest), so characters count as bytes.
    filler = pad - len(text) - len(f',"{PAD_FIELD}":""')
    if filler < 0:
        return text
    return f'{text[:-1]},"{PAD_FIELD}":"{"x" * filler}"}}'


def oversize_frame() -> str:
    """A JSON text frame of exactly :data:`OVERSIZE_BYTES` bytes that carries no seq."""
    head, tail = '{"pad":"', '"}'
    return head + "x" * (OVERSIZE_BYTES - len(head) - len(tail)) + tail


def _close_reason(text: str) -> str:
    return text.encode()[:_MAX_REASON_BYTES].decode(errors="ignore")


async def _closed_within(ws: ServerConnection, seconds: float) -> bool:
    """Wait up to ``seconds``; True as soon as the connection is closed.

    Waiting on the connection rather than sleeping lets a slow feed notice a client
    that left instead of holding the handler until its next send.
    """
    try:
        # wait_closed() shields its future, so the timeout cancels only this wait.
        await asyncio.wait_for(ws.wait_closed(), seconds)
    except TimeoutError:
        return False
    return True


def _peer_gone(ws: ServerConnection) -> bool:
    """Whether the kernel says the TCP connection is no longer established.

    A muted connection does not read, so the event loop never sees the client's FIN or
    RST; the socket state is the only way to learn that the client left.
    """
    tcp_info = getattr(socket, "TCP_INFO", None)
    sock = ws.transport.get_extra_info("socket")
    if tcp_info is None or sock is None:
        return False  # not Linux: the connection lingers until the server closes
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 8)[0]
    except OSError:
        return True
    return bool(state != _TCP_ESTABLISHED)


async def _stay_muted(ws: ServerConnection) -> None:
    """Stop reading and sending, but keep the TCP connection open.

    Ends when the connection is lost, the client has gone, or the server shuts down; in
    the last two cases the connection is aborted, since a close handshake needs reading.
    """
    ws.transport.pause_reading()
    while not await _closed_within(ws, MUTE_POLL_S):
        if not ws.server.is_serving() or _peer_gone(ws):
            ws.transport.abort()
            await ws.wait_closed()
            return


async def _stream(ws: ServerConnection, request: FeedRequest) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent = 0  # feed messages sent on this connection
    seq = math.floor(time.time() * request.rate) + 1 if request.live else request.from_seq
    while True:
        # Each fault fires exactly once per connection: `sent` takes each value once.
        # Injected frames go out before a terminating fault with the same N.
        if sent == request.garbage_after:
            await ws.send(GARBAGE_FRAME)
        if sent == request.oversize_after:
            await ws.send(oversize_frame())
        if sent == request.gap_after:
            seq += 1
        if sent == request.drop_after:
            logger.info("%s: drop after %d messages", request.feed, sent)
            ws.transport.abort()
            await ws.wait_closed()
            return
        if sent == request.close_after:
            logger.info("%s: close after %d messages", request.feed, sent)
            await ws.close(CloseCode.NORMAL_CLOSURE, "close_after")
            return
        if sent == request.mute_after:
            logger.info("%s: mute after %d messages", request.feed, sent)
            await _stay_muted(ws)
            return
        if request.count is not None and seq > request.count:
            # Idle but open: the client decides when to leave.
            await ws.wait_closed()
            return

        if request.rate > 0:
            # Due times come from the connection start, so time spent sending does not
            # accumulate into drift.
            delay = start + sent / request.rate - loop.time()
            if delay > 0 and await _closed_within(ws, delay):
                return
        else:
            # send() does not yield while the write buffer has room; without this, one
            # fast client would starve every other connection and the shutdown.
            await asyncio.sleep(0)
        await ws.send(message(request.feed, seq, now_ms(), request.seq_field, request.pad))
        sent += 1
        seq += 1


async def _handle(ws: ServerConnection, default_rate: float) -> None:
    if ws.request is None:  # pragma: no cover - the handler only runs after a handshake
        return
    try:
        request = parse_request(ws.request.path, default_rate)
    except FeedRequestError as exc:
        logger.info("refused %r: %s", ws.request.path, exc)
        await ws.close(CloseCode.POLICY_VIOLATION, _close_reason(str(exc)))
        return
    logger.info("open %r from %s", ws.request.path, ws.remote_address)
    # ConnectionClosed here means the client left mid-send: nothing to clean up.
    with contextlib.suppress(ConnectionClosed):
        if request.subscribe:
            subscribed = await _await_subscribe(ws, request)
            if subscribed is None:
                return
            request = subscribed
        await _stream(ws, request)
    logger.info("done %r", ws.request.path)


async def _await_subscribe(ws: ServerConnection, request: FeedRequest) -> FeedRequest | None:
    """The client's subscribe frame (a JSON object; its integer ``from_seq``, if any,
    is where the stream starts); None once the connection is closed for want of one."""
    try:
        frame = await asyncio.wait_for(ws.recv(), SUBSCRIBE_TIMEOUT_S)
    except TimeoutError:
        frame = None
    try:
        subscribe = json.loads(frame) if frame is not None else None
    except ValueError:
        subscribe = None
    if not isinstance(subscribe, dict):
        logger.info("%s: no subscribe frame", request.feed)
        await ws.close(CloseCode.POLICY_VIOLATION, "subscribe expected")
        return None
    start = subscribe.get("from_seq")
    if isinstance(start, int) and not isinstance(start, bool) and start >= 1:
        request = dataclasses.replace(request, from_seq=start)
    logger.info(
        "subscribed %r from_seq=%d keys=%s", request.feed, request.from_seq, sorted(subscribe)
    )
    return request


async def serve_feed(
    host: str,
    port: int,
    default_rate: float,
    *,
    api_key: Callable[[], str | None] = lambda: None,
) -> Server:
    """Start serving the feed on ``host:port`` (port 0 picks a free one) and return the
    listening server; stop it with ``server.close()`` then ``await server.wait_closed()``.

    ``default_rate`` (finite, >= 0) applies to connections that do not pass ``rate``;
    ``api_key`` says the key ``require_key=1`` streams need (:func:`key_source`).
    The server answers pings but sends none of its own, so tests decide when to ping.
    """
    if not math.isfinite(default_rate) or default_rate < 0:
        raise ValueError(f"default_rate must be a finite number >= 0, got {default_rate!r}")

    async def handler(ws: ServerConnection) -> None:
        await _handle(ws, default_rate)

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        return _refusal(connection, request, default_rate, api_key)

    return await serve(
        handler,
        host,
        port,
        process_request=process_request,
        ping_interval=None,
        compression=None,
        max_size=CLIENT_MAX_SIZE,
    )


def _rate_arg(raw: str) -> float:
    try:
        return _parse_rate(raw)
    except FeedRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def _run(host: str, port: int, rate: float, api_key: Callable[[], str | None]) -> None:
    server = await serve_feed(host, port, rate, api_key=api_key)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        bound_port = server.sockets[0].getsockname()[1]
        print(f"feed listening on ws://{host}:{bound_port}", flush=True)
        await stop.wait()
        logger.info("stopping")
    finally:
        server.close()
        await server.wait_closed()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description="Demo upstream WebSocket feed.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--rate", type=_rate_arg, default=5.0, help="default messages/s per connection"
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key",
        default=None,
        help=f"the {KEY_HEADER} value require_key=1 streams need (default: ${KEY_ENV})",
    )
    keys.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="read the key from this file at every handshake (rewrite it to rotate)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    source = key_source(key=args.api_key or os.environ.get(KEY_ENV), key_file=args.api_key_file)
    asyncio.run(_run(args.host, args.port, args.rate, source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
