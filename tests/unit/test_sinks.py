"""The built-in sinks against fake clients: what the real services do rarely or never
locally (refuse some records of a request), records over the size limits, the
stamp, and the factories' settings. The same sinks against moto's services are in
tests/integration/test_sinks.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from worker.delivery import Delivery, load_handler
from worker.plugins import PluginError
from worker.sinks import firehose, kinesis, sqs_fifo
from worker.sinks.batch_rules import deduplication_id
from worker.sinks.sending import BACKOFF_INITIAL, BACKOFF_MAXIMUM, SinkSendError
from worker.sinks.settings import DEFAULT_MAX_ATTEMPTS, SinkConfigError, SinkSettings
from wsfleet.envelope import Envelope

NOW_MS = 1_767_225_604_100


def deliveries(count: int, connection_id: str = "c-1", *, first: int = 1) -> list[Delivery]:
    return [
        Delivery(connection_id, 7, seq, {"seq": seq}, "w-1", seq_gen=2)
        for seq in range(first, first + count)
    ]


class Clock:
    """A wall clock that moves one second at each read."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return NOW_MS + 1000 * (self.reads - 1)


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


Refuse = Callable[[int, Envelope], str | None]
"""Given the request's number (1-based) and an entry's envelope: an error code to
refuse it with, or None to take it."""


def takes_all(call: int, envelope: Envelope) -> str | None:
    return None


class FakeKinesis:
    def __init__(self, refuse: Refuse = takes_all) -> None:
        self.refuse = refuse
        self.requests: list[list[Envelope]] = []
        self.written: list[Envelope] = []
        self.kwargs: list[dict[str, Any]] = []

    def put_records(self, **kwargs: Any) -> Mapping[str, Any]:
        records = kwargs.pop("Records")
        self.kwargs.append(kwargs)
        envelopes = [Envelope.from_bytes(r["Data"]) for r in records]
        assert all(
            r["PartitionKey"] == e.connection_id for r, e in zip(records, envelopes, strict=True)
        )
        self.requests.append(envelopes)
        answers = []
        for envelope in envelopes:
            code = self.refuse(len(self.requests), envelope)
            if code:
                answers.append({"ErrorCode": code, "ErrorMessage": "Rate exceeded for shard"})
            else:
                self.written.append(envelope)
                answers.append({"SequenceNumber": "1", "ShardId": "shardId-000000000000"})
        failed = sum(1 for a in answers if "ErrorCode" in a)
        return {"FailedRecordCount": failed, "Records": answers}


class FakeFirehose:
    def __init__(self, refuse: Refuse = takes_all) -> None:
        self.refuse = refuse
        self.requests: list[list[Envelope]] = []
        self.written: list[bytes] = []

    def put_record_batch(self, **kwargs: Any) -> Mapping[str, Any]:
        assert kwargs["DeliveryStreamName"] == "to-s3"
        records = kwargs["Records"]
        assert all(r["Data"].endswith(b"\n") and r["Data"].count(b"\n") == 1 for r in records)
        envelopes = [Envelope.from_bytes(r["Data"]) for r in records]
        self.requests.append(envelopes)
        answers = []
        for record, envelope in zip(records, envelopes, strict=True):
            code = self.refuse(len(self.requests), envelope)
            if code:
                answers.append({"ErrorCode": code, "ErrorMessage": "try again"})
            else:
                self.written.append(record["Data"])
                answers.append({"RecordId": "r"})
        failed = sum(1 for a in answers if "ErrorCode" in a)
        return {"FailedPutCount": failed, "Encrypted": False, "RequestResponses": answers}


class FakeSqs:
    def __init__(self, refuse: Refuse = takes_all, *, sender_fault: bool = False) -> None:
        self.refuse = refuse
        self.sender_fault = sender_fault
        self.requests: list[list[dict[str, Any]]] = []
        self.written: list[Envelope] = []

    def send_message_batch(self, **kwargs: Any) -> Mapping[str, Any]:
        assert kwargs["QueueUrl"] == QUEUE_URL
        entries = kwargs["Entries"]
        assert len({e["Id"] for e in entries}) == len(entries)
        self.requests.append(entries)
        successful, failed = [], []
        for entry in entries:
            envelope = Envelope.from_bytes(entry["MessageBody"].encode())
            code = self.refuse(len(self.requests), envelope)
            if code:
                failed.append(
                    {
                        "Id": entry["Id"],
                        "SenderFault": self.sender_fault,
                        "Code": code,
                        "Message": "no",
                    }
                )
            else:
                self.written.append(envelope)
                successful.append({"Id": entry["Id"], "MessageId": "m"})
        return {"Successful": successful, "Failed": failed}


QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/messages.fifo"


def kinesis_sink(client: Any, sleeps: Sleeps, clock: Clock | None = None, attempts: int = 5):
    settings = SinkSettings("stream-1", max_attempts=attempts)
    return kinesis.KinesisSink(
        client, settings, clock_ms=clock or Clock(), rng=lambda: 1.0, sleep=sleeps
    )


def last_copies(written: list[Envelope]) -> list[int]:
    """Seqs in the order of their last copy in the stream."""
    last = {e.seq: i for i, e in enumerate(written)}
    return sorted(last, key=last.__getitem__)


def refuse_once(*seqs: int) -> Refuse:
    """Refuse each of ``seqs`` in the first request that carries it."""
    refused: set[int] = set()

    def refuse(call: int, envelope: Envelope) -> str | None:
        if envelope.seq in seqs and envelope.seq not in refused:
            refused.add(envelope.seq)
            return "ProvisionedThroughputExceededException"
        return None

    return refuse


async def test_kinesis_envelopes_carry_the_delivery_and_one_stamp_per_batch():
    client, sleeps, clock = FakeKinesis(), Sleeps(), Clock()
    sink = kinesis_sink(client, sleeps, clock)
    await sink.handle_batch(deliveries(3))
    await sink.handle_batch(deliveries(2, first=4))
    assert clock.reads == 2
    assert [(e.connection_id, e.epoch, e.seq_gen, e.seq, e.payload) for e in client.written] == [
        ("c-1", 7, 2, seq, {"seq": seq}) for seq in range(1, 6)
    ]
    assert [e.received_at_ms for e in client.written] == [NOW_MS] * 3 + [NOW_MS + 1000] * 2
    assert client.kwargs == [{"StreamName": "stream-1"}] * 2
    assert sleeps.delays == []


async def test_kinesis_envelopes_name_the_seq_sent_before_them_in_the_call():
    client, sleeps = FakeKinesis(refuse_once(2)), Sleeps()
    sink = kinesis_sink(client, sleeps)
    await sink.handle_batch(deliveries(3))
    await sink.handle_batch(deliveries(2, first=4))
    # the copies sent again are the same envelopes: 3 names 2 both times
    assert [(e.seq, e.prev_seq) for e in client.written] == [
        (1, None), (3, 2), (2, 1), (3, 2), (4, None), (5, 4),
    ]  # fmt: skip


@pytest.mark.parametrize("sink", ["kinesis", "firehose"])
async def test_a_batch_of_several_connections_names_each_ones_own_previous_seq(sink):
    batch = [
        Delivery("a", 1, 5, None, "w", seq_gen=0),
        Delivery("b", 1, 9, None, "w", seq_gen=0),
        Delivery("a", 1, 6, None, "w", seq_gen=0),
        Delivery("a", 1, 1, None, "w", seq_gen=1),  # a new stream starts afresh
        Delivery("a", 1, 2, None, "w", seq_gen=1),
        Delivery("b", 1, 9, None, "w", seq_gen=0),  # not above the one before: none
    ]
    if sink == "kinesis":
        kinesis_client = FakeKinesis()
        await kinesis_sink(kinesis_client, Sleeps()).handle_batch(batch)
        written = kinesis_client.written
    else:
        firehose_client = FakeFirehose()
        await firehose_sink(firehose_client, Sleeps()).handle_batch(batch)
        written = [Envelope.from_bytes(line) for line in firehose_client.written]
    assert [e.prev_seq for e in written] == [None, None, 5, None, 1, None]


async def test_kinesis_names_a_stream_given_by_arn_by_its_arn():
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/stream-1"
    client = FakeKinesis()
    sink = kinesis.KinesisSink(client, SinkSettings(arn), sleep=Sleeps())
    await sink.handle_batch(deliveries(1))
    assert client.kwargs == [{"StreamARN": arn}]


