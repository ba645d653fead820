"""The local sink consumer against moto's Kinesis and DynamoDB Local: every shard
read, each message applied once and in order whatever copies and stale records the
stream carries, and ``python -m local_stack.sink_consumer`` as the local stack runs
it (its lines, its drain on SIGTERM, its exit status)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local_stack import services
from local_stack.fleet import CLIENT_CONFIG
from local_stack.process_env import Endpoints
from local_stack.sink import consumer_env, create_stream
from local_stack.sink_consumer import Applied, EnvelopeApplier, StreamReader, drain
from tests.conftest import unique_name
from tests.support.timing import scaled
from wsfleet.deduper import Deduper, create_dedup_table
from wsfleet.envelope import Envelope

NOW_MS = 1_767_225_604_100


def envelope(cid: str, seq: int, *, epoch: int = 1) -> bytes:
    return Envelope(cid, epoch, 0, seq, NOW_MS, {"seq": seq}).to_bytes()


@pytest.fixture
def kinesis(moto_endpoint: str) -> Iterator[Any]:
    client = services.local_client("kinesis", moto_endpoint, config=CLIENT_CONFIG)
    yield client
    client.close()


@pytest.fixture
def stream(kinesis: Any) -> Iterator[str]:
    name = unique_name("envelopes")
    create_stream(kinesis, name, shards=3)
    yield name
    kinesis.delete_stream(StreamName=name)


@pytest.fixture
def dedup_table(ddb: Any) -> Iterator[str]:
    name = unique_name("dedup")
    create_dedup_table(ddb, name)
    yield name
    ddb.delete_table(TableName=name)


def put(kinesis: Any, stream: str, records: list[tuple[str, bytes]]) -> None:
    kinesis.put_records(
        StreamName=stream, Records=[{"PartitionKey": k, "Data": d} for k, d in records]
    )


def test_each_message_is_applied_once_in_order_from_every_shard(
    kinesis: Any, stream: str, ddb: Any, dedup_table: str
) -> None:
    connections = [f"conn-{n}" for n in range(6)]
    # Epoch 1 sends 1..20; it dies after its checkpoint at 12, and epoch 2 sends 13..30
    # again from there: 13..20 are copies. Epoch 1, superseded, then lands 31 late:
    # applied (a message not applied yet, whichever owner sent it).
    first = [(c, envelope(c, s)) for s in range(1, 21) for c in connections]
    again = [(c, envelope(c, s, epoch=2)) for s in range(13, 31) for c in connections]
    stale = [(c, envelope(c, 31)) for c in connections]
    put(kinesis, stream, first)
    put(kinesis, stream, again)
    put(kinesis, stream, [*stale, ("conn-0", b"not an envelope")])
    applied: list[Applied] = []
    applier = EnvelopeApplier(Deduper(ddb, dedup_table), applied.append)
    reader = StreamReader(kinesis, stream, limit=25)
    assert drain(reader, applier, timeout=scaled(30))
    assert len(reader.cursors) == 3
    assert len({a.shard_id for a in applied}) > 1  # the connections spread over shards
    for cid in connections:
        mine = [a.envelope for a in applied if a.envelope.connection_id == cid]
        assert [e.seq for e in mine] == list(range(1, 32)), cid
        assert {e.epoch for e in mine if 20 < e.seq <= 30} == {2}
        assert mine[-1].epoch == 1
    tally = applier.tally
    assert (tally.applied, tally.skipped, tally.malformed) == (186, 48, 1)
    # A consumer started afresh reads it all again and applies nothing twice.
    again_applied: list[Applied] = []
    fresh = EnvelopeApplier(Deduper(ddb, dedup_table), again_applied.append)
    assert drain(StreamReader(kinesis, stream), fresh, timeout=scaled(30))
    assert again_applied == []
    assert fresh.tally.skipped == 186 + 48


@pytest.mark.timeout(scaled(90))
def test_the_command_prints_a_line_per_message_and_drains_on_sigterm(
    kinesis: Any, stream: str, dynamodb_endpoint: str, moto_endpoint: str, tmp_path: Path
) -> None:
    endpoints = Endpoints(dynamodb_endpoint, moto_endpoint)
    put(kinesis, stream, [("a", envelope("a", s)) for s in range(1, 4)])
    consumer = services.start_sink_consumer(
        tmp_path,
        consumer_env(os.environ, endpoints),
        stream=stream,
        dedup_table=unique_name("dedup"),  # the command creates it
    )
    try:
        # Written after the start: read by a later pass, or by the drain at SIGTERM.
        put(kinesis, stream, [("b", envelope("b", s)) for s in range(1, 3)])
        put(kinesis, stream, [("a", envelope("a", 3))])  # a copy
        status = consumer.stop(timeout=scaled(30))
    finally:
        consumer.stop()
    output = consumer.log_path.read_text()
    assert status == 0, output
    applied = re.findall(r"^applied connection_id=(\w+) seq_gen=0 seq=(\d+) epoch=1 ", output, re.M)
    assert sorted(applied) == [("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("b", "2")]
    assert output.splitlines()[-1] == (
        "tally applied=5 skipped=1 malformed=0 late=0 gaps=0 early=0 (final)"
    ), output
