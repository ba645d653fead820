"""The built-in sinks' service limits, and the largest message each can carry: shared
by the sinks (which cut requests by them) and the construct (which refuses, at synth,
a ``MAX_MESSAGE_BYTES`` a chosen sink could not carry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MIB: Final = 1 << 20
KIB: Final = 1 << 10


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

ENVELOPE_ALLOWANCE: Final = KIB
"""Bytes of a record that are not the message: the envelope's keys and numbers (about
200 bytes with a connection id of 128) and Kinesis's partition key (up to 128)."""


def max_message_bytes(limits: Limits) -> int:
    """The largest ``MAX_MESSAGE_BYTES`` whose every message fits a record of the
    service as JSON no longer than the frame (a text payload that JSON must escape
    can still outgrow it: the sink sets such a message aside)."""
    return limits.max_record_bytes - ENVELOPE_ALLOWANCE
