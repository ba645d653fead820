"""websockets' client connection, with a keepalive that does not give up on an
upstream while the worker itself holds the reading back.

A handler slower than its feed pauses the socket's reading (websockets pauses it
while more than ``max_queue`` frames wait; docs/DESIGN.md §4.9). The pong of a
keepalive ping then waits in the socket buffer behind frames not read yet, and
websockets' own keepalive, which waits ``ping_timeout`` for it whatever the reading
does, closes a healthy upstream: under a slow sink every lagging connection was
dropped and opened again about every 25 s (BENCHMARKS.md, "A slow sink"). Here the
wait for a pong is judged only while the reading runs: a ping times out once
``ping_timeout`` has passed with the reading neither paused nor resumed in the last
``ping_timeout``. A silent upstream is still found within interval + timeout of the
moment the worker reads again.
"""

from __future__ import annotations

import asyncio
import logging

from websockets.asyncio.client import ClientConnection
from websockets.frames import CloseCode
from websockets.protocol import OPEN

log = logging.getLogger(__name__)


class PatientConnection(ClientConnection):
    """``connect(..., create_connection=PatientConnection)``."""

    _resumed_at: list[float]
    """Loop time the reading last resumed after a pause (one item)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assembler = self.recv_messages
        resume, clock = assembler.resume, self.loop.time
        # Shared with the closure rather than read through ``self``: the assembler
        # holding the connection would make a cycle only the collector breaks.
        resumed_at = self._resumed_at = [float("-inf")]

        def resumed() -> None:
            resumed_at[0] = clock()
            resume()

        assembler.resume = resumed

    def pong_overdue(self, now: float) -> bool:
        """Whether a pong not seen for ``ping_timeout`` counts as lost: only if the
        reading ran all that time (a pong read late is the worker's doing), or the
        connection is closing (nothing will read the frames in the way any more)."""
        if self.protocol.state is not OPEN:
            return True
        timeout = self.ping_timeout or 0.0
        return not self.recv_messages.paused and now - self._resumed_at[0] >= timeout

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """websockets' close, which leaves the socket open when it is cancelled while
        it waits for the close handshake (a reader cancelled twice: the stop and a
        handler call cut at its deadline); a reader held back cannot see the peer's
        close either, so nothing else would ever close it. Cancelled, it aborts."""
        try:
            await super().close(code, reason)
        except asyncio.CancelledError:
            self.transport.abort()
            raise

    async def keepalive(self) -> None:
        """websockets' keepalive (``Connection.keepalive``), with :meth:`pong_overdue`
        deciding what a timeout means."""
        assert self.ping_interval is not None
        latency = 0.0
        try:
            while True:
                await asyncio.sleep(self.ping_interval - latency)
                pong_received = asyncio.ensure_future(await self.ping())
                if self.ping_timeout is None:
                    continue
                latency = await self._wait_for_pong(pong_received, self.ping_timeout)
        except Exception:
            log.error("keepalive ping failed", exc_info=True)

    async def _wait_for_pong(self, pong_received: asyncio.Future[float], period: float) -> float:
        while True:
            done, _ = await asyncio.wait([pong_received], timeout=period)
            if done:
                latency: float = pong_received.result()
                return latency
            if self.pong_overdue(self.loop.time()):
                break
        async with self.send_context():
            self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
        raise AssertionError(
            "send_context() should wait for connection_lost(), which cancels keepalive()"
        )
