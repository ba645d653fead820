"""The fault-injecting AWS endpoint in front of the moto server: the three batch writes
answered as the services answer (the refused entries in place, the rest as moto
answered them), what it keeps forwarded in order with the body rewritten, every other
request passed through, and what it injected counted."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from benchmarks.faulty_aws import (
    FIREHOSE,
    KINESIS,
    SQS,
    Counts,
    Faults,
    FaultyAws,
    FaultyAwsProcess,
    TokenBucket,
    fault_args,
    parse_args,
)
from local_stack import services
from local_stack.sink import create_delivery_stream
from tests.conftest import unique_name
from tests.support.stores import eventually
from worker.delivery import Delivery
from worker.sinks.firehose import FirehoseSink
from worker.sinks.kinesis import KinesisSink
from worker.sinks.settings import SinkSettings
from worker.sinks.sqs_fifo import SqsFifoSink
from wsfleet.envelope import Envelope

SENDER = "w-7"
# As the sinks' clients retry (worker/sinks/clients.py), naming their sender.
CONFIG = Config(
    connect_timeout=2,
    read_timeout=10,
    retries={"mode": "standard", "total_max_attempts": 3},
    user_agent_appid=SENDER,  # type: ignore[call-arg]  # botocore has it; its stubs lag
)


class Clock:
    """Monotonic time the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def endpoint_of(moto_endpoint: str, clock: Clock) -> Iterator[Any]:
    """Start an endpoint in front of moto with the faults given; all closed after."""
    started: list[FaultyAws] = []

    def start(faults: Faults, **kwargs: Any) -> FaultyAws:
        kwargs.setdefault("clock", clock)
        endpoint = FaultyAws(moto_endpoint, faults, **kwargs).start()
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.close()


def client(service: str, endpoint: str) -> Any:
    return services.local_client(service, endpoint, config=CONFIG)


@pytest.fixture
def stream(moto_endpoint: str) -> Iterator[str]:
    kinesis = client("kinesis", moto_endpoint)
    name = unique_name("faulty")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    yield name
    kinesis.delete_stream(StreamName=name)
    kinesis.close()


def stream_data(moto_endpoint: str, stream: str) -> list[bytes]:
    """Every record's data of the stream's one shard, in order."""
    kinesis = client("kinesis", moto_endpoint)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    data: list[bytes] = []
    while iterator:
        answer = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
        data += [r["Data"] for r in answer["Records"]]
        if not answer["Records"]:
            break
        iterator = answer.get("NextShardIterator")
    kinesis.close()
    return data


def kinesis_records(count: int) -> list[dict[str, Any]]:
    return [{"Data": f"r{i}".encode(), "PartitionKey": "a"} for i in range(count)]


def errors(results: list[dict[str, Any]]) -> list[int]:
    return [i for i, r in enumerate(results) if "ErrorCode" in r]


def test_kinesis_refusals_are_in_place_and_the_rest_land_in_order(
    endpoint_of, stream, moto_endpoint
):
    endpoint = endpoint_of(Faults(refuse=0.4, seed=3))
    kinesis = client("kinesis", endpoint.endpoint)
    answer = kinesis.put_records(StreamName=stream, Records=kinesis_records(30))
    results = answer["Records"]
    refused = errors(results)
    assert len(results) == 30
    assert 0 < len(refused) < 30
    assert answer["FailedRecordCount"] == len(refused)
    for i in refused:
        assert results[i]["ErrorCode"] in KINESIS.refusal_codes
        assert results[i]["ErrorMessage"]
        assert "SequenceNumber" not in results[i]
    taken = [i for i in range(30) if i not in refused]
    assert all(results[i]["ShardId"].startswith("shardId-") for i in taken)
    assert stream_data(moto_endpoint, stream) == [f"r{i}".encode() for i in taken]
    assert endpoint.counts()["kinesis"] == Counts(
        requests=1, records=30, forwarded=len(taken), refused=len(refused)
    )
    kinesis.close()


def test_a_request_refused_whole_reaches_nothing(endpoint_of, stream, moto_endpoint):
    endpoint = endpoint_of(Faults(refuse=1.0))
    kinesis = client("kinesis", endpoint.endpoint)
    answer = kinesis.put_records(StreamName=stream, Records=kinesis_records(4))
    assert answer["FailedRecordCount"] == 4
    assert len(errors(answer["Records"])) == 4
    assert stream_data(moto_endpoint, stream) == []
    kinesis.close()


