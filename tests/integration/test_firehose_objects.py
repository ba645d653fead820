"""The Firehose consumer recipe (:mod:`wsfleet.firehose_objects`) on what the real
Firehose sink delivers to S3 through moto: a partly refused request, a failover's
copies from a second owner and a line that is no envelope, the objects read in
shuffled orders, every message applied exactly once."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from local_stack import services
from local_stack.fleet import CLIENT_CONFIG
from local_stack.sink import create_delivery_stream
from tests.conftest import unique_name
from tests.support.stores import eventually
from worker.delivery import Delivery
from worker.sinks.firehose import FirehoseSink
from worker.sinks.settings import SinkSettings
from wsfleet.deduper import Decision, Deduper, create_dedup_table
from wsfleet.envelope import Envelope
from wsfleet.firehose_objects import (
    BadLine,
    apply_object,
    apply_object_at_least_once,
    read_envelopes,
)

NOW_MS = 1_767_225_604_100
Key = tuple[str, int, int]


def client(service: str, endpoint: str) -> Any:
    return services.local_client(service, endpoint, config=CLIENT_CONFIG)


@pytest.fixture
def delivery_stream(moto_endpoint: str) -> Iterator[tuple[str, Any, Any, str]]:
    """A Firehose delivery stream into an S3 bucket: (its name, the Firehose client,
    the S3 client, the bucket)."""
    s3 = client("s3", moto_endpoint)
    firehose = client("firehose", moto_endpoint)
    bucket = unique_name("envelopes")
    name = unique_name("to-s3")
    create_delivery_stream(firehose, s3, name, bucket, prefix="messages/")
    yield name, firehose, s3, bucket
    firehose.delete_delivery_stream(DeliveryStreamName=name)
    firehose.close()
    s3.close()


class RefusingFirehose:
    """Firehose, except that the records ``refuse`` picks in the first request are
    refused (as a throttled ``PutRecordBatch`` answers) and not written; counts the
    records it passed on."""

    def __init__(self, firehose: Any, refuse: set[int]) -> None:
        self._firehose = firehose
        self._refuse = refuse
        self.requests = 0
        self.written = 0

    def put_record_batch(self, **kwargs: Any) -> Mapping[str, Any]:
        self.requests += 1
        records = kwargs["Records"]
        refused = self._refuse if self.requests == 1 else set()
        kept = [r for i, r in enumerate(records) if i not in refused]
        if kept:
            self._firehose.put_record_batch(**{**kwargs, "Records": kept})
        self.written += len(kept)
        answers = [
            {"ErrorCode": "ServiceUnavailableException", "ErrorMessage": "slow down"}
            if i in refused
            else {"RecordId": f"r{i}"}
            for i in range(len(records))
        ]
        return {
            "FailedPutCount": len(refused & set(range(len(records)))),
            "RequestResponses": answers,
        }


async def no_pause(seconds: float) -> None:
    """The sink's backoff after a refusal, not waited out: nothing here recovers with time."""


def deliveries(cid: str, epoch: int, seqs: range) -> list[Delivery]:
    return [Delivery(cid, epoch, seq, {"seq": seq}, f"w-{epoch}") for seq in seqs]


async def deliver(delivery_stream: tuple[str, Any, Any, str]) -> tuple[int, set[Key]]:
    """What two owners send, through the real sink: epoch 1 sends two connections'
    messages, its first request partly refused; epoch 2 takes over from a checkpoint
    and sends the second half again, then more. The records written, and the messages."""
    name, firehose, _, _ = delivery_stream
    flaky = RefusingFirehose(firehose, refuse={1, 4})
    old = FirehoseSink(flaky, SinkSettings(name), clock_ms=lambda: NOW_MS, sleep=no_pause)
    for batch in (
        deliveries("conn-a", 1, range(1, 6)) + deliveries("conn-b", 1, range(1, 4)),
        deliveries("conn-a", 1, range(6, 11)),
        deliveries("conn-b", 1, range(4, 9)),
    ):
        await old.handle_batch(batch)
    new_owner = RefusingFirehose(firehose, refuse=set())
    new = FirehoseSink(new_owner, SinkSettings(name), clock_ms=lambda: NOW_MS + 1, sleep=no_pause)
    for batch in (
        deliveries("conn-a", 2, range(6, 13)),
        deliveries("conn-b", 2, range(4, 11)),
    ):
        await new.handle_batch(batch)
    sent = {("conn-a", 0, s) for s in range(1, 13)} | {("conn-b", 0, s) for s in range(1, 11)}
    return flaky.written + new_owner.written, sent


def read_objects(s3: Any, bucket: str) -> list[bytes]:
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed]


def all_objects(s3: Any, bucket: str, lines: int) -> list[bytes]:
    objects: list[bytes] = eventually(
        lambda: read_objects(s3, bucket), lambda got: sum(o.count(b"\n") for o in got) >= lines
    )
    assert sum(o.count(b"\n") for o in objects) == lines
    return objects


@pytest.fixture
def fresh_tables(ddb: Any) -> Iterator[Callable[[], tuple[str, str]]]:
    """Makes a dedup table and an effects table per call; deletes them all after."""
    made: list[str] = []

    def make() -> tuple[str, str]:
        dedup, effects = unique_name("dedup"), unique_name("effects")
        create_dedup_table(ddb, dedup)
        ddb.create_table(
            TableName=effects,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        )
        made.extend((dedup, effects))
        return dedup, effects

    yield make
    for name in made:
        ddb.delete_table(TableName=name)


