"""The consumer-side deduper against DynamoDB Local: the three decisions made by the
real conditional writes, a redelivery after a crash, a superseded owner, a restart on
a new stream, gaps and a sink's reorder, two consumers racing, effects in the same
transaction, and what is refused."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import unique_name
from wsfleet.deduper import (
    MAX_EFFECTS,
    PARTITION_KEY,
    ContendedError,
    Decision,
    Deduper,
    DedupStateError,
    EffectFailedError,
    Guard,
    Late,
    NextSeq,
    Outcome,
    Position,
    create_dedup_table,
    dedup_update,
    key,
)
from wsfleet.envelope import Envelope, EnvelopeError

NOW = 1_767_225_600_000
CID = "acme-quotes"
APPLY, SKIP, EARLY = Decision.APPLY, Decision.SKIP, Decision.EARLY


def env(epoch: int, seq_gen: int, seq: int, cid: str = CID, *, prev: int | None = None) -> Envelope:
    return Envelope(cid, epoch, seq_gen, seq, NOW + seq, {"n": seq}, prev_seq=prev)


@pytest.fixture
def dedup_table(ddb) -> Iterator[str]:
    name = unique_name("dedup")
    create_dedup_table(ddb, name)
    yield name
    ddb.delete_table(TableName=name)


@pytest.fixture
def effects_table(ddb) -> Iterator[str]:
    """Where the tests' effects go: ``pk`` (S), and a ``writes`` counter per item, so a
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


@pytest.fixture
def deduper(ddb, dedup_table) -> Deduper:
    return Deduper(ddb, dedup_table, clock_ms=lambda: NOW)


def count_once(table: str, envelope: Envelope) -> dict[str, Any]:
    """An effect that is not idempotent: one more write counted on the message's item."""
    return {
        "Update": {
            "TableName": table,
            "Key": {"pk": {"S": f"{envelope.connection_id}#{envelope.seq_gen}#{envelope.seq}"}},
            "UpdateExpression": "ADD #writes :one SET #epoch = :epoch",
            "ExpressionAttributeNames": {"#writes": "writes", "#epoch": "epoch"},
            "ExpressionAttributeValues": {":one": {"N": "1"}, ":epoch": {"N": str(envelope.epoch)}},
        }
    }


def writes(ddb, table: str) -> dict[str, int]:
    """Every effect item and how many times it was written."""
    items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
    return {i["pk"]["S"]: int(i["writes"]["N"]) for i in items}


def key_of(seq_gen: int, seq: int, cid: str = CID) -> str:
    return f"{cid}#{seq_gen}#{seq}"


def store(ddb, table: str, position: Position, cid: str = CID) -> None:
    item = {
        PARTITION_KEY: {"S": cid},
        "epoch": {"N": str(position.epoch)},
        "seq_gen": {"N": str(position.seq_gen)},
        "seq": {"N": str(position.seq)},
    }
    if position.late:
        item["late"] = {"NS": [str(s) for s in position.late]}
    ddb.put_item(TableName=table, Item=item)


def decisions(decide: Callable[[Envelope], Outcome], envelopes: list[Envelope]) -> list[Decision]:
    return [decide(e).decision for e in envelopes]


# --- the rules, as DynamoDB runs the conditions --------------------------------------------

STORED = Position(epoch=2, seq_gen=1, seq=8)


@pytest.mark.parametrize("method", ["decide", "transact"])
@pytest.mark.parametrize(
    ("envelope", "decision", "gap"),
    [
        (env(2, 1, 9), APPLY, 0),
        (env(3, 1, 9), APPLY, 0),
        (env(2, 1, 12), APPLY, 3),
        (env(2, 2, 1), APPLY, 0),
        (env(2, 1, 8), SKIP, 0),
        (env(3, 1, 7), SKIP, 0),
        (env(1, 1, 8), SKIP, 0),
        (env(2, 0, 100), SKIP, 0),
        (env(1, 1, 9), APPLY, 0),  # a superseded owner's message not applied yet
        (env(1, 2, 1), APPLY, 0),
    ],
)
def test_each_decision_at_its_boundary(
    ddb, dedup_table, effects_table, deduper, method, envelope, decision, gap
):
    store(ddb, dedup_table, STORED)
    if method == "decide":
        outcome = deduper.decide(envelope)
    else:
        outcome = deduper.transact(envelope, [count_once(effects_table, envelope)])
    assert (outcome.decision, outcome.gap) == (decision, gap)
    if decision is APPLY:
        assert outcome.stored is None
        awaited = frozenset(range(STORED.seq + 1, envelope.seq)) if gap else frozenset()
        assert deduper.stored(CID) == Position(
            envelope.epoch, envelope.seq_gen, envelope.seq, awaited
        )
    else:
        assert outcome.stored == STORED
        assert deduper.stored(CID) == STORED
    if method == "transact":
        expected = {key_of(envelope.seq_gen, envelope.seq): 1} if decision is APPLY else {}
        assert writes(ddb, effects_table) == expected