def test_the_bucket_throttles_what_is_beyond_it_per_destination(
    endpoint_of, stream, moto_endpoint, clock
):
    endpoint = endpoint_of(Faults(throttle=5.0, burst=1.0))
    kinesis = client("kinesis", endpoint.endpoint)
    first = kinesis.put_records(StreamName=stream, Records=kinesis_records(12))["Records"]
    assert errors(first) == list(range(5, 12))
    assert {first[i]["ErrorCode"] for i in range(5, 12)} == {KINESIS.throttle_code}
    clock.now += 0.4  # two tokens earned
    second = kinesis.put_records(StreamName=stream, Records=kinesis_records(3))["Records"]
    assert errors(second) == [2]
    counts = endpoint.counts()["kinesis"]
    assert (counts.throttled, counts.refused, counts.forwarded) == (8, 0, 7)
    assert len(stream_data(moto_endpoint, stream)) == 7
    kinesis.close()


def test_a_token_bucket_refills_at_its_rate_up_to_its_capacity() -> None:
    bucket = TokenBucket(rate=2.0, capacity=3.0, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5)  # one earned
    assert not bucket.take(0.5)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]


@pytest.fixture
def delivery_stream(moto_endpoint: str) -> Iterator[tuple[str, Any, str]]:
    """A Firehose delivery stream into an S3 bucket: (its name, the S3 client, the
    bucket)."""
    s3 = client("s3", moto_endpoint)
    firehose = client("firehose", moto_endpoint)
    bucket = unique_name("faulty")
    name = unique_name("faulty-to-s3")
    create_delivery_stream(firehose, s3, name, bucket, prefix="messages/")
    yield name, s3, bucket
    firehose.delete_delivery_stream(DeliveryStreamName=name)
    firehose.close()
    s3.close()


def test_firehose_refusals_are_in_place_and_the_object_holds_the_rest(endpoint_of, delivery_stream):
    name, s3, bucket = delivery_stream
    endpoint = endpoint_of(Faults(refuse=0.3, seed=5))
    firehose = client("firehose", endpoint.endpoint)
    answer = firehose.put_record_batch(
        DeliveryStreamName=name, Records=[{"Data": f"r{i}\n".encode()} for i in range(20)]
    )
    results = answer["RequestResponses"]
    refused = errors(results)
    assert 0 < len(refused) < 20
    assert answer["FailedPutCount"] == len(refused)
    assert {results[i]["ErrorCode"] for i in refused} <= set(FIREHOSE.refusal_codes)
    assert all("RecordId" in results[i] for i in range(20) if i not in refused)
    [key] = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert data == b"".join(f"r{i}\n".encode() for i in range(20) if i not in refused)
    assert endpoint.counts()["firehose"].refused == len(refused)
    firehose.close()


@pytest.fixture
def fifo_queue(sqs: Any) -> Iterator[str]:
    url: str = sqs.create_queue(
        QueueName=unique_name("faulty") + ".fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    yield url
    sqs.delete_queue(QueueUrl=url)


def entries(count: int) -> list[dict[str, str]]:
    return [
        {
            "Id": f"e{i}",
            "MessageBody": f"m{i}",
            "MessageGroupId": "g",
            "MessageDeduplicationId": f"d{i}",
        }
        for i in range(count)
    ]


def test_sqs_failed_entries_are_not_the_senders_fault_and_the_rest_arrive_in_order(
    endpoint_of, fifo_queue, sqs
):
    endpoint = endpoint_of(Faults(refuse=0.4, seed=11))
    through = client("sqs", endpoint.endpoint)
    answer = through.send_message_batch(QueueUrl=fifo_queue, Entries=entries(10))
    failed = {f["Id"]: f for f in answer["Failed"]}
    taken = [s["Id"] for s in answer["Successful"]]
    assert 0 < len(failed) < 10
    assert sorted([*failed, *taken]) == sorted(f"e{i}" for i in range(10))
    for failure in failed.values():
        assert failure["SenderFault"] is False
        assert failure["Code"] in SQS.refusal_codes
    assert all(s["MessageId"] and s["MD5OfMessageBody"] for s in answer["Successful"])
    bodies: list[str] = []

    def receive() -> list[str]:
        got = sqs.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=10)
        for message in got.get("Messages", []):
            bodies.append(message["Body"])
            sqs.delete_message(QueueUrl=fifo_queue, ReceiptHandle=message["ReceiptHandle"])
        return bodies

    eventually(receive, lambda got: len(got) >= len(taken))
    assert bodies == [f"m{ident[1:]}" for ident in sorted(taken, key=lambda i: int(i[1:]))]
    assert endpoint.counts()["sqs"].refused == len(failed)
    through.close()


