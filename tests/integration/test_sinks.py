"""The built-in sinks against moto's Kinesis, Firehose (into S3) and SQS: batches
sent through the real sink classes and read back, each message once per connection
in seq order, with the envelope's fields. Refused records and records over the size
limits are in tests/unit/test_sinks.py (moto takes every record)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from local_stack import services
from local_stack.fleet import CLIENT_CONFIG
from local_stack.sink import create_delivery_stream
from tests.conftest import unique_name
from tests.support.stores import eventually
from worker.delivery import Delivery, load_handler
from worker.sinks.firehose import FirehoseSink
from worker.sinks.kinesis import KinesisSink
from worker.sinks.settings import SinkSettings
from worker.sinks.sqs_fifo import SqsFifoSink
from wsfleet.envelope import Envelope

NOW_MS = 1_767_225_604_100
PAYLOAD_TEXT = "Grüße aus 東京 🚀"


def client(service: str, endpoint: str) -> Any:
    return services.local_client(service, endpoint, config=CLIENT_CONFIG)


def batch(connection_id: str, first: int, count: int, *, epoch: int = 3) -> list[Delivery]:
    return [
        Delivery(connection_id, epoch, seq, {"seq": seq, "text": PAYLOAD_TEXT}, "w-1", seq_gen=1)
        for seq in range(first, first + count)
    ]


async def send_like_a_worker(sink: Any, batches: dict[str, list[list[Delivery]]]) -> None:
    """Each connection's batches one after another, connections side by side."""

    async def one_connection(calls: list[list[Delivery]]) -> None:
        for deliveries in calls:
            await sink.handle_batch(deliveries)

    await asyncio.gather(*(one_connection(calls) for calls in batches.values()))


def check_envelopes(envelopes: list[Envelope], expected: dict[str, int]) -> None:
    """Every connection's seqs 1..n once and in order, with the delivery's fields."""
    for connection_id, count in expected.items():
        seqs = [e.seq for e in envelopes if e.connection_id == connection_id]
        assert seqs == list(range(1, count + 1)), connection_id
    assert {e.connection_id for e in envelopes} == set(expected)
    for e in envelopes:
        assert (e.epoch, e.seq_gen, e.received_at_ms) == (3, 1, NOW_MS)
        assert e.payload == {"seq": e.seq, "text": PAYLOAD_TEXT}


WORK = {
    # 620 records in one call: two PutRecords requests (500 + 120).
    "conn-a": [batch("conn-a", 1, 3), batch("conn-a", 4, 620), batch("conn-a", 624, 1)],
    "conn-b": [batch("conn-b", 1, 1), batch("conn-b", 2, 40)],
    "conn-c": [batch("conn-c", 1, 12)],
}
COUNTS = {"conn-a": 624, "conn-b": 41, "conn-c": 12}


@pytest.fixture
def kinesis(moto_endpoint: str) -> Iterator[Any]:
    kinesis = client("kinesis", moto_endpoint)
    yield kinesis
    kinesis.close()


@pytest.fixture
def stream(kinesis: Any) -> Iterator[str]:
    name = unique_name("messages")
    kinesis.create_stream(StreamName=name, ShardCount=3)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    yield name
    kinesis.delete_stream(StreamName=name)


def read_stream(kinesis: Any, stream: str) -> list[tuple[str, str, Envelope]]:
    """Every record of every shard: (shard, partition key, envelope), each shard's in
    its order."""
    shards = kinesis.describe_stream(StreamName=stream)["StreamDescription"]["Shards"]
    got = []
    for shard in shards:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            answer = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            got += [
                (shard["ShardId"], r["PartitionKey"], Envelope.from_bytes(r["Data"]))
                for r in answer["Records"]
            ]
            if not answer["Records"]:
                break
            iterator = answer.get("NextShardIterator")
    return got


async def test_kinesis_gets_each_connections_messages_in_order_on_one_shard(kinesis, stream):
    sink = KinesisSink(kinesis, SinkSettings(stream), clock_ms=lambda: NOW_MS)
    await send_like_a_worker(sink, WORK)
    records = eventually(
        lambda: read_stream(kinesis, stream), lambda got: len(got) >= sum(COUNTS.values())
    )
    check_envelopes([envelope for _, _, envelope in records], COUNTS)
    assert all(key == envelope.connection_id for _, key, envelope in records)
    shards = {cid: {shard for shard, key, _ in records if key == cid} for cid in COUNTS}
    assert all(len(on) == 1 for on in shards.values()), shards


async def test_kinesis_stream_named_by_arn(kinesis, stream):
    arn = kinesis.describe_stream(StreamName=stream)["StreamDescription"]["StreamARN"]
    sink = KinesisSink(kinesis, SinkSettings(arn), clock_ms=lambda: NOW_MS)
    await sink.handle_batch(batch("conn-a", 1, 2))
    records = eventually(lambda: read_stream(kinesis, stream), lambda got: len(got) >= 2)
    check_envelopes([envelope for _, _, envelope in records], {"conn-a": 2})


