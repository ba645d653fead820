"""Consumer-side de-duplication and fencing of the envelopes the fleet's sinks write
(:mod:`wsfleet.envelope`), with a DynamoDB table of the consumer's own.

Two modes, chosen per :class:`Deduper` (``ordered``):

- **ordered** (the default): one item per connection, holding its position. The rules
  below count on each connection's records being read in the order the sink wrote
  them: Kinesis (a connection's records stay on one shard) and SQS FIFO (one message
  group per connection). Its effects come in seq order, bar late seqs.
- **unordered** (``ordered=False``): one item per message, for records read in any
  order: Firehose into S3 (objects are read as their events come or as listed by key,
  not as written), or any transport read out of order. Read out of order, the ordered
  rules lose messages: a higher seq applied first makes a lower one a copy unless it
  is a late seq within the horizon (and nothing stored shows no gap at all), and an
  EARLY record whose copy was read before it is never applied.

The ordered mode
----------------

The sinks deliver at least once: after a crash the next owner (a higher ``epoch``)
resumes from the last checkpoint, so what was sent since comes again, and a superseded
owner (a lower epoch) may still land a few records late. Within one connection
``(seq_gen, seq)`` orders the messages. Per connection the table keeps the highest
``(seq_gen, seq)`` applied, the epoch of the envelope applied last (for people: it
decides nothing) and the **late seqs**: the seqs a
gap jumped over that are still within ``hole_horizon`` of the highest. An envelope's
**predecessor** is its ``prev_seq``, the message sent just before it in the same sink
call; it is applied when the stored ``seq_gen`` is the envelope's, the stored seq is at
or above it and it is not a late seq (nothing stored: not applied). For an envelope:

- **SKIP** (a copy) when it is at or below the stored position and not a late seq;
- **EARLY** when it is not a copy and has a predecessor that is not applied: the sink
  sends it again after that one, and that copy is decided then;
- **APPLY** otherwise: above the stored position or a late seq, with its predecessor
  (if any) applied.

Whichever owner sent it: a copy is a copy, and a superseded owner's envelope of a seq
not applied yet is applied like its successor's. Refusing it would count on the
successor's copy coming after it, which is not so when the transport dropped that
copy, when records are read out of order, or when the stream cannot resume.

Why predecessors: the sinks send again, after a request was
partly refused, from the first refused record of a connection on, so a shard can hold
``k+1, k, k+1`` (``worker/sinks/kinesis.py``). The early ``k+1`` names ``k``, which is
not applied yet: EARLY. Then ``k`` and the second ``k+1`` are applied, in seq order.
This holds in a connection's (or a new ``seq_gen``'s) first batch too: nothing is
stored yet, so the early ``k+1`` shows no gap, and applied it would leave ``k`` to be
skipped as a copy, lost.

Why late seqs, still: an envelope without a predecessor (the first of a sink call, one
written by an older worker) cannot be told early from a gap, and a
stream may itself skip seqs. A seq a gap jumped over is applied when it comes
(``Outcome.late``), after the higher one: those effects are not in seq order. One
request holds at most 500 records, so the default horizon of 500 seqs covers every
reorder of an older worker's sink; a seq that comes later than that is taken for a
copy. ``hole_horizon=0`` remembers nothing: a seq at or below the highest applied is
always a copy.

Every decision is made by a conditional write: two consumers racing on one envelope
cannot both apply it, nor apply an early one. A failed condition returns the stored
item (``ReturnValuesOnConditionCheckFailure=ALL_OLD``), which tells SKIP and EARLY
apart with no read. The first write expects the next seq (the common case) and,
with a ``prev_seq``, an item that exists and does not await ``prev_seq`` as a late seq;
a gap or a new ``seq_gen`` takes a second, conditioned on exactly the item the first
returned, and a late seq one conditioned on that seq still awaited (and ``prev_seq``
not).

What each way of using it guarantees for the caller's effect:

- :meth:`Deduper.transact` writes the decision and the caller's own DynamoDB writes in
  one transaction: the effect happens **exactly once** per message whatever fails (a
  crash before the commit leaves neither; after it, both; a transaction whose answer
  was lost is recognised by its request token when botocore sends it again, and when
  the caller tries the envelope again it finds its own write and answers SKIP).
- :meth:`Deduper.decide` records the decision and returns it; an effect made after it
  is **at most once**: it is lost if the process dies between the write and the
  effect, or if the answer of a write that landed is lost and the retry says SKIP.
- :meth:`Deduper.preview`, then an idempotent effect, then :meth:`Deduper.decide`
  (recorded after the effect) is **at least once**: a crash in between repeats the
  effect on the redelivery, never loses it.

A **gap** (a seq more than one above the stored one, same ``seq_gen``) is applied: a
stream may skip (a worker running ``HANDLER_ERRORS=skip``, a ``json-field`` stream
that cannot resume, a record a consumer passed over) or be reordered by a sink as
above when its envelopes carry no ``prev_seq``.
:attr:`Outcome.gap` says how many seqs were jumped over, for the caller to log; those
that come later are applied as late seqs. The first envelope of a connection or of a
new ``seq_gen`` has no gap: where a stream starts is not known.

What the rules assume: a seq names one message across owners. True for ``json-seq``
and ``json-field`` (the upstream's own numbers); not for ``live``, which numbers on
from the last checkpoint after a crash, giving seqs already used to **new** messages:
these rules would skip them. And that an envelope with a ``prev_seq`` written before
its predecessor is written again after it, as the sinks do. When the predecessor
never lands (the worker skipped the batch after the sink's last attempt,
``HANDLER_ERRORS=skip``; a consumer passed a record over), what followed it in that
sink call stays EARLY, not applied; the next call's first envelope is applied with a
gap.

Table layout: partition key ``connection_id`` (S), nothing else in the key; one item
per connection: ``epoch``, ``seq_gen``, ``seq`` (N: the last applied), ``late`` (NS:
the late seqs; absent when there are none), and for people ``received_at_ms`` (N: the
worker's stamp) and ``applied_at_ms`` (N: the consumer's clock at the last write).
About 90 bytes without late seqs: one write unit per write, a refused one included.
Every message of a connection writes its one item, so a connection is bounded by what
one DynamoDB item takes (about 1,000 writes a second).

The unordered mode
------------------

Each message ``(connection_id, seq_gen, seq)`` is an item of its own in the same
table, under the key ``<connection_id>#<seq_gen>#<seq>`` (``#`` is not allowed in a
connection id, so it never meets a connection's item: one table may serve both
modes). A conditional put that the item does not exist decides: it passes, **APPLY**;
it fails, **SKIP** (``Outcome.stored``: the epoch of the copy applied, with the
envelope's ``seq_gen`` and ``seq``). Never EARLY; ``gap`` is 0 and ``late`` False:
with no order there is nothing to jump over, and ``prev_seq`` decides nothing.

What it guarantees: every message applied once whatever order its copies are read in,
whichever owner sent each, within the retention; no order at all, not even within a
connection. The three ways of using it guarantee what they do in the ordered mode:
:meth:`Deduper.transact` exactly once (the put and the caller's writes in one
transaction), :meth:`Deduper.decide` then an effect at most once,
:meth:`Deduper.preview`, an idempotent effect, then :meth:`Deduper.decide` at least
once. Two consumers racing on one message: one put passes. It assumes, as the ordered
mode does, that a seq names one message across owners (not so for ``live``).

Retention: each item holds ``expires_at`` (N, epoch seconds: when it was applied plus
``retention_seconds``, 14 days unless chosen), on which :func:`create_dedup_table`
turns DynamoDB's TTL on. A copy read after its item has expired **may be applied
again**: TTL deletes an expired item some time after ``expires_at`` (typically within
days), and from then on the message is new to the table. Choose a retention longer
than any copy can come late (S3 event retries, a replay of old objects); an item
expired but not deleted yet still makes a copy SKIP.

Item: ``connection_id`` (S, the key above), ``epoch`` (of the copy applied),
``received_at_ms``, ``applied_at_ms`` and ``expires_at`` (N). Cost: one item per
message, so one write unit per message and per copy (a refused put included; twice
that in a transaction, as for every transactional write) and about 100 bytes plus the
connection id of storage per message for the retention. No limit per connection: each
message writes an item of its own.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, cast

from botocore.exceptions import ClientError

from wsfleet.backoff import backoff_delays
from wsfleet.envelope import MAX_NUMBER, Envelope, EnvelopeError
from wsfleet.schema import is_valid_connection_id

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

PARTITION_KEY: Final = "connection_id"
KEY_ATTRIBUTE_TYPE: Final = "S"
EPOCH: Final = "epoch"
SEQ_GEN: Final = "seq_gen"
SEQ: Final = "seq"
LATE: Final = "late"
RECEIVED_AT_MS: Final = "received_at_ms"
APPLIED_AT_MS: Final = "applied_at_ms"
EXPIRES_AT: Final = "expires_at"
"""The unordered mode's TTL attribute: epoch seconds."""
MESSAGE_ID_SEPARATOR: Final = "#"
"""Joins a message's identity into its item's key; never in a connection id."""

