"""Owner histories drawn by hypothesis, through the real sinks into moto's services and
back out through each sink's documented consumer recipe (the deduper on DynamoDB
Local): owners that crash and resume from a lagging checkpoint, calls cut at the
fence whose request lands after the next owner's, per-record refusals (throttles and
others), whole-batch retries after a failed call. For every sink: every message the
fleet checkpointed is applied, none twice, and, where the transport keeps order,
in seq order but for what a superseded owner's late request put out of it (applied
late, and said so)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local_stack import services
from local_stack.fleet import CLIENT_CONFIG
from local_stack.sink import create_delivery_stream, create_stream
from tests.conftest import unique_name
from tests.support.destinations import drain_fifo, read_shard
from tests.support.refusing_clients import (
    CutCallError,
    RefusingFirehose,
    RefusingKinesis,
    RefusingSqs,
)
from worker.delivery import Delivery
from worker.sinks.firehose import FirehoseSink
from worker.sinks.kinesis import KinesisSink
from worker.sinks.sending import SinkSendError
from worker.sinks.settings import SinkSettings
from worker.sinks.sqs_fifo import SqsFifoSink
from wsfleet.deduper import Decision, Deduper, create_dedup_table
from wsfleet.envelope import Envelope
from wsfleet.firehose_objects import apply_object

NOW_MS = 1_767_225_604_100
LAST_SEQ = 24
"""The upstream's messages: seqs 1..LAST_SEQ of one connection."""
MAX_ATTEMPTS = 2


async def no_sleep(seconds: float) -> None:
    pass


@dataclass(frozen=True)
class Owner:
    """One owner's run: the batch sizes it hands to the sink, and how it ends."""

    batches: list[int]
    ends: str
    """``crash`` (after its calls), ``cut`` (its last call is cut at the fence and its
    request lands after the next owner's first call), or ``done`` (the last owner:
    runs to LAST_SEQ)."""
    lag: int
    """How far the checkpoint it leaves lags behind what it handled (a crash before
    the last checkpoint write): the next owner resumes that much earlier."""


owners = st.builds(
    Owner,
    batches=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    ends=st.sampled_from(["crash", "cut"]),
    lag=st.integers(0, 4),
)
refusal = st.sampled_from(
    [None] * 6 + ["ProvisionedThroughputExceededException", "InternalFailure", "KMSDisabled"]
)
"""Per record and request: taken, throttled (sent again without limit), or refused
for another reason (sent again up to MAX_ATTEMPTS, then the call fails and the
owner sends the batch again)."""


@dataclass
class History:
    """What the fleet did: each owner's calls, in order."""

    checkpoint: int = 0
    late_requests: int = 0


async def run_history(
    cid: str,
    history: list[Owner],
    make_sink: Callable[[], Any],
    client: Any,
    rng: random.Random,
) -> History:
    """Each owner in turn, epoch 1, 2, ...: it resumes after the checkpoint, hands its
    batches to a sink of its own (the worker retries a failed call, the same batch,
    until it returns), then ends as drawn. The last owner runs to LAST_SEQ. A cut
    call's request lands after the next owner's first call."""
    done = History()
    final = Owner(batches=[LAST_SEQ], ends="done", lag=0)
    for epoch, owner in enumerate([*history, final], start=1):
        sink = make_sink()
        handled = done.checkpoint
        late = bool(client.held)  # a predecessor's cut request, still in flight
        for number, size in enumerate(owner.batches):
            first, last = handled + 1, min(LAST_SEQ, handled + size)
            if first > last:
                break
            batch = [
                Delivery(cid, epoch, seq, {"seq": seq, "pad": "x" * rng.randrange(200)}, "w", 1)
                for seq in range(first, last + 1)
            ]
            if owner.ends == "cut" and number == len(owner.batches) - 1:
                client.cut_next()
            try:
                while True:
                    try:
                        await sink.handle_batch(batch)
                        break
                    except SinkSendError:
                        continue  # HANDLER_ERRORS=retry: the same batch again
            except CutCallError:
                break  # fenced: this call never returned
            handled = last
            if late:
                client.land_held()
                done.late_requests += 1
                late = False
        # The checkpoint the next owner resumes after: what this one handled, less a
        # lag (a crash before its last checkpoint write), never below the last one.
        done.checkpoint = max(done.checkpoint, handled - owner.lag)
    return done


@pytest.fixture(scope="module")
def aws(dynamodb_endpoint: str, moto_endpoint: str) -> Iterator[dict[str, Any]]:
    clients = {
        name: services.local_client(
            name, dynamodb_endpoint if name == "dynamodb" else moto_endpoint, config=CLIENT_CONFIG
        )
        for name in ("dynamodb", "kinesis", "sqs", "firehose", "s3")
    }
    table = unique_name("dedup")
    create_dedup_table(clients["dynamodb"], table)
    clients["dedup_table"] = table
    effects = unique_name("effects")
    clients["dynamodb"].create_table(
        TableName=effects,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    )
    clients["effects_table"] = effects
    yield clients
    clients["dynamodb"].delete_table(TableName=table)
    clients["dynamodb"].delete_table(TableName=effects)
    for name in ("dynamodb", "kinesis", "sqs", "firehose", "s3"):
        clients[name].close()


