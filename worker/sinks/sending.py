"""What the three sinks share: a batch of deliveries made into records, sent in
requests within the service's limits, refused records sent again in order, and the
rules that keep a connection streaming whatever the destination does.

- **Nothing is lost.** A record is written at least once, or the call fails and the
  worker sends the batch again (``HANDLER_ERRORS=retry``, the default) or skips it
  (``skip``: a chosen loss, counted). Consumers drop copies by
  ``(connection_id, seq_gen, seq)`` (:mod:`wsfleet.deduper`).
- **A message that can never be sent costs only itself.** A payload that is not JSON
  (NaN, an infinity), a record over the service's limit, or one the service refuses
  for good is sent as a *set-aside* envelope in its place (:class:`SetAside`:
  the reason, the size and, when it fits, the payload as text), reported
  (:data:`SetAsideReport`: logged with its seqs and an excerpt, counted), and the
  stream goes on.
- **A throttle is waited out, not failed.** A record refused for throughput is sent
  again for as long as it takes, in requests cut to what the destination took last
  (:func:`~worker.sinks.batch_rules.next_window`), so the call finishes at the rate
  the destination grants. Only other refusals count against ``max_attempts``.
- **What landed is not sent again.** When a call fails after records of a connection
  landed in order, the next call of that connection (the worker sending the batch
  again) leaves them out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from worker.delivery import Delivery
from worker.sinks.batch_rules import (
    Limits,
    first_request_length,
    is_throttle,
    landed_in_order,
    next_window,
    to_send_again,
)
from wsfleet.backoff import backoff_delays
from wsfleet.envelope import Envelope, EnvelopeError, SetAside

log = logging.getLogger(__name__)

E = TypeVar("E")
"""A request entry, as the service's API takes it."""
T = TypeVar("T")

BACKOFF_INITIAL = 0.1
BACKOFF_MAXIMUM = 2.0
"""Seconds between sends of refused records: a refusal is mostly a shard's or a
stream's throughput limit, which frees up within a second."""
EXCERPT_CHARACTERS = 1024
"""How much of a set-aside message the log shows."""
WARN_AFTER_ROUNDS = 10
"""Requests with refusals in one call before the first warning (then at 20, 40, ...)."""


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

    The sinks send again, after a partial refusal, every later record of the
    connection: a consumer holds back a message whose ``prev_seq`` it has not applied
    (:class:`wsfleet.deduper.Decision`, EARLY) until the copy that follows that one."""
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
    envelope: Envelope
    """What the entry carries (a set-aside envelope in place of a message that could
    not be sent)."""
    size: int
    """Bytes as the service counts them."""
    excerpt: str | None = None
    """For a set-aside envelope: the start of the message it stands for, to log."""

    @property
    def connection_id(self) -> str:
        return self.envelope.connection_id


Encode = Callable[[Envelope], "tuple[E, int]"]
"""The service's entry for an envelope and its size as the service counts it; raises
:class:`~wsfleet.envelope.EnvelopeError` when the envelope cannot be written."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the service refused one record of a request."""

    code: str
    message: str
    final: bool = False
    """Sending it again cannot help (SQS's ``SenderFault``): it is set aside."""


Send = Callable[[list[E]], Awaitable[list[Refusal | None]]]
"""One request: its entries in, one outcome per entry out (None: written)."""


@dataclass(frozen=True, slots=True)
class SetAsideNotice:
    """A message sent as a set-aside envelope, once that envelope landed."""

    service: str
    destination: str
    envelope: Envelope
    """The set-aside envelope (``set_aside`` set, ``payload`` None)."""
    excerpt: str
    """The start of the message, as Python shows it."""


SetAsideReport = Callable[[SetAsideNotice], None]
"""Where set-aside messages are reported (logged and counted in production:
:func:`worker.sinks.set_aside.report`)."""


class SinkSendError(RuntimeError):
    """Records still refused after the last attempt: the batch call fails, and the
    worker sends the batch again or skips it."""


