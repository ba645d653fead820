"""``HANDLER=worker.sinks.firehose:factory``: each message as an envelope
(:mod:`wsfleet.envelope`) followed by a newline into a Firehose delivery stream, so
the objects it writes (to S3, say) are newline-delimited JSON, one envelope a line.

Settings: ``SINK_DELIVERY_STREAM`` (the delivery stream's name), ``SINK_MAX_ATTEMPTS``
(:mod:`worker.sinks.settings`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any, Protocol, TypedDict

from worker.delivery import Delivery
from worker.sinks.batch_rules import FIREHOSE_LIMITS
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


class FirehoseClient(Protocol):
    def put_record_batch(self, **kwargs: Any) -> Mapping[str, Any]: ...


class FirehoseSink:
    """A batch handler that writes each batch with ``PutRecordBatch``: requests of at
    most 500 records and 4 MiB, in delivery order.

    Records a request refuses (``FailedPutCount`` > 0) are sent again with backoff,
    up to ``max_attempts`` sends each; then the call fails and the worker sends the
    whole batch again later. As in :class:`~worker.sinks.kinesis.KinesisSink`, from
    the first refused record of a connection on, every later record of that
    connection in the request goes again too: the last copies of a connection's
    messages are then in seq order, at the price of duplicates; and each envelope
    names the seq sent before it (``prev_seq``), so a consumer holds back the early
    ones.
    """

    def __init__(
        self,
        client: FirehoseClient,
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
        for delivery, prev_seq in zip(deliveries, prev_seqs(deliveries), strict=True):
            data = envelope_of(delivery, received_at, prev_seq).to_bytes() + b"\n"
            records.append(record(FIREHOSE_LIMITS, delivery, Entry(Data=data), len(data)))
        await send_all(
            records,
            self._put,
            limits=FIREHOSE_LIMITS,
            destination=self._settings.destination,
            max_attempts=self._settings.max_attempts,
            keep_order=True,
            rng=self._rng,
            sleep=self._sleep,
        )

    async def _put(self, entries: list[Entry]) -> list[Refusal | None]:
        call = partial(
            self._client.put_record_batch,
            DeliveryStreamName=self._settings.destination,
            Records=entries,
        )
        answer = await run_blocking(self._executor, call)
        if not answer.get("FailedPutCount"):
            return [None] * len(entries)
        return [
            Refusal(r["ErrorCode"], r.get("ErrorMessage", "")) if r.get("ErrorCode") else None
            for r in answer["RequestResponses"]
        ]


def factory() -> FirehoseSink:
    """``HANDLER=worker.sinks.firehose:factory``."""
    settings = SinkSettings.from_env("firehose")
    return FirehoseSink(make_client("firehose"), settings, executor=make_executor("firehose"))
