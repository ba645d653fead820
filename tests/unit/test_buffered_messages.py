"""The pump's reading of an upstream (``worker.message_pump.messages``) against a real
websockets server on loopback: it yields what websockets' own iteration yields, keeps
its flow control, and ends or fails as it does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosedError

from worker.message_pump import messages

FRAMES = 300
"""Far more than the reader's queue (16 frames): reading pauses and must resume."""


async def fragments() -> AsyncIterator[str]:
    for part in ('{"seq": ', '"frag', 'mented"}'):
        yield part


async def mixed(ws: ServerConnection) -> None:
    for seq in range(1, FRAMES + 1):
        await ws.send(f'{{"seq": {seq}, "pad": "{"é" * (seq % 7) * 40}"}}')
        if seq == 100:
            await ws.send(fragments())
            await ws.send(b"\x00\x01binary")
            await ws.send("")
    await ws.close()


async def invalid_text(ws: ServerConnection) -> None:
    await ws.send('{"seq": 1}')
    async with ws.send_context():
        ws.protocol.send_text(b"\xff\xfe not UTF-8")
    await ws.wait_closed()


Reader = Callable[[ClientConnection], Awaitable[list[str | bytes]]]


async def websockets_own(ws: ClientConnection) -> list[str | bytes]:
    return [data async for data in ws]


async def the_pumps(ws: ClientConnection) -> list[str | bytes]:
    return [data async for data in messages(ws)]


async def read_all(
    handler: Callable[[ServerConnection], Awaitable[None]], reader: Reader, *, pauses: bool
) -> Any:
    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", max_queue=16) as ws:
            if pauses:
                # The server sends everything at once: the client's queue fills and
                # its reading pauses before it reads anything.
                await asyncio.wait_for(_until(lambda: ws.recv_messages.paused), 5)
            try:
                return await asyncio.wait_for(reader(ws), 10)
            except ConnectionClosedError as error:
                return (
                    "failed",
                    error.sent.code if error.sent else None,
                    error.rcvd.code if error.rcvd else None,
                )


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():  # noqa: ASYNC110 - websockets has no event for a pause
        await asyncio.sleep(0.005)


async def test_every_message_as_websockets_yields_it_and_reading_resumes() -> None:
    ours = await read_all(mixed, the_pumps, pauses=True)
    assert ours == await read_all(mixed, websockets_own, pauses=True)
    assert len(ours) == FRAMES + 3
    assert ours[100:103] == ['{"seq": "fragmented"}', b"\x00\x01binary", ""]


async def test_text_that_is_not_utf8_fails_the_connection_as_websockets_does() -> None:
    ours = await read_all(invalid_text, the_pumps, pauses=False)
    assert ours == await read_all(invalid_text, websockets_own, pauses=False)
    assert ours == ("failed", 1007, None)  # invalid data; the socket closes before a reply