async def test_the_kinesis_factory_uses_boto3s_endpoint_variable(
    monkeypatch, kinesis, stream, moto_endpoint
):
    monkeypatch.setenv("SINK_STREAM_NAME", stream)
    monkeypatch.setenv("SINK_MAX_ATTEMPTS", "3")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_KINESIS", moto_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", services.LOCAL_REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    sink = load_handler("worker.sinks.kinesis:factory")
    assert isinstance(sink, KinesisSink)
    try:
        await sink.handle_batch(batch("conn-f", 1, 5))
    finally:
        sink._executor.shutdown()  # type: ignore[union-attr]
    records = eventually(lambda: read_stream(kinesis, stream), lambda got: len(got) >= 5)
    assert [envelope.seq for _, _, envelope in records] == [1, 2, 3, 4, 5]
    assert all(envelope.seq_gen == 1 for _, _, envelope in records)


@pytest.fixture
def delivery_stream(moto_endpoint: str) -> Iterator[tuple[str, Any, str]]:
    """A Firehose delivery stream into an S3 bucket: (its name, the S3 client, the
    bucket)."""
    s3 = client("s3", moto_endpoint)
    firehose = client("firehose", moto_endpoint)
    bucket = unique_name("envelopes")
    name = unique_name("to-s3")
    create_delivery_stream(firehose, s3, name, bucket, prefix="messages/")
    yield name, s3, bucket
    firehose.delete_delivery_stream(DeliveryStreamName=name)
    firehose.close()
    s3.close()


def read_objects(s3: Any, bucket: str) -> list[bytes]:
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed]


async def test_firehose_writes_newline_delimited_envelopes(moto_endpoint, delivery_stream):
    name, s3, bucket = delivery_stream
    firehose = client("firehose", moto_endpoint)
    sink = FirehoseSink(firehose, SinkSettings(name), clock_ms=lambda: NOW_MS)
    await send_like_a_worker(sink, WORK)
    total = sum(COUNTS.values())
    objects = eventually(
        lambda: read_objects(s3, bucket),
        lambda got: sum(o.count(b"\n") for o in got) >= total,
    )
    firehose.close()
    envelopes = []
    for data in objects:
        assert data.endswith(b"\n")
        lines = data.split(b"\n")[:-1]
        envelopes += [Envelope.from_bytes(line) for line in lines]
        # One request per object here: each connection's lines in seq order.
        for cid in COUNTS:
            seqs = [e.seq for e in envelopes[-len(lines) :] if e.connection_id == cid]
            assert seqs == sorted(seqs)
    envelopes.sort(key=lambda e: e.seq)  # objects are listed by key, not by time
    check_envelopes(envelopes, COUNTS)


@pytest.fixture
def fifo_queue(sqs) -> Iterator[str]:
    url: str = sqs.create_queue(
        QueueName=unique_name("messages") + ".fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    yield url
    sqs.delete_queue(QueueUrl=url)


def receive_all(sqs: Any, url: str, count: int) -> list[dict[str, Any]]:
    """Messages as received (deleted once received), until ``count`` or a deadline."""
    got: list[dict[str, Any]] = []

    def more() -> list[dict[str, Any]]:
        answer = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, AttributeNames=["All"]
        )
        for message in answer.get("Messages", []):
            got.append(message)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return got

    return eventually(more, lambda messages: len(messages) >= count)


async def test_sqs_fifo_groups_each_connections_messages_in_order(sqs, fifo_queue):
    sink = SqsFifoSink(sqs, SinkSettings(fifo_queue), clock_ms=lambda: NOW_MS)
    work = {
        "conn-a": [batch("conn-a", 1, 3), batch("conn-a", 4, 23)],  # 10 + 10 + 3 per request
        "conn-b": [batch("conn-b", 1, 7)],
    }
    await send_like_a_worker(sink, work)
    messages = receive_all(sqs, fifo_queue, 33)
    envelopes = [Envelope.from_bytes(m["Body"].encode()) for m in messages]
    check_envelopes(envelopes, {"conn-a": 26, "conn-b": 7})
    for message, envelope in zip(messages, envelopes, strict=True):
        assert message["Attributes"]["MessageGroupId"] == envelope.connection_id
    assert len({m["Attributes"]["MessageDeduplicationId"] for m in messages}) == 33


async def test_sqs_fifo_drops_the_same_request_sent_again(sqs, fifo_queue):
    """A request botocore sends again after a lost answer carries the same ids: SQS
    drops it. (A batch the worker sends again whole is new requests: its copies land,
    and the consumer's deduper skips them.)"""
    sent: list[dict[str, Any]] = []

    class Twice:
        def send_message_batch(self, **kwargs: Any) -> Any:
            sent.append(kwargs)
            sqs.send_message_batch(**kwargs)
            return sqs.send_message_batch(**kwargs)

    sink = SqsFifoSink(Twice(), SinkSettings(fifo_queue), clock_ms=lambda: NOW_MS)
    await sink.handle_batch(batch("conn-a", 1, 4))
    messages = receive_all(sqs, fifo_queue, 4)
    assert [Envelope.from_bytes(m["Body"].encode()).seq for m in messages] == [1, 2, 3, 4]
    late = sqs.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    assert late.get("Messages", []) == []
