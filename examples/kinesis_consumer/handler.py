"""A Lambda consumer of the fleet's Kinesis sink: every message of every connection is
written once to an output table, however often the stream carries it.

Each record's data is one envelope (:mod:`wsfleet.envelope`). For each, in the order of
the shard, :meth:`wsfleet.deduper.Deduper.transact` decides and, when the message is
new (whichever owner sent it), writes in the same transaction:

- the message, ``(connection_id, "MSG#<seq_gen>#<seq>")``, zero-padded so a Query
  returns a connection's messages in order;
- one more on the connection's tally, ``(connection_id, "COUNT")``: an effect that is
  not idempotent, right only because it happens exactly once.

A copy (a redelivery after a crash of a worker, a superseded owner's late record of a
message already written, or this function's own retry) writes nothing; copies are
counted in the batch's log line.
After a partly refused request the sink lands a seq after a higher one and then that
higher one again: the early copy, which names a seq not yet applied as the one sent
before it, writes nothing either (counted as early), and both are written in seq order
when they follow. A seq that comes after a higher one otherwise (a gap in the stream,
or an envelope without ``prev_seq``) is written when it comes, counted as late.

Failures follow Lambda's partial batch response, made by Powertools' batch utility
(:class:`InShardOrder`, a ``BatchProcessor``): after a record fails (throttling, a
timeout, an item DynamoDB refuses) nothing after it is tried, and it and every later
record are reported failed, so Lambda gives them again, in order, from the lowest
sequence number reported. Going on past it would be wrong: a later seq of the same
connection is held back as early with no copy to follow (it names the failed one as
its ``prev_seq``), or, without one, applied first, leaving the failed one to come back
late, or to be taken for a copy once more than the deduper's horizon (500 seqs) went
by. A record that is no envelope is logged with its sequence number and counts as
processed (passed over): it would fail every time, and must not hold the shard up.

The Lambda runs this file as the module ``handler`` next to a copy of ``wsfleet``
(``construct.py`` stages the two, and adds the public Powertools layer), with
``DEDUP_TABLE`` and ``OUTPUT_TABLE`` set.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any, Final

import boto3
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    ExceptionInfo,
    FailureResponse,
    SuccessResponse,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.kinesis_stream_event import (
    KinesisStreamRecord,
)
from botocore.config import Config

from wsfleet.deduper import Decision, Deduper
from wsfleet.envelope import Envelope, EnvelopeError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

DEDUP_TABLE_ENV: Final = "DEDUP_TABLE"
OUTPUT_TABLE_ENV: Final = "OUTPUT_TABLE"
OUTPUT_PARTITION_KEY: Final = "connection_id"
OUTPUT_SORT_KEY: Final = "item"
COUNT_ITEM: Final = "COUNT"
# A timeout well inside the function's: botocore retries a transaction whose answer was
# lost with the same ClientRequestToken, which DynamoDB does not run twice.
CLIENT_CONFIG: Final = Config(
    connect_timeout=2, read_timeout=5, retries={"mode": "standard", "max_attempts": 3}
)

log = logging.getLogger(__name__)


def message_item_key(seq_gen: int, seq: int) -> str:
    return f"MSG#{seq_gen:020d}#{seq:020d}"


@dataclass(slots=True)
class BatchTally:
    applied: int = 0
    skipped: int = 0
    early: int = 0
    """Held back: ahead of the message sent before it, which comes again first."""
    malformed: int = 0
    late: int = 0
    """Of those applied: seqs a gap had jumped over, applied after higher ones."""
    gaps: int = 0
    """Applied messages that jumped over seqs of their stream."""
    jumped: int = 0
    """Seqs jumped over by those gaps (applied if they come later)."""


class NotTriedError(Exception):
    """Reported for a record after the batch's first failure: it was not tried."""


class InShardOrder(BatchProcessor):
    """Kinesis partial batch responses for records that must be applied in shard order:
    after the first record that fails, the later ones are not tried, and are reported
    failed with it (``SqsFifoPartialProcessor`` does the same for FIFO queues)."""

    _NOT_TRIED: Final[ExceptionInfo] = (
        NotTriedError,
        NotTriedError("a record before it in the batch failed"),
        None,
    )

    def __init__(self) -> None:
        # A batch whose every record failed (its first did) is answered like any other:
        # raised, it would fail the invocation, which Lambda retries (and bisects) as a
        # whole instead of from the failed record.
        super().__init__(EventType.KinesisDataStreams, raise_on_entire_batch_failure=False)

    def _process_record(self, record: dict[str, Any]) -> SuccessResponse | FailureResponse:
        if self.fail_messages:
            # Reported failed, not tried: Lambda resumes the shard from the lowest
            # sequence number reported, the first failure, so it and every later record
            # come again in order. Tried now, a later seq of the same connection would
            # be applied (or held back as early) ahead of the failed one.
            return self.failure_handler(
                record=self._to_batch_type(record, event_type=self.event_type),
                exception=self._NOT_TRIED,
            )
        return super()._process_record(record)


