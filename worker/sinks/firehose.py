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
from worker.sinks import set_aside
from worker.sinks.batch_rules import FIREHOSE_LIMITS
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


class FirehoseClient(Protocol):
    def put_record_batch(self, **kwargs: Any) -> Mapping[str, Any]: ...


class FirehoseSink:
    """A batch handler that writes each batch with ``PutRecordBatch``: requests of at
    most 500 records and 4 MiB, in delivery order.

    Records a request refuses (``FailedPutCount`` > 0) are sent again as the Kinesis
    sink's are (:class:`~worker.sinks.kinesis.KinesisSink`, and
    :mod:`worker.sinks.sending` for what a throttle and a message that can never be
    sent do). Firehose's output is not read in write order (S3 objects), so a
    consumer takes each message once with the deduper's unordered mode
    (:mod:`wsfleet.firehose_objects`), whatever the order.
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
        report: SetAsideReport = set_aside.report,
    ) -> None:
        """As :class:`~worker.sinks.kinesis.KinesisSink`."""
        self._client = client
        self._settings = settings
        self._executor = executor
        self._clock_ms = clock_ms
        self._sender: SinkSender[Entry] = sender_for(
            FIREHOSE_LIMITS,
            settings.destination,
            settings.max_attempts,
            report=report,
            rng=rng,
            sleep=sleep,
        )

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        await self._sender.send_batch(deliveries, _encode, self._put, self._clock_ms())

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


def _encode(envelope: Envelope) -> tuple[Entry, int]:
    data = envelope.to_bytes() + b"\n"
    return Entry(Data=data), len(data)


def factory() -> FirehoseSink:
    """``HANDLER=worker.sinks.firehose:factory``."""
    settings = SinkSettings.from_env("firehose")
    return FirehoseSink(make_client("firehose"), settings, executor=make_executor("firehose"))
