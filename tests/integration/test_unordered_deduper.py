"""The deduper's unordered mode against DynamoDB Local: Firehose objects in S3 read in
any order (S3), copies from two owners and whole-batch repeats, two consumers racing,
effects in the same transaction, the item it writes and the table's TTL."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import unique_name
from wsfleet.deduper import (
    EXPIRES_AT,
    PARTITION_KEY,
    RETENTION_SECONDS,
    ContendedError,
    Decision,
    Deduper,
    DedupStateError,
    EffectFailedError,
    Outcome,
    Position,
    create_dedup_table,
    message_id,
)
from wsfleet.envelope import Envelope, EnvelopeError

NOW = 1_767_225_600_000
APPLY, SKIP = Decision.APPLY, Decision.SKIP

Key = tuple[str, int, int]


@pytest.fixture
def dedup_table(ddb: Any) -> Iterator[str]:
    name = unique_name("dedup")
    create_dedup_table(ddb, name)
    yield name
    ddb.delete_table(TableName=name)


def sink_call(cid: str, epoch: int, seqs: Sequence[int], *, seq_gen: int = 0) -> list[Envelope]:
    """The envelopes of one sink call, as the sinks write them: each but the first
    names the seq sent before it in the call."""
    envelopes = []
    before: int | None = None
    for seq in seqs:
        envelopes.append(Envelope(cid, epoch, seq_gen, seq, NOW + seq, {"n": seq}, before))
        before = seq
    return envelopes


def resend(envelopes: Sequence[Envelope]) -> list[Envelope]:
    """The same envelopes written again, as a sink's retry of refused records does."""
    return list(envelopes)


def applied_keys(decide: Callable[[Envelope], Outcome], reads: Sequence[Envelope]) -> Counter[Key]:
    return Counter(e.key for e in reads if decide(e).decision is APPLY)


@dataclass(frozen=True)
class Scenario:
    name: str
    objects: list[list[Envelope]]
    """The S3 objects Firehose wrote, in the order it wrote them."""
    read: list[int]
    """The order a consumer reads them in (indexes into ``objects``)."""
    lost_when_ordered: set[int]
    """Seqs the ordered deduper never applies for that read order."""


def scenarios(cid: str) -> list[Scenario]:
    first, second = sink_call(cid, 1, [1, 2, 3]), sink_call(cid, 1, [4, 5, 6])
    before = sink_call(cid, 1, range(1, 11))
    batch = sink_call(cid, 1, [11, 12, 13])
    new_batch = sink_call(cid, 2, [11, 12, 13, 14])
    return [
        Scenario(
            # Two adjacent objects of a connection's first messages, the later read
            # first: nothing stored shows no gap, so 1-3 look like copies.
            "adjacent objects swapped",
            [first, second],
            [1, 0],
            {1, 2, 3},
        ),
        Scenario(
            # One PutRecordBatch wrote 11 and 13 and refused 12; the resend of 12 and
            # 13 went into the next object, which is read first: both are early then,
            # and their copies were read already.
            "a partly refused request split over two objects",
            [before, [batch[0], batch[2]], resend(batch[1:])],
            [0, 2, 1],
            {12, 13},
        ),
        Scenario(
            # Epoch 1 wrote 11-13 and lost its lease before its checkpoint; epoch 2
            # resumed from 10, its first request refused 12 and 14. The new owner's
            # objects are read swapped, the old owner's last.
            "after a failover, the old owner's copies read after the new owner's",
            [
                before,
                batch,
                [new_batch[0], new_batch[2]],
                resend(new_batch[1:]),
            ],
            [0, 3, 2, 1],
            {14},
        ),
    ]


