"""The example Kinesis consumer (examples/kinesis_consumer/handler.py) against DynamoDB
Local, with Kinesis events made by hand as Lambda delivers them: each message written
once through a redelivery, the function's own retries and a superseded owner; a record
that is no envelope passed over; a failing record reported so that it and the records
after it come again."""

from __future__ import annotations

import base64
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from examples.kinesis_consumer import handler as consumer_module
from examples.kinesis_consumer.handler import (
    COUNT_ITEM,
    KinesisConsumer,
    message_item_key,
)
from tests.conftest import unique_name
from wsfleet.deduper import Deduper, Position, create_dedup_table
from wsfleet.envelope import Envelope

NOW = 1_767_225_600_000
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kinesis_consumer"
STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/fleet-envelopes"


def envelope(
    cid: str,
    epoch: int,
    seq: int,
    seq_gen: int = 0,
    payload: Any = None,
    prev_seq: int | None = None,
) -> bytes:
    body = {"price": seq} if payload is None else payload
    return Envelope(cid, epoch, seq_gen, seq, NOW + seq, body, prev_seq).to_bytes()


class Shard:
    """Numbers records as a Kinesis shard does: one increasing sequence number each."""

    def __init__(self) -> None:
        self.next = 0

    def event(self, records: list[bytes]) -> dict[str, Any]:
        """A Lambda event of ``records`` (the envelopes' bytes, or anything else)."""
        made = []
        for data in records:
            self.next += 1
            number = f"4959033827149025660855969253836157109592157598913{self.next:07d}"
            made.append(self.record(number, base64.b64encode(data).decode()))
        return {"Records": made}

    @staticmethod
    def record(number: str, data: str) -> dict[str, Any]:
        return {
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": "any",
                "sequenceNumber": number,
                "data": data,
                "approximateArrivalTimestamp": NOW / 1000,
            },
            "eventSource": "aws:kinesis",
            "eventVersion": "1.0",
            "eventID": f"shardId-000000000000:{number}",
            "eventName": "aws:kinesis:record",
            "invokeIdentityArn": "arn:aws:iam::123456789012:role/consumer",
            "awsRegion": "us-east-1",
            "eventSourceARN": STREAM_ARN,
        }


def numbers(event: dict[str, Any]) -> list[str]:
    return [r["kinesis"]["sequenceNumber"] for r in event["Records"]]


@pytest.fixture
def tables(ddb) -> Iterator[tuple[str, str]]:
    dedup, output = unique_name("dedup"), unique_name("output")
    create_dedup_table(ddb, dedup)
    ddb.create_table(
        TableName=output,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "connection_id", "AttributeType": "S"},
            {"AttributeName": "item", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "connection_id", "KeyType": "HASH"},
            {"AttributeName": "item", "KeyType": "RANGE"},
        ],
    )
    yield dedup, output
    ddb.delete_table(TableName=dedup)
    ddb.delete_table(TableName=output)


@pytest.fixture
def consumer(ddb, tables) -> KinesisConsumer:
    dedup, output = tables
    return KinesisConsumer(Deduper(ddb, dedup), output, clock_ms=lambda: NOW)


def messages(ddb, output: str, cid: str) -> dict[tuple[int, int], dict[str, Any]]:
    """The connection's message items by (seq_gen, seq)."""
    items = ddb.query(
        TableName=output,
        KeyConditionExpression="connection_id = :c AND begins_with(#i, :m)",
        ExpressionAttributeNames={"#i": "item"},
        ExpressionAttributeValues={":c": {"S": cid}, ":m": {"S": "MSG#"}},
        ConsistentRead=True,
    )["Items"]
    return {(int(i["seq_gen"]["N"]), int(i["seq"]["N"])): i for i in items}


def tally(ddb, output: str, cid: str) -> int:
    got = ddb.get_item(
        TableName=output,
        Key={"connection_id": {"S": cid}, "item": {"S": COUNT_ITEM}},
        ConsistentRead=True,
    )
    return int(got["Item"]["messages"]["N"]) if "Item" in got else 0


def summary(caplog: pytest.LogCaptureFixture) -> str:
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch of")]
    caplog.clear()
    return line


