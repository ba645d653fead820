"""The consumers of :mod:`benchmarks.sink_e2e`: each sink's destination (in moto) read
on a thread of its own as the fleet writes it, each message taken once by its
documented recipe, and every APPLY kept as an :class:`Effect` in an effect log.

- **Kinesis**: every shard in order (:class:`local_stack.sink_consumer.StreamReader`),
  each record through the ordered deduper (:meth:`~wsfleet.deduper.Deduper.decide`).
- **SQS FIFO**: the queue received in order (one message group per connection), each
  message through the ordered deduper, then deleted (after the decision: a message
  whose decision failed is received again, in its group's order).
- **Firehose into S3**: the bucket listed, and the objects found read in a shuffled
  order, about half of those waiting per pass, so that an object is often read after
  objects written later (as S3 events come); each through
  :func:`wsfleet.firehose_objects.apply_object_at_least_once` with an unordered
  deduper, then deleted (it keeps each listing short).

Every decision is also kept in a :class:`DecisionLog` (each envelope read, what the
deduper said, with a gap or a late seq), written next to the run's logs, for
reading what happened to one message afterwards.

The ordered consumers also count the **superseded reads**: records of a connection read
after a record of a later owner (a higher epoch) of it, which only a superseded
owner's late request leaves.
"""

from __future__ import annotations

import abc
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from local_stack.clock import now_ms
from local_stack.sink_consumer import (
    RETRIED,
    Applied,
    EnvelopeApplier,
    Handle,
    StreamReader,
    Tally,
    drain,
)
from wsfleet.deduper import Deduper, Outcome
from wsfleet.envelope import Envelope, EnvelopeError
from wsfleet.firehose_objects import BadLine, apply_object_at_least_once

IDLE_S: Final = 0.2
"""Pause after a pass that found nothing."""
SQS_WAIT_S: Final = 1
"""Long poll of one receive."""
SQS_VISIBILITY_S: Final = 10
"""How long a received message stays hidden: one whose decision failed comes again."""
OBJECT_SHARE: Final = 0.5
"""Share of the waiting objects the Firehose consumer reads per pass."""
S3_DELETE_BATCH: Final = 1000


@dataclass(frozen=True, slots=True)
class Effect:
    """One APPLY, as the consumer made it."""

    connection_id: str
    seq_gen: int
    seq: int
    epoch: int
    lag_ms: int
    """From the worker handing the batch to the sink to the consumer's apply."""


@dataclass(frozen=True, slots=True)
class Decided:
    """One decision of the deduper, as the consumer asked for it."""

    connection_id: str
    seq_gen: int
    seq: int
    epoch: int
    prev_seq: int | None
    decision: str
    """``apply``, ``skip``, ``early``, or the error the decision raised."""
    gap: int = 0
    late: bool = False


class DecisionLog(Deduper):
    """A deduper that keeps every decision it makes (:attr:`decided`), in order."""

    def __init__(self, client: Any, table_name: str, *, ordered: bool) -> None:
        super().__init__(client, table_name, ordered=ordered)
        self.decided: list[Decided] = []

    def decide(self, envelope: Envelope) -> Outcome:
        e = envelope
        try:
            outcome = super().decide(envelope)
        except Exception as error:
            name = type(error).__name__
            self.decided.append(
                Decided(e.connection_id, e.seq_gen, e.seq, e.epoch, e.prev_seq, name)
            )
            raise
        self.decided.append(
            Decided(
                e.connection_id,
                e.seq_gen,
                e.seq,
                e.epoch,
                e.prev_seq,
                outcome.decision.value,
                outcome.gap,
                outcome.late,
            )
        )
        return outcome

    def write(self, path: Path) -> None:
        """The decisions as JSON lines."""
        with path.open("w") as out:
            for decided in self.decided:
                out.write(json.dumps(asdict(decided), separators=(",", ":")) + "\n")


class Superseded:
    """Counts records read after a record of a later owner of their connection."""

    def __init__(self) -> None:
        self.count = 0
        self._top: dict[str, int] = {}

    def see(self, data: bytes) -> None:
        try:
            envelope = Envelope.from_bytes(data)
        except EnvelopeError:
            return  # the applier counts it as malformed
        top = self._top.get(envelope.connection_id, -1)
        if envelope.epoch < top:
            self.count += 1
        else:
            self._top[envelope.connection_id] = envelope.epoch