@pytest.mark.parametrize("index", range(3), ids=["swapped", "split-request", "failover"])
def test_s3_objects_read_out_of_order_lose_messages_ordered_and_none_unordered(
    ddb, dedup_table, index
):
    """S3: Firehose's objects are not read in the order they were written. The ordered
    deduper's rules take a later object's records as the stream's order and lose
    messages; the unordered mode applies every message once, in every read order."""
    cid = f"s3-{uuid.uuid4().hex[:8]}"
    scenario = scenarios(cid)[index]
    sent = {e.key for o in scenario.objects for e in o}
    reads = [e for i in scenario.read for e in scenario.objects[i]]

    ordered = applied_keys(Deduper(ddb, dedup_table).decide, reads)
    assert all(n == 1 for n in ordered.values())
    assert {seq for (_, _, seq) in sent - set(ordered)} == scenario.lost_when_ordered

    # Every read order of the objects, each on a connection of its own (the same
    # table: per-message items never meet the ordered mode's per-connection ones).
    for order in itertools.permutations(range(len(scenario.objects))):
        other = f"{cid}-{''.join(map(str, order))}"
        objects = [[_moved(e, other) for e in o] for o in scenario.objects]
        reads = [e for i in order for e in objects[i]]
        unordered = Deduper(ddb, dedup_table, ordered=False)
        assert applied_keys(unordered.decide, reads) == Counter(
            {key: 1 for key in {e.key for e in reads}}
        ), order


def _moved(envelope: Envelope, cid: str) -> Envelope:
    return Envelope(
        cid,
        envelope.epoch,
        envelope.seq_gen,
        envelope.seq,
        envelope.received_at_ms,
        envelope.payload,
        envelope.prev_seq,
    )


def fresh_cid(prefix: str = "c") -> str:
    """A connection of its own for each case: the table is shared."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def env(cid: str, epoch: int, seq: int, *, seq_gen: int = 0, prev: int | None = None) -> Envelope:
    return Envelope(cid, epoch, seq_gen, seq, NOW + seq, {"n": seq}, prev_seq=prev)


@pytest.fixture
def unordered(ddb: Any, dedup_table: str) -> Deduper:
    return Deduper(ddb, dedup_table, ordered=False, clock_ms=lambda: NOW)


@pytest.fixture
def effects_table(ddb: Any) -> Iterator[str]:
    """Where the tests' effects go: ``pk`` (S) and a ``writes`` counter per item, so a
    repeated effect shows as 2."""
    name = unique_name("effects")
    ddb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    )
    yield name
    ddb.delete_table(TableName=name)


def count_once(table: str, envelope: Envelope) -> dict[str, Any]:
    """An effect that is not idempotent: one more write counted on the message's item."""
    return {
        "Update": {
            "TableName": table,
            "Key": {"pk": {"S": "/".join(map(str, envelope.key))}},
            "UpdateExpression": "ADD #writes :one",
            "ExpressionAttributeNames": {"#writes": "writes"},
            "ExpressionAttributeValues": {":one": {"N": "1"}},
        }
    }


def writes(ddb: Any, table: str) -> dict[str, int]:
    """Every effect item and how many times it was written."""
    items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
    return {i["pk"]["S"]: int(i["writes"]["N"]) for i in items}


def once_each(keys: set[Key]) -> dict[str, int]:
    return {"/".join(map(str, k)): 1 for k in keys}


def raw_item(ddb: Any, table: str, envelope: Envelope) -> dict[str, Any] | None:
    key = {PARTITION_KEY: {"S": message_id(envelope.connection_id, envelope.seq_gen, envelope.seq)}}
    got: dict[str, Any] | None = ddb.get_item(TableName=table, Key=key, ConsistentRead=True).get(
        "Item"
    )
    return got


# --- any read order, copies from two owners, whole-batch repeats ---------------------------


def mixed_objects(cid: str) -> list[list[Envelope]]:
    """Epoch 1's first call 1-3 was partly refused (2): the resend of 2 and 3 shares an
    object with the next call, 4 and 5, which the worker sent again whole after the
    sink failed; epoch 2 took over from the checkpoint at 3 and wrote 4-7."""
    first, second = sink_call(cid, 1, [1, 2, 3]), sink_call(cid, 1, [4, 5])
    return [
        [first[0], first[2]],
        [*first[1:], *second],
        resend(second),
        sink_call(cid, 2, [4, 5, 6, 7]),
    ]


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_every_read_order_of_the_objects_applies_each_message_once(
    ddb, dedup_table, effects_table, method
):
    deduper = Deduper(ddb, dedup_table, ordered=False)
    cid = fresh_cid()
    objects = mixed_objects(cid)
    sent = {e.key for o in objects for e in o}
    assert {seq for (_, _, seq) in sent} == set(range(1, 8))
    for order in itertools.permutations(range(len(objects))):
        other = f"{cid}-{''.join(map(str, order))}"
        reads = [_moved(e, other) for i in order for e in objects[i]]
        if method == "decide":
            outcomes = [deduper.decide(e) for e in reads]
        else:
            outcomes = [deduper.transact(e, [count_once(effects_table, e)]) for e in reads]
        applied = Counter(
            e.key for e, o in zip(reads, outcomes, strict=True) if o.decision is APPLY
        )
        assert applied == Counter({key: 1 for key in {e.key for e in reads}}), order
        assert all(o.decision in (APPLY, SKIP) and o.gap == 0 and not o.late for o in outcomes)
    if method == "transact":
        expected = {
            f"{cid}-{''.join(map(str, order))}/0/{seq}": 1
            for order in itertools.permutations(range(len(objects)))
            for seq in range(1, 8)
        }
        assert writes(ddb, effects_table) == expected