def test_a_batch_is_written_one_item_per_message_and_counted(ddb, tables, consumer, caplog):
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    _, output = tables
    shard = Shard()
    event = shard.event(
        [envelope("a", 1, 1), envelope("b", 3, 1), envelope("a", 1, 2), envelope("b", 3, 2)]
    )
    assert consumer.handle(event) == {"batchItemFailures": []}
    assert summary(caplog) == (
        "batch of 4: applied 4 (late 0), skipped 0, early 0, malformed 0, "
        "gaps 0 (0 seqs jumped over)"
    )
    a = messages(ddb, output, "a")
    assert sorted(a) == [(0, 1), (0, 2)]
    assert a[(0, 2)] == {
        "connection_id": {"S": "a"},
        "item": {"S": message_item_key(0, 2)},
        "epoch": {"N": "1"},
        "seq_gen": {"N": "0"},
        "seq": {"N": "2"},
        "received_at_ms": {"N": str(NOW + 2)},
        "payload": {"S": '{"price":2}'},
        "kinesis_sequence_number": {"S": numbers(event)[2]},
        "written_at_ms": {"N": str(NOW)},
    }
    assert (tally(ddb, output, "a"), tally(ddb, output, "b")) == (2, 2)


def test_a_redelivery_after_a_crash_and_the_functions_own_retry_write_nothing_twice(
    ddb, tables, consumer, caplog
):
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    dedup, output = tables
    shard = Shard()
    first = shard.event([envelope("a", 1, s) for s in range(1, 9)])
    assert consumer.handle(first) == {"batchItemFailures": []}
    assert summary(caplog).startswith("batch of 8: applied 8 (late 0),")
    # the worker died; its successor (epoch 2) resumed from the checkpoint at 4
    replay = shard.event([envelope("a", 2, s) for s in range(5, 11)])
    assert consumer.handle(replay) == {"batchItemFailures": []}
    assert summary(caplog).startswith("batch of 6: applied 2 (late 0), skipped 4, early 0,")
    # Lambda gives the same batch again (as after a timeout)
    assert consumer.handle(replay) == {"batchItemFailures": []}
    assert summary(caplog).startswith("batch of 6: applied 0 (late 0), skipped 6,")
    written = messages(ddb, output, "a")
    assert sorted(written) == [(0, s) for s in range(1, 11)]
    assert {s: int(i["epoch"]["N"]) for (_, s), i in written.items()} == {
        **dict.fromkeys(range(1, 9), 1),
        9: 2,
        10: 2,
    }
    assert tally(ddb, output, "a") == 10
    assert Deduper(ddb, dedup).stored("a") == Position(2, 0, 10)


def test_a_superseded_owners_late_record_is_written_once(ddb, tables, consumer, caplog):
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    _, output = tables
    shard = Shard()
    consumer.handle(shard.event([envelope("a", 2, s) for s in range(1, 7)]))
    caplog.clear()
    late = shard.event([envelope("a", 1, 6), envelope("a", 1, 7), envelope("a", 2, 7)])
    assert consumer.handle(late) == {"batchItemFailures": []}
    assert summary(caplog).startswith("batch of 3: applied 1 (late 0), skipped 2, early 0,")
    # the old owner's copy came first: it is the one written (a copy is a copy)
    assert messages(ddb, output, "a")[(0, 7)]["epoch"] == {"N": "1"}
    assert tally(ddb, output, "a") == 7


