"""Simulated upstream feeds, served on the simulated network with websockets'
sans-I/O server (the workers' side is websockets' real client).

A stream is named by its URL path and starts when it is first connected to: seq ``n``
exists from ``start + n / rate``. A connection with ``from_seq=k`` gets every seq from
``k`` that exists at once, then each new one as it comes (json-seq, resumable). The
query also shapes the upstream: ``refuse=<status>`` answers the handshake with that
status, ``http10=1`` with an HTTP/1.0 answer, ``slow=<s>`` delays the answer,
``live=1`` sends messages without a ``seq`` (for the ``live`` protocol). At run time
the fault schedule can drop every connection of a stream, refuse it for a while,
answer it with HTTP/1.0 for a while, slow its handshakes, make it silent (no byte
at all, pongs included), or restart its numbering (a maintenance: the sockets close
and seqs start again from 1; a client asking for a seq the new numbering has not
reached gets it from 1). Each numbering is a stream of its own for the monitor:
``<path>@<run>`` from the second on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from sim.network import Network
from sim.runtime import SimLoop

HOST = "feed.sim"
PORT = 80


@dataclass
class Stream:
    path: str
    rate: float
    started_at: float
    refused_until: float = 0.0
    refuse_status: int = 503
    silent_until: float = 0.0
    http10_until: float = 0.0
    slow_until: float = 0.0
    slow_by: float = 0.0
    run: int = 1
    """Which numbering the stream is in (a restart begins the next)."""
    connections: set[FeedConnection] = field(default_factory=set)

    def last_seq(self, now: float) -> int:
        return int((now - self.started_at) * self.rate)


class Feeds:
    """Every stream the simulated upstream host serves."""

    def __init__(
        self,
        loop: SimLoop,
        network: Network,
        *,
        accepted: Callable[[str, str], None] | None = None,
        closed: Callable[[str, str], None] | None = None,
    ) -> None:
        """``accepted(path, peer)``: a client's subscription to a stream was accepted;
        ``closed(path, peer)``: that subscription ended (the client's close frame
        arrived, or the connection was lost), once per subscription."""
        self.loop = loop
        self.accepted = accepted
        self.closed = closed
        self.streams: dict[str, Stream] = {}
        network.listen(HOST, PORT, loop, lambda: FeedConnection(self))

    def stream(self, path: str, rate: float) -> Stream:
        stream = self.streams.get(path)
        if stream is None:
            stream = self.streams[path] = Stream(path, rate, self.loop.time())
        return stream

    # Faults

    def drop(self, path: str) -> None:
        stream = self.streams.get(path)
        for connection in list(stream.connections if stream else ()):
            connection.abort()

    def refuse(self, path: str, status: int, seconds: float) -> None:
        stream = self.streams.get(path)
        if stream is not None:
            stream.refuse_status = status
            stream.refused_until = self.loop.time() + seconds
            self.drop(path)

    def restart_numbering(self, path: str) -> None:
        """The service restarts: its sockets close and its seqs start again from 1."""
        stream = self.streams.get(path)
        if stream is not None:
            stream.run += 1
            stream.started_at = self.loop.time()
            self.drop(path)

    def silence(self, path: str, seconds: float) -> None:
        stream = self.streams.get(path)
        if stream is not None:
            stream.silent_until = self.loop.time() + seconds

    def answer_http10(self, path: str, seconds: float) -> None:
        """A proxy in front of the stream answers HTTP/1.0 (not a WebSocket upgrade)."""
        stream = self.streams.get(path)
        if stream is not None:
            stream.http10_until = self.loop.time() + seconds
            self.drop(path)

    def slow_handshakes(self, path: str, seconds: float, by: float) -> None:
        stream = self.streams.get(path)
        if stream is not None:
            stream.slow_until, stream.slow_by = self.loop.time() + seconds, by


def url(path: str, rate: float, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"rate": rate, **options}.items())
    return f"ws://{HOST}:{PORT}/{path}?{query}"


class FeedConnection(asyncio.Protocol):
    def __init__(self, feeds: Feeds) -> None:
        self._feeds = feeds
        self._loop = feeds.loop
        self._protocol = ServerProtocol()
        self._transport: asyncio.Transport | None = None
        self._stream: Stream | None = None
        self._sender: asyncio.Task[None] | None = None
        self._live = False
        self._subscribed: tuple[str, str] | None = None
        """(path, peer) once accepted, until ``Feeds.closed`` was told."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._protocol.receive_data(data)
        for event in self._protocol.events_received():
            if isinstance(event, Request):
                self._loop.create_task(self._handshake(event))
            elif isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                self._stop_sending()
                self._ended()
        self._flush()

    def eof_received(self) -> bool | None:
        self._protocol.receive_eof()
        self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_sending()
        self._ended()
        if self._stream is not None:
            self._stream.connections.discard(self)

    def _ended(self) -> None:
        subscribed, self._subscribed = self._subscribed, None
        if subscribed is not None and self._feeds.closed is not None:
            self._feeds.closed(*subscribed)

    def abort(self) -> None:
        self._stop_sending()
        if self._transport is not None:
            self._transport.abort()

    def _flush(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        stream = self._stream
        silent = stream is not None and stream.silent_until > self._loop.time()
        for data in self._protocol.data_to_send():
            if silent:
                continue
            if data:
                transport.write(data)
            else:
                transport.close()
                return

    def _stop_sending(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            self._sender = None

    async def _handshake(self, request: Request) -> None:
        parts = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = parts.path.lstrip("/")
        rate = float(query.get("rate", "1"))
        stream = self._feeds.stream(path, rate)
        slow = float(query.get("slow", "0"))
        if stream.slow_until > self._loop.time():
            slow = max(slow, stream.slow_by)
        if slow:
            await asyncio.sleep(slow)
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if query.get("http10") or stream.http10_until > self._loop.time():
            transport.write(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
            transport.close()
            return
        status = int(query.get("refuse", "0"))
        if not status and stream.refused_until > self._loop.time():
            status = stream.refuse_status
        if status:
            response = Response(status, "Refused", Headers(), b"refused\n")
            response.headers["Content-Length"] = str(len(response.body))
            self._protocol.send_response(response)
            self._flush()
            transport.close()
            return
        self._protocol.send_response(self._protocol.accept(request))
        self._flush()
        self._stream = stream
        stream.connections.add(self)
        peer = transport.get_extra_info("peername")[0]
        self._subscribed = (path, peer)
        if self._feeds.accepted is not None:
            self._feeds.accepted(path, peer)
        self._live = bool(query.get("live"))
        first = int(query.get("from_seq", "1"))
        if first > stream.last_seq(self._loop.time()) + 1:
            first = 1  # a seq of an earlier numbering: this one is sent from its start
        self._sender = self._loop.create_task(self._send_from(stream, max(first, 1)))

    async def _send_from(self, stream: Stream, seq: int) -> None:
        loop = self._loop
        while True:
            now = loop.time()
            last = stream.last_seq(now)
            if stream.silent_until <= now:
                while seq <= last:
                    self._protocol.send_text(self._message(seq).encode())
                    seq += 1
                self._flush()
            else:
                seq = max(seq, last + 1) if self._live else seq
            next_at = stream.started_at + (max(seq, last + 1)) / stream.rate
            await asyncio.sleep(max(next_at - now, 1e-6))

    def _message(self, seq: int) -> str:
        stream = self._stream
        path = "" if stream is None else stream.path
        if stream is not None and stream.run > 1:
            path = f"{path}@{stream.run}"
        if self._live:
            return json.dumps({"n": seq, "stream": path})
        return json.dumps({"seq": seq, "stream": path})
