"""``HANDLER=worker.sinks.kinesis:factory``: each message as an envelope
(:mod:`wsfleet.envelope`) into a Kinesis data stream, the connection id as the
partition key, so each connection's messages go to one shard, in seq order.

Settings: ``SINK_STREAM_NAME`` (the stream's name or ARN), ``SINK_MAX_ATTEMPTS``
(:mod:`worker.sinks.settings`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any, Protocol, TypedDict

from worker.delivery import Delivery
from worker.sinks import set_aside
from worker.sinks.batch_rules import KINESIS_LIMITS
from worker.sinks.clients import make_client, make_executor
from worker.sinks.sending import (
    Refusal,
    SetAsideReport,
    SinkSender,
    run_blocking,
    sender_for,
    wall_ms,
)
from worker.sinks.settings import SinkSettings
from wsfleet.envelope import Envelope


class Entry(TypedDict):
    Data: bytes
    PartitionKey: str


class KinesisClient(Protocol):
    def put_records(self, **kwargs: Any) -> Mapping[str, Any]: ...


class KinesisSink:
    """A batch handler that writes each batch with ``PutRecords``: requests of at
    most 500 records and 5 MiB (data and partition keys), in delivery order.

    Records a request refuses (``FailedRecordCount`` > 0, mostly a shard over its
    write limit) are sent again with backoff, for as long as the shard throttles, in
    requests cut to what it took last; other refusals up to ``max_attempts`` sends
    each, then the call fails and the worker sends the batch again (leaving out what
    landed in order). A message that can never be sent goes as a set-aside envelope
    in its place (:mod:`worker.sinks.sending`).

    What is sent again is not only the refused record: from the first refused record
    of a connection on, every later record of that connection in the request goes
    again, refused or not, ahead of the records not yet sent. Kinesis writes every
    record of a request that it does not refuse, so with seq k refused and k+1
    written the shard holds k+1 before k, whatever is sent next. Sending k alone
    would leave k+1, k; sending k and k+1 gives k+1, k, k+1: one more duplicate, but
    the last copies of a connection's messages are always in seq order, and the full
    run k, k+1 follows the early k+1. Each envelope but the first of a connection in
    the call names the seq sent just before it (``prev_seq``), so a consumer can tell
    the early k+1 from a gap: it names k, which it has not applied. The deduper
    (:mod:`wsfleet.deduper`) holds it back (EARLY) and applies k and then k+1 when they
    follow: every message once, in seq order, in a connection's first batch too. A
    consumer that keeps only the highest seq applied and ignores ``prev_seq`` would
    take the early k+1 and then drop k as a copy, losing it.
    """

    def __init__(
        self,
        client: KinesisClient,
        settings: SinkSettings,
        *,
        executor: Executor | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        rng: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        report: SetAsideReport = set_aside.report,
    ) -> None:
        """``executor``: where the blocking boto3 calls run (None: the loop's
        default); ``clock_ms``: the wall clock (epoch ms) that stamps
        ``received_at``, read once per batch; ``report``: where a message sent as a
        set-aside envelope is reported."""
        self._client = client
        self._settings = settings
        stream = settings.destination
        arn = stream.startswith("arn:")
        self._target = {"StreamARN" if arn else "StreamName": stream}
        self._executor = executor
        self._clock_ms = clock_ms
        self._sender: SinkSender[Entry] = sender_for(
            KINESIS_LIMITS, stream, settings.max_attempts, report=report, rng=rng, sleep=sleep
        )

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        await self._sender.send_batch(deliveries, _encode, self._put, self._clock_ms())

    async def _put(self, entries: list[Entry]) -> list[Refusal | None]:
        call = partial(self._client.put_records, Records=entries, **self._target)
        answer = await run_blocking(self._executor, call)
        if not answer.get("FailedRecordCount"):
            return [None] * len(entries)
        return [
            Refusal(r["ErrorCode"], r.get("ErrorMessage", "")) if r.get("ErrorCode") else None
            for r in answer["Records"]
        ]


def _encode(envelope: Envelope) -> tuple[Entry, int]:
    data = envelope.to_bytes()
    key = envelope.connection_id
    # Kinesis counts the partition key's UTF-8 bytes with the data.
    return Entry(Data=data, PartitionKey=key), len(data) + len(key.encode())


def factory() -> KinesisSink:
    """``HANDLER=worker.sinks.kinesis:factory``."""
    settings = SinkSettings.from_env("kinesis")
    return KinesisSink(make_client("kinesis"), settings, executor=make_executor("kinesis"))