WITH_LATE = Position(epoch=2, seq_gen=1, seq=8, late=frozenset({5, 6}))


@pytest.mark.parametrize("method", ["decide", "transact"])
@pytest.mark.parametrize(
    ("envelope", "outcome", "after"),
    [
        (env(2, 1, 5), Outcome(APPLY, late=True), Position(2, 1, 8, frozenset({6}))),
        (env(3, 1, 6), Outcome(APPLY, late=True), Position(3, 1, 8, frozenset({5}))),
        (env(1, 1, 5), Outcome(APPLY, late=True), Position(1, 1, 8, frozenset({6}))),
        (env(2, 1, 7), Outcome(SKIP, stored=WITH_LATE), WITH_LATE),
        (env(2, 1, 10), Outcome(APPLY, gap=1), Position(2, 1, 10, frozenset({5, 6, 9}))),
        (env(2, 1, 9), Outcome(APPLY), Position(2, 1, 9, frozenset({5, 6}))),
        (env(2, 2, 1), Outcome(APPLY), Position(2, 2, 1)),
    ],
)
def test_late_seqs_at_their_boundary(
    ddb, dedup_table, effects_table, deduper, method, envelope, outcome, after
):
    store(ddb, dedup_table, WITH_LATE)
    if method == "decide":
        assert deduper.decide(envelope) == outcome
    else:
        assert deduper.transact(envelope, [count_once(effects_table, envelope)]) == outcome
        expected = {key_of(envelope.seq_gen, envelope.seq): 1} if outcome.decision is APPLY else {}
        assert writes(ddb, effects_table) == expected
    assert deduper.stored(CID) == after


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_the_first_envelope_of_a_connection_applies_and_is_stored(
    ddb, dedup_table, deduper, method
):
    outcome = (
        deduper.decide(env(1, 0, 1)) if method == "decide" else deduper.transact(env(1, 0, 1), [])
    )
    assert outcome == Outcome(APPLY)
    raw = ddb.get_item(TableName=dedup_table, Key={PARTITION_KEY: {"S": CID}})["Item"]
    assert raw == {
        PARTITION_KEY: {"S": CID},
        "epoch": {"N": "1"},
        "seq_gen": {"N": "0"},
        "seq": {"N": "1"},
        "received_at_ms": {"N": str(NOW + 1)},
        "applied_at_ms": {"N": str(NOW)},
    }
    assert deduper.stored("another-connection") is None


# --- the fleet's failure cases -------------------------------------------------------------


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_a_redelivery_after_a_crash_is_skipped_and_the_new_owner_goes_on(
    ddb, effects_table, deduper, method
):
    def run(envelope: Envelope) -> Outcome:
        if method == "decide":
            return deduper.decide(envelope)
        return deduper.transact(envelope, [count_once(effects_table, envelope)])

    assert decisions(run, [env(1, 0, s) for s in range(1, 9)]) == [APPLY] * 8
    # epoch 2 resumed from a checkpoint at 4: 5..8 come again
    assert decisions(run, [env(2, 0, s) for s in range(5, 9)]) == [SKIP] * 4
    assert deduper.stored(CID) == Position(1, 0, 8)
    assert run(env(2, 0, 9)) == Outcome(APPLY)
    assert deduper.stored(CID) == Position(2, 0, 9)
    if method == "transact":
        assert writes(ddb, effects_table) == {key_of(0, s): 1 for s in range(1, 10)}


