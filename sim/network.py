"""A loopback network in virtual time: listeners by (host, port), and in-memory
transports that deliver bytes to the peer's loop after a latency, in order.

The workers' real ``websockets.connect`` reaches it through
:meth:`sim.runtime.SimLoop.create_connection`, so the client side of every upstream
connection (handshake, framing, keepalive pings, close handshake, errors) is
websockets' own code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sim.runtime import SimLoop, World

Factory = Callable[[], asyncio.BaseProtocol]


class Listener:
    def __init__(self, loop: SimLoop, factory: Factory) -> None:
        self.loop = loop
        self.factory = factory


class SimTransport(asyncio.Transport):
    def __init__(self, network: Network, loop: SimLoop, peer_name: str) -> None:
        super().__init__()
        self._network = network
        self._loop = loop
        self._protocol: asyncio.BaseProtocol | None = None
        self.peer: SimTransport | None = None
        self._closing = False
        self._lost = False
        self._reading = True
        self._held: list[bytes] = []
        self._eof_held = False
        self._deliver_after = 0.0
        self._peer_name = peer_name

    # asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self._peer_name, 0)
        if name == "sockname":
            return (self._loop.name, 0)
        return default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        while self._held and self._reading:
            self._received(self._held.pop(0))
        if self._held:
            return
        if self._eof_held:
            self._eof_held = False
            self._peer_closed(None)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.peer is None:
            return
        self._send(self.peer, "data", bytes(data))

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self.peer is not None:
            self._send(self.peer, "eof", None)
        self._loop.call_soon(self._lose, None)

    def abort(self) -> None:
        if self._lost:
            return
        self._closing = True
        if self.peer is not None:
            self._send(self.peer, "reset", None)
        self._lose(None)

    # Delivery

    def _send(self, to: SimTransport, kind: str, data: bytes | None) -> None:
        # In order: a later write never overtakes an earlier one (timers due at the same
        # instant run in no particular order, so each comes a nanosecond later).
        at = max(self._network.world.now + self._network.latency(), self._deliver_after + 1e-9)
        self._deliver_after = at
        to._loop.call_at(to._loop.at_world(at), to._arrive, kind, data)

    def _arrive(self, kind: str, data: bytes | None) -> None:
        if self._lost:
            return
        if kind == "data":
            assert data is not None
            if not self._reading:
                self._held.append(data)
            else:
                self._received(data)
        elif kind == "eof":
            if not self._reading:
                self._eof_held = True
            else:
                self._peer_closed(None)
        else:
            self._peer_closed(ConnectionResetError("connection reset by peer"))

    def _received(self, data: bytes) -> None:
        protocol = self._protocol
        if isinstance(protocol, asyncio.Protocol):
            protocol.data_received(data)

    def _peer_closed(self, error: Exception | None) -> None:
        if self._lost:
            return
        protocol = self._protocol
        if error is None and isinstance(protocol, asyncio.Protocol):
            protocol.eof_received()
        self._closing = True
        self._lose(error)

    def _lose(self, error: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        if self._protocol is not None:
            self._protocol.connection_lost(error)

    def cut(self) -> None:
        """The process at this end is gone: the peer sees a reset, this end nothing."""
        self._lost = True
        if self.peer is not None and not self.peer._lost:
            self._send(self.peer, "reset", None)


class Network:
    def __init__(self, world: World, latency: Callable[[], float]) -> None:
        self.world = world
        self.latency = latency
        self._listeners: dict[tuple[str, int], Listener] = {}
        self._by_loop: dict[str, list[SimTransport]] = {}
        world.network = self

    def listen(self, host: str, port: int, loop: SimLoop, factory: Factory) -> None:
        self._listeners[(host, port)] = Listener(loop, factory)

    async def connect(
        self, loop: SimLoop, factory: Factory, host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        await asyncio.sleep(self.latency())
        listener = self._listeners.get((host, port))
        if listener is None or listener.loop.crashed:
            raise ConnectionRefusedError(f"connection refused: {host}:{port}")
        client = SimTransport(self, loop, host)
        server = SimTransport(self, listener.loop, loop.name)
        client.peer, server.peer = server, client
        client_protocol = factory()
        client.set_protocol(client_protocol)
        self._by_loop.setdefault(loop.name, []).append(client)

        def accept() -> None:
            if client._lost:
                server.abort()
                return
            server_protocol = listener.factory()
            server.set_protocol(server_protocol)
            server_protocol.connection_made(server)

        listener.loop.call_soon(accept)
        client_protocol.connection_made(client)
        return client, client_protocol

    def crash(self, loop: SimLoop) -> None:
        """Every connection of a crashed process is reset at the other end."""
        for transport in self._by_loop.pop(loop.name, []):
            transport.cut()
