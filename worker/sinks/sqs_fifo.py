"""``HANDLER=worker.sinks.sqs_fifo:factory``: each message as an envelope
(:mod:`wsfleet.envelope`) into an SQS FIFO queue, the connection id as the message
group (so each connection's messages are received in the order sent) and a hash of
``(connection_id, seq_gen, seq)`` and the request as the deduplication id (so SQS
drops a request botocore sent again, and nothing else).

Settings: ``SINK_QUEUE_URL`` (a FIFO queue's URL, ending in ``.fifo``),
``SINK_MAX_ATTEMPTS`` (:mod:`worker.sinks.settings`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any, Protocol, TypedDict

from worker.delivery import Delivery
from worker.sinks import set_aside
from worker.sinks.batch_rules import SQS_LIMITS, deduplication_id
from worker.sinks.clients import make_client, make_executor
from worker.sinks.sending import (
    Refusal,
    SetAsideReport,
    SinkSender,
    default_rng,
    run_blocking,
    sender_for,
    wall_ms,
)
from worker.sinks.settings import SinkSettings
from wsfleet.envelope import Envelope

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

    Entries a request refuses (``Failed``) are sent again as the Kinesis sink's are
    (:class:`~worker.sinks.kinesis.KinesisSink`): from a connection's first refused
    entry on, in order, so when SQS refuses seq k and takes k+1 the group holds
    k+1, k, k+1. Each envelope names the seq sent before it (``prev_seq``), so the
    deduper holds the early k+1 back (EARLY) and applies k, then k+1. That needs the
    later copy of k+1 to land: each request gives its entries deduplication ids of
    their own (:func:`~worker.sinks.batch_rules.deduplication_id`), so SQS drops only
    a request botocore sent again, and a consumer drops the other copies (another
    owner's, a batch sent again whole) with the deduper.
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
        report: SetAsideReport = set_aside.report,
    ) -> None:
        """As :class:`~worker.sinks.kinesis.KinesisSink`."""
        self._client = client
        self._settings = settings
        self._executor = executor
        self._clock_ms = clock_ms
        self._rng = rng or default_rng()
        self._sender: SinkSender[Entry] = sender_for(
            SQS_LIMITS,
            settings.destination,
            settings.max_attempts,
            report=report,
            rng=self._rng,
            sleep=sleep,
        )

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        token = f"{self._rng():.17f}"
        requests = itertools.count(1)
        entries = itertools.count()
        names: dict[str, tuple[str, int, int]] = {}

        def encode(envelope: Envelope) -> tuple[Entry, int]:
            body = envelope.to_bytes().decode()
            if any(c in body for c in _NOT_IN_SQS):
                body = envelope.to_bytes(ascii_only=True).decode()
            # Unique within any request of the call.
            ident = str(next(entries))
            names[ident] = envelope.key
            entry = Entry(
                Id=ident,
                MessageBody=body,
                MessageGroupId=envelope.connection_id,
                MessageDeduplicationId="",  # set per request
            )
            return entry, len(body.encode())

        async def send(entries: list[Entry]) -> list[Refusal | None]:
            request = f"{token}.{next(requests)}"
            sent: list[Entry] = []
            for entry in entries:
                ident = deduplication_id(*names[entry["Id"]], request)
                sent.append(
                    Entry(
                        Id=entry["Id"],
                        MessageBody=entry["MessageBody"],
                        MessageGroupId=entry["MessageGroupId"],
                        MessageDeduplicationId=ident,
                    )
                )
            return await self._send(sent)

        await self._sender.send_batch(deliveries, encode, send, self._clock_ms())

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