def test_other_requests_pass_through_unchanged(endpoint_of, moto_endpoint, stream, sqs):
    endpoint = endpoint_of(Faults(refuse=1.0, request_errors=1.0))
    kinesis = client("kinesis", endpoint.endpoint)
    assert kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
        "StreamName"
    ] == (stream)
    with pytest.raises(ClientError) as missing:
        kinesis.describe_stream_summary(StreamName="no-such-stream")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    through = client("sqs", endpoint.endpoint)
    url = through.create_queue(QueueName=unique_name("plain"))["QueueUrl"]
    through.send_message(QueueUrl=url, MessageBody="hello")
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in got] == ["hello"]
    assert all(c.requests == 0 for c in endpoint.counts().values())
    kinesis.close()
    through.close()


def test_a_delayed_request_of_a_sender_that_exited_counts_as_late(
    endpoint_of, stream, moto_endpoint, clock
):
    endpoint = endpoint_of(Faults(delay=1.0, delay_seconds=(0.2, 0.2)))
    kinesis = client("kinesis", endpoint.endpoint)
    kinesis.put_records(StreamName=stream, Records=kinesis_records(2))
    endpoint.note_exit(SENDER)
    endpoint.note_exit("another", at=clock.now + 60)  # not yet
    kinesis.put_records(StreamName=stream, Records=kinesis_records(3))
    counts = endpoint.counts()["kinesis"]
    assert (counts.requests, counts.delayed, counts.late, counts.late_records) == (2, 2, 1, 3)
    assert len(stream_data(moto_endpoint, stream)) == 5
    kinesis.close()


def test_request_errors_are_sent_again_by_botocore_and_lost_answers_leave_copies(
    endpoint_of, stream, moto_endpoint
):
    endpoint = endpoint_of(Faults(request_errors=1.0, seed=2))
    kinesis = client("kinesis", endpoint.endpoint)
    with pytest.raises(ClientError) as failed:
        kinesis.put_records(StreamName=stream, Records=kinesis_records(2))
    assert failed.value.response["Error"]["Code"] == "InternalFailure"
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    counts = endpoint.counts()["kinesis"]
    assert counts.requests == counts.request_errors == 3  # every attempt
    # A request failed after it was forwarded landed: its records are in the stream.
    assert len(stream_data(moto_endpoint, stream)) == 2 * counts.answers_lost
    kinesis.close()


def test_a_failed_call_fails_every_attempt_and_only_that_call(endpoint_of, fifo_queue):
    endpoint = endpoint_of(Faults(failed_calls=1.0, seed=1))
    through = client("sqs", endpoint.endpoint)
    with pytest.raises(ClientError) as failed:
        through.send_message_batch(QueueUrl=fifo_queue, Entries=entries(2))
    assert failed.value.response["Error"]["Code"] == "InternalError"
    counts = endpoint.counts()["sqs"]
    assert (counts.failed_calls, counts.request_errors, counts.requests) == (1, 3, 3)
    through.close()


def test_absorbed_writes_are_answered_and_reported_without_moto(endpoint_of, stream, moto_endpoint):
    landed: list[tuple[str, str, list[dict[str, Any]]]] = []
    endpoint = endpoint_of(
        Faults(absorb=True, refuse=0.5, seed=4),
        landed=lambda service, where, items: landed.append((service, where, list(items))),
    )
    kinesis = client("kinesis", endpoint.endpoint)
    answer = kinesis.put_records(StreamName=stream, Records=kinesis_records(10))
    taken = [i for i in range(10) if i not in errors(answer["Records"])]
    assert answer["FailedRecordCount"] == 10 - len(taken)
    assert stream_data(moto_endpoint, stream) == []
    [(service, where, items)] = landed
    assert (service, where) == ("kinesis", stream)
    assert [base64.b64decode(item["Data"]) for item in items] == [f"r{i}".encode() for i in taken]
    kinesis.close()


def batch(connection_id: str, count: int) -> list[Delivery]:
    return [
        Delivery(connection_id, 2, seq, {"seq": seq, "pad": "x" * 2000}, "w", seq_gen=1)
        for seq in range(1, count + 1)
    ]


def read_all_kinesis(moto_endpoint: str, stream: str) -> list[Envelope]:
    return [Envelope.from_bytes(data) for data in stream_data(moto_endpoint, stream)]


