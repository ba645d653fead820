"""Upstreams that enforce the rules real services document, served on loopback: each
closes the socket when the client breaks its rule, and counts it.

- ``client_silence``: close (4000) when the client sent no frame for that long;
- ``ping_every``: send a ping that often (``ping(stamp)``: ``{"ping": <ms>}`` by
  default) and close (4001) once ``unanswered_limit`` (2) are unanswered; the answer
  is a frame from which ``pong_stamp`` reads the same stamp (``{"pong": <ms>}`` by
  default);
- ``answer_client_pings``: answer a client's ``{"op": "ping"}`` with ``{"op": "pong"}``
  (``answers_left``: that many times, then never again, keeping the socket open);
- ``gzip``: every message as a gzip binary frame (pings too).

Messages are json-seq (``{"seq": n}``), resumed with ``from_seq`` in the URL, one every
``message_every`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed


@dataclass
class RuleUpstream:
    message_every: float = 0.2
    client_silence: float | None = None
    ping_every: float | None = None
    answer_client_pings: bool = False
    answers_left: int | None = None
    gzip: bool = False
    ping: Callable[[int], Any] = lambda stamp: {"ping": stamp}
    pong_stamp: Callable[[Any], Any] = lambda doc: (
        doc.get("pong") if isinstance(doc, dict) else None
    )
    unanswered_limit: int = 2
    url: str = ""
    connections: int = 0
    closes: list[str] = field(default_factory=list)
    """Why the server closed a socket, one entry per close."""
    client_frames: list[str] = field(default_factory=list)
    pongs_received: int = 0

    def _frame(self, value: object) -> str | bytes:
        text = json.dumps(value)
        return gzip.compress(text.encode()) if self.gzip else text

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.connections += 1
        query = parse_qs(urlsplit(ws.request.path).query)
        seq = int(query.get("from_seq", ["1"])[0])
        last_heard = time.monotonic()
        unanswered: list[int] = []

        async def listen() -> None:
            nonlocal last_heard
            async for frame in ws:
                last_heard = time.monotonic()
                text = frame if isinstance(frame, str) else frame.decode()
                self.client_frames.append(text)
                with contextlib.suppress(ValueError):
                    doc = json.loads(text)
                    stamp = self.pong_stamp(doc)
                    if stamp is not None and stamp in unanswered:
                        unanswered.remove(stamp)
                        self.pongs_received += 1
                    left = self.answers_left
                    if self.answer_client_pings and doc == {"op": "ping"} and left != 0:
                        if left is not None:
                            self.answers_left = left - 1
                        await ws.send(self._frame({"op": "pong"}))

        listener = asyncio.create_task(listen())
        next_message = next_ping = time.monotonic()
        try:
            while not listener.done():
                now = time.monotonic()
                if self.client_silence is not None and now - last_heard > self.client_silence:
                    self.closes.append("client silent")
                    await ws.close(4000, "no frame from the client")
                    break
                if len(unanswered) >= self.unanswered_limit:
                    self.closes.append("pings unanswered")
                    await ws.close(4001, "pings unanswered")
                    break
                if self.ping_every is not None and now >= next_ping:
                    stamp = int(now * 1000)
                    unanswered.append(stamp)
                    await ws.send(self._frame(self.ping(stamp)))
                    next_ping = now + self.ping_every
                if now >= next_message:
                    await ws.send(self._frame({"seq": seq}))
                    seq += 1
                    next_message = now + self.message_every
                await asyncio.sleep(0.01)
        except ConnectionClosed:
            pass
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await listener


class Served(Protocol):
    url: str

    async def handler(self, ws: ServerConnection) -> None: ...


S = TypeVar("S", bound=Served)


@contextlib.asynccontextmanager
async def serving(upstream: S) -> AsyncIterator[S]:
    """Serve ``upstream`` on loopback while the block runs; its ``url`` is set."""
    server = await serve(upstream.handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream.url = f"ws://127.0.0.1:{port}/feed"
    try:
        yield upstream
    finally:
        server.close()
        await server.wait_closed()