def test_a_superseded_owners_late_message_is_applied_once_whoever_comes_first(deduper):
    assert decisions(deduper.decide, [env(1, 0, s) for s in range(1, 5)]) == [APPLY] * 4
    # the new owner resumed from 2: 3 and 4 again, then new ones
    assert decisions(deduper.decide, [env(2, 0, s) for s in (3, 4, 5, 6)]) == [
        SKIP, SKIP, APPLY, APPLY,
    ]  # fmt: skip
    # the old owner's late records: a copy is skipped, a message not yet applied is
    # applied (the new owner's copy may never come: S1)
    late_copy, late_new = deduper.decide(env(1, 0, 5)), deduper.decide(env(1, 0, 7))
    assert late_copy == Outcome(SKIP, stored=Position(2, 0, 6))
    assert late_new == Outcome(APPLY)
    assert deduper.stored(CID) == Position(1, 0, 7)
    # the new owner's copy of 7 is a copy
    assert deduper.decide(env(2, 0, 7)) == Outcome(SKIP, stored=Position(1, 0, 7))


def test_a_restart_on_a_new_stream_applies_and_the_old_stream_stays_behind(deduper):
    assert deduper.decide(env(3, 1, 50)) == Outcome(APPLY)
    assert deduper.decide(env(4, 2, 1)) == Outcome(APPLY)
    assert deduper.decide(env(3, 1, 51)) == Outcome(SKIP, stored=Position(4, 2, 1))
    assert deduper.decide(env(4, 2, 2)) == Outcome(APPLY)


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_a_gap_is_applied_and_says_how_many_seqs_are_missing(ddb, effects_table, deduper, method):
    def run(envelope: Envelope) -> Outcome:
        if method == "decide":
            return deduper.decide(envelope)
        return deduper.transact(envelope, [count_once(effects_table, envelope)])

    assert [run(env(1, 0, s)).gap for s in (1, 2, 5, 6, 7, 20)] == [0, 0, 2, 0, 0, 12]
    assert deduper.stored(CID) == Position(1, 0, 20, frozenset({3, 4, *range(8, 20)}))
    if method == "transact":  # the cancelled first tries wrote nothing
        assert writes(ddb, effects_table) == {key_of(0, s): 1 for s in (1, 2, 5, 6, 7, 20)}


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_a_sinks_reorder_loses_nothing_and_applies_each_once(ddb, effects_table, deduper, method):
    """A partly refused PutRecords: 12 and 14 were written, 11 and 13 refused; the sink
    sends again from 11 on, in order. The shard holds 12, 14, 11, 12, 13, 14, then 15."""

    def run(envelope: Envelope) -> Outcome:
        if method == "decide":
            return deduper.decide(envelope)
        return deduper.transact(envelope, [count_once(effects_table, envelope)])

    assert decisions(run, [env(1, 0, s) for s in range(1, 11)]) == [APPLY] * 10
    outcomes = [run(env(1, 0, s)) for s in (12, 14, 11, 12, 13, 14, 15)]
    assert outcomes == [
        Outcome(APPLY, gap=1),
        Outcome(APPLY, gap=1),
        Outcome(APPLY, late=True),
        Outcome(SKIP, stored=Position(1, 0, 14, frozenset({13}))),
        Outcome(APPLY, late=True),
        Outcome(SKIP, stored=Position(1, 0, 14)),
        Outcome(APPLY),
    ]
    assert deduper.stored(CID) == Position(1, 0, 15)
    if method == "transact":
        assert writes(ddb, effects_table) == {key_of(0, s): 1 for s in range(1, 16)}


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_a_partial_refusal_in_a_first_batch_applies_each_message_once_in_order(
    ddb, effects_table, deduper, method
):
    """A connection's first batch 1, 2, 3: PutRecords refused 1 and wrote 2 and 3; the
    sink sends 1, 2, 3 again. Then the batch 4, 5, 6, with 5 refused."""

    def run(envelope: Envelope) -> Outcome:
        if method == "decide":
            return deduper.decide(envelope)
        return deduper.transact(envelope, [count_once(effects_table, envelope)])

    first = [env(1, 0, 1), env(1, 0, 2, prev=1), env(1, 0, 3, prev=2)]
    second = [env(1, 0, 4), env(1, 0, 5, prev=4), env(1, 0, 6, prev=5)]
    shard = [first[1], first[2], *first, second[0], second[2], second[1], second[2]]
    outcomes = [run(e) for e in shard]
    assert outcomes[:2] == [Outcome(EARLY), Outcome(EARLY)]  # nothing stored yet
    assert [o.decision for o in outcomes[2:]] == [APPLY] * 4 + [EARLY] + [APPLY] * 2
    assert outcomes[6] == Outcome(EARLY, stored=Position(1, 0, 4))
    assert not any(o.late or o.gap for o in outcomes)
    applied_in_order = [e.seq for e, o in zip(shard, outcomes, strict=True) if o.decision is APPLY]
    assert applied_in_order == [1, 2, 3, 4, 5, 6]
    assert deduper.stored(CID) == Position(1, 0, 6)
    if method == "transact":  # an early one wrote nothing
        assert writes(ddb, effects_table) == {key_of(0, s): 1 for s in range(1, 7)}


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_an_envelope_whose_predecessor_is_awaited_is_refused_by_the_first_write(
    ddb, dedup_table, effects_table, deduper, method
):
    """The item holds 10, awaiting 9 (an older worker's gap): 11, sent after 9, is the
    next seq, and only the write's own condition on the late seqs makes it EARLY."""

    def run(envelope: Envelope) -> Outcome:
        if method == "decide":
            return deduper.decide(envelope)
        return deduper.transact(envelope, [count_once(effects_table, envelope)])

    awaiting = Position(1, 0, 10, frozenset({9}))
    store(ddb, dedup_table, awaiting)
    assert run(env(1, 0, 11, prev=9)) == Outcome(EARLY, stored=awaiting)
    assert deduper.stored(CID) == awaiting
    assert run(env(1, 0, 9, prev=8)) == Outcome(APPLY, late=True)
    assert run(env(1, 0, 11, prev=9)) == Outcome(APPLY)
    assert deduper.stored(CID) == Position(1, 0, 11)
    if method == "transact":
        assert writes(ddb, effects_table) == {key_of(0, 9): 1, key_of(0, 11): 1}


