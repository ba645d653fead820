"""The SQS start path: long-poll for start/reassign hints and try to acquire (a
``reassign`` only while the worker is below its fair share, :mod:`worker.balancer`).

Messages are hints (the table is the truth). A message is deleted once its outcome
is known; on an error it becomes visible again after a short delay; a worker that
cannot take it (full, closing) hands it straight back, and a worker that is full or
has no ready session does not receive at all (every receive counts towards the DLQ).
A poison message is logged and left alone, so after ``maxReceiveCount`` receives it
lands in the DLQ.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from worker.acquire_result import AcquireResult
from worker.capacity import Capacity
from worker.threads import OS_THREADS, Threads, in_daemon_thread
from wsfleet.backoff import backoff_delays
from wsfleet.start_messages import (
    REASSIGN,
    InvalidStartMessageError,
    StartMessage,
    parse_body,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

log = logging.getLogger(__name__)

Acquire = Callable[[str], Awaitable[AcquireResult]]

READY_POLL_SECONDS = 0.1
"""How often a worker without a ready session looks again before it receives."""


class StartQueue:
    """Thin async wrapper over the start queue."""

    def __init__(
        self,
        sqs: SQSClient,
        queue_url: str,
        *,
        wait_seconds: int,
        threads: Threads = OS_THREADS,
        poll: SQSClient | None = None,
    ) -> None:
        """``sqs``: every call but the long poll; ``poll``: the long poll's own client
        (None: ``sqs``), the only one whose read timeout outlasts ``wait_seconds``."""
        self._sqs = sqs
        self._poll = sqs if poll is None else poll
        self._url = queue_url
        self._wait = wait_seconds
        self._threads = threads

    async def receive(self, max_messages: int) -> list[MessageTypeDef]:
        response = await in_daemon_thread(
            lambda: self._poll.receive_message(
                QueueUrl=self._url,
                MaxNumberOfMessages=max(1, min(10, max_messages)),
                WaitTimeSeconds=self._wait,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            ),
            self._threads,
        )
        return list(response.get("Messages", []))

    async def delete(self, receipt: str) -> None:
        await self._call(self._sqs.delete_message, QueueUrl=self._url, ReceiptHandle=receipt)

    async def retry_later(self, receipt: str, seconds: int) -> None:
        await self._call(
            self._sqs.change_message_visibility,
            QueueUrl=self._url,
            ReceiptHandle=receipt,
            VisibilityTimeout=seconds,
        )

    async def send(self, message: StartMessage) -> None:
        await self._call(self._sqs.send_message, QueueUrl=self._url, MessageBody=message.to_body())

    async def hint_reassign(self, connection_id: str) -> None:
        """Hint that ``connection_id`` is free for whoever has room. Best effort: a
        free connection is still found by the next reconcile of any worker."""
        try:
            await self.send(StartMessage(REASSIGN, connection_id))
        except Exception as error:
            log.warning(
                "could not send reassign",
                extra={"connection_id": connection_id, "error": repr(error)},
            )

    async def _call(self, method: Callable[..., Any], **kwargs: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: method(**kwargs))


class StartConsumer:
    def __init__(
        self,
        queue: StartQueue,
        *,
        capacity: Capacity,
        acquire: Acquire,
        retry_seconds: int,
        rng: random.Random,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        """``ready()``: whether the worker has a session it may take work under."""
        self._queue = queue
        self._ready = ready
        self._capacity = capacity
        self._acquire = acquire
        self._retry_seconds = retry_seconds
        self._rng = rng
        self._poll: asyncio.Future[list[MessageTypeDef]] | None = None

    async def run(self) -> None:
        errors = backoff_delays(initial=1.0, maximum=30.0, rng=self._rng.random)
        while True:
            if self._capacity.free <= 0:
                # A full worker does not receive at all, so valid starts never
                # drift towards the DLQ while it waits.
                await self._capacity.wait_for_free()
                continue
            if not self._ready():
                # Nor does a worker without a ready session (opening one, or its
                # DynamoDB failing): every acquire would answer "no session" and hand
                # the hint back, and each receive counts towards the DLQ's
                # maxReceiveCount, so a few seconds of it sent valid starts there.
                await asyncio.sleep(READY_POLL_SECONDS)
                continue
            # The poll runs shielded: if this loop is cancelled at shutdown, the poll
            # still completes and :meth:`drain` hands back what it received.
            self._poll = asyncio.ensure_future(self._queue.receive(self._capacity.free))
            try:
                messages = await asyncio.shield(self._poll)
            except Exception as error:
                log.warning("receive from the start queue failed", extra={"error": repr(error)})
                await asyncio.sleep(next(errors))
                continue
            errors = backoff_delays(initial=1.0, maximum=30.0, rng=self._rng.random)
            await asyncio.gather(*(self.handle(message) for message in messages))

    async def drain(self, within: float) -> int:
        """After the loop was cancelled: wait for a poll still in flight and make what
        it received visible again at once, for other workers. Without this, a
        ``reassign`` sent by this very worker while it shuts down could be swallowed
        by its own abandoned poll and stay invisible for the visibility timeout.
        Returns how many messages were handed back."""
        poll, self._poll = self._poll, None
        if poll is None:
            return 0
        try:
            messages = await asyncio.wait_for(asyncio.shield(poll), within)
        except Exception:
            # A poll still hanging (its call stuck on a partition) ends later: its
            # error is logged then, not left unretrieved; what it receives comes back
            # after the visibility timeout.
            poll.add_done_callback(_log_late_poll)
            return 0
        for message in messages:
            await self._settle(self._queue.retry_later(message["ReceiptHandle"], 0))
        return len(messages)

    async def handle(self, message: MessageTypeDef) -> AcquireResult | None:
        """Act on one received message; returns the acquire result (None for poison)."""
        receipt = message["ReceiptHandle"]
        try:
            start = parse_body(message.get("Body", ""))
        except InvalidStartMessageError as error:
            log.warning(
                "poison message on the start queue left for the DLQ",
                extra={
                    "message_id": message.get("MessageId"),
                    "receive_count": message.get("Attributes", {}).get("ApproximateReceiveCount"),
                    "reason": str(error),
                    "body": message.get("Body", "")[:200],
                },
            )
            return None
        try:
            # A reassign hint is taken up to capacity, like a drain: it is sent for a
            # connection released at shutdown that no offer placed, and it must find a
            # home now; a worker it puts above its share gives the excess back in a
            # later, graceful balance round.
            result = await self._acquire(start.connection_id)
        except Exception as error:
            log.warning(
                "acquire failed; the message will come back",
                extra={"connection_id": start.connection_id, "error": repr(error)},
            )
            await self._settle(self._queue.retry_later(receipt, self._retry_seconds))
            return None
        log.info(
            "start message",
            extra={
                "connection_id": start.connection_id,
                "kind": start.type,
                "result": result.value,
                "reassign": start.type == REASSIGN,
            },
        )
        if result.settled:
            await self._settle(self._queue.delete(receipt))
        else:
            await self._settle(self._queue.retry_later(receipt, 0))
        return result

    async def _settle(self, call: Awaitable[None]) -> None:
        try:
            await call
        except Exception as error:
            # Harmless: the message comes back as a hint and is settled again.
            log.warning("could not settle a start message", extra={"error": repr(error)})


def _log_late_poll(poll: asyncio.Future[list[MessageTypeDef]]) -> None:
    if not poll.cancelled() and poll.exception() is not None:
        log.warning(
            "a start-queue poll ended after the shutdown", extra={"error": repr(poll.exception())}
        )
