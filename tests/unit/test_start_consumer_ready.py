"""A worker without a ready session does not receive from the start queue: each of its
acquires would answer "no session" and hand the hint back at once, and each receive
counts towards the DLQ's maxReceiveCount, so a worker whose DynamoDB failed (it could
not open a session) sent valid start hints to the DLQ within seconds (found by the
simulator, seed 221 on the draws of `82ec8b6`: a start received five times in 4 s by
such a worker, then dead-lettered; its connection waited for the sweep)."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

import pytest

from worker.acquire_result import AcquireResult
from worker.capacity import Capacity
from worker.start_queue import StartConsumer

pytestmark = pytest.mark.timeout(10)


class Queue:
    def __init__(self) -> None:
        self.receives = 0
        self.deleted: list[str] = []
        self.received = asyncio.Event()
        self.settled = asyncio.Event()

    async def receive(self, max_messages: int) -> list[dict[str, Any]]:
        self.receives += 1
        self.received.set()
        if self.receives > 1:
            await asyncio.Event().wait()  # a long poll that brings nothing more
        return [{"ReceiptHandle": "r1", "Body": '{"type": "start", "connection_id": "c1"}'}]

    async def delete(self, receipt: str) -> None:
        self.deleted.append(receipt)
        self.settled.set()

    async def retry_later(self, receipt: str, seconds: int) -> None:
        raise AssertionError("handed back: received while it could not act")


async def test_no_receive_until_the_session_is_ready() -> None:
    queue, ready = Queue(), False

    async def acquire(connection_id: str) -> AcquireResult:
        return AcquireResult.WON if ready else AcquireResult.NO_SESSION

    consumer = StartConsumer(
        cast(Any, queue),
        capacity=Capacity(4),
        acquire=acquire,
        retry_seconds=1,
        rng=random.Random(1),
        ready=lambda: ready,
    )
    running = asyncio.create_task(consumer.run())
    for _ in range(20):
        await asyncio.sleep(0)  # as far as it goes without a session
    assert queue.receives == 0
    ready = True
    await asyncio.wait_for(queue.received.wait(), 5.0)
    await asyncio.wait_for(queue.settled.wait(), 5.0)
    assert queue.deleted == ["r1"]
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