@pytest.mark.parametrize(
    ("stored", "envelope", "guard", "passes"),
    [
        (None, env(1, 0, 1), NextSeq(), True),
        (None, env(1, 0, 1, prev=0), NextSeq(), False),  # nothing stored: not applied
        (Position(1, 0, 10), env(1, 0, 11, prev=10), NextSeq(), True),
        (Position(1, 0, 10), env(1, 0, 11, prev=8), NextSeq(), True),  # no late attribute
        (Position(1, 0, 10, frozenset({7})), env(1, 0, 11, prev=8), NextSeq(), True),
        (Position(1, 0, 10, frozenset({8})), env(1, 0, 11, prev=8), NextSeq(), False),
        (Position(1, 0, 10, frozenset({8, 9})), env(1, 0, 9, prev=7), Late(), True),
        (Position(1, 0, 10, frozenset({8, 9})), env(1, 0, 9, prev=8), Late(), False),
        (Position(1, 0, 10, frozenset({9})), env(1, 0, 9, prev=8), Late(), True),
    ],
)
def test_the_predecessor_conditions_as_dynamodb_runs_them(
    ddb, dedup_table, stored, envelope, guard: Guard, passes
):
    if stored is not None:
        store(ddb, dedup_table, stored)
    update = dedup_update(envelope, NOW, guard)
    call = partial(ddb.update_item, TableName=dedup_table, Key=key(CID), **update)
    if passes:
        call()
        return
    with pytest.raises(ClientError, match="ConditionalCheckFailedException"):
        call()
    assert Deduper(ddb, dedup_table).stored(CID) == stored


def test_without_a_horizon_the_reordered_seq_is_taken_for_a_copy(ddb, dedup_table):
    deduper = Deduper(ddb, dedup_table, hole_horizon=0)
    assert decisions(deduper.decide, [env(1, 0, s) for s in (1, 3, 2, 3)]) == [
        APPLY, APPLY, SKIP, SKIP,
    ]  # fmt: skip
    assert deduper.stored(CID) == Position(1, 0, 3)


