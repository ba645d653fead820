"""What the three sinks share: a batch of deliveries made into records, sent in
requests within the service's limits, refused records sent again with backoff, and
the call failed when one is still refused after the last attempt.

A sink is at-least-once: a record may be written more than once (sent again after a
partial failure, or the whole batch again after a failed call), never skipped
unless the operator chose ``HANDLER_ERRORS=skip``. Consumers drop copies by
``(connection_id, seq_gen, seq)`` (:class:`wsfleet.envelope.Envelope`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from worker.delivery import Delivery
from worker.sinks.batch_rules import Limits, check_record_size, first_request_length, to_send_again
from wsfleet.backoff import backoff_delays
from wsfleet.envelope import Envelope

E = TypeVar("E")
"""A request entry, as the service's API takes it."""
T = TypeVar("T")

BACKOFF_INITIAL = 0.1
BACKOFF_MAXIMUM = 2.0
"""Seconds between sends of refused records: a refusal is mostly a shard's or a
stream's throughput limit, which frees up within a second; the worker's own backoff
takes over once the call fails."""


def wall_ms() -> int:
    """The wall clock in epoch milliseconds (an envelope's ``received_at``)."""
    return time.time_ns() // 1_000_000


def envelope_of(delivery: Delivery, received_at_ms: int, prev_seq: int | None = None) -> Envelope:
    return Envelope(
        connection_id=delivery.connection_id,
        epoch=delivery.epoch,
        seq_gen=delivery.seq_gen,
        seq=delivery.seq,
        received_at_ms=received_at_ms,
        payload=delivery.payload,
        prev_seq=prev_seq,
    )


def prev_seqs(deliveries: Sequence[Delivery]) -> list[int | None]:
    """Each delivery's ``prev_seq``: the seq of the delivery before it in the batch of
    the same connection, when of the same ``seq_gen`` and below its seq; else None.

    Only for a sink that sends again, after a partial refusal, every later record of
    the connection (``keep_order``): a consumer holds back a message whose
    ``prev_seq`` it has not applied (:class:`wsfleet.deduper.Decision`, EARLY) until
    the copy that follows that one."""
    last: dict[str, tuple[int, int]] = {}
    prevs: list[int | None] = []
    for delivery in deliveries:
        before = last.get(delivery.connection_id)
        if before is not None and before[0] == delivery.seq_gen and before[1] < delivery.seq:
            prevs.append(before[1])
        else:
            prevs.append(None)
        last[delivery.connection_id] = (delivery.seq_gen, delivery.seq)
    return prevs


@dataclass(frozen=True, slots=True)
class Record(Generic[E]):
    """One message as one request entry."""

    entry: E
    connection_id: str
    seq_gen: int
    seq: int
    size: int
    """Bytes as the service counts them."""


def record(limits: Limits, delivery: Delivery, entry: E, size: int) -> Record[E]:
    """The record of ``delivery``, refused (:class:`RecordTooLargeError`) when the
    service would refuse it for its size."""
    check_record_size(limits, delivery.connection_id, delivery.seq_gen, delivery.seq, size)
    return Record(entry, delivery.connection_id, delivery.seq_gen, delivery.seq, size)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the service refused one record of a request."""

    code: str
    message: str
    final: bool = False
    """Sending it again cannot help (SQS's ``SenderFault``): the call fails at once."""


class SinkSendError(RuntimeError):
    """Records still refused after the last attempt (or refused for good): the batch
    call fails, and the worker retries the whole batch or skips it."""


Send = Callable[[list[E]], Awaitable[list[Refusal | None]]]
"""One request: its entries in, one outcome per entry out (None: written)."""


async def send_all(
    records: Sequence[Record[E]],
    send: Send[E],
    *,
    limits: Limits,
    destination: str,
    max_attempts: int,
    keep_order: bool,
    rng: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Send ``records`` in order, in requests within ``limits``. After a request
    that had records refused, what :func:`to_send_again` picks goes first into the
    next request, ahead of the records not yet sent (so a connection's records stay
    in order), after a backoff. A record refused on its ``max_attempts``-th send, or
    refused for good, fails the call with :class:`SinkSendError`."""
    pending = list(range(len(records)))
    sends = [0] * len(records)
    delays = None
    while pending:
        length = first_request_length((records[i].size for i in pending), limits)
        request, pending = pending[:length], pending[length:]
        outcomes = await send([records[i].entry for i in request])
        if len(outcomes) != len(request):
            raise SinkSendError(
                f"{limits.service} {destination}: {len(outcomes)} outcomes for a request "
                f"of {len(request)} records"
            )
        for i in request:
            sends[i] += 1
        refused = [outcome is not None for outcome in outcomes]
        if not any(refused):
            continue
        for i, outcome in zip(request, outcomes, strict=True):
            if outcome is not None and (outcome.final or sends[i] >= max_attempts):
                raise SinkSendError(
                    _refused(limits, destination, records[i], outcome, sends[i], sum(refused))
                )
        keys = [records[i].connection_id for i in request]
        again = to_send_again(keys, refused, keep_order=keep_order)
        pending = [request[k] for k in again] + pending
        if delays is None:
            delays = backoff_delays(initial=BACKOFF_INITIAL, maximum=BACKOFF_MAXIMUM, rng=rng)
        await sleep(next(delays))


def _refused(
    limits: Limits, destination: str, record: Record[Any], why: Refusal, sends: int, refused: int
) -> str:
    how = "for good" if why.final else f"at send {sends} of at most {sends}"
    return (
        f"{limits.service} {destination} refused message {record.seq} (seq_gen "
        f"{record.seq_gen}) of connection {record.connection_id} {how}: {why.code}: "
        f"{why.message} ({refused} refused in that request)"
    )


async def run_blocking(executor: Executor | None, call: Callable[[], T]) -> T:
    """``call`` (a boto3 call, which blocks) on ``executor`` (None: the loop's
    default executor)."""
    return await asyncio.get_running_loop().run_in_executor(executor, call)


def default_rng() -> Callable[[], float]:
    return random.Random().random
