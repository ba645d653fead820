"""Histories that lost messages at the sink edge, end to end: the real sink classes
against moto's services (made to refuse records where a test says so, as the real
services do and moto never does), and a consumer that follows the documented recipe
(:class:`wsfleet.deduper.Deduper` on DynamoDB Local). Each test checks what the
README promises: every message the fleet checkpointed is applied exactly once, in seq
order where the transport keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from local_stack import services
from local_stack.fleet import CLIENT_CONFIG
from local_stack.sink import create_stream
from tests.conftest import unique_name
from tests.support.destinations import drain_fifo, read_shard
from tests.support.refusing_clients import RefusingSqs
from worker.delivery import Delivery
from worker.sinks.kinesis import KinesisSink
from worker.sinks.settings import SinkSettings
from worker.sinks.sqs_fifo import SqsFifoSink
from wsfleet.deduper import Decision, Deduper, create_dedup_table
from wsfleet.envelope import Envelope

NOW_MS = 1_767_225_604_100
CID = "conn-a"


async def no_sleep(seconds: float) -> None:
    pass


def batch(first: int, last: int, *, epoch: int, cid: str = CID, gen: int = 1) -> list[Delivery]:
    return [
        Delivery(cid, epoch, seq, {"seq": seq}, f"w-{epoch}", seq_gen=gen)
        for seq in range(first, last + 1)
    ]


@pytest.fixture
def deduper(ddb) -> Iterator[Deduper]:
    name = unique_name("dedup")
    create_dedup_table(ddb, name)
    yield Deduper(ddb, name, clock_ms=lambda: NOW_MS)
    ddb.delete_table(TableName=name)


@pytest.fixture
def fifo_queue(sqs) -> Iterator[str]:
    url: str = sqs.create_queue(
        QueueName=unique_name("messages") + ".fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    yield url
    sqs.delete_queue(QueueUrl=url)


@pytest.fixture
def kinesis(moto_endpoint: str) -> Iterator[Any]:
    client = services.local_client("kinesis", moto_endpoint, config=CLIENT_CONFIG)
    yield client
    client.close()


@pytest.fixture
def stream(kinesis: Any) -> Iterator[str]:
    name = unique_name("envelopes")
    create_stream(kinesis, name, shards=1)
    yield name
    kinesis.delete_stream(StreamName=name)


def apply_all(deduper: Deduper, envelopes: list[Envelope]) -> list[tuple[int, int]]:
    """The recipe: each envelope through ``decide``; the ``(seq_gen, seq)`` applied, in
    the order applied."""
    applied = []
    for envelope in envelopes:
        if deduper.decide(envelope).decision is Decision.APPLY:
            applied.append((envelope.seq_gen, envelope.seq))
    return applied


def seqs(first: int, last: int, gen: int = 1) -> list[tuple[int, int]]:
    return [(gen, seq) for seq in range(first, last + 1)]


async def test_s1_sqs_fifo_a_superseded_owners_late_request_loses_nothing(sqs, fifo_queue, deduper):
    """S1: the old owner (epoch 3) checkpointed 1-4; its call of 9-12 was cut at the
    fence, its thread still sending, and lands between the new owner's (epoch 4)
    requests of 5-8 and 9-12. SQS kept the old copies and dropped the new owner's as
    duplicates, and the deduper refused the old ones: 9-12 lost."""
    old = SqsFifoSink(sqs, SinkSettings(fifo_queue), clock_ms=lambda: NOW_MS)
    new = SqsFifoSink(sqs, SinkSettings(fifo_queue), clock_ms=lambda: NOW_MS)
    await old.handle_batch(batch(1, 4, epoch=3))
    await new.handle_batch(batch(5, 8, epoch=4))
    await old.handle_batch(batch(9, 12, epoch=3))  # the late request
    await new.handle_batch(batch(9, 12, epoch=4))
    applied = apply_all(deduper, drain_fifo(sqs, fifo_queue))
    assert applied == seqs(1, 12)


async def test_s4_a_stream_that_cannot_resume_keeps_a_superseded_owners_late_records(
    kinesis, stream, deduper
):
    """S4: a ``resume: none`` stream. The old owner (epoch 3) checkpointed 1-8; its cut
    call of 9-12 lands after the new owner (epoch 4), which could not resume, sent what
    the upstream sends now (20-22). Nobody else ever sends 9-12, and the deduper
    refused them as a superseded owner's: lost."""
    old = KinesisSink(kinesis, SinkSettings(stream), clock_ms=lambda: NOW_MS)
    new = KinesisSink(kinesis, SinkSettings(stream), clock_ms=lambda: NOW_MS)
    await old.handle_batch(batch(1, 8, epoch=3))
    await new.handle_batch(batch(20, 22, epoch=4))
    await old.handle_batch(batch(9, 12, epoch=3))  # the late request
    applied = apply_all(deduper, read_shard(kinesis, stream))
    # 9-12 after 20-22: late, not in seq order (the upstream's own order is lost), but
    # applied, each once.
    assert sorted(applied) == [*seqs(1, 12), *seqs(20, 22)]
    assert len(applied) == len(set(applied))


async def test_s2_sqs_fifo_a_connections_first_message_refused_is_not_lost(
    sqs, fifo_queue, deduper
):
    """S2: the first request of a connection; SQS refuses seq 1 and takes 2. Nothing is
    stored yet, so 2 was applied with no gap and 1, sent again, skipped as a copy."""
    refusing = RefusingSqs(
        sqs, lambda request, e: "InternalError" if (request, e.seq) == (1, 1) else None
    )
    sink = SqsFifoSink(refusing, SinkSettings(fifo_queue), clock_ms=lambda: NOW_MS, sleep=no_sleep)
    await sink.handle_batch(batch(1, 3, epoch=3))
    assert [e.seq for e in refusing.refused] == [1]
    assert apply_all(deduper, drain_fifo(sqs, fifo_queue)) == seqs(1, 3)
