"""The sinks' decisions, as pure functions: how many records go into one request,
which records are sent again after a partial failure, which refusals are a
throttle, how many records the next request may carry while throttled, what a
failed call landed in order, and the SQS deduplication id of a send."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Final

from wsfleet.sink_limits import FIREHOSE_LIMITS, KINESIS_LIMITS, SQS_LIMITS, Limits

__all__ = ["FIREHOSE_LIMITS", "KINESIS_LIMITS", "SQS_LIMITS", "Limits"]


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


THROTTLE_CODES: Final = frozenset(
    {
        "ProvisionedThroughputExceededException",  # Kinesis: the shard's write limit
        "ServiceUnavailableException",  # Firehose: the stream's throughput limit
        "ThrottlingException",
        "RequestThrottled",
        "InternalFailure",  # Kinesis and Firehose: passes when sent again
        "InternalError",  # SQS: the same
        "ServiceUnavailable",
    }
)
"""Refusals of one record that pass when sent again later: sent again for as long as
it takes (the rate the destination grants), never counted against
``SINK_MAX_ATTEMPTS``."""


def is_throttle(code: str) -> bool:
    return code in THROTTLE_CODES


def next_window(window: int, sent: int, landed: int, limits: Limits) -> int:
    """Records the next request may carry after one of ``sent`` records in which
    ``landed`` were taken: twice as many after a request taken whole (up to the
    service's count), else as many as were taken (at least one). While throttled,
    requests shrink to what the destination takes, so few records are refused and
    sent again, and grow back once it takes them all."""
    if landed >= sent:
        return min(limits.max_count, max(window, sent) * 2)
    return max(1, landed)


def landed_in_order(keys: Sequence[str], landed: Sequence[bool]) -> dict[str, int]:
    """Per connection, how many of its records, from its first in the call, landed
    where a consumer applies them: each taken with every record of the connection
    before it taken first. ``keys``: each record's connection id in the call's
    order; ``landed``: whether its last send was taken (a record sent again after a
    refusal of an earlier one is not landed until its later copy is)."""
    if len(keys) != len(landed):
        raise ValueError(f"{len(keys)} keys but {len(landed)} outcomes")
    count: dict[str, int] = {}
    broken: set[str] = set()
    for key, taken in zip(keys, landed, strict=True):
        if key in broken:
            continue
        if taken:
            count[key] = count.get(key, 0) + 1
        else:
            broken.add(key)
            count.setdefault(key, 0)
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
