"""``HANDLER=worker.sinks.sqs_fifo:factory``: each message as an envelope
(:mod:`wsfleet.envelope`) into an SQS FIFO queue, the connection id as the message
group (so each connection's messages are received in seq order) and a hash of
``(connection_id, seq_gen, seq)`` as the deduplication id (so SQS drops a copy sent
again within its five-minute deduplication window, by this worker or another).

Settings: ``SINK_QUEUE_URL`` (a FIFO queue's URL, ending in ``.fifo``),
``SINK_MAX_ATTEMPTS`` (:mod:`worker.sinks.settings`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any, Protocol, TypedDict

from worker.delivery import Delivery
from worker.sinks.batch_rules import SQS_LIMITS, deduplication_id
from worker.sinks.clients import make_client, make_executor
from worker.sinks.sending import (
    Record,
    Refusal,
    default_rng,
    envelope_of,
    record,
    run_blocking,
    send_all,
    wall_ms,
)
from worker.sinks.settings import SinkSettings

_NOT_IN_SQS = ("\ufffe", "\uffff")
"""The only characters a JSON text may hold as themselves that an SQS message body
may not (the others are escaped by JSON, or not valid in UTF-8)."""


class Entry(TypedDict):
    Id: str
    MessageBody: str
    MessageGroupId: str
    MessageDeduplicationId: str


class SqsClient(Protocol):
    def send_message_batch(self, **kwargs: Any) -> Mapping[str, Any]: ...


class SqsFifoSink:
    """A batch handler that writes each batch with ``SendMessageBatch``: requests of
    at most 10 messages and 256 KiB, in delivery order.

    Entries a request refuses (``Failed``) are sent again with backoff, up to
    ``max_attempts`` sends each, and not at all when SQS says the fault is the
    sender's (``SenderFault``: the same entry would be refused again); then the call
    fails and the worker sends the whole batch again later.

    Only the refused entries are sent again, unlike the Kinesis and Firehose sinks:
    sending a later entry of the connection again would not put a copy of it after
    the refused one, since SQS drops it as a duplicate of the copy it took (same
    deduplication id, within five minutes). So when SQS refuses seq k and takes k+1
    of one request (it has no reason to for entries the sink checked beforehand, but
    it may on an internal error), the group holds k+1 before k and no later copy of
    k+1: a consumer that keeps only the highest seq applied loses k, one that takes
    only the next seq loses k+1; one that remembers every seq it took loses neither.
    For the same reason its envelopes carry no ``prev_seq``: a message a consumer held
    back until the one before it came would not come again. The deduper applies k+1
    with a gap and k late.
    """

    def __init__(
        self,
        client: SqsClient,
        settings: SinkSettings,
        *,
        executor: Executor | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        rng: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """As :class:`~worker.sinks.kinesis.KinesisSink`."""
        self._client = client
        self._settings = settings
        self._executor = executor
        self._clock_ms = clock_ms
        self._rng = rng or default_rng()
        self._sleep = sleep

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        received_at = self._clock_ms()
        records: list[Record[Entry]] = []
        for number, delivery in enumerate(deliveries):
            # No prev_seq: SQS drops a later copy of a message as a duplicate, so one a
            # consumer held back as early would never come again.
            envelope = envelope_of(delivery, received_at)
            body = envelope.to_bytes().decode()
            if any(c in body for c in _NOT_IN_SQS):
                body = envelope.to_bytes(ascii_only=True).decode()
            entry = Entry(
                # Unique within any request: the position in the batch.
                Id=str(number),
                MessageBody=body,
                MessageGroupId=delivery.connection_id,
                MessageDeduplicationId=deduplication_id(
                    delivery.connection_id, delivery.seq_gen, delivery.seq
                ),
            )
            records.append(record(SQS_LIMITS, delivery, entry, len(body.encode())))
        await send_all(
            records,
            self._send,
            limits=SQS_LIMITS,
            destination=self._settings.destination,
            max_attempts=self._settings.max_attempts,
            keep_order=False,
            rng=self._rng,
            sleep=self._sleep,
        )

    async def _send(self, entries: list[Entry]) -> list[Refusal | None]:
        call = partial(
            self._client.send_message_batch, QueueUrl=self._settings.destination, Entries=entries
        )
        answer = await run_blocking(self._executor, call)
        failed = {f["Id"]: f for f in answer.get("Failed", ())}
        if not failed:
            return [None] * len(entries)
        taken = {s["Id"] for s in answer.get("Successful", ())}
        outcomes: list[Refusal | None] = []
        for entry in entries:
            failure = failed.get(entry["Id"])
            if failure is not None:
                outcomes.append(
                    Refusal(
                        failure.get("Code", "?"),
                        failure.get("Message", ""),
                        final=bool(failure.get("SenderFault")),
                    )
                )
            elif entry["Id"] in taken:
                outcomes.append(None)
            else:
                outcomes.append(Refusal("NotAnswered", "neither taken nor refused in the answer"))
        return outcomes


def factory() -> SqsFifoSink:
    """``HANDLER=worker.sinks.sqs_fifo:factory``."""
    settings = SinkSettings.from_env("sqs_fifo")
    return SqsFifoSink(make_client("sqs"), settings, executor=make_executor("sqs"))
