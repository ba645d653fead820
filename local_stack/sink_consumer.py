"""``python -m local_stack.sink_consumer --stream NAME --dedup-table TABLE``: a consumer
of the Kinesis sink's stream (``HANDLER=worker.sinks.kinesis:factory``) that takes
each message once, with :class:`wsfleet.deduper.Deduper`.

It reads every shard of the stream from its oldest record (``TRIM_HORIZON``), one
``GetRecords`` after another, and after an error or an expired iterator again from
after the last record it handled (``AFTER_SEQUENCE_NUMBER``). Shards are listed again
every few seconds: a shard that a split or a merge made is read once its parents are
read to their end, so a connection's records keep their order across a reshard. Each
record's envelope goes through :meth:`Deduper.decide`; the effect of an applied one is
a line on stdout::

    applied connection_id=demo-1 seq_gen=0 seq=42 epoch=2 shard=shardId-000000000001
    applied connection_id=demo-1 seq_gen=0 seq=57 epoch=3 shard=shardId-000000000001 gap=2
    tally applied=1200 skipped=35 malformed=0 late=0 gaps=1 early=0

(``gap=N``: N seqs jumped over, applied later if they come, then marked ``late``). A
copy is SKIPPED (whichever owner sent it) and a record ahead of the one sent before it
held back as EARLY (its copy after that one is applied), without a line of their own;
both are counted in the ``tally`` line, printed when it changed, at most every
``--tally-seconds``, and once more at the end. So ``grep '^applied '`` lists each message
once, ``grep '^tally '`` the counts.

The effect comes after the decision (``decide``, then print): at most once. A consumer
restarted from scratch reads the stream again from its oldest record and the deduper
skips everything it applied before.

It reaches Kinesis and DynamoDB through boto3's endpoint variables
(``AWS_ENDPOINT_URL_KINESIS``, ``AWS_ENDPOINT_URL_DYNAMODB``), as the worker does.
SIGTERM or SIGINT: it reads on until it has caught up (at most ``--drain-seconds``),
prints the last tally and exits 0; a second signal stops it at once.
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.backoff import backoff_delays
from wsfleet.deduper import ContendedError, Decision, Deduper, Outcome, create_dedup_table
from wsfleet.envelope import Envelope, EnvelopeError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

log = logging.getLogger("local_stack.sink_consumer")

GET_RECORDS_LIMIT: Final = 1000
"""Records per ``GetRecords``: the deduper takes a few milliseconds each, so a larger
read would only hold the other shards up."""
RELIST_SECONDS: Final = 5.0
"""How often the shards are listed again, to find those a reshard made."""
CLIENT_CONFIG: Final = Config(
    connect_timeout=2, read_timeout=10, retries={"mode": "standard", "max_attempts": 3}
)
_EXPIRED: Final = "ExpiredIteratorException"


# --- reading every shard -----------------------------------------------------------------


@dataclass
class ShardCursor:
    """Where the reader is in one shard."""

    shard_id: str
    parents: tuple[str, ...]
    """The shards it was split or merged from: read to their end first."""
    ending_sequence: str | None = None
    """Set once the shard is closed (a reshard): nothing is written to it after this."""
    last_sequence: str | None = None
    """The last record handed on, in full."""
    iterator: str | None = None
    """None: get one, after ``last_sequence`` (or from the oldest record)."""
    finished: bool = False
    """Closed and read to its end."""


Handle = Callable[[str, Mapping[str, Any]], None]
"""Takes one record (its shard id, the record as ``GetRecords`` returns it)."""


class StreamReader:
    """Reads every shard of ``stream`` in order, from its oldest record, one
    ``GetRecords`` per shard per :meth:`read_pass`.

    A record counts as read once ``handle`` returned for it; when ``handle`` raises,
    the shard is read again from that record on the next pass (the error propagates),
    so nothing is passed over."""

    def __init__(
        self,
        client: Any,
        stream: str,
        *,
        limit: int = GET_RECORDS_LIMIT,
        relist_seconds: float = RELIST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._stream = stream
        self._limit = limit
        self._relist_seconds = relist_seconds
        self._clock = clock
        self._listed_at: float | None = None
        self.cursors: dict[str, ShardCursor] = {}
        """Every shard seen, by id, in the order listed."""
        self.caught_up = False
        """The last pass found nothing to read in any shard it could read."""

    def list_shards(self) -> None:
        """List the shards (all pages) and start following any new one; mark those
        that a reshard closed."""
        kwargs: dict[str, Any] = {"StreamName": self._stream}
        while True:
            page = self._client.list_shards(**kwargs)
            for shard in page.get("Shards", []):
                shard_id = shard["ShardId"]
                cursor = self.cursors.get(shard_id)
                if cursor is None:
                    parents = tuple(
                        p
                        for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId"))
                        if p
                    )
                    cursor = self.cursors[shard_id] = ShardCursor(shard_id, parents)
                ending = shard.get("SequenceNumberRange", {}).get("EndingSequenceNumber")
                if ending is not None:
                    cursor.ending_sequence = str(ending)
            token = page.get("NextToken")
            if not token:
                break
            # ListShards takes the token alone: the stream is in it.
            kwargs = {"NextToken": token}
        self._listed_at = self._clock()

    def readable(self) -> list[ShardCursor]:
        """Shards not finished whose parents are: a child's records come after its
        parents' for every partition key. A parent the listing no longer shows (past
        the retention) counts as read."""
        return [
            cursor
            for cursor in self.cursors.values()
            if not cursor.finished
            and all(self.cursors[p].finished if p in self.cursors else True for p in cursor.parents)
        ]

    def read_pass(self, handle: Handle) -> int:
        """One ``GetRecords`` on each readable shard, every record handed to
        ``handle`` in shard order; how many were."""
        if self._listed_at is None or self._clock() - self._listed_at >= self._relist_seconds:
            self.list_shards()
        total = 0
        behind = False
        for cursor in self.readable():
            count, more = self._read_shard(cursor, handle)
            total += count
            behind = behind or more
        self.caught_up = total == 0 and not behind
        return total

    def _read_shard(self, cursor: ShardCursor, handle: Handle) -> tuple[int, bool]:
        """Records handed on, and whether the shard said it holds more."""
        if cursor.iterator is None:
            cursor.iterator = self._iterator(cursor)
        try:
            answer = self._client.get_records(ShardIterator=cursor.iterator, Limit=self._limit)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == _EXPIRED:
                cursor.iterator = None  # read again after the last record handled
                return 0, True
            raise
        records = answer.get("Records", [])
        for record in records:
            try:
                handle(cursor.shard_id, record)
            except BaseException:
                cursor.iterator = None  # from the record that failed, next time
                raise
            cursor.last_sequence = str(record["SequenceNumber"])
        cursor.iterator = answer.get("NextShardIterator")
        behind = int(answer.get("MillisBehindLatest") or 0) > 0
        if cursor.iterator is None or self._read_to_end(cursor, bool(records), behind):
            cursor.finished = True
            log.info("shard %s read to its end", cursor.shard_id)
        return len(records), behind

    @staticmethod
    def _read_to_end(cursor: ShardCursor, got_records: bool, behind: bool) -> bool:
        """Kinesis ends a closed shard with no next iterator; moto does not, so a
        closed shard also ends at its last sequence number, or on an empty read."""
        if cursor.ending_sequence is None:
            return False
        if cursor.last_sequence is not None and int(cursor.last_sequence) >= int(
            cursor.ending_sequence
        ):
            return True
        return not got_records and not behind

    def _iterator(self, cursor: ShardCursor) -> str:
        if cursor.last_sequence is None:
            kwargs: dict[str, Any] = {"ShardIteratorType": "TRIM_HORIZON"}
        else:
            kwargs = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": cursor.last_sequence,
            }
        answer = self._client.get_shard_iterator(
            StreamName=self._stream, ShardId=cursor.shard_id, **kwargs
        )
        iterator: str = answer["ShardIterator"]
        return iterator


# --- taking each envelope once -------------------------------------------------------------


@dataclass
class Tally:
    applied: int = 0
    skipped: int = 0
    malformed: int = 0
    late: int = 0
    """Of those applied: seqs a gap had jumped over, applied after higher ones."""
    gaps: int = 0
    """Applied messages that jumped over seqs of their stream."""
    early: int = 0
    """Records ahead of the one sent before them, held back: a copy follows that one."""

    def line(self) -> str:
        return (
            f"tally applied={self.applied} skipped={self.skipped} "
            f"malformed={self.malformed} late={self.late} gaps={self.gaps} early={self.early}"
        )


@dataclass(frozen=True, slots=True)
class Applied:
    """One applied message, as the effect receives it."""

    envelope: Envelope
    outcome: Outcome
    shard_id: str
    sequence_number: str

    def line(self) -> str:
        e = self.envelope
        text = (
            f"applied connection_id={e.connection_id} seq_gen={e.seq_gen} seq={e.seq} "
            f"epoch={e.epoch} shard={self.shard_id}"
        )
        if self.outcome.gap:
            text += f" gap={self.outcome.gap}"
        if self.outcome.late:
            text += " late"
        return text


@dataclass
class EnvelopeApplier:
    """A :data:`Handle`: the record's envelope through the deduper, ``effect`` on
    APPLY. A record that is no envelope is counted and passed over (it would fail
    every time); an error of the deduper propagates, so the reader gives the record
    again."""

    deduper: Deduper
    effect: Callable[[Applied], None]
    tally: Tally = field(default_factory=Tally)

    def __call__(self, shard_id: str, record: Mapping[str, Any]) -> None:
        try:
            envelope = Envelope.from_bytes(record["Data"])
        except EnvelopeError as error:
            self.tally.malformed += 1
            number = record["SequenceNumber"]
            log.error("record %s of %s is no envelope: %s", number, shard_id, error)
            return
        try:
            outcome = self.deduper.decide(envelope)
        except EnvelopeError as error:
            # Read, yet not one the deduper can decide on: it would fail every time.
            self.tally.malformed += 1
            number = record["SequenceNumber"]
            log.error("record %s of %s is no envelope: %s", number, shard_id, error)
            return
        if outcome.decision is Decision.APPLY:
            self.tally.applied += 1
            self.tally.late += int(outcome.late)
            self.tally.gaps += int(outcome.gap > 0)
            self.effect(Applied(envelope, outcome, shard_id, str(record["SequenceNumber"])))
        elif outcome.decision is Decision.SKIP:
            self.tally.skipped += 1
        else:
            self.tally.early += 1


RETRIED: Final = (BotoCoreError, ClientError, ContendedError)
"""Errors a pass may end with that another pass may not: a server's, or a dedup item
another consumer kept changing."""


def consume(
    reader: StreamReader,
    applier: Handle,
    *,
    stop: Callable[[], bool],
    idle_seconds: float,
    on_pass: Callable[[], None] = lambda: None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Read passes until ``stop()``; a pass that finds nothing waits ``idle_seconds``,
    one that fails (a server error after botocore's retries) waits with backoff and
    reads the failed shard again from the record that failed."""
    pauses: Iterator[float] | None = None
    while not stop():
        try:
            reader.read_pass(applier)
        except RETRIED as error:
            pauses = pauses or backoff_delays(initial=0.2, maximum=5.0, rng=random.random)
            log.warning("reading the stream failed, trying again: %s", error)
            sleep(next(pauses))
            continue
        pauses = None
        on_pass()
        if reader.caught_up:
            sleep(idle_seconds)