class KinesisConsumer:
    """One batch of Kinesis records at a time (:meth:`handle`); the clients and tables
    are passed in, so tests run it against DynamoDB Local."""

    def __init__(
        self,
        deduper: Deduper,
        output_table: str,
        *,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._deduper = deduper
        self._output = output_table
        self._clock_ms = clock_ms
        self._processor = InShardOrder()

    def handle(self, event: dict[str, Any]) -> PartialItemFailureResponse:
        """The partial batch response: empty, or the sequence numbers of the first
        record that failed and of every record after it."""
        tally = BatchTally()
        response = process_partial_response(
            event=event, record_handler=partial(self.apply, tally), processor=self._processor
        )
        failures = response["batchItemFailures"]
        log.info(
            "batch of %d: applied %d (late %d), skipped %d, early %d, "
            "malformed %d, gaps %d (%d seqs jumped over)%s",
            len(event["Records"]),
            tally.applied,
            tally.late,
            tally.skipped,
            tally.early,
            tally.malformed,
            tally.gaps,
            tally.jumped,
            f", failed at {failures[0]['itemIdentifier']}" if failures else "",
        )
        return response

    def apply(self, tally: BatchTally, record: KinesisStreamRecord) -> None:
        """One record, counted in ``tally``; raises when it failed."""
        payload = record.kinesis
        number = payload.sequence_number
        try:
            data = base64.b64decode(payload.data, validate=True)
            envelope = Envelope.from_bytes(data)
            outcome = self._deduper.transact(envelope, self.effects(envelope, number))
        except (EnvelopeError, binascii.Error) as error:
            # Returning counts it processed: it would fail on every try.
            tally.malformed += 1
            log.error("record %s is no envelope, passed over: %s", number, error)
            return
        except Exception:
            log.exception("record %s failed: it and every later record come again", number)
            raise
        if outcome.decision is Decision.APPLY:
            tally.applied += 1
            tally.late += outcome.late
            if outcome.gap:
                tally.gaps += 1
                tally.jumped += outcome.gap
                log.warning(
                    "%s: seq_gen %d seq %d jumped over %d seqs (record %s)",
                    envelope.connection_id,
                    envelope.seq_gen,
                    envelope.seq,
                    outcome.gap,
                    number,
                )
        elif outcome.decision is Decision.SKIP:
            tally.skipped += 1
        else:
            tally.early += 1

    def effects(self, envelope: Envelope, sequence_number: str) -> list[dict[str, Any]]:
        """The writes of one applied message: the message and its connection's tally."""
        cid = {"S": envelope.connection_id}
        payload = json.dumps(envelope.payload, separators=(",", ":"), ensure_ascii=False)
        return [
            {
                "Put": {
                    "TableName": self._output,
                    "Item": {
                        OUTPUT_PARTITION_KEY: cid,
                        OUTPUT_SORT_KEY: {"S": message_item_key(envelope.seq_gen, envelope.seq)},
                        "epoch": {"N": str(envelope.epoch)},
                        "seq_gen": {"N": str(envelope.seq_gen)},
                        "seq": {"N": str(envelope.seq)},
                        "received_at_ms": {"N": str(envelope.received_at_ms)},
                        "payload": {"S": payload},
                        "kinesis_sequence_number": {"S": sequence_number},
                        "written_at_ms": {"N": str(self._clock_ms())},
                    },
                }
            },
            {
                "Update": {
                    "TableName": self._output,
                    "Key": {OUTPUT_PARTITION_KEY: cid, OUTPUT_SORT_KEY: {"S": COUNT_ITEM}},
                    "UpdateExpression": "ADD #messages :one SET #gen = :gen, #seq = :seq",
                    "ExpressionAttributeNames": {
                        "#messages": "messages",
                        "#gen": "last_seq_gen",
                        "#seq": "last_seq",
                    },
                    "ExpressionAttributeValues": {
                        ":one": {"N": "1"},
                        ":gen": {"N": str(envelope.seq_gen)},
                        ":seq": {"N": str(envelope.seq)},
                    },
                }
            },
        ]


@cache
def consumer() -> KinesisConsumer:
    """The function's consumer, made once per execution environment."""
    client: DynamoDBClient = boto3.client("dynamodb", config=CLIENT_CONFIG)
    return KinesisConsumer(
        Deduper(client, os.environ[DEDUP_TABLE_ENV]), os.environ[OUTPUT_TABLE_ENV]
    )


def handler(event: dict[str, Any], context: object) -> PartialItemFailureResponse:
    """The Lambda entry point (``handler.handler``)."""
    return consumer().handle(event)