def count_once(table: str) -> Callable[[Envelope], list[dict[str, Any]]]:
    """The effect: one more write counted on the message's item (not idempotent)."""

    def effects(envelope: Envelope) -> list[dict[str, Any]]:
        return [
            {
                "Update": {
                    "TableName": table,
                    "Key": {"pk": {"S": "/".join(map(str, envelope.key))}},
                    "UpdateExpression": "ADD #writes :one",
                    "ExpressionAttributeNames": {"#writes": "writes"},
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            }
        ]

    return effects


def writes(ddb: Any, table: str) -> dict[str, int]:
    items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
    return {i["pk"]["S"]: int(i["writes"]["N"]) for i in items}


async def test_every_message_firehose_delivered_is_applied_once_in_any_read_order(
    ddb, delivery_stream, fresh_tables
):
    lines, sent = await deliver(delivery_stream)
    _, _, s3, bucket = delivery_stream
    objects = all_objects(s3, bucket, lines)
    copies = [e.key for o in objects for e in read_envelopes(o)]
    assert set(copies) == sent
    assert len(copies) > len(sent)  # the refused records and the failover's copies

    with pytest.raises(ValueError, match="must be unordered"):
        apply_object(objects[0], Deduper(ddb, "never-used"), count_once("never-used"))

    rng = random.Random(20260101)
    orders = [list(reversed(range(len(objects))))]
    orders += [rng.sample(range(len(objects)), len(objects)) for _ in range(2)]
    for order in orders:
        dedup, effects = fresh_tables()
        deduper = Deduper(ddb, dedup, ordered=False)
        tallies = [apply_object(objects[i], deduper, count_once(effects)) for i in order]
        assert writes(ddb, effects) == {"/".join(map(str, k)): 1 for k in sent}, order
        assert sum(t.applied for t in tallies) == len(sent)
        assert sum(t.skipped for t in tallies) == len(copies) - len(sent)
        assert not any(t.bad_lines for t in tallies)


async def test_the_ordered_deduper_loses_the_first_messages_read_last_and_the_recipe_none(
    ddb, delivery_stream, fresh_tables
):
    """S3 on real objects: the ordered rules lose what the recipe applies."""
    lines, sent = await deliver(delivery_stream)
    _, _, s3, bucket = delivery_stream
    objects = all_objects(s3, bucket, lines)

    # The object holding the connections' first messages read last (S3 lists by key,
    # events come in any order): every higher seq applied before makes them copies.
    def holds_a_first(data: bytes) -> bool:
        return any(e.seq == 1 for e in read_envelopes(data))

    order = sorted(objects, key=holds_a_first)
    assert holds_a_first(order[-1])
    assert not holds_a_first(order[0])
    dedup, effects = fresh_tables()
    ordered = Deduper(ddb, dedup)
    applied = {
        e.key
        for o in order
        for e in read_envelopes(o)
        if ordered.decide(e).decision is Decision.APPLY
    }
    assert {("conn-a", 0, 1), ("conn-b", 0, 1)} <= sent - applied
    # The recipe, on the same order, loses nothing.
    unordered = Deduper(ddb, dedup, ordered=False)
    for data in order:
        apply_object(data, unordered, count_once(effects))
    assert writes(ddb, effects) == {"/".join(map(str, k)): 1 for k in sent}


async def test_a_line_that_is_no_envelope_costs_only_itself(ddb, delivery_stream, fresh_tables):
    name, firehose, s3, bucket = delivery_stream
    good = [
        Envelope("conn-x", 1, 0, seq, NOW_MS, {"seq": seq}).to_bytes() + b"\n" for seq in (1, 2)
    ]
    # One request, so one object: an envelope, a line that is not one, an envelope.
    firehose.put_record_batch(
        DeliveryStreamName=name,
        Records=[{"Data": good[0]}, {"Data": b'{"not": "an envelope"}\n'}, {"Data": good[1]}],
    )
    [data] = all_objects(s3, bucket, 3)
    dedup, effects = fresh_tables()
    reported: list[BadLine] = []
    deduper = Deduper(ddb, dedup, ordered=False)
    tally = apply_object(data, deduper, count_once(effects), on_bad_line=reported.append)
    assert (tally.applied, tally.skipped) == (2, 0)
    assert tally.bad_lines == reported
    assert [(b.number, b.start) for b in reported] == [(2, b'{"not": "an envelope"}')]
    assert "envelope keys are" in reported[0].error
    assert writes(ddb, effects) == {"conn-x/0/1": 1, "conn-x/0/2": 1}


async def test_an_idempotent_effect_is_made_for_every_message_in_any_read_order(
    ddb, delivery_stream, fresh_tables
):
    lines, sent = await deliver(delivery_stream)
    _, _, s3, bucket = delivery_stream
    objects = all_objects(s3, bucket, lines)
    dedup, _ = fresh_tables()
    deduper = Deduper(ddb, dedup, ordered=False)
    made: list[Key] = []
    for i in random.Random(7).sample(range(len(objects)), len(objects)):
        apply_object_at_least_once(objects[i], deduper, lambda e: made.append(e.key))
    # no crash in between: at least once is once here
    assert sorted(made) == sorted(sent)