def check_ordered_recipe(deduper: Deduper, envelopes: list[Envelope], history: History) -> None:
    """The ordered recipe over what the transport holds, in its order."""
    applied: list[int] = []
    late: list[int] = []
    for envelope in envelopes:
        outcome = deduper.decide(envelope)
        if outcome.decision is Decision.APPLY:
            applied.append(envelope.seq)
            if outcome.late:
                late.append(envelope.seq)
    assert sorted(applied) == list(range(1, LAST_SEQ + 1)), applied  # every one, once
    in_order = [seq for seq in applied if seq not in late]
    assert in_order == sorted(in_order), applied
    if not history.late_requests:
        assert late == [], applied


def draw_refusals(data: st.DataObject) -> Callable[[int, Envelope], str | None]:
    """Refusals drawn up front, one per record sent, in order, until they run out (a
    destination that throttles for ever is the benchmark's business). Drawn before
    the run: the sinks send from threads, where hypothesis cannot draw."""
    codes = iter(data.draw(st.lists(refusal, max_size=120), label="refusals"))

    def refuse(request: int, envelope: Envelope) -> str | None:
        return next(codes, None)

    return refuse


HISTORY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@HISTORY_SETTINGS
@given(history=st.lists(owners, min_size=0, max_size=3), data=st.data())
def test_kinesis_histories_apply_every_checkpointed_message_once_in_order(aws, history, data):
    kinesis = aws["kinesis"]
    stream = unique_name("hist")
    create_stream(kinesis, stream, shards=1)
    try:
        client = RefusingKinesis(kinesis, draw_refusals(data))
        settings_ = SinkSettings(stream, max_attempts=MAX_ATTEMPTS)

        def make_sink() -> KinesisSink:
            return KinesisSink(client, settings_, clock_ms=lambda: NOW_MS, sleep=no_sleep)

        cid = unique_name("c")
        done = asyncio.run(run_history(cid, history, make_sink, client, random.Random(1)))
        assert done.checkpoint == LAST_SEQ
        assert not client.held
        deduper = Deduper(aws["dynamodb"], aws["dedup_table"])
        envelopes = read_shard(kinesis, stream)
        check_ordered_recipe(deduper, envelopes, done)
    finally:
        kinesis.delete_stream(StreamName=stream)


@HISTORY_SETTINGS
@given(history=st.lists(owners, min_size=0, max_size=3), data=st.data())
def test_sqs_fifo_histories_apply_every_checkpointed_message_once_in_order(aws, history, data):
    sqs = aws["sqs"]
    url: str = sqs.create_queue(
        QueueName=unique_name("hist") + ".fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    try:
        client = RefusingSqs(sqs, draw_refusals(data))
        settings_ = SinkSettings(url, max_attempts=MAX_ATTEMPTS)

        def make_sink() -> SqsFifoSink:
            return SqsFifoSink(client, settings_, clock_ms=lambda: NOW_MS, sleep=no_sleep)

        cid = unique_name("c")
        done = asyncio.run(run_history(cid, history, make_sink, client, random.Random(1)))
        assert done.checkpoint == LAST_SEQ
        assert not client.held
        deduper = Deduper(aws["dynamodb"], aws["dedup_table"])
        check_ordered_recipe(deduper, drain_fifo(sqs, url), done)
    finally:
        sqs.delete_queue(QueueUrl=url)


@HISTORY_SETTINGS
@given(history=st.lists(owners, min_size=0, max_size=3), data=st.data())
def test_firehose_histories_read_in_any_order_apply_every_checkpointed_message_once(
    aws, history, data
):
    """Firehose into S3, the objects read in a drawn order through the unordered
    recipe (``wsfleet.firehose_objects``)."""
    firehose, s3 = aws["firehose"], aws["s3"]
    bucket, name = unique_name("hist"), unique_name("hist")
    create_delivery_stream(firehose, s3, name, bucket, prefix="m/")
    try:
        client = RefusingFirehose(firehose, draw_refusals(data))
        settings_ = SinkSettings(name, max_attempts=MAX_ATTEMPTS)

        def make_sink() -> FirehoseSink:
            return FirehoseSink(client, settings_, clock_ms=lambda: NOW_MS, sleep=no_sleep)

        cid = unique_name("c")
        done = asyncio.run(run_history(cid, history, make_sink, client, random.Random(1)))
        assert done.checkpoint == LAST_SEQ
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        objects = [s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys]
        deduper = Deduper(aws["dynamodb"], aws["dedup_table"], ordered=False)
        table = aws["effects_table"]

        def effects(envelope: Envelope) -> list[dict[str, Any]]:
            """One more on the message's count: right only if made exactly once."""
            return [
                {
                    "Update": {
                        "TableName": table,
                        "Key": {"pk": {"S": f"{cid}#{envelope.seq}"}},
                        "UpdateExpression": "ADD #n :one",
                        "ExpressionAttributeNames": {"#n": "n"},
                        "ExpressionAttributeValues": {":one": {"N": "1"}},
                    }
                }
            ]

        for data_ in data.draw(st.permutations(objects), label="read order"):
            apply_object(data_, deduper, effects)
        counts = {}
        for seq in range(1, LAST_SEQ + 1):
            item = (
                aws["dynamodb"]
                .get_item(TableName=table, Key={"pk": {"S": f"{cid}#{seq}"}}, ConsistentRead=True)
                .get("Item")
            )
            counts[seq] = int(item["n"]["N"]) if item else 0
        assert counts == dict.fromkeys(range(1, LAST_SEQ + 1), 1)
    finally:
        firehose.delete_delivery_stream(DeliveryStreamName=name)
