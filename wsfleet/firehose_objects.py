"""Reading what the Firehose sink delivered to S3, each message once: the recipe a
consumer (a Lambda on the bucket's S3 events, say) runs on every object.

The Firehose sink (``worker.sinks.firehose``) writes each message as an envelope
(:mod:`wsfleet.envelope`) and a newline; Firehose concatenates records into S3
objects, so an object is newline-delimited JSON, one envelope a line (gzip when the
delivery stream compresses: read here as well). Objects are not read in the order
they were written (event notifications are unordered, listings go by key), and the
same message may be in several objects (the sinks deliver at least once, and an old
owner's copies can land after its successor's), so the deduper runs in its unordered
mode (``Deduper(..., ordered=False)``): every message applied once, whatever the read
order, within the dedup table's retention; no order among messages.

A Lambda on ``s3:ObjectCreated:*`` events::

    deduper = Deduper(dynamodb, os.environ["DEDUP_TABLE"], ordered=False)

    def handler(event, context):
        for bucket, key in s3_event_objects(event):
            data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            apply_object(data, deduper, effects_of)

An error (DynamoDB's, an effect's, a timeout) propagates, and Lambda runs the event
again: what was applied before it is skipped then, so nothing is applied twice
(:func:`apply_object`). Lambda tries an asynchronous event three times in all, then
drops it unless the function has an on-failure destination (or a dead-letter queue):
give it one, or objects can go unread. A line that is no envelope is reported and
passed over: it would fail every time, and must cost only itself.

This module is for consumers, so it imports nothing of the worker.
"""

from __future__ import annotations

import gzip
import logging
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote_plus

from wsfleet.deduper import Decision, Deduper
from wsfleet.envelope import Envelope, EnvelopeError

_GZIP_MAGIC: Final = b"\x1f\x8b"
"""How a gzip stream starts; an envelope line starts with ``{``."""
SHOWN_BYTES: Final = 200
"""How much of a bad line :class:`BadLine` keeps, for a log line."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line of an object that is not an envelope (or one no decision can be made on)."""

    number: int
    """1 for the object's first line."""
    error: str
    start: bytes
    """The line's first :data:`SHOWN_BYTES` bytes."""


def log_bad_line(bad: BadLine) -> None:
    log.error("line %d is no envelope, passed over: %s (%r)", bad.number, bad.error, bad.start)


def object_lines(data: bytes) -> list[bytes]:
    """The lines of an object, decompressed when it is gzip. Raises
    :class:`EnvelopeError` for gzip that does not decompress: nothing in it can be read."""
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:
            raise EnvelopeError(f"the object is gzip that does not decompress: {error}") from None
    return data.split(b"\n")


def read_envelopes(
    data: bytes, on_bad_line: Callable[[BadLine], None] = log_bad_line
) -> Iterator[Envelope]:
    """The envelopes of one object Firehose wrote, in the object's order. A line that is
    not an envelope goes to ``on_bad_line`` (logged by default) and the next is read;
    blank lines (the one after the last newline) hold no record and are passed over."""
    for _, _, envelope in _numbered(data, on_bad_line):
        yield envelope


def _numbered(
    data: bytes, on_bad_line: Callable[[BadLine], None]
) -> Iterator[tuple[int, bytes, Envelope]]:
    """Each envelope with its line's number and bytes."""
    for number, line in enumerate(object_lines(data), start=1):
        if not line.strip():
            continue
        try:
            envelope = Envelope.from_bytes(line)
        except EnvelopeError as error:
            on_bad_line(BadLine(number, str(error), line[:SHOWN_BYTES]))
            continue
        yield number, line, envelope


@dataclass(slots=True)
class ObjectTally:
    """What one object held."""

    applied: int = 0
    skipped: int = 0
    """Copies of messages applied before (from this object or any other)."""
    bad_lines: list[BadLine] = field(default_factory=list)


Effects = Callable[[Envelope], Sequence[Mapping[str, Any]]]
"""The caller's DynamoDB writes for one message (``TransactWriteItems`` entries)."""


def apply_object(
    data: bytes,
    deduper: Deduper,
    effects: Effects,
    *,
    on_bad_line: Callable[[BadLine], None] = log_bad_line,
) -> ObjectTally:
    """Every envelope of one object through :meth:`Deduper.transact`, with
    ``effects(envelope)``: each message's effects written **exactly once**, however
    many objects hold it and in whatever order they are read. ``deduper`` must be
    unordered (ValueError otherwise: the ordered rules lose messages read out of
    order). An error propagates; the object may then be applied again whole. gzip that
    does not decompress raises :class:`EnvelopeError`: nothing in it can be read."""
    return _apply(data, deduper, on_bad_line, lambda e: deduper.transact(e, effects(e)).decision)


def apply_object_at_least_once(
    data: bytes,
    deduper: Deduper,
    effect: Callable[[Envelope], None],
    *,
    on_bad_line: Callable[[BadLine], None] = log_bad_line,
) -> ObjectTally:
    """As :func:`apply_object`, for an effect that is not a DynamoDB write: a
    strongly consistent read, ``effect(envelope)`` when the message is new, then the
    decision recorded. A crash (or a consumer racing on the same message) between the
    effect and the record repeats the effect, so it must be idempotent: **at least
    once**, never lost."""

    def apply(envelope: Envelope) -> Decision:
        if deduper.preview(envelope).decision is not Decision.APPLY:
            return Decision.SKIP
        effect(envelope)
        deduper.decide(envelope)
        # Made here even if another consumer recorded it first: counted as applied.
        return Decision.APPLY

    return _apply(data, deduper, on_bad_line, apply)


def _apply(
    data: bytes,
    deduper: Deduper,
    on_bad_line: Callable[[BadLine], None],
    apply: Callable[[Envelope], Decision],
) -> ObjectTally:
    if deduper.ordered:
        raise ValueError(
            "objects are read out of order: the deduper must be unordered (ordered=False)"
        )
    tally = ObjectTally()

    def bad(line: BadLine) -> None:
        tally.bad_lines.append(line)
        on_bad_line(line)

    for number, line, envelope in _numbered(data, bad):
        try:
            decision = apply(envelope)
        except EnvelopeError as error:
            # Read, yet not one the deduper can decide on: it would fail every time,
            # so it costs only itself.
            bad(BadLine(number, str(error), line[:SHOWN_BYTES]))
            continue
        if decision is Decision.APPLY:
            tally.applied += 1
        else:
            tally.skipped += 1
    return tally


def s3_event_objects(event: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(bucket, key)`` of each record of an S3 event notification, the key decoded
    (S3 sends it URL-encoded, a space as ``+``)."""
    for record in event.get("Records", []):
        s3 = record["s3"]
        yield s3["bucket"]["name"], unquote_plus(s3["object"]["key"])