RETENTION_SECONDS: Final = 14 * 24 * 3600
"""How long the unordered mode keeps a message's item by default (14 days): longer
than S3 event notifications are retried and than most replays reach back."""

HOLE_HORIZON: Final = 500
"""How far below the highest applied seq a seq jumped over is still awaited: the
sinks' largest request (500 records) bounds how far they reorder."""
MAX_EFFECTS: Final = 99
"""TransactWriteItems takes 100 actions; one is the dedup write."""
MAX_ATTEMPTS: Final = 8
"""Writes tried per decision: the first, the one after it (a gap, a late seq, a new
stream), and more only when other consumers keep changing the item in between."""

_RETRYABLE_REASONS: Final = frozenset(
    {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
)
"""Cancellation reasons that wrote nothing and may pass when tried again."""
_CONFLICT: Final = "TransactionConflictException"
"""What ``UpdateItem`` answers while a transaction holds the item."""


class Decision(enum.Enum):
    APPLY = "apply"
    """Not applied yet, whichever owner sent it: recorded (and, through ``transact``,
    its effects)."""
    SKIP = "skip"
    """A copy of a message already applied."""
    EARLY = "early"
    """Ahead of the message sent just before it in its batch (``prev_seq``), which is
    not applied yet: not applied now. The sink writes it again after that one
    (Kinesis and Firehose send again in order), so the copy that follows is applied.
    Ordered mode only."""


class DedupStateError(RuntimeError):
    """The dedup table holds an item that is not a position: nothing was decided."""


class EffectFailedError(RuntimeError):
    """The transaction was cancelled by one of the caller's effects (its own condition,
    or a write DynamoDB refused): nothing was written, the decision included."""

    def __init__(self, message: str, reasons: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(message)
        self.reasons = list(reasons)
        """``CancellationReasons``: index 0 is the dedup write, then the effects."""


class ContendedError(RuntimeError):
    """Every attempt lost to another writer of the same item: nothing was written by
    this call; the envelope may be tried again."""


@dataclass(frozen=True, slots=True)
class Position:
    """What the dedup item of a connection holds."""

    epoch: int
    """The epoch of the envelope applied last (decides nothing)."""
    seq_gen: int
    seq: int
    """With ``seq_gen``: the highest message applied."""
    late: frozenset[int] = frozenset()
    """Seqs of ``seq_gen`` below ``seq`` that a gap jumped over, still awaited."""

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None) -> Position | None:
        """The position of a stored item in DynamoDB's JSON (None or empty: no item).
        Raises :class:`DedupStateError` when a field is missing or not a whole number
        >= 0."""
        if not item:
            return None
        epoch, seq_gen, seq = (_whole_number(item, item.get(n), n) for n in (EPOCH, SEQ_GEN, SEQ))
        late = item.get(LATE)
        if late is None:
            return cls(epoch, seq_gen, seq)
        texts = late.get("NS") if isinstance(late, Mapping) else None
        if not isinstance(texts, list):
            raise DedupStateError(f"dedup item {item.get(PARTITION_KEY)!r}: {LATE} is {late!r}")
        return cls(
            epoch, seq_gen, seq, frozenset(_whole_number(item, {"N": t}, LATE) for t in texts)
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    decision: Decision
    gap: int = 0
    """For APPLY above the stored seq: the seqs of the same ``seq_gen`` jumped over;
    otherwise 0."""
    late: bool = False
    """For APPLY: a seq a gap had jumped over, applied after higher ones."""
    stored: Position | None = None
    """For SKIP and EARLY: the stored position that made it so (None for EARLY
    when nothing is stored); None for APPLY. In the unordered mode, for SKIP: the
    epoch of the copy applied, with the envelope's ``seq_gen`` and ``seq``."""


# --- the rules, pure --------------------------------------------------------------------


def validate(envelope: Envelope) -> None:
    """Raise :class:`EnvelopeError` for an envelope no decision can be made on. Those
    read by ``Envelope.from_bytes`` pass, bar numbers of more than 38 digits; one made
    in code may carry anything."""
    if not is_valid_connection_id(envelope.connection_id):
        raise EnvelopeError(
            "connection_id must be 1-128 characters of [A-Za-z0-9._:-], "
            f"got {envelope.connection_id!r}"
        )
    for name in ("epoch", "seq_gen", "seq", "received_at_ms"):
        value = getattr(envelope, name)
        # bool is an int to Python, not a number to anyone writing an envelope.
        if type(value) is not int or not 0 <= value <= MAX_NUMBER:
            raise EnvelopeError(
                f"{name} of an envelope of {envelope.connection_id} must be an integer "
                f"from 0 to 10**38 - 1, got {value!r}"
            )
    prev_seq = envelope.prev_seq
    if prev_seq is not None and (type(prev_seq) is not int or not 0 <= prev_seq < envelope.seq):
        raise EnvelopeError(
            f"prev_seq of an envelope of {envelope.connection_id} must be None or an "
            f"integer from 0 to below seq ({envelope.seq}), got {prev_seq!r}"
        )


def is_ahead(stored: Position | None, envelope: Envelope) -> bool:
    return stored is None or (envelope.seq_gen, envelope.seq) > (stored.seq_gen, stored.seq)


def is_late(stored: Position | None, envelope: Envelope, horizon: int) -> bool:
    """One of the stored late seqs, within the horizon."""
    return (
        stored is not None
        and envelope.seq_gen == stored.seq_gen
        and envelope.seq in stored.late
        and stored.seq - envelope.seq < horizon
    )


def predecessor_applied(stored: Position | None, envelope: Envelope) -> bool:
    """Whether the message sent just before ``envelope`` in its batch is applied (true
    when it names none): at or below the stored seq of its ``seq_gen`` and not awaited
    as a late seq. The horizon plays no part: the late seqs kept are within it."""
    prev_seq = envelope.prev_seq
    if prev_seq is None:
        return True
    return (
        stored is not None
        and stored.seq_gen == envelope.seq_gen
        and stored.seq >= prev_seq
        and prev_seq not in stored.late
    )


def classify(stored: Position | None, envelope: Envelope, horizon: int = HOLE_HORIZON) -> Decision:
    """The decision for ``envelope`` when the connection's item holds ``stored``."""
    if not (is_ahead(stored, envelope) or is_late(stored, envelope, horizon)):
        return Decision.SKIP
    if not predecessor_applied(stored, envelope):
        return Decision.EARLY
    return Decision.APPLY


def gap_before(stored: Position | None, envelope: Envelope) -> int:
    """Seqs of ``envelope``'s ``seq_gen`` missing between ``stored`` and it."""
    if stored is None or stored.seq_gen != envelope.seq_gen:
        return 0
    return max(0, envelope.seq - stored.seq - 1)


def late_after(stored: Position | None, envelope: Envelope, horizon: int) -> frozenset[int]:
    """The late seqs once ``envelope`` is applied above ``stored``: those kept, and
    those its gap jumps over, within ``horizon`` of it."""
    if stored is None or stored.seq_gen != envelope.seq_gen:
        return frozenset()
    floor = envelope.seq - horizon  # only seqs above it are awaited
    kept = {seq for seq in stored.late if seq > floor}
    return frozenset(kept.union(range(max(stored.seq + 1, floor + 1), envelope.seq)))


@dataclass(frozen=True, slots=True)
class NextSeq:
    """Guard of the first write: nothing stored, or the seq just before the envelope's,
    of its ``seq_gen``. Leaves the late seqs as they are.
    With a ``prev_seq``, something stored (nothing: EARLY), and ``prev_seq`` not a late
    seq."""


@dataclass(frozen=True, slots=True)
class Ahead:
    """Guard: exactly ``stored`` (None: no item), which the envelope is above. Its
    late seqs are written whole, so they are part of the condition: a late seq applied
    in between must not come back."""

    stored: Position | None


@dataclass(frozen=True, slots=True)
class Late:
    """Guard: the envelope's seq is still one of the late seqs, within the horizon, and
    its ``prev_seq`` (if any) is not (it is below the stored seq, as the envelope's is)."""


Guard = NextSeq | Ahead | Late


def plan(stored: Position | None, envelope: Envelope, horizon: int) -> Outcome | Ahead | Late:
    """After a write was refused with ``stored`` in the item: the SKIP or EARLY
    outcome, or the guard of the write that applies the envelope over it."""
    decision = classify(stored, envelope, horizon)
    if decision is not Decision.APPLY:
        return Outcome(decision, stored=stored)
    return Ahead(stored) if is_ahead(stored, envelope) else Late()


def applied(guard: Guard, envelope: Envelope) -> Outcome:
    """The outcome of a write under ``guard`` that passed."""
    match guard:
        case Ahead(stored=stored):
            return Outcome(Decision.APPLY, gap=gap_before(stored, envelope))
        case Late():
            return Outcome(Decision.APPLY, late=True)
        case NextSeq():
            return Outcome(Decision.APPLY)


def key(connection_id: str) -> dict[str, Any]:
    return {PARTITION_KEY: {KEY_ATTRIBUTE_TYPE: connection_id}}


def dedup_update(
    envelope: Envelope, now_ms: int, guard: Guard, horizon: int = HOLE_HORIZON
) -> dict[str, Any]:
    """``UpdateExpression``, ``ConditionExpression`` and their names and values: the
    write that applies ``envelope`` if ``guard`` holds. DynamoDB compares one value at
    a time, so each guard pins ``seq_gen`` and ``seq`` with equalities (or spells out
    the order)."""
    names = {"#epoch": EPOCH, "#received": RECEIVED_AT_MS, "#applied": APPLIED_AT_MS}
    values: dict[str, Any] = {
        ":epoch": _number(envelope.epoch),
        ":received": _number(envelope.received_at_ms),
        ":now": _number(now_ms),
    }
    sets = ["#epoch = :epoch", "#received = :received", "#applied = :now"]
    clauses: list[str] = []
    if isinstance(guard, Ahead) and not (
        is_ahead(guard.stored, envelope)
        and classify(guard.stored, envelope, horizon) is Decision.APPLY
    ):
        # The guard pins the item, so nothing else would stop the write.
        raise ValueError(f"{envelope.key} does not apply above {guard.stored or 'no item'}")
    match guard:
        case NextSeq():
            names |= {"#gen": SEQ_GEN, "#seq": SEQ}
            values |= {":gen": _number(envelope.seq_gen), ":prev": _number(envelope.seq - 1)}
            condition = "#gen = :gen AND #seq = :prev"
            if envelope.prev_seq is None:
                names["#id"] = PARTITION_KEY
                condition = f"attribute_not_exists(#id) OR ({condition})"
            elif envelope.prev_seq != envelope.seq - 1:
                # The stored seq is seq - 1, above prev_seq: applied unless still awaited.
                names["#late"] = LATE
                values[":prev_seq"] = _number(envelope.prev_seq)
                condition += " AND NOT contains(#late, :prev_seq)"
            sets += ["#gen = :gen", "#seq = :seq"]
            values[":seq"] = _number(envelope.seq)
        case Ahead(stored=None):
            names |= {"#id": PARTITION_KEY, "#gen": SEQ_GEN, "#seq": SEQ}
            condition = "attribute_not_exists(#id)"
            sets += ["#gen = :gen", "#seq = :seq"]
            values |= {":gen": _number(envelope.seq_gen), ":seq": _number(envelope.seq)}
        case Ahead(stored=Position() as stored):
            names |= {"#gen": SEQ_GEN, "#seq": SEQ, "#late": LATE}
            values |= {
                ":gen": _number(envelope.seq_gen),
                ":seq": _number(envelope.seq),
                ":old_epoch": _number(stored.epoch),
                ":old_gen": _number(stored.seq_gen),
                ":old_seq": _number(stored.seq),
            }
            condition = "#epoch = :old_epoch AND #gen = :old_gen AND #seq = :old_seq"
            if stored.late:
                values[":old_late"] = _numbers(stored.late)
                condition += " AND #late = :old_late"
            else:
                condition += " AND attribute_not_exists(#late)"
            sets += ["#gen = :gen", "#seq = :seq"]
            late = late_after(stored, envelope, horizon)
            if late:
                values[":late"] = _numbers(late)
                sets.append("#late = :late")
            elif stored.late:
                clauses.append("REMOVE #late")
        case Late():
            names |= {"#gen": SEQ_GEN, "#seq": SEQ, "#late": LATE}
            values |= {
                ":gen": _number(envelope.seq_gen),
                ":seq": _number(envelope.seq),
                ":limit": _number(envelope.seq + horizon),
                ":this": _numbers({envelope.seq}),
            }
            condition = "#gen = :gen AND contains(#late, :seq) AND #seq < :limit"
            if envelope.prev_seq is not None:
                values[":prev_seq"] = _number(envelope.prev_seq)
                condition += " AND NOT contains(#late, :prev_seq)"
            clauses.append("DELETE #late :this")
    return {
        "UpdateExpression": " ".join(["SET " + ", ".join(sets), *clauses]),
        "ConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }


# --- the unordered mode, pure -----------------------------------------------------------


def message_id(connection_id: str, seq_gen: int, seq: int) -> str:
    """The key of a message's item in the unordered mode. A connection id holds no
    ``#`` (:func:`wsfleet.schema.is_valid_connection_id`), so this is never one, and
    the three parts read back unambiguously."""
    return MESSAGE_ID_SEPARATOR.join((connection_id, str(seq_gen), str(seq)))


def message_key(envelope: Envelope) -> dict[str, Any]:
    return key(message_id(envelope.connection_id, envelope.seq_gen, envelope.seq))


def expires_at(now_ms: int, retention_seconds: int) -> int:
    """The TTL of an item applied at ``now_ms``: epoch seconds, rounded up, so an item
    is kept at least ``retention_seconds``."""
    return -(-now_ms // 1000) + retention_seconds


def message_put(envelope: Envelope, now_ms: int, retention_seconds: int) -> dict[str, Any]:
    """``Item``, ``ConditionExpression`` and its names: the put that applies
    ``envelope`` in the unordered mode, if its message has no item yet."""
    item = {
        **message_key(envelope),
        EPOCH: _number(envelope.epoch),
        RECEIVED_AT_MS: _number(envelope.received_at_ms),
        APPLIED_AT_MS: _number(now_ms),
        EXPIRES_AT: _number(expires_at(now_ms, retention_seconds)),
    }
    return {
        "Item": item,
        "ConditionExpression": "attribute_not_exists(#id)",
        "ExpressionAttributeNames": {"#id": PARTITION_KEY},
    }


def copy_position(item: Mapping[str, Any] | None, envelope: Envelope) -> Position | None:
    """What a message's stored item says about ``envelope`` (None or empty: no item):
    the epoch of the copy applied, with the envelope's ``seq_gen`` and ``seq``. Raises
    :class:`DedupStateError` when its epoch is not a whole number >= 0."""
    if not item:
        return None
    return Position(_whole_number(item, item.get(EPOCH), EPOCH), envelope.seq_gen, envelope.seq)


def message_outcome(item: Mapping[str, Any] | None, envelope: Envelope) -> Outcome:
    """The unordered decision when the message's item holds ``item``: SKIP when there
    is one, APPLY otherwise."""
    stored = copy_position(item, envelope)
    return Outcome(Decision.APPLY) if stored is None else Outcome(Decision.SKIP, stored=stored)


def refused_with(reasons: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The stored item when a cancelled transaction's dedup update (the first action)
    failed its condition; None when that was not the reason."""
    own = reasons[0] if reasons else {}
    if own.get("Code") != "ConditionalCheckFailed":
        return None
    return cast("Mapping[str, Any]", own.get("Item") or {})


def _number(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _numbers(values: set[int] | frozenset[int]) -> dict[str, list[str]]:
    return {"NS": [str(v) for v in sorted(values)]}


def _whole_number(item: Mapping[str, Any], raw: Any, name: str) -> int:
    text = raw.get("N") if isinstance(raw, Mapping) else None
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()):
        raise DedupStateError(
            f"dedup item {item.get(PARTITION_KEY)!r}: {name} must be a whole number >= 0, "
            f"got {raw!r}"
        )
    return int(text)


# --- the table ---------------------------------------------------------------------------


def create_dedup_table(client: DynamoDBClient, table_name: str) -> None:
    """The dedup table, on demand (PAY_PER_REQUEST), with TTL on ``expires_at`` (the
    unordered mode's items expire; a connection's item has no such attribute and is
    kept); returns once it is ACTIVE. One that exists with this key is used as it is,
    its TTL turned on if it is off; with another key, or TTL on another attribute,
    ValueError. Needs ``dynamodb:UpdateTimeToLive`` and ``DescribeTimeToLive`` besides
    ``CreateTable`` and ``DescribeTable``."""
    try:
        client.create_table(
            TableName=table_name,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[
                {"AttributeName": PARTITION_KEY, "AttributeType": KEY_ATTRIBUTE_TYPE}
            ],
            KeySchema=[{"AttributeName": PARTITION_KEY, "KeyType": "HASH"}],
        )
    except ClientError as error:
        if _code(error) != "ResourceInUseException":
            raise
        table = client.describe_table(TableName=table_name)["Table"]
        keys = [(k["AttributeName"], k["KeyType"]) for k in table.get("KeySchema", [])]
        if keys != [(PARTITION_KEY, "HASH")]:
            raise ValueError(
                f"table {table_name} exists with the key {keys}, not {PARTITION_KEY} alone"
            ) from None
    client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
    )
    enable_ttl(client, table_name)


def enable_ttl(client: DynamoDBClient, table_name: str) -> None:
    """Turn TTL on ``expires_at`` on, unless it is on or being turned on already (by
    another consumer creating the table at the same time, say). ValueError when TTL is
    on another attribute: the unordered mode's items would never expire."""
    if _ttl_on(client, table_name):
        return
    try:
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": EXPIRES_AT},
        )
    except ClientError as error:
        # "TimeToLive is already enabled" when another caller got there in between;
        # any other refusal (turned off within the last hour, say) stands.
        if _code(error) != "ValidationException" or not _ttl_on(client, table_name):
            raise


def _ttl_on(client: DynamoDBClient, table_name: str) -> bool:
    """Whether TTL is on, or being turned on, for ``expires_at``; ValueError when for
    another attribute."""
    described = client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
    if described.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
        return False
    attribute = described.get("AttributeName")
    if attribute != EXPIRES_AT:
        raise ValueError(
            f"table {table_name} has TTL on {attribute!r}, not {EXPIRES_AT!r}: the "
            "unordered mode's items would never expire"
        )
    return True


# --- the store ---------------------------------------------------------------------------


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class _Refused:
    """The dedup condition failed; ``item`` is what the table holds."""

    item: Mapping[str, Any]


class _Conflict:
    """Nothing was written, for a reason that may pass on another try."""


Write = Callable[[dict[str, Any]], "_Refused | _Conflict | None"]
"""Runs one dedup update (with or without effects): None when it was written."""


class Deduper:
    """Decides, per envelope, with conditional writes to ``table_name`` (see the
    module's docstring for the two modes, their rules and what each method
    guarantees). Holds no state of its own: one instance may serve many threads if the
    client does.

    Errors other than a failed condition or a conflict (throttling after botocore's
    retries, timeouts) propagate as botocore exceptions: the outcome is unknown, and
    the envelope may be given again (it is then applied, or skipped if it was)."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        ordered: bool = True,
        hole_horizon: int = HOLE_HORIZON,
        retention_seconds: int = RETENTION_SECONDS,
        clock_ms: Callable[[], int] = _wall_ms,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        """``ordered``: False for records read in any order (one item per message);
        ``hole_horizon`` (ordered mode only): how far below the highest applied seq a
        jumped-over seq is still awaited (0: never); ``retention_seconds`` (unordered
        mode only): how long a message's item is kept, so how late a copy may come and
        still be skipped; ``clock_ms``: the wall clock stamped as ``applied_at_ms``
        (and, unordered, that ``expires_at`` counts from); ``sleep`` and ``rng``: the
        pause after a conflict with another writer."""
        if max_attempts < 1 or hole_horizon < 0 or retention_seconds < 1:
            raise ValueError("need max_attempts >= 1, hole_horizon >= 0 and retention_seconds >= 1")
        self._client = client
        self._table = table_name
        self._ordered = ordered
        self._horizon = hole_horizon
        self._retention = retention_seconds
        self._clock_ms = clock_ms
        self._sleep = sleep
        self._rng = rng
        self._max_attempts = max_attempts

    @property
    def table_name(self) -> str:
        return self._table

    @property
    def ordered(self) -> bool:
        """False: one item per message, for records read in any order."""
        return self._ordered

    def decide(self, envelope: Envelope) -> Outcome:
        """Record the decision for ``envelope`` and return it: one conditional
        ``UpdateItem``, two for a gap, a late seq or a new stream; unordered, one
        conditional ``PutItem``. An effect made after it happens at most once."""
        validate(envelope)
        if not self._ordered:
            return self._decide_unordered(envelope, self._put_alone)
        return self._decide(envelope, partial(self._write_alone, envelope))

    def transact(self, envelope: Envelope, effects: Sequence[Mapping[str, Any]]) -> Outcome:
        """Decide, and on APPLY make ``effects`` (``TransactWriteItems`` entries:
        ``{"Put": {...}}``, ``{"Update": {...}}``, ``{"Delete": {...}}``,
        ``{"ConditionCheck": {...}}``, on other tables) in the same transaction: they
        happen exactly once per message. On SKIP or EARLY nothing is written.

        Raises :class:`EffectFailedError` when an effect cancelled it (nothing is
        written), :class:`ContendedError` after ``max_attempts``."""
        validate(envelope)
        effects = list(effects)
        if len(effects) > MAX_EFFECTS:
            raise ValueError(f"at most {MAX_EFFECTS} effects per transaction, got {len(effects)}")
        for index, effect in enumerate(effects):
            if any(
                isinstance(action, Mapping) and action.get("TableName") == self._table
                for action in effect.values()
            ):
                raise ValueError(f"effect {index} writes to the dedup table {self._table}")

        if not self._ordered:
            return self._decide_unordered(
                envelope, partial(self._put_with, envelope, effects=effects)
            )
        return self._decide(envelope, partial(self._write_with, envelope, effects=effects))

    def preview(self, envelope: Envelope) -> Outcome:
        """What :meth:`decide` would answer now, from a strongly consistent read,
        writing nothing. For an idempotent effect made before :meth:`decide` records
        it; the answer may be out of date by the time the effect is made."""
        validate(envelope)
        if not self._ordered:
            response = self._client.get_item(
                TableName=self._table, Key=message_key(envelope), ConsistentRead=True
            )
            return message_outcome(response.get("Item"), envelope)
        stored = self.stored(envelope.connection_id)
        step = plan(stored, envelope, self._horizon)
        return step if isinstance(step, Outcome) else applied(step, envelope)

    def stored(self, connection_id: str) -> Position | None:
        """The connection's position, read strongly (None: nothing applied yet).
        Ordered mode only: the unordered mode keeps no position (ValueError)."""
        if not self._ordered:
            raise ValueError("an unordered Deduper keeps no position per connection")
        response = self._client.get_item(
            TableName=self._table, Key=key(connection_id), ConsistentRead=True
        )
        return Position.from_item(response.get("Item"))

    def _decide(self, envelope: Envelope, write: Write) -> Outcome:
        guard: Guard = NextSeq()
        pauses: Iterator[float] = self._pauses()
        for _ in range(self._max_attempts):
            update = dedup_update(envelope, self._clock_ms(), guard, self._horizon)
            result = write(update)
            if result is None:
                return applied(guard, envelope)
            if isinstance(result, _Conflict):
                self._sleep(next(pauses))
                continue
            step = plan(Position.from_item(result.item), envelope, self._horizon)
            if isinstance(step, Outcome):
                return step
            if step == guard:  # refused, yet the item it returned would pass
                raise DedupStateError(
                    f"dedup item of {envelope.connection_id} refused {envelope.key} under "
                    f"{guard}, which the item it returned passes"
                )
            guard = step
        raise self._contended(envelope)

    def _decide_unordered(self, envelope: Envelope, put: Write) -> Outcome:
        pauses: Iterator[float] = self._pauses()
        for _ in range(self._max_attempts):
            result = put(message_put(envelope, self._clock_ms(), self._retention))
            if result is None:
                return Outcome(Decision.APPLY)
            if isinstance(result, _Conflict):
                self._sleep(next(pauses))
                continue
            # The condition failed, so the item exists: a copy, even when DynamoDB
            # returned no item to show for it.
            return Outcome(Decision.SKIP, stored=copy_position(result.item, envelope))
        raise self._contended(envelope)

    def _pauses(self) -> Iterator[float]:
        return backoff_delays(initial=0.02, maximum=0.5, rng=self._rng)

    def _contended(self, envelope: Envelope) -> ContendedError:
        return ContendedError(
            f"the decision on {envelope.key} lost {self._max_attempts} times to other "
            "writers; nothing was written"
        )

    def _write_alone(
        self, envelope: Envelope, update: dict[str, Any]
    ) -> _Refused | _Conflict | None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=key(envelope.connection_id),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **update,
            )
        except ClientError as error:
            return _single_write_refused(error)
        return None

    def _put_alone(self, put: dict[str, Any]) -> _Refused | _Conflict | None:
        try:
            self._client.put_item(
                TableName=self._table, ReturnValuesOnConditionCheckFailure="ALL_OLD", **put
            )
        except ClientError as error:
            return _single_write_refused(error)
        return None

    def _write_with(
        self, envelope: Envelope, update: dict[str, Any], *, effects: list[Mapping[str, Any]]
    ) -> _Refused | _Conflict | None:
        own: dict[str, Any] = {
            "TableName": self._table,
            "Key": key(envelope.connection_id),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            **update,
        }
        return self._transact(envelope, {"Update": own}, effects)

    def _put_with(
        self, envelope: Envelope, put: dict[str, Any], *, effects: list[Mapping[str, Any]]
    ) -> _Refused | _Conflict | None:
        own: dict[str, Any] = {
            "TableName": self._table,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            **put,
        }
        return self._transact(envelope, {"Put": own}, effects)

    def _transact(
        self,
        envelope: Envelope,
        own: Mapping[str, Any],
        effects: list[Mapping[str, Any]],
    ) -> _Refused | _Conflict | None:
        """The dedup write ``own`` first, then ``effects``, in one transaction."""
        items = [own, *effects]
        try:
            self._client.transact_write_items(
                TransactItems=cast("list[TransactWriteItemTypeDef]", items)
            )
        except ClientError as error:
            if _code(error) != "TransactionCanceledException":
                raise
            reasons: list[Mapping[str, Any]] = list(error.response.get("CancellationReasons") or [])
            stored = refused_with(reasons)
            if stored is not None:
                return _Refused(stored)
            if any(r.get("Code") in _RETRYABLE_REASONS for r in reasons):
                return _Conflict()
            raise EffectFailedError(
                f"the transaction for {envelope.key} was cancelled: "
                + "; ".join(_describe(i, r) for i, r in enumerate(reasons)),
                reasons,
            ) from error
        return None


def _single_write_refused(error: ClientError) -> _Refused | _Conflict:
    """A refused ``UpdateItem`` or ``PutItem``: its failed condition (with the item it
    returned) or a conflict with a transaction; anything else propagates."""
    code = _code(error)
    if code == "ConditionalCheckFailedException":
        raw: Mapping[str, Any] | None = error.response.get("Item")  # type: ignore[assignment]
        return _Refused(raw or {})
    if code == _CONFLICT:
        return _Conflict()
    raise error


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _describe(index: int, reason: Mapping[str, Any]) -> str:
    what = "the dedup write" if index == 0 else f"effect {index - 1}"
    return f"{what}: {reason.get('Code')}" + (
        f" ({reason['Message']})" if reason.get("Message") else ""
    )