def test_a_seq_that_comes_later_than_the_horizon_is_taken_for_a_copy(ddb, dedup_table):
    deduper = Deduper(ddb, dedup_table, hole_horizon=5)
    assert deduper.decide(env(1, 0, 1)) == Outcome(APPLY)
    assert deduper.decide(env(1, 0, 4)) == Outcome(APPLY, gap=2)
    assert deduper.stored(CID) == Position(1, 0, 4, frozenset({2, 3}))
    # 9 is 5 above 4: 2 and 3 fall out of the horizon, 5 to 8 come in
    assert deduper.decide(env(1, 0, 9)) == Outcome(APPLY, gap=4)
    assert deduper.stored(CID) == Position(1, 0, 9, frozenset({5, 6, 7, 8}))
    assert deduper.decide(env(1, 0, 2)).decision is SKIP
    assert deduper.decide(env(1, 0, 7)) == Outcome(APPLY, late=True)


def test_a_superseded_owners_late_seq_is_applied_and_the_new_owners_copy_skipped(deduper):
    assert decisions(deduper.decide, [env(1, 0, s) for s in (1, 2, 4)]) == [APPLY] * 3
    assert deduper.decide(env(2, 0, 5)) == Outcome(APPLY)
    assert deduper.decide(env(1, 0, 3)) == Outcome(APPLY, late=True)
    assert deduper.decide(env(2, 0, 3)).decision is SKIP
    assert deduper.stored(CID) == Position(1, 0, 5)


# --- two consumers at once -----------------------------------------------------------------

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
    first, second = (Deduper(ddb, dedup_table) for _ in range(2))
    for seq in range(1, ROUNDS + 1):
        envelope = env(1, 0, seq)
        outcomes = race([partial(first.decide, envelope), partial(second.decide, envelope)])
        assert sorted(o.decision.value for o in outcomes) == ["apply", "skip"], seq
    assert first.stored(CID) == Position(1, 0, ROUNDS)


def test_two_consumers_transacting_one_envelope_make_its_effect_once(
    ddb, dedup_table, effects_table
):
    first, second = (Deduper(ddb, dedup_table) for _ in range(2))
    for seq in range(1, ROUNDS + 1):
        envelope = env(1, 0, seq)
        effects = [count_once(effects_table, envelope)]
        outcomes = race(
            [
                partial(first.transact, envelope, effects),
                partial(second.transact, envelope, effects),
            ]
        )
        assert sorted(o.decision.value for o in outcomes) == ["apply", "skip"], seq
    assert writes(ddb, effects_table) == {key_of(0, s): 1 for s in range(1, ROUNDS + 1)}


def test_two_consumers_on_one_late_seq_apply_it_once(ddb, dedup_table, effects_table):
    first, second = (Deduper(ddb, dedup_table) for _ in range(2))
    assert first.decide(env(1, 0, 1)) == Outcome(APPLY)
    # every round jumps over one seq, then both consumers get it
    for seq in range(3, 3 + 2 * ROUNDS, 2):
        assert first.decide(env(1, 0, seq)) == Outcome(APPLY, gap=1)
        late = env(1, 0, seq - 1)
        effects = [count_once(effects_table, late)]
        outcomes = race([partial(d.transact, late, effects) for d in (first, second)])
        assert sorted((o.decision.value, o.late) for o in outcomes) == [
            ("apply", True), ("skip", False),
        ]  # fmt: skip
    assert first.stored(CID) == Position(1, 0, 1 + 2 * ROUNDS)
    assert writes(ddb, effects_table) == {key_of(0, s): 1 for s in range(2, 2 * ROUNDS + 1, 2)}


def test_an_old_and_a_new_owner_racing_apply_each_seq_once(ddb, dedup_table):
    """Epoch 1 and epoch 2 send the same seqs at once: every seq is applied exactly
    once, by one or the other."""
    old, new = Deduper(ddb, dedup_table), Deduper(ddb, dedup_table)
    applied_by: dict[int, int] = {}
    for seq in range(1, ROUNDS + 1):
        outcomes = race([partial(old.decide, env(1, 0, seq)), partial(new.decide, env(2, 0, seq))])
        winners = [epoch for epoch, o in zip((1, 2), outcomes, strict=True) if o.decision is APPLY]
        assert len(winners) == 1, (seq, outcomes)
        applied_by[seq] = winners[0]
    assert new.stored(CID) == Position(applied_by[ROUNDS], 0, ROUNDS)


