"""The worker's threads, behind one small port.

Two parts of the worker must not wait for the event loop: the session renew (its own
schedule thread and one thread per renew in flight, worker.session) and the SQS long
poll (a daemon thread, so a poll still open at exit does not hold the process). They
start threads and wait on mailboxes only through :class:`Threads`; the production
adapter is :data:`OS_THREADS` (``threading`` and ``queue``). The simulator's adapter
runs the same code as tasks in virtual time (docs/DESIGN.md §10).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class MailboxEmptyError(Exception):
    """:meth:`Mailbox.get` timed out."""


class Mailbox(Protocol[T]):
    """A queue between threads: ``put`` never blocks; ``get`` waits up to ``timeout``
    seconds and raises :class:`MailboxEmptyError` when nothing came."""

    def put(self, item: T) -> None: ...

    def get(self, timeout: float) -> T: ...


class Joinable(Protocol):
    def join(self, timeout: float) -> None: ...


class Threads(Protocol):
    def start(self, target: Callable[[], None], name: str) -> Joinable:
        """Run ``target`` in a daemon thread of its own."""
        ...

    def mailbox(self) -> Mailbox[T]: ...


class _QueueMailbox(Generic[T]):
    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()

    def put(self, item: T) -> None:
        self._queue.put(item)

    def get(self, timeout: float) -> T:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise MailboxEmptyError from None


class OsThreads:
    """The production adapter: daemon threads and ``queue.SimpleQueue``."""

    def start(self, target: Callable[[], None], name: str) -> Joinable:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def mailbox(self) -> Mailbox[T]:
        return _QueueMailbox()


OS_THREADS: Threads = OsThreads()


def in_daemon_thread(call: Callable[[], T], threads: Threads = OS_THREADS) -> asyncio.Future[T]:
    """Run ``call`` in its own daemon thread and resolve the returned future.

    For SQS long polls: a thread of the default executor would be joined at exit,
    so a poll still open at shutdown would delay the exit by up to its wait time.
    Cancelling the future abandons the call's result.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result = call()
        except BaseException as error:  # handed to the awaiting task
            _call_soon(loop, settle, None, error)
        else:
            _call_soon(loop, settle, result, None)

    threads.start(target, "sqs-long-poll")
    return future


def _call_soon(loop: asyncio.AbstractEventLoop, *args: object) -> None:
    # RuntimeError: the loop is closed, nobody waits for this result any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(*args)  # type: ignore[arg-type]