async def test_kinesis_sends_again_from_the_first_refused_record_of_the_connection():
    client, sleeps = FakeKinesis(refuse_once(2, 4)), Sleeps()
    await kinesis_sink(client, sleeps).handle_batch(deliveries(5))
    # 3 of 5 taken: the next request carries 3 (what the destination took), then 6
    assert [[e.seq for e in r] for r in client.requests] == [[1, 2, 3, 4, 5], [2, 3, 4], [5]]
    assert [e.seq for e in client.written] == [1, 3, 5, 2, 3, 4, 5]
    assert last_copies(client.written) == [1, 2, 3, 4, 5]
    assert sleeps.delays == [BACKOFF_INITIAL]  # rng 1.0: the full first delay


async def test_kinesis_sends_again_only_the_connections_with_a_refused_record():
    client, sleeps = FakeKinesis(refuse_once(2)), Sleeps()
    mixed = [
        d
        for pair in zip(deliveries(3, "a"), deliveries(3, "b", first=11), strict=True)
        for d in pair
    ]
    await kinesis_sink(client, sleeps).handle_batch(mixed)
    again = client.requests[1]
    assert [(e.connection_id, e.seq) for e in again] == [("a", 2), ("a", 3)]


async def test_kinesis_requests_keep_to_500_records_and_what_is_sent_again_goes_first():
    def refuse(call: int, envelope: Envelope) -> str | None:
        return "InternalFailure" if call == 1 and envelope.seq == 500 else None

    client, sleeps = FakeKinesis(refuse), Sleeps()
    await kinesis_sink(client, sleeps).handle_batch(deliveries(1100))
    sizes = [len(r) for r in client.requests]
    assert sizes == [500, 499, 102]  # 499 taken: the window is 499, then twice that
    assert [e.seq for e in client.requests[1]][:2] == [500, 501]
    assert last_copies(client.written) == list(range(1, 1101))


async def test_kinesis_requests_keep_to_5_mib_counting_the_partition_keys():
    # Ten records of 512 KiB - 60 bytes of data would fit in 5 MiB; with their
    # partition keys of 100 bytes they do not.
    key = "k" * 100
    overhead = len(Envelope(key, 1, 0, 10, NOW_MS, "", prev_seq=10).to_bytes())
    filler = "x" * (512 * 1024 - 60 - overhead)
    batch = [Delivery(key, 1, seq, filler, "w") for seq in range(11, 21)]
    client = FakeKinesis()
    await kinesis_sink(client, Sleeps()).handle_batch(batch)
    assert [len(r) for r in client.requests] == [9, 1]
    # the first has no prev_seq
    first = 512 * 1024 - 60 - len(',"prev_seq":10')
    assert [len(e.to_bytes()) for e in client.written] == [first] + [512 * 1024 - 60] * 9


async def test_kinesis_gives_up_after_the_last_attempt_naming_the_message():
    def refuse(call: int, envelope: Envelope) -> str | None:
        return "KMSAccessDeniedException" if envelope.seq == 3 else None

    client, sleeps = FakeKinesis(refuse), Sleeps()
    with pytest.raises(SinkSendError) as caught:
        await kinesis_sink(client, sleeps, attempts=4).handle_batch(deliveries(4))
    assert len(client.requests) == 4
    assert str(caught.value) == (
        "Kinesis stream-1 refused message 3 (seq_gen 2) of connection c-1 at send 4 of at "
        "most 4: KMSAccessDeniedException: Rate exceeded for shard "
        "(1 refused in that request); seqs 4 landed ahead of a refused one: a consumer "
        "holds them back until the batch is sent again (skipped, they are lost with it)"
    )
    assert sleeps.delays == [0.1, 0.2, 0.4]  # wsfleet.backoff, rng 1.0
    assert max(sleeps.delays) <= BACKOFF_MAXIMUM


async def test_a_kinesis_record_of_exactly_1_mib_with_its_key_is_sent():
    envelope_size = len(Envelope("c-1", 7, 2, 1, NOW_MS, "").to_bytes())
    exact = "x" * ((1 << 20) - envelope_size - len("c-1"))
    client = FakeKinesis()
    await kinesis_sink(client, Sleeps()).handle_batch([Delivery("c-1", 7, 1, exact, "w", 2)])
    assert len(client.written) == 1
    over = Delivery("c-1", 7, 2, exact + "x", "w", 2)
    await kinesis_sink(client, Sleeps()).handle_batch([over])
    assert client.written[1].set_aside is not None
    assert client.written[1].set_aside.bytes == (1 << 20) + 1


def firehose_sink(client: Any, sleeps: Sleeps, attempts: int = 5) -> firehose.FirehoseSink:
    settings = SinkSettings("to-s3", max_attempts=attempts)
    return firehose.FirehoseSink(client, settings, clock_ms=Clock(), rng=lambda: 1.0, sleep=sleeps)