async def test_the_real_sinks_get_every_message_through_refusals_and_throttles(
    endpoint_of, moto_endpoint, stream, delivery_stream, fifo_queue, sqs
):
    """The sinks read the answers as the services give them: every message lands, the
    last copies of a connection's in seq order where the destination keeps order."""
    endpoint = endpoint_of(
        Faults(refuse=0.3, throttle=200.0, burst=0.1, seed=9), clock=time.monotonic
    )
    make: dict[str, Callable[[], Any]] = {
        "kinesis": lambda: KinesisSink(
            client("kinesis", endpoint.endpoint), SinkSettings(stream), sleep=no_wait
        ),
        "firehose": lambda: FirehoseSink(
            client("firehose", endpoint.endpoint),
            SinkSettings(delivery_stream[0]),
            sleep=no_wait,
        ),
        "sqs": lambda: SqsFifoSink(
            client("sqs", endpoint.endpoint), SinkSettings(fifo_queue), sleep=no_wait
        ),
    }
    for sink in make.values():
        await sink().handle_batch(batch("c-1", 40))
    counts = endpoint.counts()
    assert all(c.refused > 0 for c in counts.values()), counts

    kinesis_seqs = [e.seq for e in read_all_kinesis(moto_endpoint, stream)]
    assert last_copies_in_order(kinesis_seqs) == list(range(1, 41))

    _, s3, bucket = delivery_stream
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    lines = b"".join(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed)
    firehose_seqs = {Envelope.from_bytes(line).seq for line in lines.split(b"\n") if line}
    assert firehose_seqs == set(range(1, 41))

    sqs_seqs: list[int] = []

    def receive() -> list[int]:
        got = sqs.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=10)
        for message in got.get("Messages", []):
            sqs_seqs.append(Envelope.from_bytes(message["Body"].encode()).seq)
            sqs.delete_message(QueueUrl=fifo_queue, ReceiptHandle=message["ReceiptHandle"])
        return sqs_seqs

    eventually(receive, lambda got: set(got) >= set(range(1, 41)))
    assert last_copies_in_order(sqs_seqs) == list(range(1, 41))


async def no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


def last_copies_in_order(seqs: list[int]) -> list[int]:
    """Each seq at the position of its last copy."""
    last = {seq: i for i, seq in enumerate(seqs)}
    return sorted(last, key=last.__getitem__)


def test_faults_are_checked() -> None:
    with pytest.raises(ValueError, match="refuse must be a share"):
        Faults(refuse=1.5)
    with pytest.raises(ValueError, match="throttle must be > 0"):
        Faults(throttle=0)
    with pytest.raises(ValueError, match="delay_seconds"):
        Faults(delay_seconds=(5.0, 1.0))


def test_the_command_line_takes_the_faults() -> None:
    args = parse_args(["--upstream", "http://127.0.0.1:1", "--refuse", "0.1", "--throttle", "50"])
    assert (args.faults.refuse, args.faults.throttle) == (0.1, 50.0)
    assert json.dumps(args.faults.delay_seconds) == "[3.0, 7.0]"
    every = Faults(0.1, 20.0, 0.5, 0.2, (1.0, 2.0), 0.03, 0.01, absorb=True, seed=4)
    assert parse_args(["--upstream", "http://127.0.0.1:1", *fault_args(every)]).faults == every


def test_in_a_process_of_its_own_it_is_driven_through_its_control_paths(
    moto_endpoint, stream, tmp_path
):
    faults = Faults(refuse=0.5, delay=1.0, delay_seconds=(0.3, 0.3), seed=6)
    with FaultyAwsProcess(moto_endpoint, faults, tmp_path) as endpoint:
        assert endpoint.faults == faults
        kinesis = client("kinesis", endpoint.endpoint)
        answer = kinesis.put_records(StreamName=stream, Records=kinesis_records(10))
        endpoint.note_exit(SENDER)
        kinesis.put_records(StreamName=stream, Records=kinesis_records(4))
        assert endpoint.wait_idle(5.0)
        counts = endpoint.counts()["kinesis"]
        kinesis.close()
    assert counts.requests == counts.delayed == 2
    assert counts.late == 1
    assert counts.refused >= answer["FailedRecordCount"] > 0
    assert counts.records == 14
    log = (tmp_path / "faulty-aws.log").read_text()
    assert '"refused": ' in log  # its counts, printed as it stopped


def test_an_unknown_control_path_is_refused(endpoint_of):
    endpoint = endpoint_of(Faults())
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=5)
    connection.request("GET", "/_faulty_aws/nothing")
    answer = connection.getresponse()
    assert answer.status == 404
    assert b"no control" in answer.read()
    connection.close()
