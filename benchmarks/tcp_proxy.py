"""A small asyncio TCP proxy whose network behaviour is switched at run time, to cut one
worker off from DynamoDB (the worker's ``AWS_ENDPOINT_URL_DYNAMODB`` points at it).

Modes:

- ``pass``: every chunk is forwarded as soon as it is read.
- ``blackhole``: new connections are accepted and everything read is held; nothing is
  forwarded in either direction. On heal, what was held is delivered in order, as TCP
  retransmission would deliver it once a partition ends: a request the client gave up
  on may still reach the server late.
- ``delay D``: every chunk read is forwarded ``D`` seconds after it was read. The delay is
  stamped on arrival, so chunks read during a delay keep their due time after a heal:
  a renew sent before the heal reaches the server after renews sent later on other
  connections (late renews arrive after newer ones).

Within one connection and direction, chunks always leave in the order they arrived.
A half-close (EOF) travels like data. Held data is kept in memory without a bound:
the proxy is for the small request/response traffic of a lease table.

:class:`TcpProxy` lives on one event loop; :class:`ProxyThread` runs such a loop in a
daemon thread for synchronous callers and makes the controls thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

LOOPBACK = "127.0.0.1"
_READ_BYTES = 65536

T = TypeVar("T")


class Mode(enum.Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    DELAY = "delay"


@dataclass(frozen=True, slots=True)
class _Chunk:
    data: bytes
    """``b""`` is the end of the stream (EOF)."""
    due: float
    """Loop time before which the chunk must not be forwarded."""


@dataclass(slots=True)
class ProxyStats:
    connections: int = 0
    bytes_read: int = 0
    bytes_forwarded: int = 0


class TcpProxy:
    """Listens on ``host:port`` (0: a free port) and forwards to ``target``.

    Create, :meth:`start`, switch modes with :meth:`blackhole` / :meth:`delay` /
    :meth:`heal` (all on the proxy's event loop), and :meth:`close` at the end, which
    also closes every connection still open.
    """

    def __init__(
        self, target_host: str, target_port: int, *, host: str = LOOPBACK, port: int = 0
    ) -> None:
        self._target = (target_host, target_port)
        self._listen = (host, port)
        self._server: asyncio.Server | None = None
        self._mode = Mode.PASS
        self._delay = 0.0
        self._changed = asyncio.Event()
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        """Every socket of every link, open or closing: aborted at :meth:`close`."""
        self.stats = ProxyStats()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy has not been started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def mode(self) -> Mode:
        return self._mode

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, *self._listen)

    def heal(self) -> None:
        """Forward again; held chunks go out now, delayed ones at their due time."""
        self._set(Mode.PASS, 0.0)

    def blackhole(self) -> None:
        """Hold everything from now on (connections are still accepted)."""
        self._set(Mode.BLACKHOLE, 0.0)

    def delay(self, seconds: float) -> None:
        """Forward each chunk read from now on ``seconds`` after it was read."""
        if not seconds > 0:
            raise ValueError(f"delay must be > 0 s, got {seconds}")
        self._set(Mode.DELAY, seconds)

    async def close(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        # A closed link's socket still waits to flush what a blackholed or slow peer
        # never took, and its loop stops after this: abort them all, then let the loop
        # run the callbacks that close the sockets.
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()

    def _set(self, mode: Mode, delay: float) -> None:
        self._mode, self._delay = mode, delay
        # Wake every waiting forwarder, then arm the event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        self.stats.connections += 1
        upstream_w: asyncio.StreamWriter | None = None
        self._writers.add(client_w)
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self._target)
            self._writers.add(upstream_w)
            await asyncio.gather(
                self._pipe(client_r, upstream_w, client_w),
                self._pipe(upstream_r, client_w, upstream_w),
            )
        except OSError:
            pass  # the target refused, or a peer reset: the link ends
        finally:
            self._links.discard(task)
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        source: asyncio.StreamWriter,
    ) -> None:
        """Forward ``reader`` to ``writer`` under the current mode; ``source`` is the
        writer of the reading side, closed when forwarding fails (the peer went away)."""
        queue: asyncio.Queue[_Chunk] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def read() -> None:
            while True:
                try:
                    data = await reader.read(_READ_BYTES)
                except OSError:
                    data = b""
                delay = self._delay if self._mode is Mode.DELAY else 0.0
                self.stats.bytes_read += len(data)
                queue.put_nowait(_Chunk(data, loop.time() + delay))
                if not data:
                    return

        reading = asyncio.create_task(read())
        try:
            not_before = 0.0
            while True:
                chunk = await queue.get()
                not_before = max(not_before, chunk.due)
                await self._forwardable(not_before)
                if not chunk.data:
                    if writer.can_write_eof():
                        with contextlib.suppress(OSError):
                            writer.write_eof()
                    return
                writer.write(chunk.data)
                try:
                    await writer.drain()
                except OSError:
                    source.close()
                    return
                self.stats.bytes_forwarded += len(chunk.data)
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def _forwardable(self, not_before: float) -> None:
        """Return once the mode is not blackhole and ``not_before`` has passed."""
        loop = asyncio.get_running_loop()
        while True:
            changed = self._changed
            if self._mode is Mode.BLACKHOLE:
                await changed.wait()
                continue
            wait = not_before - loop.time()
            if wait <= 0:
                return
            # Sleep, but wake on a mode change (a blackhole may start meanwhile).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait)


class ProxyThread:
    """An event loop in a daemon thread hosting proxies for synchronous code.

    ``with ProxyThread() as proxies: handle = proxies.add(target_port)``; every method
    of the returned :class:`ProxyHandle` is thread-safe and returns once applied.
    Leaving the block closes every proxy and stops the thread.
    """

    def __init__(self, timeout: float = 10.0) -> None:
        self._timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="tcp-proxies", daemon=True)
        self._proxies: list[TcpProxy] = []

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run the coroutine made by ``make`` on the proxy loop and return its result."""

        async def run() -> T:
            return await make()

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(self._timeout)

    def add(self, target_port: int, target_host: str = LOOPBACK) -> ProxyHandle:
        """Start a proxy to ``target_host:target_port`` on a free loopback port."""

        async def start() -> TcpProxy:
            proxy = TcpProxy(target_host, target_port)
            await proxy.start()
            return proxy

        proxy = self.call(start)
        self._proxies.append(proxy)
        return ProxyHandle(self, proxy)

    def close(self) -> None:
        """Close every proxy, stop the loop and join the thread. Idempotent."""
        if not self._thread.is_alive():
            if not self._loop.is_closed() and not self._loop.is_running():
                self._loop.close()
            return

        async def close_all() -> None:
            await asyncio.gather(*(p.close() for p in self._proxies), return_exceptions=True)

        try:
            self.call(close_all)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self._timeout)
            if not self._thread.is_alive():
                self._loop.close()


class ProxyHandle:
    """Thread-safe controls of one proxy hosted by a :class:`ProxyThread`."""

    def __init__(self, host: ProxyThread, proxy: TcpProxy) -> None:
        self._host = host
        self._proxy = proxy
        self.port = proxy.port

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``: an AWS endpoint URL through this proxy."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def mode(self) -> Mode:
        return self._proxy.mode

    def _apply(self, change: Callable[[], None]) -> None:
        async def apply() -> None:
            change()

        self._host.call(apply)

    def heal(self) -> None:
        self._apply(self._proxy.heal)

    def blackhole(self) -> None:
        self._apply(self._proxy.blackhole)

    def delay(self, seconds: float) -> None:
        self._apply(lambda: self._proxy.delay(seconds))

    def stats(self) -> ProxyStats:
        async def read() -> ProxyStats:
            s = self._proxy.stats
            return ProxyStats(s.connections, s.bytes_read, s.bytes_forwarded)

        return self._host.call(read)