async def test_firehose_sends_again_from_the_first_refused_record_of_the_connection():
    client, sleeps = FakeFirehose(refuse_once(2)), Sleeps()
    await firehose_sink(client, sleeps).handle_batch(deliveries(3))
    assert [[e.seq for e in r] for r in client.requests] == [[1, 2, 3], [2, 3]]
    written = [Envelope.from_bytes(line) for line in client.written]
    assert [(e.seq, e.prev_seq) for e in written] == [(1, None), (3, 2), (2, 1), (3, 2)]
    assert sleeps.delays == [BACKOFF_INITIAL]


async def test_firehose_gives_up_after_the_last_attempt():
    client, sleeps = FakeFirehose(lambda call, e: "KMSAccessDeniedException"), Sleeps()
    with pytest.raises(SinkSendError, match=r"Firehose to-s3 refused message 1 .* at send 2 of"):
        await firehose_sink(client, sleeps, attempts=2).handle_batch(deliveries(2))
    assert len(client.requests) == 2


async def test_firehose_refuses_a_record_over_1000_kib_counting_its_newline():
    envelope_size = len(Envelope("c-1", 7, 2, 1, NOW_MS, "").to_bytes())
    exact = "x" * (1000 * 1024 - envelope_size - 1)
    client = FakeFirehose()
    await firehose_sink(client, Sleeps()).handle_batch([Delivery("c-1", 7, 1, exact, "w", 2)])
    assert len(client.written[0]) == 1000 * 1024
    await firehose_sink(client, Sleeps()).handle_batch([Delivery("c-1", 7, 2, exact + "x", "w", 2)])
    marker = Envelope.from_bytes(client.written[1])
    assert marker.set_aside is not None
    assert "1,024,001 bytes as a Firehose record" in marker.set_aside.detail


def sqs_sink(client: Any, sleeps: Sleeps, attempts: int = 5) -> sqs_fifo.SqsFifoSink:
    settings = SinkSettings(QUEUE_URL, max_attempts=attempts)
    return sqs_fifo.SqsFifoSink(client, settings, clock_ms=Clock(), rng=lambda: 1.0, sleep=sleeps)


async def test_sqs_sends_again_from_the_first_refused_entry_of_the_connection():
    client, sleeps = FakeSqs(refuse_once(2)), Sleeps()
    await sqs_sink(client, sleeps).handle_batch(deliveries(15))
    seqs = [
        [Envelope.from_bytes(e["MessageBody"].encode()).seq for e in r] for r in client.requests
    ]
    # 9 of 10 taken: the next request carries 9, then as many as the limit allows
    assert seqs == [list(range(1, 11)), list(range(2, 11)), list(range(11, 16))]
    assert sleeps.delays == [BACKOFF_INITIAL]
    # the early copies name the seq before them, so a consumer waits for the later copy
    assert [(e.seq, e.prev_seq) for e in client.written[:3]] == [(1, None), (3, 2), (4, 3)]
    first = client.requests[0][0]
    assert first["MessageGroupId"] == "c-1"
    # each request its own deduplication ids: the later copy of 3 is not dropped
    token = f"{1.0:.17f}"
    assert first["MessageDeduplicationId"] == deduplication_id("c-1", 2, 1, f"{token}.1")
    again = client.requests[1][1]
    assert again["MessageDeduplicationId"] == deduplication_id("c-1", 2, 3, f"{token}.2")


async def test_sqs_sets_aside_a_message_over_256_kib():
    envelope_size = len(Envelope("c-1", 7, 2, 1, NOW_MS, "").to_bytes())
    exact = "x" * (256 * 1024 - envelope_size)
    client = FakeSqs()
    await sqs_sink(client, Sleeps()).handle_batch([Delivery("c-1", 7, 1, exact, "w", 2)])
    await sqs_sink(client, Sleeps()).handle_batch([Delivery("c-1", 7, 2, exact + "x", "w", 2)])
    assert client.written[1].set_aside is not None
    assert "262,145 bytes as a SQS record" in client.written[1].set_aside.detail


