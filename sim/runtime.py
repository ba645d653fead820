"""Virtual time for a whole fleet in one thread.

Every process of the simulated fleet (each worker, the router, the upstream feeds) has
an asyncio event loop of its own, a :class:`SimLoop`, and all of them read one clock,
the :class:`World`'s. The world runs them the way an operating system runs processes:
at each instant it steps, in an order drawn from the seed, every loop that has work
due, and when none has, it moves the clock to the next timer. Nothing waits for real
time, so a simulated minute takes what its callbacks cost, and a seed decides every
interleaving.

A process can be paused (its loop is not stepped until the pause ends: its timers fire
late, and what reached it waits, as under SIGSTOP) or crashed (its loop is never
stepped again and its memory is dropped).

Blocking code (boto3 calls on the executor, the session renew's threads, the SQS long
poll) runs in greenlets: :meth:`SimLoop.run_in_executor` and :class:`SimThreads` start
the same synchronous code as a task of the loop, and the simulated AWS clients suspend
it with :func:`await_only` while their request travels, so another process's call can
land between two calls of one function.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import random
import sys
from asyncio import events
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from greenlet import getcurrent, greenlet

from worker.threads import Joinable, Mailbox, MailboxEmptyError

T = TypeVar("T")

TICKS = 1000
"""Clock ticks per second."""


# --- greenlets: blocking code as tasks ---------------------------------------------------


class _Await:
    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


class _Bridge(greenlet):  # type: ignore[misc]
    """A greenlet that runs blocking code for a task (see :func:`run_blocking`)."""


def in_blocking_code() -> bool:
    return isinstance(getcurrent(), _Bridge)


def await_only(awaitable: Awaitable[T]) -> T:
    """From blocking code run by :func:`run_blocking`: wait for ``awaitable`` (the task
    that runs the code awaits it) and return its result or raise its error."""
    current = getcurrent()
    if not isinstance(current, _Bridge):
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise RuntimeError("a simulated blocking call outside a simulated thread")
    return current.parent.switch(_Await(awaitable))  # type: ignore[no-any-return]


def _drive(
    loop: SimLoop,
    bridge: _Bridge,
    method: Callable[..., Any],
    values: tuple[Any, ...],
    done: Callable[[Any, BaseException | None], None],
) -> None:
    """Run ``bridge`` until it waits or ends, from a callback of ``loop`` (no task): it
    is resumed by the done callback of what it waits for, and ``done`` gets its
    result or error. An executor's call costs a few callbacks this way, not a task's
    steps."""
    events._set_running_loop(None)
    try:
        result = method(*values)
    except BaseException as error:  # the blocking code's error, for its caller
        events._set_running_loop(loop)
        done(None, error)
        return
    events._set_running_loop(loop)
    if not isinstance(result, _Await):
        done(result, None)
        return
    waited = asyncio.ensure_future(result.awaitable, loop=loop)

    def resume(future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            _drive(loop, bridge, bridge.throw, (asyncio.CancelledError(),), done)
        elif (error := future.exception()) is not None:
            _drive(loop, bridge, bridge.throw, (error,), done)
        else:
            _drive(loop, bridge, bridge.switch, (future.result(),), done)

    waited.add_done_callback(resume)


async def run_blocking(call: Callable[..., T], *args: Any) -> T:
    """Run the blocking ``call(*args)`` in a greenlet, awaiting what it waits for.

    The code runs with no running event loop, as on a thread of its own: what it
    must not do there (``asyncio.get_running_loop()``, a future of the loop) fails
    here as it would in production."""
    bridge = _Bridge(call)
    loop = events._get_running_loop()

    def resume(method: Callable[..., Any], *values: Any) -> Any:
        events._set_running_loop(None)
        try:
            return method(*values)
        finally:
            events._set_running_loop(loop)

    result = resume(bridge.switch, *args)
    while isinstance(result, _Await):
        try:
            value = await result.awaitable
        except BaseException as error:  # handed to the blocking code, as a thread would see it
            result = resume(bridge.throw, error)
        else:
            result = resume(bridge.switch, value)
    return result  # type: ignore[no-any-return]


# --- the loop ----------------------------------------------------------------------------


class _NoSelector:
    def select(self, timeout: float | None) -> list[Any]:
        return []


class SimLoop(asyncio.BaseEventLoop):
    """An event loop whose clock is the world's and which the world steps."""

    EXECUTOR_THREADS = 32
    """As the worker's executor (worker.__main__): calls beyond it wait their turn."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__()
        self._world = world
        self.name = name
        self._executor_busy = 0
        self._executor_queue: deque[Callable[[], None]] = deque()
        # BaseEventLoop's ready queue, which the world looks at to step it (its timer
        # heap, ``_scheduled``, is replaced now and then: read where it is).
        self._ready_queue: deque[asyncio.Handle] = self._ready  # type: ignore[attr-defined]
        self._selector = _NoSelector()
        self.paused_until = 0.0
        """World time (as every instant the world compares)."""
        self.crashed = False
        self.set_exception_handler(world.unhandled)
        self.rate = 1.0
        """How fast this process's monotonic clock runs against the world's."""
        self._base = 0.0
        self._since = 0.0
        """The clock read ``_base`` at world time ``_since``, and runs at ``rate``."""

    # The clock and the stepping.

    def time(self) -> float:
        """The process's monotonic clock (``time.monotonic`` in production): the
        world's time, at the rate the seed gave it."""
        return self._base + (self._world.now - self._since) * self.rate

    def set_rate(self, rate: float) -> None:
        """From now on the clock runs at ``rate`` (continuous: no step)."""
        self._base, self._since, self.rate = self.time(), self._world.now, rate

    def at_world(self, world_time: float) -> float:
        """What this clock will read at ``world_time``: for timers the world sets on
        this loop (a reply's arrival, a packet's)."""
        return self._base + (world_time - self._since) * self.rate

    def world_at(self, when: float) -> float:
        """The world time at which this clock reads ``when``."""
        return self._since + (when - self._base) / self.rate

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def due(self, now: float) -> bool:
        if self.crashed or self.paused_until > now:
            return False
        if self._ready_queue:
            return True
        scheduled = self._scheduled  # type: ignore[attr-defined]
        return bool(scheduled) and self.world_at(scheduled[0]._when) <= now

    def next_timer(self) -> float | None:
        if self.crashed:
            return None
        if self._ready_queue:
            return max(self._world.now, self.paused_until)
        if not self._scheduled:  # type: ignore[attr-defined]
            return None
        first = self.world_at(self._scheduled[0].when())  # type: ignore[attr-defined]
        return max(first, self.paused_until)

    def step(self) -> None:
        events._set_running_loop(self)
        try:
            self._run_once()  # type: ignore[attr-defined]
        finally:
            events._set_running_loop(None)

    # Effects: the executor runs blocking code in greenlets, sockets go to the world's
    # network.

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        # As a thread of an executor: it starts on a later step (when one of the
        # threads is free), and cancelling the future abandons the result, the call
        # itself goes on.
        future: asyncio.Future[T] = self.create_future()

        def done(result: Any, error: BaseException | None) -> None:
            if self._executor_queue:
                self.call_soon(self._executor_queue.popleft())  # the thread goes on to it
            else:
                self._executor_busy -= 1
            if future.cancelled():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def start() -> None:
            bridge = _Bridge(func)
            _drive(self, bridge, bridge.switch, args, done)

        if self._executor_busy < self.EXECUTOR_THREADS:
            self._executor_busy += 1
            self.call_soon(start)
        else:
            self._executor_queue.append(start)
        return future

    async def create_connection(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        network = self._world.network
        if network is None or host is None or port is None:
            raise OSError("no simulated network")
        connected: tuple[asyncio.Transport, asyncio.BaseProtocol]
        connected = await network.connect(self, protocol_factory, host, port)
        return connected

    async def getaddrinfo(self, *args: Any, **kwargs: Any) -> list[Any]:
        raise OSError("no name resolution in the simulation")

    def crash(self) -> None:
        """The process dies: nothing of it runs again."""
        self.crashed = True
        self._ready_queue.clear()
        self._scheduled.clear()  # type: ignore[attr-defined]


_DESTROYED_PENDING = "Task was destroyed but it is pending!"
"""What asyncio reports of a pending task that is garbage collected."""


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or type(func).__name__


class World:
    """The clock, the processes and the order in which they run."""

    def __init__(self, seed: int, *, start: float = 1_000.0) -> None:
        self.now = start
        self.rng = random.Random(seed)
        self.loops: list[SimLoop] = []
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = 0
        self.network: Any = None
        self.errors: list[str] = []
        self.current: SimLoop | None = None

    def loop(self, name: str) -> SimLoop:
        loop = SimLoop(self, name)
        self.loops.append(loop)
        return loop

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at ``when`` outside every process (the network, the AWS
        services)."""
        self._sequence += 1
        heapq.heappush(self._events, (max(when, self.now), self._sequence, callback))

    def pause(self, loop: SimLoop, seconds: float) -> None:
        loop.paused_until = max(loop.paused_until, self.now + seconds)

    def unhandled(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if getattr(loop, "crashed", False) and context.get("message") == _DESTROYED_PENDING:
            # A task the crash left pending, collected later: the crash itself, not an
            # error of the process (an error it had raised is still reported).
            return
        name = getattr(loop, "name", "?")
        error = context.get("exception")
        future = context.get("future")
        of = f" ({future.get_name()})" if isinstance(future, asyncio.Task) else ""
        self.errors.append(f"{name}: {context.get('message')}{of}: {error!r}")

    def run_until(self, end: float) -> None:
        """Run every process until the clock reaches ``end``.

        At each instant: the network's and services' events due, then every process
        with work due, in an order the seed draws, each for one step (the callbacks
        ready at that moment); again until nothing is due; then the clock moves to
        the next timer."""
        rng = self.rng
        events = self._events
        loops = self.loops
        while True:
            now = self.now
            while events and events[0][0] <= now:
                heapq.heappop(events)[2]()
            # One look at every loop: those with work due now, and the next instant
            # any other has work.
            runnable = []
            following = events[0][0] if events else None
            for loop in loops:
                if loop.crashed:
                    continue
                ready = loop._ready_queue
                if ready:
                    when = now
                else:
                    scheduled = loop._scheduled  # type: ignore[attr-defined]
                    if not scheduled:
                        continue
                    when = loop.world_at(scheduled[0]._when)
                if loop.paused_until > now:
                    when = max(when, loop.paused_until)
                if when <= now:
                    runnable.append(loop)
                elif following is None or when < following:
                    following = when
            if runnable:
                if len(runnable) > 1:
                    rng.shuffle(runnable)
                for loop in runnable:
                    if loop.due(now):
                        self.current = loop
                        loop.step()
                self.current = None
                continue
            if following is None or following > end:
                self.now = max(now, end)
                return
            # The clock ticks in milliseconds, as a scheduler's would: what falls due
            # within one runs together, so a run has a few instants per simulated
            # millisecond at most instead of one per timer.
            # (Never past ``end``: the clock must not run back when the run stops.)
            self.now = max(now, following, min(math.ceil(following * TICKS) / TICKS, end))

    def close(self) -> None:
        """Drop every process (what is still pending is abandoned, as at exit)."""
        for loop in self.loops:
            loop.crash()
            loop.close()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_task(self, loop: SimLoop, coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``coroutine`` as a task of ``loop`` (from outside every loop)."""
        events._set_running_loop(loop)
        try:
            return loop.create_task(coroutine)
        finally:
            events._set_running_loop(None)


def install_asyncgen_hooks(world: World) -> None:
    """Async generators (websockets' ``async for``) are finalised by the loop that first
    iterated them, as ``run_forever`` arranges for one loop."""

    def firstiter(agen: Any) -> None:
        loop = events._get_running_loop()
        if isinstance(loop, SimLoop):
            loop._asyncgen_firstiter_hook(agen)  # type: ignore[attr-defined]

    def finalizer(agen: Any) -> None:
        for loop in world.loops:
            if agen in loop._asyncgens and not loop.crashed:  # type: ignore[attr-defined]
                loop._asyncgen_finalizer_hook(agen)  # type: ignore[attr-defined]
                return

    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)


