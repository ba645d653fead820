"""Running blocking boto3 calls from the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_daemon_thread(call: Callable[[], T]) -> asyncio.Future[T]:
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

    threading.Thread(target=target, name="sqs-long-poll", daemon=True).start()
    return future


def _call_soon(loop: asyncio.AbstractEventLoop, *args: object) -> None:
    # RuntimeError: the loop is closed, nobody waits for this result any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(*args)  # type: ignore[arg-type]