async def test_sqs_bodies_escape_the_two_characters_sqs_refuses():
    client = FakeSqs()
    payload = "fine: é; not: \ufffe \uffff"
    await sqs_sink(client, Sleeps()).handle_batch([Delivery("c-1", 7, 1, payload, "w", 2)])
    body = client.requests[0][0]["MessageBody"]
    assert body.isascii()
    assert client.written[0].payload == payload
    await sqs_sink(client, Sleeps()).handle_batch([Delivery("c-1", 7, 2, "é", "w", 2)])
    assert "é" in client.requests[1][0]["MessageBody"]  # other text as itself


@pytest.mark.parametrize(
    ("spec", "env", "message"),
    [
        ("kinesis", {}, "SINK_STREAM_NAME is required by the kinesis sink"),
        ("kinesis", {"SINK_STREAM_NAME": "a b"}, "SINK_STREAM_NAME must be a Kinesis stream"),
        ("firehose", {}, "SINK_DELIVERY_STREAM is required by the firehose sink"),
        ("firehose", {"SINK_DELIVERY_STREAM": "x" * 65}, "SINK_DELIVERY_STREAM must be a Firehose"),
        ("sqs_fifo", {}, "SINK_QUEUE_URL is required by the sqs_fifo sink"),
        (
            "sqs_fifo",
            {"SINK_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/1/messages"},
            "SINK_QUEUE_URL must be the URL of a FIFO queue",
        ),
        (
            "sqs_fifo",
            {"SINK_QUEUE_URL": "messages.fifo"},
            "SINK_QUEUE_URL must be an SQS queue URL",
        ),
        (
            "kinesis",
            {"SINK_STREAM_NAME": "s", "SINK_MAX_ATTEMPTS": "many"},
            "SINK_MAX_ATTEMPTS must be an integer, got 'many'",
        ),
        (
            "kinesis",
            {"SINK_STREAM_NAME": "s", "SINK_MAX_ATTEMPTS": "0"},
            "SINK_MAX_ATTEMPTS must be from 1 to 20, got 0",
        ),
    ],
)
def test_a_factory_with_a_missing_or_bad_setting_says_which(monkeypatch, spec, env, message):
    for name in ("SINK_STREAM_NAME", "SINK_DELIVERY_STREAM", "SINK_QUEUE_URL", "SINK_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SinkConfigError, match=message):
        load_handler(f"worker.sinks.{spec}:factory")
    # The worker reports a plug-in's error and exits with status 2 (worker.__main__).
    assert issubclass(SinkConfigError, PluginError)


@pytest.mark.parametrize(
    ("spec", "variable", "value", "kind", "service", "endpoint"),
    [
        ("kinesis", "SINK_STREAM_NAME", "s-1", kinesis.KinesisSink, "kinesis", "KINESIS"),
        ("firehose", "SINK_DELIVERY_STREAM", "f-1", firehose.FirehoseSink, "firehose", "FIREHOSE"),
        ("sqs_fifo", "SINK_QUEUE_URL", QUEUE_URL, sqs_fifo.SqsFifoSink, "sqs", "SQS"),
    ],
)
def test_a_factory_makes_its_sink_with_a_client_of_boto3s_endpoint(
    monkeypatch, spec, variable, value, kind, service, endpoint
):
    monkeypatch.setenv(variable, value)
    monkeypatch.delenv("SINK_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv(f"AWS_ENDPOINT_URL_{endpoint}", "http://127.0.0.1:4599")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    sink = load_handler(f"worker.sinks.{spec}:factory")
    assert type(sink) is kind
    assert sink._settings == SinkSettings(value, max_attempts=DEFAULT_MAX_ATTEMPTS)
    client = sink._client
    assert client.meta.service_model.service_name == service
    assert client.meta.endpoint_url == "http://127.0.0.1:4599"
    assert client.meta.region_name == "eu-west-1"
    assert sink._executor is not None  # its own threads, not the worker's
    sink._executor.shutdown()


async def test_what_a_consumer_reads_is_the_envelope_json_of_the_delivery():
    client = FakeKinesis()
    await kinesis_sink(client, Sleeps()).handle_batch(deliveries(2))
    assert [json.loads(e.to_bytes()) for e in client.written] == [
        {
            "connection_id": "c-1",
            "epoch": 7,
            "seq_gen": 2,
            "seq": 1,
            "received_at": NOW_MS,
            "payload": {"seq": 1},
        },
        {
            "connection_id": "c-1",
            "epoch": 7,
            "seq_gen": 2,
            "seq": 2,
            "prev_seq": 1,
            "received_at": NOW_MS,
            "payload": {"seq": 2},
        },
    ]
