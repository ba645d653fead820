"""A message that can never be sent costs only itself (S5), and a throttled sink makes
progress at the rate the destination grants, never sending again what landed (S6):
the real sink classes against fake services, the throttle in virtual time."""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

import pytest

from tests.unit.test_sinks import (
    NOW_MS,
    FakeFirehose,
    FakeKinesis,
    FakeSqs,
    Sleeps,
    deliveries,
    firehose_sink,
    kinesis_sink,
    sqs_sink,
)
from worker.delivery import Delivery
from worker.sinks import kinesis, set_aside
from worker.sinks.sending import SetAsideNotice, SinkSendError
from worker.sinks.settings import SinkSettings
from wsfleet.envelope import Envelope, SetAside

SINKS = ["kinesis", "firehose", "sqs_fifo"]


def make(kind: str) -> tuple[Any, Any]:
    """A sink of ``kind`` and its fake service; the envelopes written are read back
    with :func:`written`."""
    if kind == "kinesis":
        client: Any = FakeKinesis()
        return kinesis_sink(client, Sleeps()), client
    if kind == "firehose":
        client = FakeFirehose()
        return firehose_sink(client, Sleeps()), client
    client = FakeSqs()
    return sqs_sink(client, Sleeps()), client


def written(client: Any) -> list[Envelope]:
    return [e if isinstance(e, Envelope) else Envelope.from_bytes(e) for e in client.written]


def with_payload(seq: int, payload: Any) -> Delivery:
    return Delivery("c-1", 7, seq, payload, "w-1", seq_gen=2)


@pytest.mark.parametrize("kind", SINKS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"price": float("1e999")}])
async def test_s5_a_payload_that_is_not_json_is_set_aside_and_the_batch_goes_on(kind, bad):
    """S5: NaN, Infinity or 1e999 pass the worker's decoder but not the envelope
    writer: every call failed, the connection stopped for good (or, skipped, took the
    good messages of the batch with it)."""
    sink, client = make(kind)
    batch = deliveries(3)
    batch[1] = with_payload(2, {"nested": [bad]})
    await sink.handle_batch(batch)
    got = written(client)
    assert [e.seq for e in got] == [1, 2, 3]
    marker = got[1]
    assert marker.payload is None
    assert marker.set_aside is not None
    assert marker.set_aside.reason == "not_json"
    # nothing of it is lost: its text, as Python's JSON writer gives it
    assert marker.set_aside.text is not None
    assert ("NaN" in marker.set_aside.text) or ("Infinity" in marker.set_aside.text)
    assert [e.payload for e in (got[0], got[2])] == [{"seq": 1}, {"seq": 3}]


@pytest.mark.parametrize(
    ("kind", "limit"), [("kinesis", 1 << 20), ("firehose", 1000 << 10), ("sqs_fifo", 256 << 10)]
)
async def test_s5_a_message_over_the_services_limit_is_set_aside_and_the_batch_goes_on(kind, limit):
    """S5: a record over the limit failed every call (SQS takes 256 KiB while the
    worker reads messages of up to 1 MiB)."""
    sink, client = make(kind)
    batch = deliveries(3)
    batch[1] = with_payload(2, "x" * limit)
    await sink.handle_batch(batch)
    got = written(client)
    assert [e.seq for e in got] == [1, 2, 3]
    assert got[1].set_aside is not None
    assert got[1].set_aside.reason == "too_large"
    assert got[1].set_aside.bytes > limit
    assert got[1].set_aside.text is None  # it would not fit either


async def test_s5_an_entry_sqs_refuses_for_good_is_set_aside_and_the_batch_goes_on():
    client = FakeSqs(
        lambda call, e: "InvalidMessageContents" if e.seq == 2 and e.set_aside is None else None,
        sender_fault=True,
    )
    await sqs_sink(client, Sleeps()).handle_batch(deliveries(3))
    got = written(client)
    assert [e.seq for e in got] == [1, 3, 2, 3]  # from the refused one on, in order
    assert got[2].set_aside is not None
    assert got[2].set_aside.reason == "refused"
    assert "InvalidMessageContents" in got[2].set_aside.detail


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class ThrottledShard:
    """PutRecords against a shard that takes ``rate`` records a second (a token
    bucket of one second's worth, in virtual time): the records of a request are
    taken in order while tokens last, the rest refused. Each request takes 50 ms."""

    def __init__(self, clock: VirtualClock, rate: float) -> None:
        self.clock = clock
        self.rate = rate
        self.tokens = rate
        self.at = 0.0
        self.writes: list[Envelope] = []

    def put_records(self, **kwargs: Any) -> Mapping[str, Any]:
        self.clock.now += 0.05
        self.tokens = min(self.rate, self.tokens + (self.clock.now - self.at) * self.rate)
        self.at = self.clock.now
        answers: list[dict[str, str]] = []
        for r in kwargs["Records"]:
            if self.tokens >= 1:
                self.tokens -= 1
                self.writes.append(Envelope.from_bytes(r["Data"]))
                answers.append({"SequenceNumber": "1", "ShardId": "shardId-000000000000"})
            else:
                answers.append(
                    {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "-"}
                )
        failed = sum(1 for a in answers if "ErrorCode" in a)
        return {"FailedRecordCount": failed, "Records": answers}