@st.composite
def firehose_records(draw: st.DrawFn) -> tuple[list[Envelope], set[Key]]:
    """What Firehose delivers for one or two connections: epoch 1's sink calls, each
    maybe partly refused (written, then sent again from the first refused record on)
    and maybe sent again whole by the worker; then maybe a failover, epoch 2 resuming
    from a checkpoint at a call boundary, or on a new ``seq_gen`` (a stream that cannot
    resume). The records, and the messages they hold."""
    records: list[Envelope] = []
    for index in range(draw(st.integers(1, 2))):
        cid = f"c{index}"
        seq, boundaries = 0, [0]
        for size in draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)):
            records += delivered(draw, sink_call(cid, 1, range(seq + 1, seq + size + 1)))
            seq += size
            boundaries.append(seq)
        match draw(st.sampled_from(["none", "resume", "new stream"])):
            case "resume":
                checkpoint = draw(st.sampled_from(boundaries))
                end = seq + draw(st.integers(0, 3))
                records += delivered(draw, sink_call(cid, 2, range(checkpoint + 1, end + 1)))
            case "new stream":
                count = draw(st.integers(1, 4))
                records += delivered(draw, sink_call(cid, 2, range(1, count + 1), seq_gen=1))
    return records, {e.key for e in records}


def delivered(draw: st.DrawFn, call: list[Envelope]) -> list[Envelope]:
    """What one sink call leaves in Firehose: the records the first request wrote, the
    resend from the first refused one on, and maybe the whole call again."""
    if not call:
        return []
    written = [e for e in call if draw(st.booleans())]
    refused = [i for i, e in enumerate(call) if e not in written]
    records = written + (call[refused[0] :] if refused else [])
    if draw(st.booleans()):  # the worker sent the batch again whole
        records += call
    return records


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(drawn=firehose_records(), data=st.data())
def test_any_shuffle_of_the_records_applies_each_message_once(ddb, dedup_table, drawn, data):
    records, sent = drawn
    prefix = fresh_cid("h")  # each example on connections of its own
    shuffled = [
        _moved(e, f"{prefix}-{e.connection_id}") for e in data.draw(st.permutations(records))
    ]
    deduper = Deduper(ddb, dedup_table, ordered=False)
    applied = Counter(e.key for e in shuffled if deduper.decide(e).decision is APPLY)
    assert applied == Counter({(f"{prefix}-{c}", g, s): 1 for (c, g, s) in sent})


# --- two consumers at once ---------------------------------------------------------------

ROUNDS = 12


