"""The local sink consumer's stream reader against a Kinesis of its own: every shard
from its oldest record, a reshard's children after their parents, an expired iterator
or a failed record read again from after the last record handled, and the lines it
prints."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ClientError

from local_stack.sink_consumer import Applied, EnvelopeApplier, StreamReader, Tally, drain
from wsfleet.deduper import Decision, Outcome, validate
from wsfleet.envelope import Envelope, EnvelopeError


@dataclass
class FakeShard:
    shard_id: str
    parent: str | None = None
    adjacent_parent: str | None = None
    records: list[str] = field(default_factory=list)
    """Each record's data; its sequence number is its position + 1 (as text)."""
    closed: bool = False


class FakeKinesis:
    """ListShards in pages of two, iterators as ``shard:next position``; a closed
    shard read to its end gives no next iterator (``moto_style``: it gives one
    anyway, as moto does)."""

    def __init__(self, *, moto_style: bool = False) -> None:
        self.shards: dict[str, FakeShard] = {}
        self.moto_style = moto_style
        self.expire_next = False
        self.iterator_requests: list[dict[str, Any]] = []

    def add(self, shard: FakeShard) -> FakeShard:
        self.shards[shard.shard_id] = shard
        return shard

    def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        if "NextToken" in kwargs:
            assert "StreamName" not in kwargs  # the real API refuses both
            start = int(kwargs["NextToken"])
        else:
            assert kwargs["StreamName"] == "s"
            start = 0
        ids = list(self.shards)
        page = []
        for shard_id in ids[start : start + 2]:
            shard = self.shards[shard_id]
            entry: dict[str, Any] = {
                "ShardId": shard_id,
                "SequenceNumberRange": {"StartingSequenceNumber": "1"},
            }
            if shard.parent:
                entry["ParentShardId"] = shard.parent
            if shard.adjacent_parent:
                entry["AdjacentParentShardId"] = shard.adjacent_parent
            if shard.closed:
                entry["SequenceNumberRange"]["EndingSequenceNumber"] = str(len(shard.records))
            page.append(entry)
        answer: dict[str, Any] = {"Shards": page}
        if start + 2 < len(ids):
            answer["NextToken"] = str(start + 2)
        return answer

    def get_shard_iterator(self, **kwargs: Any) -> dict[str, str]:
        self.iterator_requests.append(kwargs)
        position = 0
        if kwargs["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER":
            position = int(kwargs["StartingSequenceNumber"])
        else:
            assert kwargs["ShardIteratorType"] == "TRIM_HORIZON"
        return {"ShardIterator": f"{kwargs['ShardId']}:{position}"}

    def get_records(self, *, ShardIterator: str, Limit: int) -> dict[str, Any]:  # noqa: N803
        if self.expire_next:
            self.expire_next = False
            raise ClientError(
                {"Error": {"Code": "ExpiredIteratorException", "Message": "expired"}},
                "GetRecords",
            )
        shard_id, raw = ShardIterator.split(":")
        shard = self.shards[shard_id]
        position = int(raw)
        taken = shard.records[position : position + Limit]
        after = position + len(taken)
        answer: dict[str, Any] = {
            "Records": [
                {"SequenceNumber": str(position + i + 1), "Data": data, "PartitionKey": "k"}
                for i, data in enumerate(taken)
            ],
            "MillisBehindLatest": 1000 * (len(shard.records) - after),
        }
        if not (shard.closed and after == len(shard.records)) or self.moto_style:
            answer["NextShardIterator"] = f"{shard_id}:{after}"
        return answer


class Seen:
    """A handle that records (shard, data) and can be told to fail on one record."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []
        self.fail_on: str | None = None

    def __call__(self, shard_id: str, record: Mapping[str, Any]) -> None:
        if record["Data"] == self.fail_on:
            self.fail_on = None
            raise RuntimeError("effect failed")
        self.records.append((shard_id, record["Data"]))

    @property
    def data(self) -> list[str]:
        return [data for _, data in self.records]


def reader(client: FakeKinesis, **kwargs: Any) -> StreamReader:
    return StreamReader(client, "s", relist_seconds=0.0, **kwargs)


def test_every_shard_is_read_from_its_oldest_record_across_listing_pages() -> None:
    client = FakeKinesis()
    for n in range(5):
        client.add(FakeShard(f"shard-{n}", records=[f"{n}-a", f"{n}-b"]))
    seen = Seen()
    assert drain(reader(client), seen, timeout=5.0)
    assert sorted(seen.data) == sorted(f"{n}-{x}" for n in range(5) for x in "ab")
    assert {r["ShardIteratorType"] for r in client.iterator_requests} == {"TRIM_HORIZON"}


@pytest.mark.parametrize("moto_style", [False, True])
def test_a_reshards_children_are_read_after_their_parents(moto_style: bool) -> None:
    client = FakeKinesis(moto_style=moto_style)
    client.add(FakeShard("a", records=["a1", "a2", "a3"], closed=True))
    client.add(FakeShard("b", records=["b1"], closed=True))
    # "c" is a split of "a"; "d" a merge of "a" and "b"; "c" already holds records.
    client.add(FakeShard("c", parent="a", records=["c1", "c2"]))
    client.add(FakeShard("d", parent="a", adjacent_parent="b", records=["d1"]))
    seen = Seen()
    stream = reader(client, limit=2)
    assert drain(stream, seen, timeout=5.0)
    order = seen.data
    assert sorted(order) == ["a1", "a2", "a3", "b1", "c1", "c2", "d1"]
    assert order.index("c1") > order.index("a3")
    assert order.index("d1") > max(order.index("a3"), order.index("b1"))
    assert stream.cursors["a"].finished
    assert stream.cursors["b"].finished
    assert not stream.cursors["c"].finished


def test_records_written_later_are_read_on_the_next_pass() -> None:
    client = FakeKinesis()
    shard = client.add(FakeShard("a", records=["1"]))
    seen = Seen()
    stream = reader(client)
    assert stream.read_pass(seen) == 1
    assert stream.read_pass(seen) == 0
    assert stream.caught_up
    shard.records += ["2", "3"]
    assert stream.read_pass(seen) == 2
    assert seen.data == ["1", "2", "3"]


def test_an_expired_iterator_is_replaced_after_the_last_record_handled() -> None:
    client = FakeKinesis()
    shard = client.add(FakeShard("a", records=["1", "2"]))
    seen = Seen()
    stream = reader(client)
    stream.read_pass(seen)
    shard.records.append("3")
    client.expire_next = True
    assert stream.read_pass(seen) == 0
    assert not stream.caught_up
    assert stream.read_pass(seen) == 1
    assert seen.data == ["1", "2", "3"]
    assert client.iterator_requests[-1] == {
        "StreamName": "s",
        "ShardId": "a",
        "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
        "StartingSequenceNumber": "2",
    }


def test_a_record_whose_handling_failed_is_read_again_and_nothing_after_it_is_skipped() -> None:
    client = FakeKinesis()
    client.add(FakeShard("a", records=["1", "2", "3"]))
    seen = Seen()
    seen.fail_on = "2"
    stream = reader(client)
    with pytest.raises(RuntimeError, match="effect failed"):
        stream.read_pass(seen)
    assert stream.read_pass(seen) == 2
    assert seen.data == ["1", "2", "3"]


def test_the_lines_it_prints() -> None:
    envelope = Envelope("demo-1", 3, 0, 42, 1_767_225_604_100, {"seq": 42})
    plain = Applied(envelope, Outcome(Decision.APPLY), "shardId-000000000001", "7")
    assert plain.line() == (
        "applied connection_id=demo-1 seq_gen=0 seq=42 epoch=3 shard=shardId-000000000001"
    )
    assert Applied(envelope, Outcome(Decision.APPLY, gap=2), "s", "7").line().endswith(" gap=2")
    assert Applied(envelope, Outcome(Decision.APPLY, late=True), "s", "7").line().endswith(" late")
    assert Tally(applied=5, skipped=2, early=3).line() == (
        "tally applied=5 skipped=2 malformed=0 late=0 gaps=0 early=3"
    )


class Decides:
    """A deduper that answers each envelope's seq with the outcome given for it."""

    def __init__(self, outcomes: dict[int, Outcome]) -> None:
        self.outcomes = outcomes

    def decide(self, envelope: Envelope) -> Outcome:
        return self.outcomes[envelope.seq]


def test_each_decision_is_counted_and_only_an_applied_one_has_an_effect() -> None:
    outcomes = {
        1: Outcome(Decision.APPLY),
        2: Outcome(Decision.EARLY),
        3: Outcome(Decision.SKIP),
        5: Outcome(Decision.APPLY, late=True),
    }
    effects: list[Applied] = []
    applier = EnvelopeApplier(Decides(outcomes), effects.append)  # type: ignore[arg-type]
    for seq in outcomes:
        data = Envelope("demo-1", 1, 0, seq, 1_767_225_604_100, None).to_bytes()
        applier("shardId-000000000000", {"Data": data, "SequenceNumber": str(seq)})
    assert [a.envelope.seq for a in effects] == [1, 5]
    assert applier.tally == Tally(applied=2, skipped=1, late=1, early=1)


class Validates:
    """A deduper that checks each envelope as the real one does, then applies it."""

    def decide(self, envelope: Envelope) -> Outcome:
        validate(envelope)
        return Outcome(Decision.APPLY)


def test_a_record_with_a_number_no_deduper_takes_is_malformed_and_the_stream_goes_on() -> None:
    """S9: a number of 39 digits read as an envelope but failed the deduper's check, and
    the consumer died on it (and again after every restart)."""
    effects: list[Applied] = []
    applier = EnvelopeApplier(Validates(), effects.append)  # type: ignore[arg-type]
    too_big = Envelope("demo-1", 1, 0, 10**38, 1_767_225_604_100, None).to_bytes()
    good = Envelope("demo-1", 1, 0, 2, 1_767_225_604_100, None).to_bytes()
    applier("shardId-000000000000", {"Data": too_big, "SequenceNumber": "1"})
    applier("shardId-000000000000", {"Data": good, "SequenceNumber": "2"})
    assert [a.envelope.seq for a in effects] == [2]
    assert applier.tally.malformed == 1


@pytest.mark.parametrize("name", ["epoch", "seq_gen", "seq", "received_at"])
def test_an_envelope_is_read_only_with_numbers_a_deduper_can_store(name: str) -> None:
    fields = {"connection_id": "c", "epoch": 1, "seq_gen": 0, "seq": 1, "received_at": 5}
    fields[name] = 10**38
    with pytest.raises(EnvelopeError, match=name):
        Envelope.from_bytes(json.dumps({**fields, "payload": None}).encode())
    fields[name] = 10**38 - 1
    Envelope.from_bytes(json.dumps({**fields, "payload": None}).encode())