# --- transactions --------------------------------------------------------------------------


def test_a_replayed_transaction_leaves_one_write(ddb, effects_table, deduper):
    envelope = env(1, 0, 1)
    assert deduper.transact(envelope, [count_once(effects_table, envelope)]) == Outcome(APPLY)
    # the same envelope again (a retry after a lost answer), and from a newer owner
    assert deduper.transact(envelope, [count_once(effects_table, envelope)]).decision is SKIP
    again = env(2, 0, 1)
    assert deduper.transact(again, [count_once(effects_table, again)]).decision is SKIP
    assert writes(ddb, effects_table) == {key_of(0, 1): 1}


def test_an_early_envelope_writes_no_effect(ddb, effects_table, deduper):
    assert deduper.transact(env(2, 0, 1), []) == Outcome(APPLY)
    early = env(1, 0, 3, prev=2)
    assert deduper.transact(early, [count_once(effects_table, early)]) == Outcome(
        EARLY, stored=Position(2, 0, 1)
    )
    assert writes(ddb, effects_table) == {}


def test_an_effect_that_fails_its_condition_writes_nothing(ddb, effects_table, deduper):
    effect = count_once(effects_table, env(1, 0, 1))
    effect["Update"]["ConditionExpression"] = "attribute_exists(#writes)"
    with pytest.raises(EffectFailedError, match="effect 0: ConditionalCheckFailed") as failed:
        deduper.transact(env(1, 0, 1), [effect])
    assert [r["Code"] for r in failed.value.reasons] == ["None", "ConditionalCheckFailed"]
    assert deduper.stored(CID) is None
    assert writes(ddb, effects_table) == {}


def test_several_effects_are_written_together(ddb, effects_table, deduper):
    envelope = env(1, 0, 1)
    other = env(1, 0, 1, cid="other")
    outcome = deduper.transact(
        envelope, [count_once(effects_table, envelope), count_once(effects_table, other)]
    )
    assert outcome == Outcome(APPLY)
    assert writes(ddb, effects_table) == {key_of(0, 1): 1, key_of(0, 1, "other"): 1}


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_after_its_attempts_a_contended_decision_gives_up_having_written_nothing(
    ddb, dedup_table, effects_table, method
):
    # One attempt, and the first one expects the next seq: a gap needs a second.
    deduper = Deduper(ddb, dedup_table, max_attempts=1)
    assert deduper.decide(env(1, 0, 1)) == Outcome(APPLY)
    envelope = env(1, 0, 5)
    call = partial(deduper.transact, envelope, [count_once(effects_table, envelope)])
    if method == "decide":
        call = partial(deduper.decide, envelope)
    with pytest.raises(ContendedError, match="lost 1 times"):
        call()
    assert deduper.stored(CID) == Position(1, 0, 1)
    assert writes(ddb, effects_table) == {}