def drain(
    reader: StreamReader,
    applier: Handle,
    *,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Read until a pass finds nothing, twice in a row (a shard a reshard made shows
    up on the listing in between), or ``timeout`` passes; whether it caught up."""
    deadline = clock() + timeout
    quiet = 0
    while clock() < deadline:
        try:
            reader.read_pass(applier)
        except RETRIED as error:
            log.warning("reading the stream failed, trying again: %s", error)
            quiet = 0
            sleep(0.2)
            continue
        if not reader.caught_up:
            quiet = 0
            continue
        quiet += 1
        if quiet == 2:
            return True
        reader.list_shards()
    return False


# --- the command ---------------------------------------------------------------------------


class _Signals:
    """The first SIGTERM or SIGINT asks for a drain; a second one, to stop now."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._count = 0

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        self.stop.set()
        if self._count > 1:
            raise KeyboardInterrupt


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m local_stack.sink_consumer",
        description="Read the Kinesis sink's stream and take each message once (Deduper); "
        "one 'applied ...' line per message applied, 'tally ...' lines with the counts.",
    )
    parser.add_argument("--stream", required=True, help="the stream the sink writes to")
    parser.add_argument("--dedup-table", required=True, help="the deduper's DynamoDB table")
    parser.add_argument(
        "--create-table",
        action="store_true",
        help="create the dedup table first if it does not exist",
    )
    parser.add_argument("--idle-seconds", type=float, default=0.25, help="pause when caught up")
    parser.add_argument(
        "--tally-seconds", type=float, default=5.0, help="at most this often, a tally line"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=5.0,
        help="on SIGTERM or SIGINT, read on until caught up for at most this long",
    )
    args = parser.parse_args(argv)
    if min(args.idle_seconds, args.tally_seconds, args.drain_seconds) < 0:
        parser.error("the seconds must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # Its INFO lines (where the credentials and endpoints came from) would bury ours.
    logging.getLogger("botocore").setLevel(logging.WARNING)
    signals = _Signals()
    signals.install()
    kinesis = boto3.client("kinesis", config=CLIENT_CONFIG)
    dynamodb: DynamoDBClient = boto3.client("dynamodb", config=CLIENT_CONFIG)
    if args.create_table:
        create_dedup_table(dynamodb, args.dedup_table)
    reader = StreamReader(kinesis, args.stream)
    reader.list_shards()
    applier = EnvelopeApplier(Deduper(dynamodb, args.dedup_table), lambda a: print(a.line()))
    print(
        f"sink consumer: stream {args.stream} ({len(reader.cursors)} shards) from TRIM_HORIZON, "
        f"dedup table {args.dedup_table}",
        flush=True,
    )
    printed = Tally()
    last_printed_at = 0.0

    def pause(seconds: float) -> None:
        signals.stop.wait(seconds)  # a signal ends the pause at once

    def maybe_tally() -> None:
        nonlocal printed, last_printed_at
        now = time.monotonic()
        if applier.tally != printed and now - last_printed_at >= args.tally_seconds:
            print(applier.tally.line(), flush=True)
            printed = replace(applier.tally)
            last_printed_at = now

    try:
        consume(
            reader,
            applier,
            stop=signals.stop.is_set,
            idle_seconds=args.idle_seconds,
            on_pass=maybe_tally,
            sleep=pause,
        )
        caught_up = drain(reader, applier, timeout=args.drain_seconds)
        if not caught_up:
            print(f"sink consumer: not caught up after {args.drain_seconds:g} s", flush=True)
    except KeyboardInterrupt:
        print("sink consumer: stopped before catching up", flush=True)
    print(applier.tally.line() + " (final)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