async def test_s6_a_sustained_throttle_lets_a_batch_through_at_the_rate_granted():
    """S6: 500 records against a shard share of 100 records/s. The call gave up after
    SINK_MAX_ATTEMPTS, the worker sent the whole batch again, rewriting its prefix,
    and no call ever finished. Here the worker's retry is played as it is made
    (``HANDLER_ERRORS=retry``: the same batch again after a pause) for ten virtual
    minutes at most."""
    clock = VirtualClock()
    shard = ThrottledShard(clock, rate=100)
    sink = kinesis.KinesisSink(
        shard, SinkSettings("stream-1"), clock_ms=lambda: NOW_MS, rng=lambda: 1.0, sleep=clock.sleep
    )
    batch = deliveries(500)
    done = False
    while not done and clock.now < 600:
        try:
            await sink.handle_batch(batch)
            done = True
        except SinkSendError:
            clock.now += 1.0  # the worker's backoff
    assert done, f"{len(shard.writes)} writes, {len({e.seq for e in shard.writes})} distinct"
    # the throttle takes a prefix of each request: nothing landed is sent again
    assert sorted(e.seq for e in shard.writes) == list(range(1, 501))
    # and the rate granted is used: 500 records at 100/s (one second's tokens at the
    # start) in well under twice the ideal 4 s
    assert clock.now < 8


async def test_s6_a_batch_sent_again_after_a_failed_call_leaves_out_what_landed_in_order():
    """The worker sends a failed call's batch again whole; what landed in order (1, 2)
    is not written again, what landed ahead of the refused one (4) is."""
    refusals = {"left": 2}

    def refuse(call: int, envelope: Envelope) -> str | None:
        if envelope.seq == 3 and refusals["left"]:
            refusals["left"] -= 1
            return "KMSAccessDeniedException"
        return None

    client = FakeKinesis(refuse)
    sink = kinesis_sink(client, Sleeps(), attempts=2)
    with pytest.raises(SinkSendError, match="seqs 4 landed ahead of a refused one"):
        await sink.handle_batch(deliveries(4))
    await sink.handle_batch(deliveries(4))
    assert [[e.seq for e in r] for r in client.requests] == [[1, 2, 3, 4], [3, 4], [3, 4]]
    assert [(e.seq, e.prev_seq) for e in client.requests[2]] == [(3, None), (4, 3)]
    # and a later batch of the connection is sent whole
    await sink.handle_batch(deliveries(2, first=5))
    assert [e.seq for e in client.requests[3]] == [5, 6]


async def test_s5_a_set_aside_message_is_reported_once_it_landed_with_its_seqs_and_an_excerpt():
    notices: list[SetAsideNotice] = []
    client = FakeKinesis()
    sink = kinesis.KinesisSink(
        client, SinkSettings("stream-1"), clock_ms=lambda: NOW_MS, report=notices.append
    )
    batch = deliveries(2)
    batch[1] = with_payload(2, {"price": math.nan})
    await sink.handle_batch(batch)
    assert [(n.service, n.destination, n.envelope.seq) for n in notices] == [
        ("Kinesis", "stream-1", 2)
    ]
    assert notices[0].excerpt == "{'price': nan}"


def test_the_production_report_logs_the_message_and_counts_it(caplog, monkeypatch):
    monkeypatch.setenv("METRICS_NAMESPACE", "Fleet")
    monkeypatch.setenv("SERVICE_NAME", "quotes")
    marker = Envelope(
        "c-1", 7, 2, 5, NOW_MS, None, set_aside=SetAside("too_large", "over", 300_000)
    )
    out = io.StringIO()
    with caplog.at_level(logging.ERROR, logger="worker.sinks.set_aside"):
        set_aside.report(SetAsideNotice("SQS", "q.fifo", marker, "'xxxx'"), out=out)
    document = json.loads(out.getvalue())
    assert document["SinkMessagesSetAside"] == 1
    assert document["Service"] == "quotes"
    assert document["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Fleet"
    assert document["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Service"]]
    (record,) = caplog.records
    assert (record.connection_id, record.seq_gen, record.seq) == ("c-1", 2, 5)  # type: ignore[attr-defined]
    assert (record.reason, record.bytes, record.payload_excerpt) == ("too_large", 300_000, "'xxxx'")  # type: ignore[attr-defined]
