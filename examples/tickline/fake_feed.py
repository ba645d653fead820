"""A fake of Tickline, the ticker feed the example plug-in speaks (protocol.py), to run
in a test's own event loop or on its own:

    python -m examples.tickline.fake_feed --port 9200 --api-key KEY --account ACCOUNT \\
        [--rate 10] [--host 127.0.0.1]

It prints ``tickline feed listening on ws://HOST:PORT/tickline`` once listening and
serves until SIGTERM or SIGINT.

- ``GET /session`` with ``X-Api-Key: <key>`` answers ``{"stream": "/stream/<ticket>"}``
  (HTTP 401 without the key). A ticket opens one stream: used again, or unknown, the
  handshake is refused with HTTP 403.
- On the stream, within 5 s, ``SUB <account> <channel> <from_seq>``; another account
  or frame closes it with 1008.
- Then ``D <seq> {"channel": ..., "price": ...}`` every ``1 / rate`` s from
  ``from_seq`` on (tick n of a channel is always the same), and ``P <nonce>`` every
  ``ping_every`` ticks; an answer other than ``O <nonce>`` closes it with 1008.
- The client sends ``H <anything>`` at least every ``heartbeat_timeout`` s, or the
  stream is closed with 4000.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import secrets
import signal
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

SUBSCRIBE_TIMEOUT_S = 5.0
NO_HEARTBEAT = 4000


def tick(channel: str, seq: int) -> dict[str, object]:
    """Tick ``seq`` of ``channel``: the same on every connection."""
    digest = zlib.crc32(f"{channel}\n{seq}".encode())
    return {"channel": channel, "price": round(100 + (digest % 2001 - 1000) / 100, 2)}


@dataclass
class Stream:
    """One stream as the feed saw it."""

    ticket: str
    subscribe: str | None = None
    sent: list[int] = field(default_factory=list)
    pongs: int = 0
    heartbeats: int = 0
    closed_because: str | None = None


@dataclass
class TicklineFeed:
    """The feed; ``close_after``: ticks per stream before the feed closes it (None:
    never), as a feed that rebalances its own servers would."""

    api_key: str
    account: str
    rate: float = 50.0
    ping_every: int = 5
    heartbeat_timeout: float = 2.0
    close_after: int | None = None
    quiet_after: int | None = None
    """Ticks after which a stream goes silent (neither ticks nor pings) but stays open."""
    sessions: int = 0
    refused_sessions: int = 0
    refused_tickets: int = 0
    streams: list[Stream] = field(default_factory=list)
    _tickets: dict[str, bool] = field(default_factory=dict)
    """Each ticket handed out, and whether a stream used it."""

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/session":
            if request.headers.get("X-Api-Key") != self.api_key:
                self.refused_sessions += 1
                return connection.respond(401, "X-Api-Key missing or wrong\n")
            self.sessions += 1
            ticket = secrets.token_hex(8)
            self._tickets[ticket] = False
            return connection.respond(200, json.dumps({"stream": f"/stream/{ticket}"}))
        ticket = path.removeprefix("/stream/")
        if not path.startswith("/stream/") or self._tickets.get(ticket, True):
            self.refused_tickets += 1
            return connection.respond(403, "no such ticket, or used already\n")
        self._tickets[ticket] = True
        return None

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        stream = Stream(ws.request.path.removeprefix("/stream/"))
        self.streams.append(stream)
        with contextlib.suppress(ConnectionClosed):
            try:
                frame = await asyncio.wait_for(ws.recv(), SUBSCRIBE_TIMEOUT_S)
            except TimeoutError:
                await ws.close(CloseCode.POLICY_VIOLATION, "no SUB")
                return
            stream.subscribe = str(frame)
            parts = stream.subscribe.split(" ")
            if len(parts) != 4 or parts[0] != "SUB" or parts[1] != self.account:
                await ws.close(CloseCode.POLICY_VIOLATION, "bad SUB")
                return
            channel, start = parts[2], int(parts[3])
            reading = asyncio.create_task(self._read(ws, stream))
            try:
                await self._send(ws, stream, channel, start, reading)
            finally:
                reading.cancel()

    async def _send(
        self,
        ws: ServerConnection,
        stream: Stream,
        channel: str,
        start: int,
        reading: asyncio.Task[None],
    ) -> None:
        for count, seq in enumerate(itertools.count(start), 1):
            if reading.done():
                return
            if self.quiet_after is not None and count > self.quiet_after:
                await reading  # silent from here on; the client's heartbeats still count
                return
            if self.close_after is not None and count > self.close_after:
                await ws.close()
                return
            await ws.send(f"D {seq} {json.dumps(tick(channel, seq))}")
            stream.sent.append(seq)
            if count % self.ping_every == 0:
                await ws.send(f"P {count}")
            await asyncio.sleep(1 / self.rate)

    async def _read(self, ws: ServerConnection, stream: Stream) -> None:
        """The client's heartbeats and pongs; a heartbeat missed closes the stream."""
        with contextlib.suppress(ConnectionClosed):
            await self._heartbeats(ws, stream)

    async def _heartbeats(self, ws: ServerConnection, stream: Stream) -> None:
        while True:
            try:
                frame = await asyncio.wait_for(ws.recv(), self.heartbeat_timeout)
            except TimeoutError:
                stream.closed_because = "no heartbeat"
                await ws.close(NO_HEARTBEAT, "no heartbeat")
                return
            if isinstance(frame, str) and frame.startswith("H "):
                stream.heartbeats += 1
            elif isinstance(frame, str) and frame.startswith("O "):
                stream.pongs += 1
            else:
                stream.closed_because = "unexpected frame"
                await ws.close(CloseCode.POLICY_VIOLATION, "unexpected frame")
                return


@contextlib.asynccontextmanager
async def serving(feed: TicklineFeed, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``feed`` in this event loop; yields the ``ws_url`` a start gives."""
    server: Server = await serve(feed.handler, host, port, process_request=feed.process_request)
    bound = server.sockets[0].getsockname()[1]
    try:
        yield f"ws://{host}:{bound}/tickline"
    finally:
        server.close()
        await server.wait_closed()


async def _main(args: argparse.Namespace) -> None:
    feed = TicklineFeed(api_key=args.api_key, account=args.account, rate=args.rate)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with serving(feed, args.host, args.port) as url:
        print(f"tickline feed listening on {url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A fake Tickline feed.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9200)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--account", required=True)
    parser.add_argument("--rate", type=float, default=10.0, help="ticks per second per stream")
    asyncio.run(_main(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
