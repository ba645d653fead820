"""The upstream keepalive against a real websockets server on loopback: a reader the
worker holds back keeps its upstream; a silent upstream is still given up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosedError
from websockets.protocol import OPEN

from worker.patient_connection import PatientConnection

PING_INTERVAL = 0.1
PING_TIMEOUT = 0.2
FRAMES = 400


async def flood(ws: ServerConnection) -> None:
    """Many frames at once (more than the reader's queue, so its reading pauses),
    then the connection stays open and answers pings."""
    for seq in range(1, FRAMES + 1):
        await ws.send(f'{{"seq": {seq}, "pad": "{"x" * 200}"}}')
    await ws.wait_closed()


async def read_after_a_stall(connection_class: type[ClientConnection]) -> tuple[int, str | None]:
    """Hold the reading back for ten ping timeouts, then read every frame: how many
    arrived, and why the connection closed, if it did."""
    async with serve(flood, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(
            f"ws://127.0.0.1:{port}",
            ping_interval=PING_INTERVAL,
            ping_timeout=PING_TIMEOUT,
            create_connection=connection_class,
        ) as ws:
            # The reader is paused once the frames pile up: the pong of every ping
            # sent meanwhile waits behind them in the socket.
            await asyncio.wait_for(_until(lambda: ws.recv_messages.paused), 5)
            await asyncio.sleep(10 * PING_TIMEOUT)
            received = 0
            try:
                while received < FRAMES:
                    await asyncio.wait_for(ws.recv(), 5)
                    received += 1
                # Pings go on after the stall and their pongs are seen.
                await asyncio.sleep(3 * PING_INTERVAL)
                await asyncio.wait_for(await ws.ping(), 5)
            except ConnectionClosedError as closed:
                return received, str(closed)
            return received, None


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():  # noqa: ASYNC110 - websockets has no event for a pause
        await asyncio.sleep(0.005)


async def test_a_reader_held_back_by_its_handler_keeps_its_upstream():
    assert await read_after_a_stall(PatientConnection) == (FRAMES, None)


async def test_websockets_own_keepalive_drops_it():
    """The fault this class fixes: the pong unread behind the frames counts as lost."""
    _, closed = await read_after_a_stall(ClientConnection)
    assert closed is not None
    assert "keepalive ping timeout" in closed


async def test_a_silent_upstream_is_still_given_up_within_interval_and_timeout():
    """The upstream stops reading (so it answers no ping) while the worker reads on."""
    silenced = asyncio.Event()

    async def go_silent(ws: ServerConnection) -> None:
        await ws.send('{"seq": 1}')
        ws.transport.pause_reading()
        silenced.set()
        await ws.wait_closed()

    async with serve(go_silent, "127.0.0.1", 0, close_timeout=0.1) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(
            f"ws://127.0.0.1:{port}",
            ping_interval=PING_INTERVAL,
            ping_timeout=PING_TIMEOUT,
            close_timeout=0.1,
            create_connection=PatientConnection,
        ) as ws:
            await ws.recv()
            await silenced.wait()
            started = time.monotonic()
            with pytest.raises(ConnectionClosedError, match="keepalive ping timeout"):
                await asyncio.wait_for(ws.recv(), 5)
            # Found within interval + timeout (0.3 s), give or take a busy machine.
            assert time.monotonic() - started < 2


@pytest.mark.parametrize("connection_class", [PatientConnection, ClientConnection])
async def test_a_close_cut_short_by_a_cancellation_still_closes_the_socket(connection_class):
    """A reader held back cannot see the peer's close frame, so the close waits for
    its timeout; cancelled meanwhile (the stop's cancellation and a handler call cut
    at its deadline reach one task), websockets' own close leaves the socket open."""
    async with serve(flood, "127.0.0.1", 0, close_timeout=0.1) as server:
        port = server.sockets[0].getsockname()[1]
        ws = await connect(
            f"ws://127.0.0.1:{port}",
            ping_interval=None,
            close_timeout=5,
            create_connection=connection_class,
        )
        try:
            await asyncio.wait_for(_until(lambda: ws.recv_messages.paused), 5)
            closing = asyncio.create_task(ws.close())
            await asyncio.wait_for(_until(lambda: ws.protocol.state is not OPEN), 5)
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            socket_closed = ws.transport.is_closing()
        finally:
            ws.transport.abort()
    if connection_class is ClientConnection:
        assert not socket_closed  # websockets' own: open until something else closes it
    else:
        assert socket_closed
