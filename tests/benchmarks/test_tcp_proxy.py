"""The chaos run's TCP proxy on loopback: pass, blackhole, delay and heal, the order of
late chunks, half-close, and the thread-safe host used by synchronous code."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from benchmarks.tcp_proxy import Mode, ProxyThread, TcpProxy
from tests.support.timing import scaled

pytestmark = pytest.mark.timeout(scaled(30))

# Long enough for a loaded machine, short enough that a hang fails fast.
ANSWER_TIMEOUT_S = scaled(5.0)
QUIET_S = 0.3
"""How long "nothing arrives" is watched for."""


@dataclass
class Upstream:
    """A line server: echoes each line back and remembers the order lines arrived in."""

    server: asyncio.Server
    arrived: list[bytes] = field(default_factory=list)
    eof_seen: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def port(self) -> int:
        port: int = self.server.sockets[0].getsockname()[1]
        return port


async def start_upstream() -> Upstream:
    upstream: Upstream

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                upstream.arrived.append(line)
                writer.write(line)
                await writer.drain()
            upstream.eof_seen.set()
        finally:
            writer.close()

    upstream = Upstream(await asyncio.start_server(serve, "127.0.0.1", 0))
    return upstream


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = await start_upstream()
    yield up
    up.server.close()
    await up.server.wait_closed()


@pytest.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[TcpProxy]:
    p = TcpProxy("127.0.0.1", upstream.port)
    await p.start()
    yield p
    await p.close()


async def dial(proxy: TcpProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def answer(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readline(), ANSWER_TIMEOUT_S)


async def read_by_proxy(proxy: TcpProxy, count: int) -> None:
    """Wait until the proxy has read ``count`` bytes (and so stamped their due time)."""
    deadline = asyncio.get_running_loop().time() + ANSWER_TIMEOUT_S
    while proxy.stats.bytes_read < count:
        assert asyncio.get_running_loop().time() < deadline, "the proxy read nothing"
        await asyncio.sleep(0.01)


async def stays_quiet(reader: asyncio.StreamReader) -> bool:
    try:
        await asyncio.wait_for(reader.readline(), QUIET_S)
    except TimeoutError:
        return True
    return False


async def test_pass_forwards_both_ways(proxy: TcpProxy, upstream: Upstream) -> None:
    reader, writer = await dial(proxy)
    writer.write(b"hello\n")
    assert await answer(reader) == b"hello\n"
    assert upstream.arrived == [b"hello\n"]
    assert proxy.mode is Mode.PASS
    writer.close()


async def test_blackhole_accepts_and_holds_until_heal(proxy: TcpProxy, upstream: Upstream) -> None:
    proxy.blackhole()
    reader, writer = await dial(proxy)  # still accepted
    writer.write(b"held\n")
    assert await stays_quiet(reader)
    assert upstream.arrived == []
    proxy.heal()
    # Held data is delivered on heal, as TCP retransmission would deliver it.
    assert await answer(reader) == b"held\n"
    writer.close()


async def test_blackhole_also_holds_open_connections(proxy: TcpProxy, upstream: Upstream) -> None:
    reader, writer = await dial(proxy)
    writer.write(b"one\n")
    assert await answer(reader) == b"one\n"
    proxy.blackhole()
    writer.write(b"two\n")
    assert await stays_quiet(reader)
    proxy.heal()
    assert await answer(reader) == b"two\n"
    writer.close()


async def test_delay_holds_each_direction(proxy: TcpProxy) -> None:
    delay = 0.25
    proxy.delay(delay)
    reader, writer = await dial(proxy)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    writer.write(b"slow\n")
    assert await answer(reader) == b"slow\n"
    # Delayed on the way there and on the way back.
    assert loop.time() - sent >= 2 * delay * 0.95
    writer.close()


async def test_chunks_read_during_a_delay_arrive_after_newer_ones(
    proxy: TcpProxy, upstream: Upstream
) -> None:
    late_reader, late_writer = await dial(proxy)
    new_reader, new_writer = await dial(proxy)
    proxy.delay(0.5)
    late_writer.write(b"old renew\n")
    await read_by_proxy(proxy, len(b"old renew\n"))
    proxy.heal()
    new_writer.write(b"new renew\n")
    assert await answer(new_reader) == b"new renew\n"
    assert await answer(late_reader) == b"old renew\n"
    assert upstream.arrived == [b"new renew\n", b"old renew\n"]
    late_writer.close()
    new_writer.close()


async def test_order_within_a_connection_survives_a_heal(
    proxy: TcpProxy, upstream: Upstream
) -> None:
    reader, writer = await dial(proxy)
    proxy.delay(0.3)
    writer.write(b"first\n")
    await read_by_proxy(proxy, len(b"first\n"))
    proxy.heal()
    writer.write(b"second\n")
    assert await answer(reader) == b"first\n"
    assert await answer(reader) == b"second\n"
    assert upstream.arrived == [b"first\n", b"second\n"]
    writer.close()


async def test_half_close_reaches_the_server(proxy: TcpProxy, upstream: Upstream) -> None:
    reader, writer = await dial(proxy)
    writer.write(b"last\n")
    writer.write_eof()
    assert await answer(reader) == b"last\n"
    await asyncio.wait_for(upstream.eof_seen.wait(), ANSWER_TIMEOUT_S)
    # The server closed after the EOF: the client sees the end of the stream.
    assert await answer(reader) == b""
    writer.close()


async def test_close_ends_open_connections(upstream: Upstream) -> None:
    proxy = TcpProxy("127.0.0.1", upstream.port)
    await proxy.start()
    reader, writer = await dial(proxy)
    writer.write(b"x\n")
    assert await answer(reader) == b"x\n"
    await proxy.close()
    assert await answer(reader) == b""
    assert proxy.stats.connections == 1
    writer.close()


def test_delay_must_be_positive() -> None:
    proxy = TcpProxy("127.0.0.1", 9)
    with pytest.raises(ValueError, match="delay"):
        proxy.delay(0)


def blocking_echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(ANSWER_TIMEOUT_S)
    return server, server.getsockname()[1]


def test_proxy_thread_controls_from_synchronous_code() -> None:
    server, port = blocking_echo_server()
    with server, ProxyThread() as proxies:
        handle = proxies.add(port)
        assert handle.endpoint == f"http://127.0.0.1:{handle.port}"
        client = socket.create_connection(("127.0.0.1", handle.port), timeout=ANSWER_TIMEOUT_S)
        accepted, _ = server.accept()
        with client, accepted:
            accepted.settimeout(QUIET_S)
            handle.blackhole()
            assert handle.mode is Mode.BLACKHOLE
            client.sendall(b"ping")
            with pytest.raises(TimeoutError):
                accepted.recv(16)
            handle.heal()
            accepted.settimeout(ANSWER_TIMEOUT_S)
            assert accepted.recv(16) == b"ping"
            handle.delay(0.2)
            started = time.monotonic()
            client.sendall(b"pong")
            assert accepted.recv(16) == b"pong"
            assert time.monotonic() - started >= 0.19
            assert handle.stats().bytes_forwarded == 8