class SinkConsumer(abc.ABC):
    """A destination read on a thread of its own: :meth:`start`, :meth:`check` (raises
    what the thread failed with), :meth:`stop_and_drain`."""

    sink: str
    ordered: bool

    def __init__(self) -> None:
        self.effects: list[Effect] = []
        self.highest: dict[str, int] = {}
        """Connection id -> the highest seq applied."""
        self.applied: dict[str, set[int]] = {}
        """Connection id -> every seq applied."""
        self.tally = Tally()
        self.superseded: Superseded | None = Superseded() if self.ordered else None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"consumer-{self.sink}", daemon=True)

    def effect(self, envelope: Envelope) -> None:
        """The effect of an APPLY: an entry of the log."""
        cid = envelope.connection_id
        self.effects.append(
            Effect(
                cid,
                envelope.seq_gen,
                envelope.seq,
                envelope.epoch,
                now_ms() - envelope.received_at_ms,
            )
        )
        self.highest[cid] = max(self.highest.get(cid, 0), envelope.seq)
        self.applied.setdefault(cid, set()).add(envelope.seq)

    def applied_count(self, connection_id: str) -> int:
        return len(self.applied.get(connection_id, ()))

    @abc.abstractmethod
    def read_pass(self) -> bool:
        """Read what there is (one round); whether it found nothing to read."""

    @abc.abstractmethod
    def drain(self, timeout: float) -> bool:
        """Read to the end, here; whether it got there within ``timeout``."""

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        pauses: Iterator[float] | None = None
        try:
            while not self._stop.is_set():
                try:
                    caught_up = self.read_pass()
                except RETRIED:
                    pauses = pauses or _pauses()
                    self._stop.wait(next(pauses))
                    continue
                pauses = None
                if caught_up:
                    self._stop.wait(IDLE_S)
        except BaseException as error:  # reported by the main thread
            self.error = error

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the {self.sink} consumer failed: {self.error!r}") from self.error

    def stop_and_drain(self, timeout: float) -> bool:
        """Stop the thread, then read to the end here; whether it got there."""
        self._stop.set()
        self._thread.join()
        self.check()
        return self.drain(timeout)

    def _applier(self, deduper: Deduper) -> Handle:
        """The ordered recipe: each record's envelope through ``deduper.decide``, after
        the superseded count has seen it."""

        def apply(applied: Applied) -> None:
            self.effect(applied.envelope)

        applier = EnvelopeApplier(deduper, apply, self.tally)
        superseded = self.superseded

        def handle(where: str, record: Mapping[str, Any]) -> None:
            if superseded is not None:
                superseded.see(record["Data"])
            applier(where, record)

        return handle


def _pauses() -> Iterator[float]:
    delay = 0.2
    while True:
        yield delay
        delay = min(5.0, delay * 2)


class KinesisConsumer(SinkConsumer):
    sink = "kinesis"
    ordered = True

    def __init__(self, kinesis: Any, deduper: Deduper, stream: str) -> None:
        super().__init__()
        self.reader = StreamReader(kinesis, stream)
        self._handle = self._applier(deduper)

    def read_pass(self) -> bool:
        self.reader.read_pass(self._handle)
        return self.reader.caught_up

    def drain(self, timeout: float) -> bool:
        return drain(self.reader, self._handle, timeout=timeout)


class SqsFifoConsumer(SinkConsumer):
    sink = "sqs_fifo"
    ordered = True

    def __init__(self, sqs: Any, deduper: Deduper, queue_url: str) -> None:
        super().__init__()
        self._sqs = sqs
        self._url = queue_url
        self._handle = self._applier(deduper)

    def read_pass(self, wait: int = SQS_WAIT_S) -> bool:
        answer = self._sqs.receive_message(
            QueueUrl=self._url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait,
            VisibilityTimeout=SQS_VISIBILITY_S,
        )
        messages = answer.get("Messages", [])
        decided: list[dict[str, str]] = []
        try:
            for message in messages:
                record = {"Data": message["Body"].encode(), "SequenceNumber": message["MessageId"]}
                self._handle("fifo", record)
                decided.append({"Id": str(len(decided)), "ReceiptHandle": message["ReceiptHandle"]})
        finally:
            # What was decided goes; the rest (after a failed decision) comes again.
            if decided:
                self._sqs.delete_message_batch(QueueUrl=self._url, Entries=decided)
        # A long poll already waited: no pause after it.
        return False

    def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.read_pass(wait=0)
                if self._empty():
                    return True
            except RETRIED:
                time.sleep(0.2)
        return False

    def _empty(self) -> bool:
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=self._url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return all(int(value) == 0 for value in attributes.values())


class FirehoseConsumer(SinkConsumer):
    sink = "firehose"
    ordered = False

    def __init__(
        self,
        s3: Any,
        deduper: Deduper,
        bucket: str,
        *,
        rng: random.Random,
        on_bad_line: Callable[[BadLine], None] | None = None,
    ) -> None:
        super().__init__()
        self._s3 = s3
        self._deduper = deduper
        self._bucket = bucket
        self._rng = rng
        self._waiting: list[str] = []
        self._listed: set[str] = set()
        self.objects_read = 0
        self.bad_lines: list[BadLine] = []
        self._on_bad_line = on_bad_line or self.bad_lines.append

    def read_pass(self, share: float = OBJECT_SHARE) -> bool:
        self._list()
        if not self._waiting:
            return True
        self._rng.shuffle(self._waiting)
        count = max(1, round(len(self._waiting) * share))
        chosen, self._waiting = self._waiting[:count], self._waiting[count:]
        done: list[str] = []
        try:
            for key in chosen:
                self._apply(key)
                done.append(key)
        finally:
            # An object whose apply failed is read again, whole, on a later pass.
            self._waiting.extend(key for key in chosen if key not in done)
            self._delete(done)
        return False

    def _list(self) -> None:
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self._bucket):
            for listed in page.get("Contents", []):
                key = listed["Key"]
                if key not in self._listed:
                    self._listed.add(key)
                    self._waiting.append(key)

    def _apply(self, key: str) -> None:
        data = self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read()
        tally = apply_object_at_least_once(
            data, self._deduper, self.effect, on_bad_line=self._on_bad_line
        )
        self.objects_read += 1
        self.tally.applied += tally.applied
        self.tally.skipped += tally.skipped
        self.tally.malformed += len(tally.bad_lines)

    def _delete(self, keys: list[str]) -> None:
        for first in range(0, len(keys), S3_DELETE_BATCH):
            chunk = keys[first : first + S3_DELETE_BATCH]
            self._s3.delete_objects(
                Bucket=self._bucket,
                Delete={"Objects": [{"Key": key} for key in chunk], "Quiet": True},
            )

    def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.read_pass(share=1.0):
                    return True
            except RETRIED:
                time.sleep(0.2)
        return False
