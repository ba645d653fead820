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
from worker.sinks.batch_rules import KINESIS_LIMITS
from worker.sinks.clients import make_client, make_executor
from worker.sinks.sending import (
    Record,
    Refusal,
    default_rng,
    envelope_of,
    prev_seqs,
    record,
    run_blocking,
    send_all,
    wall_ms,
)
from worker.sinks.settings import SinkSettings


class Entry(TypedDict):
    Data: bytes
    PartitionKey: str


class KinesisClient(Protocol):
    def put_records(self, **kwargs: Any) -> Mapping[str, Any]: ...


class KinesisSink:
    """A batch handler that writes each batch with ``PutRecords``: requests of at
    most 500 records and 5 MiB (data and partition keys), in delivery order.

    Records a request refuses (``FailedRecordCount`` > 0, mostly a shard over its
    write limit) are sent again with backoff, up to ``max_attempts`` sends each;
    then the call fails and the worker sends the whole batch again later.

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
    ) -> None:
        """``executor``: where the blocking boto3 calls run (None: the loop's
        default); ``clock_ms``: the wall clock (epoch ms) that stamps
        ``received_at``, read once per batch."""
        self._client = client
        self._settings = settings
        stream = settings.destination
        arn = stream.startswith("arn:")
        self._target = {"StreamARN" if arn else "StreamName": stream}
        self._executor = executor
        self._clock_ms = clock_ms
        self._rng = rng or default_rng()
        self._sleep = sleep

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        received_at = self._clock_ms()
        records: list[Record[Entry]] = []
        for delivery, prev_seq in zip(deliveries, prev_seqs(deliveries), strict=True):
            data = envelope_of(delivery, received_at, prev_seq).to_bytes()
            key = delivery.connection_id
            # Kinesis counts the partition key's UTF-8 bytes with the data.
            size = len(data) + len(key.encode())
            records.append(
                record(KINESIS_LIMITS, delivery, Entry(Data=data, PartitionKey=key), size)
            )
        await send_all(
            records,
            self._put,
            limits=KINESIS_LIMITS,
            destination=self._settings.destination,
            max_attempts=self._settings.max_attempts,
            keep_order=True,
            rng=self._rng,
            sleep=self._sleep,
        )

    async def _put(self, entries: list[Entry]) -> list[Refusal | None]:
        call = partial(self._client.put_records, Records=entries, **self._target)
        answer = await run_blocking(self._executor, call)
        if not answer.get("FailedRecordCount"):
            return [None] * len(entries)
        return [
            Refusal(r["ErrorCode"], r.get("ErrorMessage", "")) if r.get("ErrorCode") else None
            for r in answer["Records"]
        ]


def factory() -> KinesisSink:
    """``HANDLER=worker.sinks.kinesis:factory``."""
    settings = SinkSettings.from_env("kinesis")
    return KinesisSink(make_client("kinesis"), settings, executor=make_executor("kinesis"))