# --- threads ---------------------------------------------------------------------------


class _TaskThread:
    def __init__(self, task: asyncio.Task[None]) -> None:
        self._task = task

    def join(self, timeout: float) -> None:
        if self._task.done():
            return
        with contextlib.suppress(TimeoutError):
            await_only(asyncio.wait_for(asyncio.shield(self._task), timeout))


class _TaskMailbox(Mailbox[T]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue()

    def put(self, item: T) -> None:
        self._queue.put_nowait(item)

    def get(self, timeout: float) -> T:
        if not self._queue.empty():
            return self._queue.get_nowait()
        # A thread's timed wait takes at least a moment: a loop that waits "until"
        # an instant by a relative timeout would otherwise spin in place, its
        # ``now + (then - now)`` rounding to just short of ``then``.
        try:
            return await_only(asyncio.wait_for(self._queue.get(), max(timeout, 1e-6)))
        except TimeoutError:
            raise MailboxEmptyError from None


class SimThreads:
    """The :class:`worker.threads.Threads` port in virtual time: a thread is a task of
    the loop that started it, running its code in a greenlet."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def start(self, target: Callable[[], None], name: str) -> Joinable:
        task = self._loop.create_task(run_blocking(target), name=f"thread:{name}")
        return _TaskThread(task)

    def mailbox(self) -> Mailbox[T]:
        return _TaskMailbox()