class SinkSender(Generic[E]):
    """Sends batches to one destination (one per sink). Holds, per connection, what a
    failed call landed in order, so the call that sends the batch again leaves it
    out; an entry lives only until that connection's next call."""

    def __init__(
        self,
        *,
        limits: Limits,
        destination: str,
        max_attempts: int,
        report: SetAsideReport,
        rng: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._limits = limits
        self._destination = destination
        self._max_attempts = max_attempts
        self._report = report
        self._rng = rng
        self._sleep = sleep
        self._landed: dict[str, tuple[int, int]] = {}
        """Connection id -> (seq_gen, seq): the last record a failed call of it landed
        in order."""

    async def send_batch(
        self,
        deliveries: Sequence[Delivery],
        encode: Encode[E],
        send: Send[E],
        received_at_ms: int,
    ) -> None:
        """Write ``deliveries`` (one handler call's batch) in order."""
        unsent = self._unsent(deliveries)
        records = [
            self._record(delivery, prev_seq, encode, received_at_ms)
            for delivery, prev_seq in zip(unsent, prev_seqs(unsent), strict=True)
        ]
        landed = [False] * len(records)
        try:
            await self._send_all(records, landed, encode, send)
        finally:
            self._remember(records, landed)

    def _unsent(self, deliveries: Sequence[Delivery]) -> Sequence[Delivery]:
        if not self._landed:
            return deliveries
        landed = self._landed
        return [
            d
            for d in deliveries
            if (mark := landed.get(d.connection_id)) is None
            or mark[0] != d.seq_gen
            or d.seq > mark[1]
        ]

    def _remember(self, records: Sequence[Record[E]], landed: Sequence[bool]) -> None:
        keys = [r.connection_id for r in records]
        counts = landed_in_order(keys, landed)
        for cid, count in counts.items():
            mine = [r.envelope for r in records if r.connection_id == cid]
            if count == len(mine):
                self._landed.pop(cid, None)
            elif count:
                self._landed[cid] = (mine[count - 1].seq_gen, mine[count - 1].seq)

    def _record(
        self, delivery: Delivery, prev_seq: int | None, encode: Encode[E], received_at_ms: int
    ) -> Record[E]:
        envelope = envelope_of(delivery, received_at_ms, prev_seq)
        limit = self._limits.max_record_bytes
        try:
            entry, size = encode(envelope)
        except EnvelopeError as error:
            text = json.dumps(delivery.payload, separators=(",", ":"), default=repr)
            return self._set_aside(
                envelope, encode, "not_json", str(error), len(text.encode()), text
            )
        if size > limit:
            detail = (
                f"{size:,} bytes as a {self._limits.service} record, over the limit of {limit:,}"
            )
            return self._set_aside(envelope, encode, "too_large", detail, size, None)
        return Record(entry, envelope, size)

    def _set_aside(
        self,
        envelope: Envelope,
        encode: Encode[E],
        reason: str,
        detail: str,
        size: int,
        text: str | None,
    ) -> Record[E]:
        """The record of a set-aside envelope in place of ``envelope``: the payload as
        text when it fits, else without it."""
        excerpt = repr(envelope.payload)[:EXCERPT_CHARACTERS]
        why = SetAside(reason, detail, size, text)
        marker = dataclasses.replace(envelope, payload=None, set_aside=why)
        entry, marker_size = encode(marker)
        if marker_size > self._limits.max_record_bytes and text is not None:
            marker = dataclasses.replace(marker, set_aside=dataclasses.replace(why, text=None))
            entry, marker_size = encode(marker)
        return Record(entry, marker, marker_size, excerpt)

    async def _send_all(
        self, records: list[Record[E]], landed: list[bool], encode: Encode[E], send: Send[E]
    ) -> None:
        """Send ``records`` in order, in requests within the limits and the window.
        After a request with refusals, what :func:`to_send_again` picks goes first into
        the next request, after a backoff; ``landed`` says, per record, whether its
        last send was taken."""
        limits = self._limits
        pending = list(range(len(records)))
        sends = [0] * len(records)
        ahead: set[int] = set()
        """Records taken ahead of a refused one of their connection, to be sent again."""
        window = limits.max_count
        delays = None
        rounds = 0
        while pending:
            length = min(window, first_request_length((records[i].size for i in pending), limits))
            request, pending = pending[:length], pending[length:]
            outcomes = await send([records[i].entry for i in request])
            if len(outcomes) != len(request):
                raise SinkSendError(
                    f"{limits.service} {self._destination}: {len(outcomes)} outcomes for a "
                    f"request of {len(request)} records"
                )
            refused = [outcome is not None for outcome in outcomes]
            for i, outcome in zip(request, outcomes, strict=True):
                sends[i] += 1
                landed[i] = outcome is None
                if outcome is None and records[i].excerpt is not None:
                    self._notify(records[i])
            window = next_window(window, len(request), refused.count(False), limits)
            if not any(refused):
                delays = None
                continue
            keys = [records[i].connection_id for i in request]
            again = [request[k] for k in to_send_again(keys, refused, keep_order=True)]
            for i in again:
                if landed[i]:
                    ahead.add(i)
                landed[i] = False
            for i, outcome in zip(request, outcomes, strict=True):
                if outcome is None:
                    continue
                if outcome.final and records[i].excerpt is None:
                    envelope = records[i].envelope
                    why = f"{outcome.code}: {outcome.message}"
                    records[i] = self._set_aside(
                        envelope, encode, "refused", why, records[i].size, None
                    )
                elif outcome.final or (
                    not is_throttle(outcome.code) and sends[i] >= self._max_attempts
                ):
                    raise SinkSendError(
                        self._refused(records[i], outcome, sends[i], refused.count(True))
                        + self._held_back(records, landed, ahead)
                    )
            pending = again + pending
            rounds += 1
            if _warn_at(rounds):
                log.warning(
                    "sink requests refused: still sending",
                    extra={
                        "service": limits.service,
                        "destination": self._destination,
                        "requests_with_refusals": rounds,
                        "records_left": len(pending),
                        "last_code": next(o.code for o in outcomes if o is not None),
                    },
                )
            if delays is None:
                delays = backoff_delays(
                    initial=BACKOFF_INITIAL, maximum=BACKOFF_MAXIMUM, rng=self._rng
                )
            await self._sleep(next(delays))

    def _notify(self, record: Record[E]) -> None:
        self._report(
            SetAsideNotice(
                self._limits.service, self._destination, record.envelope, record.excerpt or ""
            )
        )

    def _refused(self, record: Record[E], why: Refusal, sends: int, refused: int) -> str:
        e = record.envelope
        how = "for good" if why.final else f"at send {sends} of at most {self._max_attempts}"
        return (
            f"{self._limits.service} {self._destination} refused message {e.seq} (seq_gen "
            f"{e.seq_gen}) of connection {e.connection_id} {how}: {why.code}: "
            f"{why.message} ({refused} refused in that request)"
        )

    @staticmethod
    def _held_back(records: Sequence[Record[Any]], landed: Sequence[bool], ahead: set[int]) -> str:
        """For the error: the records that landed ahead of a refused one and whose
        later copy has not landed. A consumer holds them back (EARLY) until the batch
        is sent again; if the worker skips it, they are lost with it."""
        early = sorted(records[i].envelope.seq for i in ahead if not landed[i])
        if not early:
            return ""
        return (
            f"; seqs {', '.join(map(str, early))} landed ahead of a refused one: a consumer "
            "holds them back until the batch is sent again (skipped, they are lost with it)"
        )


def _warn_at(rounds: int) -> bool:
    """Whether to warn after ``rounds`` requests with refusals: at 10, 20, 40, ..."""
    tens, rest = divmod(rounds, WARN_AFTER_ROUNDS)
    return rest == 0 and tens > 0 and tens & (tens - 1) == 0


def sender_for(
    limits: Limits,
    destination: str,
    max_attempts: int,
    *,
    report: SetAsideReport,
    rng: Callable[[], float] | None,
    sleep: Callable[[float], Awaitable[None]],
) -> SinkSender[Any]:
    """A sink's :class:`SinkSender` (``rng`` None: a random source of its own)."""
    return SinkSender(
        limits=limits,
        destination=destination,
        max_attempts=max_attempts,
        report=report,
        rng=rng or default_rng(),
        sleep=sleep,
    )


async def run_blocking(executor: Executor | None, call: Callable[[], T]) -> T:
    """``call`` (a boto3 call, which blocks) on ``executor`` (None: the loop's
    default executor)."""
    return await asyncio.get_running_loop().run_in_executor(executor, call)


def default_rng() -> Callable[[], float]:
    return random.Random().random
