"""The sinks' decisions, as pure functions: how many records go into one request,
which records are sent again after a partial failure, whether one record may be
sent at all, and the SQS deduplication id of a message."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Limits:
    """One service's request limits, in bytes as the service counts them."""

    service: str
    """How error messages name the service."""
    max_count: int
    """Records per request."""
    max_bytes: int
    """Bytes per request, all records together."""
    max_record_bytes: int
    """Bytes per record."""


MIB: Final = 1 << 20
KIB: Final = 1 << 10

KINESIS_LIMITS: Final = Limits("Kinesis", max_count=500, max_bytes=5 * MIB, max_record_bytes=MIB)
"""PutRecords: each record's data plus its partition key counts, for the record and
for the request."""
FIREHOSE_LIMITS: Final = Limits(
    "Firehose", max_count=500, max_bytes=4 * MIB, max_record_bytes=1000 * KIB
)
"""PutRecordBatch: the record's data (before base64) counts."""
SQS_LIMITS: Final = Limits("SQS", max_count=10, max_bytes=256 * KIB, max_record_bytes=256 * KIB)
"""SendMessageBatch: the message bodies count. 256 KiB is a queue's default
``MaximumMessageSize``; kept as the limit so that any FIFO queue takes every message
the sink sends."""


class RecordTooLargeError(ValueError):
    """A message whose record is over the service's limit: never cut, never sent.

    A handler failure like any other: the worker retries the batch, or skips it with
    ``HANDLER_ERRORS=skip``."""

    def __init__(
        self, limits: Limits, connection_id: str, seq_gen: int, seq: int, size: int
    ) -> None:
        self.connection_id = connection_id
        self.seq_gen = seq_gen
        self.seq = seq
        self.size = size
        self.limit = limits.max_record_bytes
        super().__init__(
            f"message {seq} (seq_gen {seq_gen}) of connection {connection_id} is "
            f"{size:,} bytes as a {limits.service} record, over the limit of "
            f"{limits.max_record_bytes:,}: not sent"
        )


def check_record_size(
    limits: Limits, connection_id: str, seq_gen: int, seq: int, size: int
) -> None:
    """Raise :class:`RecordTooLargeError` when a record of ``size`` bytes may not be
    sent to the service."""
    if size > limits.max_record_bytes:
        raise RecordTooLargeError(limits, connection_id, seq_gen, seq, size)


def first_request_length(sizes: Iterable[int], limits: Limits) -> int:
    """How many of the records, from the first on, go into the next request: as many
    as the count and byte limits allow, at least one (every record is within the
    record limit, itself within the request limit). ``sizes`` is read only as far as
    needed."""
    count = 0
    total = 0
    for size in sizes:
        if count == limits.max_count or (count and total + size > limits.max_bytes):
            break
        count += 1
        total += size
    return count


def to_send_again(keys: Sequence[str], failed: Sequence[bool], *, keep_order: bool) -> list[int]:
    """Positions, in a request's order, of the records to send again after it.

    ``keys``: each record's connection id; ``failed``: whether the service refused
    it. ``keep_order=False``: the failed records only. ``keep_order=True``: for each
    connection with a failed record, that record and every later record of the same
    connection in the request, whether it was refused or not. A record refused
    while a later one of its connection was written is then written again before a
    new copy of each later one: the last copies of a connection's messages are in
    seq order, at the price of duplicates (which the consumer drops by
    ``(connection_id, seq_gen, seq)``)."""
    if len(keys) != len(failed):
        raise ValueError(f"{len(keys)} keys but {len(failed)} outcomes")
    if not keep_order:
        return [i for i, refused in enumerate(failed) if refused]
    broken: set[str] = set()
    again = []
    for i, (key, refused) in enumerate(zip(keys, failed, strict=True)):
        if refused:
            broken.add(key)
        if key in broken:
            again.append(i)
    return again


def deduplication_id(connection_id: str, seq_gen: int, seq: int, send: str) -> str:
    """The SQS ``MessageDeduplicationId`` of one send of a message: ``send`` names the
    request (a token of the sink call and the request's number in it), so SQS drops
    only the same request sent again (botocore's retry after a lost answer), never a
    later send of the message. A later send must land: after a partial refusal it is
    the copy that follows the early one (``prev_seq``), and a consumer holding the
    early one back waits for it. A hash, 64 hex digits: SQS allows 128 characters,
    and a connection id may have 128 before the rest is added. The hashed string is a
    JSON array, so no two sends share it."""
    canonical = json.dumps([connection_id, seq_gen, seq, send], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
