"""A start-queue poll the shutdown stopped waiting for still has its error retrieved.
The drain waits a bounded time for the poll in flight; a poll that outlived it (its
SQS call hung on a partition, then timed out) ended with an error nobody retrieved,
which asyncio reports as "Task exception was never retrieved" (found by the
simulator, seed 390 on the draws of `b6613e4`)."""

from __future__ import annotations

import asyncio
import gc
import random
from typing import Any, cast

import pytest

from worker.acquire_result import AcquireResult
from worker.capacity import Capacity
from worker.start_queue import StartConsumer

pytestmark = pytest.mark.timeout(10)


class HangingQueue:
    def __init__(self) -> None:
        self.polling = asyncio.Event()
        self.fail = asyncio.Event()
        self.failed = asyncio.Event()

    async def receive(self, max_messages: int) -> list[dict[str, Any]]:
        self.polling.set()
        await self.fail.wait()
        self.failed.set()
        raise TimeoutError("read timeout")


async def test_a_poll_outliving_the_drain_has_its_error_retrieved() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    queue = HangingQueue()

    async def acquire(connection_id: str) -> AcquireResult:
        raise AssertionError("nothing was received")

    consumer = StartConsumer(
        cast(Any, queue),
        capacity=Capacity(4),
        acquire=acquire,
        retry_seconds=1,
        rng=random.Random(1),
    )
    running = asyncio.create_task(consumer.run())
    await asyncio.wait_for(queue.polling.wait(), 5.0)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert await consumer.drain(0.01) == 0  # gave up on the poll, still hanging
    queue.fail.set()
    await asyncio.wait_for(queue.failed.wait(), 5.0)
    for _ in range(5):
        await asyncio.sleep(0)  # the poll's task finishes
    gc.collect()  # an unretrieved error is reported when its task is collected
    assert reported == []