def race(calls: list[Callable[[], Outcome]]) -> list[Outcome]:
    """Run the calls on threads released together by a barrier; their outcomes."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Outcome | BaseException | None] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait(timeout=10)
        try:
            outcomes[index] = calls[index]()
        except BaseException as error:
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [o for o in outcomes if isinstance(o, Outcome)]


def test_two_consumers_deciding_on_one_envelope_apply_it_once(ddb, dedup_table):
    first, second = (Deduper(ddb, dedup_table, ordered=False) for _ in range(2))
    cid = fresh_cid()
    for seq in range(1, ROUNDS + 1):
        envelope = env(cid, 1, seq)
        outcomes = race([partial(first.decide, envelope), partial(second.decide, envelope)])
        assert sorted(o.decision.value for o in outcomes) == ["apply", "skip"], seq


def test_two_consumers_transacting_one_envelope_make_its_effect_once(
    ddb, dedup_table, effects_table
):
    first, second = (Deduper(ddb, dedup_table, ordered=False) for _ in range(2))
    cid = fresh_cid()
    for seq in range(1, ROUNDS + 1):
        envelope = env(cid, 1, seq)
        effects = [count_once(effects_table, envelope)]
        outcomes = race(
            [
                partial(first.transact, envelope, effects),
                partial(second.transact, envelope, effects),
            ]
        )
        assert sorted(o.decision.value for o in outcomes) == ["apply", "skip"], seq
    assert writes(ddb, effects_table) == once_each({(cid, 0, s) for s in range(1, ROUNDS + 1)})


def test_an_old_and_a_new_owners_copies_racing_apply_each_message_once(ddb, dedup_table):
    old, new = (Deduper(ddb, dedup_table, ordered=False) for _ in range(2))
    cid = fresh_cid()
    for seq in range(1, ROUNDS + 1):
        outcomes = race(
            [partial(old.decide, env(cid, 1, seq)), partial(new.decide, env(cid, 2, seq))]
        )
        by_epoch = dict(zip((1, 2), outcomes, strict=True))
        winners = [epoch for epoch, o in by_epoch.items() if o.decision is APPLY]
        assert len(winners) == 1, (seq, outcomes)
        # the other is a copy, and says whose copy was applied
        loser = 3 - winners[0]
        assert by_epoch[loser] == Outcome(SKIP, stored=Position(winners[0], 0, seq))


# --- transactions --------------------------------------------------------------------------


def test_transact_writes_the_effects_once_and_a_copy_writes_nothing(ddb, effects_table, unordered):
    cid = fresh_cid()
    for envelope in [env(cid, 1, 2), env(cid, 1, 1), env(cid, 2, 2), env(cid, 1, 1)]:
        unordered.transact(envelope, [count_once(effects_table, envelope)])
    assert writes(ddb, effects_table) == once_each({(cid, 0, 1), (cid, 0, 2)})
    copy = env(cid, 2, 1)
    assert unordered.transact(copy, [count_once(effects_table, copy)]) == Outcome(
        SKIP, stored=Position(1, 0, 1)
    )
    assert writes(ddb, effects_table) == once_each({(cid, 0, 1), (cid, 0, 2)})


def test_an_effect_that_fails_its_condition_writes_nothing(ddb, dedup_table, effects_table):
    deduper = Deduper(ddb, dedup_table, ordered=False)
    envelope = env(fresh_cid(), 1, 1)
    effect = count_once(effects_table, envelope)
    effect["Update"]["ConditionExpression"] = "attribute_exists(#writes)"
    with pytest.raises(EffectFailedError, match="effect 0: ConditionalCheckFailed") as failed:
        deduper.transact(envelope, [effect])
    assert [r["Code"] for r in failed.value.reasons] == ["None", "ConditionalCheckFailed"]
    assert raw_item(ddb, dedup_table, envelope) is None
    assert writes(ddb, effects_table) == {}
    # nothing was decided: the message applies when it comes again
    assert deduper.transact(envelope, [count_once(effects_table, envelope)]) == Outcome(APPLY)
    assert writes(ddb, effects_table) == once_each({envelope.key})


class Conflicting:
    """The client, except that its first ``conflicts`` writes of the dedup table are
    refused as DynamoDB refuses them while a transaction holds the item."""

    def __init__(self, client: Any, conflicts: int) -> None:
        self._client = client
        self.left = conflicts
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _conflict(self) -> bool:
        if self.left == 0:
            return False
        self.left -= 1
        self.refused += 1
        return True

    def transact_write_items(self, **kwargs: Any) -> Any:
        if self._conflict():
            raise ClientError(
                {
                    "Error": {"Code": "TransactionCanceledException", "Message": "conflict"},
                    "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
                },
                "TransactWriteItems",
            )
        return self._client.transact_write_items(**kwargs)

    def put_item(self, **kwargs: Any) -> Any:
        if self._conflict():
            raise ClientError(
                {"Error": {"Code": "TransactionConflictException", "Message": "conflict"}},
                "PutItem",
            )
        return self._client.put_item(**kwargs)


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_a_conflict_is_tried_again_after_a_pause(ddb, dedup_table, effects_table, method):
    pauses: list[float] = []
    client: Any = Conflicting(ddb, conflicts=1)
    deduper = Deduper(client, dedup_table, ordered=False, sleep=pauses.append, rng=lambda: 1.0)
    envelope = env(fresh_cid(), 1, 1)
    if method == "decide":
        assert deduper.decide(envelope) == Outcome(APPLY)
    else:
        effects = [count_once(effects_table, envelope)]
        assert deduper.transact(envelope, effects) == Outcome(APPLY)
        assert writes(ddb, effects_table) == once_each({envelope.key})
    assert (client.refused, pauses) == (1, [0.02])


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_after_its_attempts_a_contended_decision_gives_up_having_written_nothing(
    ddb, dedup_table, effects_table, method
):
    client: Any = Conflicting(ddb, conflicts=3)
    deduper = Deduper(client, dedup_table, ordered=False, max_attempts=3, sleep=lambda _: None)
    envelope = env(fresh_cid(), 1, 1)
    call = partial(deduper.transact, envelope, [count_once(effects_table, envelope)])
    if method == "decide":
        call = partial(deduper.decide, envelope)
    with pytest.raises(ContendedError, match="lost 3 times"):
        call()
    assert client.refused == 3
    assert raw_item(ddb, dedup_table, envelope) is None
    assert writes(ddb, effects_table) == {}


def test_effects_are_checked_before_anything_is_written(ddb, dedup_table, effects_table):
    deduper = Deduper(ddb, dedup_table, ordered=False)
    envelope = env(fresh_cid(), 1, 1)
    own = {"Put": {"TableName": dedup_table, "Item": {PARTITION_KEY: {"S": "x"}}}}
    with pytest.raises(ValueError, match="effect 1 writes to the dedup table"):
        deduper.transact(envelope, [count_once(effects_table, envelope), own])
    assert raw_item(ddb, dedup_table, envelope) is None


# --- preview, the item, the retention ------------------------------------------------------


def test_preview_then_effect_then_decide_repeats_the_effect_never_loses_it(
    ddb, dedup_table, unordered
):
    envelope = env(fresh_cid(), 3, 5)
    assert unordered.preview(envelope) == Outcome(APPLY)
    # ...an idempotent effect, then the process dies before decide; it comes again:
    assert unordered.preview(envelope) == Outcome(APPLY)
    assert raw_item(ddb, dedup_table, envelope) is None  # preview writes nothing
    assert unordered.decide(envelope) == Outcome(APPLY)
    copy = env(envelope.connection_id, 4, 5)
    assert unordered.preview(copy) == Outcome(SKIP, stored=Position(3, 0, 5))
    assert unordered.decide(copy) == Outcome(SKIP, stored=Position(3, 0, 5))


def test_the_item_of_a_message_and_its_expiry(ddb, dedup_table):
    deduper = Deduper(ddb, dedup_table, ordered=False, clock_ms=lambda: NOW + 1)
    envelope = env(fresh_cid(), 2, 7, seq_gen=3)
    assert deduper.decide(envelope) == Outcome(APPLY)
    assert raw_item(ddb, dedup_table, envelope) == {
        PARTITION_KEY: {"S": f"{envelope.connection_id}#3#7"},
        "epoch": {"N": "2"},
        "received_at_ms": {"N": str(NOW + 7)},
        "applied_at_ms": {"N": str(NOW + 1)},
        # the applied time rounded up to a second, plus 14 days
        EXPIRES_AT: {"N": str(NOW // 1000 + 1 + RETENTION_SECONDS)},
    }
    assert RETENTION_SECONDS == 14 * 24 * 3600


def test_the_retention_is_chosen_and_a_copy_after_its_item_is_gone_applies_again(ddb, dedup_table):
    deduper = Deduper(ddb, dedup_table, ordered=False, retention_seconds=3600, clock_ms=lambda: NOW)
    envelope = env(fresh_cid(), 1, 1)
    assert deduper.decide(envelope) == Outcome(APPLY)
    item = raw_item(ddb, dedup_table, envelope)
    assert item is not None
    assert item[EXPIRES_AT] == {"N": str(NOW // 1000 + 3600)}
    # TTL deletes the item some time after it expires; a copy read after that is new
    ddb.delete_item(TableName=dedup_table, Key={PARTITION_KEY: item[PARTITION_KEY]})
    assert deduper.decide(envelope) == Outcome(APPLY)


def test_the_table_has_ttl_on_expires_at_and_creating_it_again_keeps_it(ddb, dedup_table):
    described = ddb.describe_time_to_live(TableName=dedup_table)["TimeToLiveDescription"]
    assert (described["TimeToLiveStatus"], described["AttributeName"]) == ("ENABLED", EXPIRES_AT)
    deduper = Deduper(ddb, dedup_table, ordered=False)
    envelope = env(fresh_cid(), 1, 1)
    assert deduper.decide(envelope) == Outcome(APPLY)
    create_dedup_table(ddb, dedup_table)  # TTL already on: nothing to do
    assert deduper.decide(envelope).decision is SKIP
    described = ddb.describe_time_to_live(TableName=dedup_table)["TimeToLiveDescription"]
    assert described["TimeToLiveStatus"] == "ENABLED"


def test_an_existing_table_gets_ttl_and_one_with_ttl_on_another_attribute_is_refused(ddb):
    names = [unique_name("dedup-old"), unique_name("dedup-other-ttl")]
    for name in names:
        ddb.create_table(
            TableName=name,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": PARTITION_KEY, "AttributeType": "S"}],
            KeySchema=[{"AttributeName": PARTITION_KEY, "KeyType": "HASH"}],
        )
    without_ttl, other_ttl = names
    ddb.update_time_to_live(
        TableName=other_ttl,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"},
    )
    try:
        create_dedup_table(ddb, without_ttl)
        described = ddb.describe_time_to_live(TableName=without_ttl)["TimeToLiveDescription"]
        assert (described["TimeToLiveStatus"], described["AttributeName"]) == (
            "ENABLED", EXPIRES_AT,
        )  # fmt: skip
        with pytest.raises(ValueError, match="has TTL on 'gone_at', not 'expires_at'"):
            create_dedup_table(ddb, other_ttl)
    finally:
        for name in names:
            ddb.delete_table(TableName=name)


def test_both_modes_share_a_table_without_meeting(ddb, dedup_table):
    ordered = Deduper(ddb, dedup_table)
    unordered = Deduper(ddb, dedup_table, ordered=False)
    cid = fresh_cid()
    assert ordered.decide(env(cid, 1, 1)) == Outcome(APPLY)
    assert unordered.decide(env(cid, 1, 1)) == Outcome(APPLY)
    assert unordered.decide(env(cid, 1, 2)) == Outcome(APPLY)
    assert ordered.stored(cid) == Position(1, 0, 1)
    assert ordered.decide(env(cid, 1, 2)) == Outcome(APPLY)


def test_an_unordered_deduper_keeps_no_position(unordered):
    with pytest.raises(ValueError, match="keeps no position"):
        unordered.stored("any")


@pytest.mark.parametrize(
    ("envelope", "match"),
    [
        (Envelope("not valid!", 1, 0, 1, NOW, None), "connection_id"),
        (Envelope("has#hash", 1, 0, 1, NOW, None), "connection_id"),
        (Envelope("c", -1, 0, 1, NOW, None), "epoch"),
        (Envelope("c", 1, 0, 10**38, NOW, None), "seq"),
    ],
)
@pytest.mark.parametrize("method", ["decide", "transact", "preview"])
def test_a_malformed_envelope_is_refused_before_any_write(
    ddb, dedup_table, effects_table, unordered, envelope, match, method
):
    call = partial(getattr(unordered, method), envelope)
    if method == "transact":
        call = partial(unordered.transact, envelope, [count_once(effects_table, env("c", 1, 1))])
    with pytest.raises(EnvelopeError, match=match):
        call()
    assert ddb.scan(TableName=dedup_table, ConsistentRead=True)["Items"] == []
    assert writes(ddb, effects_table) == {}


@pytest.mark.parametrize("method", ["decide", "transact", "preview"])
def test_a_stored_item_that_is_no_copy_stops_the_decision(ddb, dedup_table, unordered, method):
    envelope = env(fresh_cid(), 1, 1)
    key = message_id(envelope.connection_id, 0, 1)
    ddb.put_item(TableName=dedup_table, Item={PARTITION_KEY: {"S": key}, "epoch": {"S": "1"}})
    with pytest.raises(DedupStateError, match="epoch must be a whole number"):
        getattr(unordered, method)(envelope, *([[]] if method == "transact" else []))


def test_the_retention_must_be_positive(ddb, dedup_table):
    with pytest.raises(ValueError, match="retention_seconds >= 1"):
        Deduper(ddb, dedup_table, ordered=False, retention_seconds=0)
