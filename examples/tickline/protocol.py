"""A protocol plug-in for Tickline, a ticker feed with its own framing: the worked
example of the protocol plug-in interface, version 1 (docs/PROTOCOLS.md).

Register it by name and start connections that name it::

    UPSTREAM_PROTOCOLS='{"tickline": "examples.tickline.protocol:factory"}'

    {"ws_url": "wss://feed.example.com/tickline",
     "auth": {"secret": "websocket-fleet/tickline"},
     "protocol": {"name": "tickline", "options": {"channel": "quotes"}}}

The secret holds ``{"api_key": "...", "account": "..."}``. What Tickline asks of a
client (fake_feed.py serves it):

- a **session** first: ``GET /session`` on the feed's host (``https`` for ``wss``)
  with ``X-Api-Key: <api_key>`` answers ``{"stream": "/stream/<ticket>"}``; a ticket
  is good for one connect (``resolve_url``);
- on the stream, before anything else, ``SUB <account> <channel> <from_seq>``
  (``open_frames``, which reads ``account`` from the secret);
- then text frames, one letter and a space first: ``D <seq> <json>`` a tick,
  ``P <nonce>`` the server's ping, answered ``O <nonce>`` (``decode``);
- from the client, ``H <wall ms>`` at least every few seconds, or the server closes
  the stream; a stream that goes quiet is left and connected again (``attached``).

Only the standard library and the interface's types: the session call is a small
HTTP/1.1 GET on asyncio's streams, so a thousand connections that connect at once
never wait on a thread. A plug-in of your own may use an HTTP client from its
handler directory's requirements instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from worker.upstream_protocol import (
    Frame,
    LinkPort,
    Message,
    OpenFrameError,
    Reply,
    ResolveUrlError,
    Unreadable,
)

DEFAULT_HEARTBEAT_SECONDS: Final = 1.0
DEFAULT_QUIET_SECONDS: Final = 10.0
MAX_SESSION_BYTES: Final = 64 * 1024
_OPTIONS: Final = frozenset({"channel", "heartbeat_seconds", "quiet_seconds"})


class TicklineProtocol:
    """One connection's Tickline protocol: made by :func:`factory`, then configured
    with the options of the connection's spec."""

    resumable = True
    """A new connection asks for what came after the checkpoint (``SUB``'s from_seq)."""

    def __init__(self) -> None:
        self.channel = ""
        self.heartbeat_seconds = DEFAULT_HEARTBEAT_SECONDS
        self.quiet_seconds = DEFAULT_QUIET_SECONDS
        self._link: LinkPort | None = None
        self._heard_at = 0.0

    def configure(self, options: Mapping[str, Any]) -> None:
        """``{"channel": str, "heartbeat_seconds"?: number, "quiet_seconds"?:
        number}``. The router checked only that they are a JSON object: what they
        mean is checked here, and a refusal parks the connection with this message."""
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"unknown options {sorted(unknown)} (known: {sorted(_OPTIONS)})")
        channel = options.get("channel")
        if not isinstance(channel, str) or not channel or " " in channel:
            raise ValueError("channel must be a non-empty string without spaces")
        self.channel = channel
        self.heartbeat_seconds = _seconds(options, "heartbeat_seconds", DEFAULT_HEARTBEAT_SECONDS)
        self.quiet_seconds = _seconds(options, "quiet_seconds", DEFAULT_QUIET_SECONDS)

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        # Tickline resumes through the SUB frame, not the URL.
        return ws_url

    def open_frames(self, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
        account = secret.get("account")
        if not isinstance(account, str) or not account or " " in account:
            # The attempt fails with this reason (it names the field, never a value).
            raise OpenFrameError("the secret has no usable account field")
        return [f"SUB {account} {self.channel} {last_seq + 1}"]

    async def resolve_url(self, ws_url: str, last_seq: int, secret: Mapping[str, Any]) -> str:
        """Ask the feed's host for a stream ticket; the stream's URL names it. Only
        the host of ``ws_url`` is called, the one the router's URL policy admitted."""
        api_key = secret.get("api_key")
        if not isinstance(api_key, str) or not api_key or not api_key.isprintable():
            raise ResolveUrlError("the secret has no usable api_key field")
        parts = urlsplit(ws_url)
        status, body = await _get(parts.scheme == "wss", parts.hostname or "", parts.port, api_key)
        if status != 200:
            raise ResolveUrlError(f"session refused: HTTP {status}")
        try:
            stream = json.loads(body)["stream"]
        except (ValueError, KeyError, TypeError):
            raise ResolveUrlError("session answer has no stream") from None
        if not isinstance(stream, str) or not stream.startswith("/"):
            raise ResolveUrlError("session answer has no stream path")
        return urlunsplit((parts.scheme, parts.netloc, stream, "", ""))

    def decode(self, data: str | bytes) -> Frame:
        if self._link is not None:
            self._heard_at = self._link.now()
        if not isinstance(data, str):
            return Unreadable("binary frame")
        kind, _, rest = data.partition(" ")
        if kind == "P" and rest:
            return Reply(f"O {rest}")
        if kind != "D":
            return Unreadable(f"unknown frame kind {kind[:8]!r}")
        number, _, body = rest.partition(" ")
        if not (number.isascii() and number.isdigit()) or int(number) < 1:
            return Unreadable("no seq >= 1")
        try:
            tick = json.loads(body)
        except ValueError:
            return Unreadable("tick is not JSON")
        return Message(int(number), tick)

    async def attached(self, link: LinkPort) -> None:
        """While a stream is open: a heartbeat every ``heartbeat_seconds`` (sent only
        while the worker holds the connection), and a stream quiet for
        ``quiet_seconds`` (no tick, no ping) is left, to be connected again."""
        self._link = link
        self._heard_at = link.now()
        try:
            while True:
                await asyncio.sleep(self.heartbeat_seconds)
                if link.now() - self._heard_at >= self.quiet_seconds:
                    await link.recycle("tickline stream went quiet")
                    return
                await link.send(f"H {link.wall_ms()}")
        finally:
            self._link = None


def factory() -> TicklineProtocol:
    """The registered factory: one call per connection (and one when the worker starts,
    to check it)."""
    return TicklineProtocol()


def _seconds(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.05 <= value <= 600:
        raise ValueError(f"{key} must be a number of seconds from 0.05 to 600")
    return float(value)


async def _get(secure: bool, host: str, port: int | None, api_key: str) -> tuple[int, bytes]:
    """``GET /session`` with the key; the status and the body (HTTP/1.1, one request
    on a connection of its own)."""
    context = ssl.create_default_context() if secure else None
    reader, writer = await asyncio.open_connection(
        host, port or (443 if secure else 80), ssl=context
    )
    try:
        writer.write(
            f"GET /session HTTP/1.1\r\nHost: {host}\r\nX-Api-Key: {api_key}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if length > MAX_SESSION_BYTES:
            raise ResolveUrlError("session answer too large")
        return status, await reader.readexactly(length)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