def test_a_restart_on_a_new_stream_is_written_beside_the_old_one(ddb, tables, consumer):
    _, output = tables
    shard = Shard()
    event = shard.event([envelope("a", 1, 50, seq_gen=1), envelope("a", 2, 1, seq_gen=2)])
    assert consumer.handle(event) == {"batchItemFailures": []}
    assert sorted(messages(ddb, output, "a")) == [(1, 50), (2, 1)]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (None, "an envelope is UTF-8"),  # base64 of bytes that are not UTF-8
        (b"not json", "not JSON"),
        (b'{"connection_id": "a", "epoch": 1}', "missing: seq_gen, seq, received_at, payload"),
        (
            b'{"connection_id":"no spaces!","epoch":1,"seq_gen":0,"seq":1,'
            b'"received_at":1,"payload":1}',
            "connection_id must be",
        ),
        ("not base64 !", "Only base64 data is allowed"),  # the record's data field itself
    ],
)
def test_a_record_that_is_no_envelope_is_logged_and_passed_over(
    ddb, tables, consumer, caplog, data, why
):
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    _, output = tables
    shard = Shard()
    middle = data if isinstance(data, bytes) else b"\xff\xfe"
    event = shard.event([envelope("a", 1, 1), middle, envelope("a", 1, 2)])
    if isinstance(data, str):
        event["Records"][1]["kinesis"]["data"] = data
    bad = numbers(event)[1]
    assert consumer.handle(event) == {"batchItemFailures": []}
    (logged,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert logged.getMessage().startswith(f"record {bad} is no envelope, passed over: ")
    assert why in logged.getMessage()
    assert summary(caplog).startswith(
        "batch of 3: applied 2 (late 0), skipped 0, early 0, malformed 1,"
    )
    assert sorted(messages(ddb, output, "a")) == [(0, 1), (0, 2)]


def test_a_passed_over_seq_shows_as_a_gap_on_the_next_message(ddb, tables, consumer, caplog):
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    shard = Shard()
    event = shard.event([envelope("a", 1, 1), envelope("a", 1, 4)])
    assert consumer.handle(event) == {"batchItemFailures": []}
    assert f"a: seq_gen 0 seq 4 jumped over 2 seqs (record {numbers(event)[1]})" in (
        caplog.messages
    )
    assert summary(caplog).endswith("gaps 1 (2 seqs jumped over)")


def test_an_early_record_of_the_sink_writes_nothing_and_its_copy_is_written_in_order(
    ddb, tables, consumer, caplog
):
    """A partly refused PutRecords: 4 written, 3 refused; the sink sends 3 and 4 again.
    The early 4 names 3, not yet written, as the message before it."""
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    _, output = tables
    shard = Shard()
    sent = [(1, None), (2, 1), (4, 3), (3, 2), (4, 3), (5, 4)]
    event = shard.event([envelope("a", 1, s, prev_seq=p) for s, p in sent])
    assert consumer.handle(event) == {"batchItemFailures": []}
    assert summary(caplog) == (
        "batch of 6: applied 5 (late 0), skipped 0, early 1, malformed 0, "
        "gaps 0 (0 seqs jumped over)"
    )
    written = messages(ddb, output, "a")
    assert sorted(written) == [(0, s) for s in range(1, 6)]
    # 4 was written from its copy, after 3
    assert written[(0, 4)]["kinesis_sequence_number"] == {"S": numbers(event)[4]}
    assert written[(0, 3)]["kinesis_sequence_number"] == {"S": numbers(event)[3]}
    assert tally(ddb, output, "a") == 5


def test_a_seq_an_older_sink_landed_after_a_higher_one_is_written_once_when_it_comes(
    ddb, tables, consumer, caplog
):
    """As above, from a worker that writes no prev_seq: 4 is applied with a gap, 3 late."""
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    _, output = tables
    shard = Shard()
    event = shard.event([envelope("a", 1, s) for s in (1, 2, 4, 3, 4, 5)])
    assert consumer.handle(event) == {"batchItemFailures": []}
    assert summary(caplog) == (
        "batch of 6: applied 5 (late 1), skipped 1, early 0, malformed 0, "
        "gaps 1 (1 seqs jumped over)"
    )
    written = messages(ddb, output, "a")
    assert sorted(written) == [(0, s) for s in range(1, 6)]
    # each item holds the record that wrote it: 4 the early one, not its copy
    assert written[(0, 4)]["kinesis_sequence_number"] == {"S": numbers(event)[2]}
    assert tally(ddb, output, "a") == 5


class FailingOn:
    """The client, except that transactions fail as throttled while ``failing``."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.failing = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transact_write_items(self, **kwargs: Any) -> Any:
        own = kwargs["TransactItems"][0]["Update"]
        if self.failing and own["ExpressionAttributeValues"][":seq"] == {"N": "3"}:
            raise ClientError(
                {"Error": {"Code": "ThrottlingException", "Message": "slow down"}},
                "TransactWriteItems",
            )
        return self._client.transact_write_items(**kwargs)


def test_a_failing_record_is_reported_and_nothing_after_it_is_tried(ddb, tables, caplog):
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    dedup, output = tables
    client = FailingOn(ddb)
    consumer = KinesisConsumer(Deduper(client, dedup), output, clock_ms=lambda: NOW)
    shard = Shard()
    event = shard.event(
        [envelope("a", 1, 1), envelope("a", 1, 2), envelope("a", 1, 3), envelope("a", 1, 4)]
    )
    third, fourth = numbers(event)[2:]
    # both reported: Lambda resumes from the lowest, the one that failed
    assert consumer.handle(event) == {
        "batchItemFailures": [{"itemIdentifier": third}, {"itemIdentifier": fourth}]
    }
    assert f"record {third} failed: it and every later record come again" in caplog.messages
    # seq 4 was not tried: only the failed record logs a failure
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"record {third} failed: it and every later record come again"
    ]
    assert summary(caplog).endswith(f"gaps 0 (0 seqs jumped over), failed at {third}")
    # Seq 4 was not applied ahead of 3: 3 would have become a copy, and been lost.
    assert sorted(messages(ddb, output, "a")) == [(0, 1), (0, 2)]
    # Lambda gives the batch again from the failed record
    client.failing = False
    retry = {"Records": event["Records"][2:]}
    assert consumer.handle(retry) == {"batchItemFailures": []}
    assert sorted(messages(ddb, output, "a")) == [(0, s) for s in range(1, 5)]
    assert tally(ddb, output, "a") == 4


def test_an_item_dynamodb_refuses_fails_its_record(ddb, tables, consumer):
    """A payload too large for an item fails on every try: after the retries Lambda
    passes it over to the failure destination (the construct's)."""
    _, output = tables
    shard = Shard()
    event = shard.event(
        [envelope("a", 1, 1), envelope("a", 1, 2, payload="x" * 420_000), envelope("a", 1, 3)]
    )
    assert consumer.handle(event) == {
        "batchItemFailures": [{"itemIdentifier": n} for n in numbers(event)[1:]]
    }
    assert sorted(messages(ddb, output, "a")) == [(0, 1)]


def test_a_batch_whose_first_record_fails_is_answered_not_raised(ddb, tables, caplog):
    """Every record reported failed is still a partial batch response: an error of the
    whole invocation would be retried (and bisected) as a whole."""
    caplog.set_level(logging.INFO, logger=consumer_module.__name__)
    dedup, output = tables
    client = FailingOn(ddb)
    consumer = KinesisConsumer(Deduper(client, dedup), output, clock_ms=lambda: NOW)
    event = Shard().event([envelope("a", 1, 3), envelope("a", 1, 4)])
    first = numbers(event)[0]
    assert consumer.handle(event) == {
        "batchItemFailures": [{"itemIdentifier": n} for n in numbers(event)]
    }
    assert summary(caplog) == (
        "batch of 2: applied 0 (late 0), skipped 0, early 0, malformed 0, "
        f"gaps 0 (0 seqs jumped over), failed at {first}"
    )
    assert messages(ddb, output, "a") == {}


def test_each_batch_is_reported_on_its_own(ddb, tables, caplog):
    """The processor is kept across invocations: a failure does not carry over."""
    dedup, output = tables
    client = FailingOn(ddb)
    consumer = KinesisConsumer(Deduper(client, dedup), output, clock_ms=lambda: NOW)
    shard = Shard()
    failed = shard.event([envelope("a", 1, 1), envelope("a", 1, 2), envelope("a", 1, 3)])
    assert consumer.handle(failed)["batchItemFailures"] == [{"itemIdentifier": numbers(failed)[2]}]
    client.failing = False
    assert consumer.handle({"Records": failed["Records"][2:]}) == {"batchItemFailures": []}
    assert consumer.handle(shard.event([envelope("a", 1, 4)])) == {"batchItemFailures": []}
    assert sorted(messages(ddb, output, "a")) == [(0, s) for s in range(1, 5)]


def test_the_lambda_entry_point_reads_its_tables_from_the_environment(
    ddb, tables, dynamodb_endpoint, monkeypatch
):
    dedup, output = tables
    monkeypatch.setenv("DEDUP_TABLE", dedup)
    monkeypatch.setenv("OUTPUT_TABLE", output)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamodb_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    consumer_module.consumer.cache_clear()
    try:
        event = Shard().event([envelope("a", 1, 1)])
        assert consumer_module.handler(event, object()) == {"batchItemFailures": []}
    finally:
        consumer_module.consumer.cache_clear()
    assert sorted(messages(ddb, output, "a")) == [(0, 1)]


def test_the_function_imports_nothing_but_wsfleet_and_what_the_runtime_and_layer_have(
    tmp_path,
):
    """What the asset holds (handler.py and wsfleet/), alone on the path, as in Lambda,
    with what the runtime (boto3) and the Powertools layer (Powertools and its
    dependencies) provide."""
    shutil.copy2(EXAMPLE / "handler.py", tmp_path / "handler.py")
    shutil.copytree(
        Path(__file__).resolve().parents[2] / "wsfleet",
        tmp_path / "wsfleet",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    probe = (
        "import sys, json; sys.path.insert(0, '.'); before = set(sys.modules); "
        "import handler; "
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert {"handler", "wsfleet", "boto3", "botocore", "aws_lambda_powertools"} <= loaded
    # certifi: botocore takes it where it is installed, and its own bundle where not
    runtime = {"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six"}
    layer = {"aws_lambda_powertools", "typing_extensions"}
    # __mp_main__: the name multiprocessing gives __main__ when imported
    others = loaded - set(sys.stdlib_module_names) - {"handler", "wsfleet", "__mp_main__"}
    # nothing of this project's other packages (worker, websocket_fleet, ...), no CDK
    assert others <= runtime | layer | {"certifi"}