class ConflictOnce:
    """The client, except that its first transaction is cancelled by a conflict, as
    DynamoDB does when another transaction holds the item."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.conflicts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transact_write_items(self, **kwargs: Any) -> Any:
        if self.conflicts == 0:
            self.conflicts += 1
            raise ClientError(
                {
                    "Error": {"Code": "TransactionCanceledException", "Message": "conflict"},
                    "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
                },
                "TransactWriteItems",
            )
        return self._client.transact_write_items(**kwargs)


def test_a_conflicting_transaction_is_tried_again_after_a_pause(ddb, dedup_table, effects_table):
    pauses: list[float] = []
    client = ConflictOnce(ddb)
    deduper = Deduper(client, dedup_table, sleep=pauses.append, rng=lambda: 1.0)
    envelope = env(1, 0, 1)
    assert deduper.transact(envelope, [count_once(effects_table, envelope)]) == Outcome(APPLY)
    assert client.conflicts == 1
    assert pauses == [0.02]
    assert writes(ddb, effects_table) == {key_of(0, 1): 1}


def test_effects_are_checked_before_anything_is_written(ddb, dedup_table, effects_table, deduper):
    envelope = env(1, 0, 1)
    own = {"Put": {"TableName": dedup_table, "Item": {PARTITION_KEY: {"S": "x"}}}}
    with pytest.raises(ValueError, match="effect 1 writes to the dedup table"):
        deduper.transact(envelope, [count_once(effects_table, envelope), own])
    many = [count_once(effects_table, env(1, 0, s)) for s in range(MAX_EFFECTS + 1)]
    with pytest.raises(ValueError, match="at most 99 effects"):
        deduper.transact(envelope, many)
    assert deduper.stored(CID) is None


# --- what each method guarantees for an effect made outside the transaction ----------------


def test_decide_then_effect_loses_the_effect_when_the_process_dies_in_between(deduper):
    assert deduper.decide(env(1, 0, 1)).decision is APPLY
    # ...the process dies before its effect; the message comes again:
    assert deduper.decide(env(1, 0, 1)).decision is SKIP  # at most once


def test_preview_then_effect_then_decide_repeats_the_effect_instead(deduper):
    envelope = env(1, 0, 1)
    assert deduper.preview(envelope) == Outcome(APPLY)
    # ...an idempotent effect, then the process dies before decide; it comes again:
    assert deduper.preview(envelope) == Outcome(APPLY)  # the effect is made again
    assert deduper.decide(envelope) == Outcome(APPLY)
    assert deduper.preview(envelope) == Outcome(SKIP, stored=Position(1, 0, 1))
    assert deduper.preview(env(1, 0, 4)) == Outcome(APPLY, gap=2)
    assert deduper.preview(env(1, 0, 4, prev=3)) == Outcome(EARLY, stored=Position(1, 0, 1))
    assert deduper.stored(CID) == Position(1, 0, 1)  # preview writes nothing


# --- what is refused -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("envelope", "match"),
    [
        (Envelope("not valid!", 1, 0, 1, NOW, None), "connection_id"),
        (Envelope(CID, -1, 0, 1, NOW, None), "epoch"),
        (Envelope(CID, 1, 0, True, NOW, None), "seq"),
        (Envelope(CID, 1, 0, 10**38, NOW, None), "seq"),
        (Envelope(CID, 1, None, 1, NOW, None), "seq_gen"),  # type: ignore[arg-type]
    ],
)
@pytest.mark.parametrize("method", ["decide", "transact", "preview"])
def test_a_malformed_envelope_is_refused_before_any_write(
    ddb, effects_table, deduper, envelope, match, method
):
    effects = [count_once(effects_table, env(1, 0, 1))]
    call = partial(deduper.transact, envelope, effects)
    if method != "transact":
        call = partial(getattr(deduper, method), envelope)
    with pytest.raises(EnvelopeError, match=match):
        call()
    assert deduper.stored(CID) is None
    assert writes(ddb, effects_table) == {}


def test_bytes_that_are_no_envelope_are_refused_by_the_reader():
    with pytest.raises(EnvelopeError, match="missing: seq_gen"):
        Envelope.from_bytes(b'{"connection_id":"a","epoch":1,"seq":1,"received_at":1,"payload":1}')


@pytest.mark.parametrize("method", ["decide", "transact"])
def test_a_stored_item_that_is_no_position_stops_the_decision(ddb, dedup_table, deduper, method):
    ddb.put_item(
        TableName=dedup_table,
        Item={
            PARTITION_KEY: {"S": CID},
            "epoch": {"N": "1"},
            "seq_gen": {"N": "0"},
            "seq": {"S": "7"},
        },
    )
    with pytest.raises(DedupStateError, match="seq must be a whole number"):
        getattr(deduper, method)(env(1, 0, 8), *([[]] if method == "transact" else []))


# --- the table -----------------------------------------------------------------------------


def test_creating_the_table_again_keeps_it_and_another_key_is_refused(ddb, dedup_table, deduper):
    assert deduper.decide(env(1, 0, 1)).decision is APPLY
    create_dedup_table(ddb, dedup_table)
    assert deduper.stored(CID) == Position(1, 0, 1)
    other = unique_name("not-dedup")
    ddb.create_table(
        TableName=other,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    )
    try:
        with pytest.raises(ValueError, match="exists with the key"):
            create_dedup_table(ddb, other)
    finally:
        ddb.delete_table(TableName=other)
