"""The deduper's pure part: the three decisions, gaps and late seqs, the checks on an
envelope and on a stored item, and every write's condition and update, evaluated
against items by the expression evaluator (``tests.unit.expressions``): each condition
passes exactly where the rules say it should."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.expressions import apply, holds
from worker.delivery import Delivery
from worker.sinks.batch_rules import Limits
from worker.sinks.kinesis import KinesisSink
from worker.sinks.sending import Refusal, SinkSender, SinkSendError
from worker.sinks.settings import SinkSettings
from wsfleet.deduper import (
    HOLE_HORIZON,
    MAX_NUMBER,
    PARTITION_KEY,
    Ahead,
    Decision,
    DedupStateError,
    Late,
    NextSeq,
    Outcome,
    Position,
    applied,
    classify,
    dedup_update,
    gap_before,
    is_ahead,
    is_late,
    late_after,
    plan,
    refused_with,
    validate,
)
from wsfleet.envelope import Envelope, EnvelopeError

NOW = 1_767_225_600_000
CID = "btc-eth"
APPLY, SKIP, EARLY = Decision.APPLY, Decision.SKIP, Decision.EARLY


def env(
    epoch: int,
    seq_gen: int,
    seq: int,
    *,
    cid: str = CID,
    received: int = NOW,
    prev: int | None = None,
) -> Envelope:
    return Envelope(cid, epoch, seq_gen, seq, received, {"p": seq}, prev_seq=prev)


def item(position: Position | None) -> dict[str, Any] | None:
    """The stored dedup item of ``position`` in DynamoDB's JSON."""
    if position is None:
        return None
    stored = {
        PARTITION_KEY: {"S": CID},
        "epoch": {"N": str(position.epoch)},
        "seq_gen": {"N": str(position.seq_gen)},
        "seq": {"N": str(position.seq)},
        "received_at_ms": {"N": str(NOW - 5)},
        "applied_at_ms": {"N": str(NOW - 1)},
    }
    if position.late:
        stored["late"] = {"NS": [str(s) for s in sorted(position.late)]}
    return stored


STORED = Position(epoch=2, seq_gen=1, seq=8)
WITH_LATE = Position(epoch=2, seq_gen=1, seq=8, late=frozenset({5, 6}))


@pytest.mark.parametrize(
    ("stored", "envelope", "decision"),
    [
        (None, env(1, 0, 1), APPLY),  # the first of a connection
        (None, env(7, 3, 900), APPLY),  # whatever it is
        (STORED, env(2, 1, 9), APPLY),  # the next, same owner
        (STORED, env(3, 1, 9), APPLY),  # the next, a newer owner
        (STORED, env(2, 1, 20), APPLY),  # a gap is applied
        (STORED, env(2, 2, 1), APPLY),  # a restart on a new stream
        (STORED, env(3, 2, 0), APPLY),
        (STORED, env(2, 1, 8), SKIP),  # the same message again
        (STORED, env(3, 1, 8), SKIP),  # replayed by a newer owner
        (STORED, env(3, 1, 5), SKIP),
        (STORED, env(1, 1, 8), SKIP),  # a copy is a copy, even from a stale owner
        (STORED, env(1, 1, 3), SKIP),
        (STORED, env(2, 0, 100), SKIP),  # an older stream, however high its seq
        # a superseded owner's message not applied yet: applied, as its successor's
        # copy would be (that copy may never come: dropped by SQS, read before it)
        (STORED, env(1, 1, 9), APPLY),
        (STORED, env(1, 2, 1), APPLY),
        (STORED, env(0, 1, 9), APPLY),
        # late seqs: jumped over by a gap, applied when they come
        (WITH_LATE, env(2, 1, 5), APPLY),
        (WITH_LATE, env(3, 1, 6), APPLY),
        (WITH_LATE, env(1, 1, 5), APPLY),  # ... from a superseded owner too
        (WITH_LATE, env(2, 1, 7), SKIP),  # not one of them: applied already
        (WITH_LATE, env(1, 1, 7), SKIP),
        (WITH_LATE, env(2, 0, 5), SKIP),  # another stream's 5
        (WITH_LATE, env(2, 2, 5), APPLY),  # a new stream
    ],
)
def test_each_decision(stored, envelope, decision):
    assert classify(stored, envelope) is decision


@pytest.mark.parametrize(
    ("horizon", "decision"),
    [(HOLE_HORIZON, APPLY), (4, APPLY), (3, SKIP), (1, SKIP), (0, SKIP)],
)
def test_a_late_seq_is_awaited_only_within_the_horizon(horizon, decision):
    # 8 - 5 = 3 seqs below the highest applied
    assert classify(WITH_LATE, env(2, 1, 5), horizon) is decision


@pytest.mark.parametrize(
    ("stored", "envelope", "gap"),
    [
        (None, env(1, 0, 50), 0),  # where a stream starts is not known
        (STORED, env(2, 1, 9), 0),
        (STORED, env(2, 1, 10), 1),
        (STORED, env(3, 1, 20), 11),
        (STORED, env(2, 2, 7), 0),  # a new stream starts anywhere
        (STORED, env(2, 1, 8), 0),  # not ahead: no gap
        (STORED, env(2, 1, 2), 0),
    ],
)
def test_the_gap_counts_the_seqs_jumped_over(stored, envelope, gap):
    assert gap_before(stored, envelope) == gap


@pytest.mark.parametrize(
    ("stored", "seq", "horizon", "late"),
    [
        (Position(1, 0, 10), 11, 500, set()),
        (Position(1, 0, 10), 15, 500, {11, 12, 13, 14}),
        (Position(1, 0, 10, frozenset({3, 7})), 15, 500, {3, 7, 11, 12, 13, 14}),
        (Position(1, 0, 10, frozenset({3, 7})), 11, 500, {3, 7}),  # the next keeps them
        (Position(1, 0, 10, frozenset({3, 7})), 15, 10, {7, 11, 12, 13, 14}),  # 3 too far
        (Position(1, 0, 10, frozenset({3, 7})), 15, 3, {13, 14}),
        (Position(1, 0, 10, frozenset({3, 7})), 15, 0, set()),
        (Position(1, 0, 10), 10_010, 500, set(range(9_511, 10_010))),  # a jump: the last 499
        (None, 15, 500, set()),
    ],
)
def test_the_late_seqs_after_an_apply_above(stored, seq, horizon, late):
    assert late_after(stored, env(1, 0, seq), horizon) == late


def test_a_new_stream_awaits_nothing_of_the_old_one():
    assert late_after(Position(1, 0, 10, frozenset({7})), env(1, 1, 5), 500) == frozenset()


@pytest.mark.parametrize(
    ("stored", "envelope", "decision"),
    [
        # a connection's first batch, 1 refused and 2 written: nothing stored is not 1
        (None, env(1, 0, 2, prev=1), EARLY),
        (None, env(1, 0, 1), APPLY),
        (Position(1, 0, 1), env(1, 0, 2, prev=1), APPLY),
        # a later batch
        (STORED, env(2, 1, 9, prev=8), APPLY),
        (STORED, env(3, 1, 9, prev=8), APPLY),
        (STORED, env(2, 1, 10, prev=9), EARLY),
        (STORED, env(2, 1, 12, prev=11), EARLY),
        (STORED, env(2, 1, 12), APPLY),  # no prev_seq: a gap
        # a gap inside the batch: the one before it is what counts
        (STORED, env(2, 1, 11, prev=8), APPLY),
        (STORED, env(2, 1, 11, prev=7), APPLY),
        (STORED, env(2, 1, 12, prev=10), EARLY),
        # the one before it awaited as a late seq: not applied
        (WITH_LATE, env(2, 1, 9, prev=6), EARLY),
        (WITH_LATE, env(2, 1, 9, prev=5), EARLY),
        (WITH_LATE, env(2, 1, 9, prev=7), APPLY),
        (WITH_LATE, env(2, 1, 9, prev=4), APPLY),
        (WITH_LATE, env(2, 1, 6, prev=5), EARLY),  # a late seq after a late seq
        (WITH_LATE, env(2, 1, 6, prev=4), APPLY),
        (WITH_LATE, env(2, 1, 5, prev=4), APPLY),
        # a new stream: its seqs are not the stored ones
        (STORED, env(2, 2, 2, prev=1), EARLY),
        (STORED, env(2, 2, 1), APPLY),
        (Position(2, 2, 1), env(2, 2, 2, prev=1), APPLY),
        # SKIP first, whoever sent it
        (STORED, env(2, 1, 8, prev=7), SKIP),
        (WITH_LATE, env(2, 1, 7, prev=6), SKIP),  # a copy, though 6 is not applied
        (STORED, env(2, 0, 9, prev=8), SKIP),  # an older stream
        (STORED, env(1, 1, 10, prev=9), EARLY),
        (STORED, env(1, 2, 2, prev=1), EARLY),
    ],
)
def test_an_envelope_ahead_of_the_one_sent_before_it_is_early(stored, envelope, decision):
    assert classify(stored, envelope) is decision


@pytest.mark.parametrize(
    ("stored", "envelope"),
    [
        (None, env(1, 0, 2, prev=1)),
        (STORED, env(2, 1, 10, prev=9)),
        (WITH_LATE, env(2, 1, 6, prev=5)),
    ],
)
def test_an_early_envelope_is_planned_as_an_outcome_with_the_stored_position(stored, envelope):
    assert plan(stored, envelope, HOLE_HORIZON) == Outcome(EARLY, stored=stored)


# --- the conditions, evaluated ----------------------------------------------------------

POSITIONS = [
    None,
    STORED,
    WITH_LATE,
    Position(0, 0, 0),
    Position(5, 1, 8),  # stored by an owner newer than most envelopes below
    Position(2, 1, 8, frozenset({6})),  # as WITH_LATE, with 5 applied since
]
ENVELOPES = [
    env(e, g, s)
    for e, (g, s) in itertools.product(
        (0, 1, 2, 3, 5, 6),
        ((0, 0), (0, 1), (0, 100), (1, 5), (1, 6), (1, 7), (1, 8), (1, 9), (1, 10), (2, 0)),
    )
]
GRID = list(itertools.product(POSITIONS, ENVELOPES))


def _holds(update: dict[str, Any], stored: Position | None) -> bool:
    return holds(
        update["ConditionExpression"],
        item(stored),
        update["ExpressionAttributeNames"],
        update["ExpressionAttributeValues"],
        all_used=False,  # the update uses the rest; _apply checks them all
    )


def _apply(update: dict[str, Any], stored: Position | None) -> dict[str, Any] | None:
    return apply(
        update["UpdateExpression"],
        update["ConditionExpression"],
        update["ExpressionAttributeNames"],
        update["ExpressionAttributeValues"],
        item(stored),
        key_attributes={PARTITION_KEY},
    )


@pytest.mark.parametrize(("stored", "envelope"), GRID)
def test_the_first_write_passes_exactly_on_the_next_seq_of_a_current_owner(stored, envelope):
    next_seq = stored is None or (
        envelope.seq_gen == stored.seq_gen and envelope.seq == stored.seq + 1
    )
    expected = classify(stored, envelope) is APPLY and next_seq
    assert _holds(dedup_update(envelope, NOW, NextSeq()), stored) is expected


@pytest.mark.parametrize(("stored", "envelope"), GRID)
def test_a_write_above_passes_only_on_the_item_it_was_planned_on(stored, envelope):
    if not (is_ahead(stored, envelope) and classify(stored, envelope) is APPLY):
        with pytest.raises(ValueError, match="does not apply above"):
            dedup_update(envelope, NOW, Ahead(stored))
        return
    update = dedup_update(envelope, NOW, Ahead(stored))
    for other in POSITIONS:
        assert _holds(update, other) is (other == stored), other


@pytest.mark.parametrize("horizon", [HOLE_HORIZON, 3, 0])
@pytest.mark.parametrize(("stored", "envelope"), GRID)
def test_a_late_write_passes_exactly_on_an_awaited_seq_of_a_current_owner(
    stored, envelope, horizon
):
    expected = is_late(stored, envelope, horizon) and classify(stored, envelope) is APPLY
    assert _holds(dedup_update(envelope, NOW, Late(), horizon), stored) is expected


@pytest.mark.parametrize(("stored", "envelope"), GRID)
def test_every_refusal_plans_the_write_that_passes(stored, envelope):
    """After a refused write, the plan made from the item it returned either decides
    (SKIP or EARLY, the rules' answer) or is a write whose condition that item
    passes: a second write is enough unless another consumer changed the item."""
    step = plan(stored, envelope, HOLE_HORIZON)
    if isinstance(step, Outcome):
        assert step == Outcome(classify(stored, envelope), stored=stored)
        assert step.decision is not APPLY
    else:
        assert _holds(dedup_update(envelope, NOW, step), stored)


PREV_POSITIONS = [
    *POSITIONS,
    Position(2, 1, 8, frozenset({7})),
    Position(2, 1, 9, frozenset({6, 8})),
]
PREV_ENVELOPES = [
    env(e, g, s, prev=p)
    for e, (g, s) in itertools.product(
        (1, 2, 3, 5),
        ((0, 1), (0, 100), (1, 5), (1, 6), (1, 7), (1, 8), (1, 9), (1, 10), (1, 11), (2, 2)),
    )
    for p in {s - 1, s - 2, s - 3, 4, 5, 6, 7, 8}
    if 0 <= p < s
]


def _mismatches(check: Callable[[Envelope], tuple[object, object]]) -> list[str]:
    """The envelopes of PREV_ENVELOPES for which ``check`` gives (got, expected) unequal."""
    wrong = []
    for envelope in PREV_ENVELOPES:
        got, expected = check(envelope)
        if got != expected:
            wrong.append(
                f"{envelope.epoch} {envelope.seq_gen} {envelope.seq} prev "
                f"{envelope.prev_seq}: {got} != {expected}"
            )
    return wrong


@pytest.mark.parametrize("stored", PREV_POSITIONS)
def test_with_prev_seq_the_first_write_passes_exactly_on_the_next_seq_with_its_predecessor(stored):
    def check(envelope: Envelope) -> tuple[object, object]:
        next_seq = stored is not None and (
            envelope.seq_gen == stored.seq_gen and envelope.seq == stored.seq + 1
        )
        expected = classify(stored, envelope) is APPLY and next_seq
        return _holds(dedup_update(envelope, NOW, NextSeq()), stored), expected

    assert _mismatches(check) == []


@pytest.mark.parametrize("horizon", [HOLE_HORIZON, 3, 0])
@pytest.mark.parametrize("stored", PREV_POSITIONS)
def test_with_prev_seq_a_late_write_passes_exactly_when_its_predecessor_is_applied(stored, horizon):
    def check(envelope: Envelope) -> tuple[object, object]:
        expected = is_late(stored, envelope, horizon) and classify(stored, envelope) is APPLY
        return _holds(dedup_update(envelope, NOW, Late(), horizon), stored), expected

    assert _mismatches(check) == []


@pytest.mark.parametrize("stored", PREV_POSITIONS)
def test_with_prev_seq_a_write_above_is_made_only_for_an_envelope_that_applies(stored):
    def check(envelope: Envelope) -> tuple[object, object]:
        if not (is_ahead(stored, envelope) and classify(stored, envelope) is APPLY):
            with pytest.raises(ValueError, match="does not apply above"):
                dedup_update(envelope, NOW, Ahead(stored))
            return True, True
        update = dedup_update(envelope, NOW, Ahead(stored))
        passes = [other for other in PREV_POSITIONS if _holds(update, other)]
        return passes, [stored]

    assert _mismatches(check) == []


@pytest.mark.parametrize("stored", PREV_POSITIONS)
def test_with_prev_seq_every_refusal_plans_the_write_that_passes_or_decides(stored):
    def check(envelope: Envelope) -> tuple[object, object]:
        step = plan(stored, envelope, HOLE_HORIZON)
        decision = classify(stored, envelope)
        if isinstance(step, Outcome):
            return step, Outcome(decision, stored=stored) if decision is not APPLY else "a write"
        return _holds(dedup_update(envelope, NOW, step), stored), True

    assert _mismatches(check) == []


def test_with_prev_seq_the_first_write_never_creates_the_item():
    """Nothing stored: the one before it is not applied."""
    assert _holds(dedup_update(env(1, 0, 1), NOW, NextSeq()), None)
    assert not _holds(dedup_update(env(1, 0, 1, prev=0), NOW, NextSeq()), None)
    assert not _holds(dedup_update(env(1, 0, 2, prev=1), NOW, NextSeq()), None)
    # the guard is today's when there is no prev_seq
    assert dedup_update(env(1, 0, 2), NOW, NextSeq())["ConditionExpression"] == (
        "attribute_not_exists(#id) OR (#gen = :gen AND #seq = :prev)"
    )


def test_the_first_write_stores_the_position_and_keeps_the_late_seqs():
    after = _apply(dedup_update(env(3, 1, 9, received=NOW - 30), NOW, NextSeq()), WITH_LATE)
    assert after is not None
    assert Position.from_item(after) == Position(3, 1, 9, frozenset({5, 6}))
    assert after["received_at_ms"] == {"N": str(NOW - 30)}
    assert after["applied_at_ms"] == {"N": str(NOW)}


def test_the_first_write_of_a_connection_creates_its_item():
    after = _apply(dedup_update(env(1, 0, 1), NOW, NextSeq()), None)
    assert after is not None
    assert Position.from_item(after) == Position(1, 0, 1)


@pytest.mark.parametrize(
    ("stored", "envelope", "expected"),
    [
        (None, env(1, 0, 7), Position(1, 0, 7)),
        (STORED, env(2, 1, 12), Position(2, 1, 12, frozenset({9, 10, 11}))),
        (WITH_LATE, env(3, 1, 10), Position(3, 1, 10, frozenset({5, 6, 9}))),
        (WITH_LATE, env(2, 2, 3), Position(2, 2, 3)),  # a new stream: none awaited
        (WITH_LATE, env(2, 1, 9), Position(2, 1, 9, frozenset({5, 6}))),
        (WITH_LATE, env(2, 1, 509), Position(2, 1, 509, frozenset(range(10, 509)))),
        (WITH_LATE, env(2, 1, 510), Position(2, 1, 510, frozenset(range(11, 510)))),
        (WITH_LATE, env(2, 1, 600), Position(2, 1, 600, frozenset(range(101, 600)))),
    ],
)
def test_a_write_above_stores_the_position_and_the_late_seqs(stored, envelope, expected):
    after = _apply(dedup_update(envelope, NOW, Ahead(stored)), stored)
    assert after is not None
    assert Position.from_item(after) == expected
    assert ("late" in after) is bool(expected.late)


def test_a_late_write_takes_the_seq_off_and_keeps_the_position():
    after = _apply(dedup_update(env(3, 1, 5), NOW, Late()), WITH_LATE)
    assert after is not None
    assert Position.from_item(after) == Position(3, 1, 8, frozenset({6}))
    last = _apply(dedup_update(env(3, 1, 6), NOW, Late()), Position(3, 1, 8, frozenset({6})))
    assert last is not None
    assert "late" not in last  # an emptied set is no attribute
    assert Position.from_item(last) == Position(3, 1, 8)


def test_order_is_that_of_numbers_not_strings():
    # "10" < "9" as strings
    assert _holds(dedup_update(env(2, 1, 10), NOW, NextSeq()), Position(2, 1, 9))
    assert not _holds(dedup_update(env(2, 1, 9), NOW, NextSeq()), Position(2, 1, 10))


@pytest.mark.parametrize(
    ("stored", "envelope", "step"),
    [
        (STORED, env(2, 1, 8), Outcome(SKIP, stored=STORED)),
        (STORED, env(1, 1, 9), Ahead(STORED)),
        (STORED, env(2, 1, 12), Ahead(STORED)),
        (STORED, env(2, 2, 1), Ahead(STORED)),
        (None, env(2, 1, 12), Ahead(None)),  # the item went away in between
        (WITH_LATE, env(2, 1, 6), Late()),
        (WITH_LATE, env(1, 1, 6), Late()),
        (None, env(2, 1, 12, prev=11), Outcome(EARLY)),
        (STORED, env(2, 1, 12, prev=8), Ahead(STORED)),
        (STORED, env(2, 1, 12, prev=9), Outcome(EARLY, stored=STORED)),
        (WITH_LATE, env(2, 1, 6, prev=4), Late()),
        (WITH_LATE, env(2, 1, 6, prev=5), Outcome(EARLY, stored=WITH_LATE)),
    ],
)
def test_a_refusal_plans_the_next_step(stored, envelope, step):
    assert plan(stored, envelope, HOLE_HORIZON) == step


@pytest.mark.parametrize(
    ("guard", "envelope", "outcome"),
    [
        (NextSeq(), env(2, 1, 9), Outcome(APPLY)),
        (Ahead(STORED), env(2, 1, 12), Outcome(APPLY, gap=3)),
        (Ahead(STORED), env(2, 2, 12), Outcome(APPLY)),
        (Ahead(None), env(2, 1, 12), Outcome(APPLY)),
        (Late(), env(2, 1, 5), Outcome(APPLY, late=True)),
    ],
)
def test_a_passed_write_says_what_it_applied(guard, envelope, outcome):
    assert applied(guard, envelope) == outcome


# --- what is stored, and what comes in ---------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ({}, None),
        (item(STORED), STORED),
        (item(WITH_LATE), WITH_LATE),
        (item(Position(0, 0, 0)), Position(0, 0, 0)),
        (item(Position(MAX_NUMBER, 3, MAX_NUMBER)), Position(MAX_NUMBER, 3, MAX_NUMBER)),
    ],
)
def test_a_stored_item_reads_as_its_position(raw, expected):
    assert Position.from_item(raw) == expected


@pytest.mark.parametrize(
    ("attribute", "raw"),
    [
        ("epoch", None),  # missing
        ("seq", {"S": "8"}),
        ("seq_gen", {"N": "-1"}),
        ("seq", {"N": "8.5"}),
        ("epoch", {"N": "1e3"}),
        ("seq", "8"),  # not DynamoDB's JSON at all
        ("late", {"SS": ["5"]}),
        ("late", {"NS": ["5", "-2"]}),
    ],
)
def test_a_stored_item_that_is_no_position_is_refused(attribute, raw):
    stored = item(STORED)
    assert stored is not None
    if raw is None:
        del stored[attribute]
    else:
        stored[attribute] = raw
    with pytest.raises(DedupStateError, match=attribute):
        Position.from_item(stored)


@pytest.mark.parametrize(
    "envelope",
    [
        env(0, 0, 0),
        env(MAX_NUMBER, MAX_NUMBER, MAX_NUMBER, received=MAX_NUMBER),
        env(1, 0, 1, cid="a"),
        env(1, 0, 1, cid="x" * 128),
    ],
)
def test_envelopes_within_the_limits_pass(envelope):
    validate(envelope)


@pytest.mark.parametrize(
    ("envelope", "match"),
    [
        (Envelope("", 1, 0, 1, NOW, None), "connection_id"),
        (Envelope("has space", 1, 0, 1, NOW, None), "connection_id"),
        (Envelope("x" * 129, 1, 0, 1, NOW, None), "connection_id"),
        (Envelope(7, 1, 0, 1, NOW, None), "connection_id"),  # type: ignore[arg-type]
        (Envelope(CID, -1, 0, 1, NOW, None), "epoch"),
        (Envelope(CID, True, 0, 1, NOW, None), "epoch"),
        (Envelope(CID, 1, 0.0, 1, NOW, None), "seq_gen"),  # type: ignore[arg-type]
        (Envelope(CID, 1, 0, "1", NOW, None), "seq"),  # type: ignore[arg-type]
        (Envelope(CID, 1, 0, MAX_NUMBER + 1, NOW, None), "seq"),
        (Envelope(CID, 1, 0, 1, None, None), "received_at_ms"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_envelope_is_refused_naming_the_field(envelope, match):
    with pytest.raises(EnvelopeError, match=match):
        validate(envelope)


@pytest.mark.parametrize(
    ("reasons", "stored"),
    [
        ([{"Code": "ConditionalCheckFailed", "Item": item(STORED)}, {"Code": "None"}],
         item(STORED)),
        ([{"Code": "ConditionalCheckFailed"}], {}),  # no item
        ([{"Code": "None"}, {"Code": "ConditionalCheckFailed"}], None),  # an effect's
        ([{"Code": "TransactionConflict"}, {"Code": "None"}], None),
        ([], None),
    ],
)  # fmt: skip
def test_a_cancelled_transaction_is_read_from_its_first_reason(reasons, stored):
    assert refused_with(reasons) == stored


# --- a sink's partial refusal, through the rules ------------------------------------------


class Consumer:
    """What :meth:`Deduper.decide` does with each connection's item, the conditions
    evaluated by the expression evaluator instead of DynamoDB, and no other writer:
    the applied messages, in the order they were applied."""

    def __init__(self, horizon: int = HOLE_HORIZON) -> None:
        self.horizon = horizon
        self.items: dict[str, dict[str, Any]] = {}
        self.applied: list[tuple[int, int]] = []
        self.applied_envelopes: list[Envelope] = []

    def decide(self, envelope: Envelope) -> Outcome:
        guard: NextSeq | Ahead | Late = NextSeq()
        for _ in range(2):  # with no other writer, the second write passes or decides
            update = dedup_update(envelope, NOW, guard, self.horizon)
            after = apply(
                update["UpdateExpression"],
                update["ConditionExpression"],
                update["ExpressionAttributeNames"],
                update["ExpressionAttributeValues"],
                self.items.get(envelope.connection_id),
                key_attributes={PARTITION_KEY},
            )
            if after is not None:
                # UpdateItem on no item creates it with its key
                self.items[envelope.connection_id] = {
                    **after,
                    PARTITION_KEY: {"S": envelope.connection_id},
                }
                self.applied.append((envelope.seq_gen, envelope.seq))
                self.applied_envelopes.append(envelope)
                return applied(guard, envelope)
            stored = Position.from_item(self.items.get(envelope.connection_id))
            step = plan(stored, envelope, self.horizon)
            if isinstance(step, Outcome):
                return step
            guard = step
        raise AssertionError(f"{envelope.key}: the second write did not pass")


class Shard:
    """A Kinesis client: refuses a record of the ``n``-th request (1-based) when
    ``refuse(n, envelope)``, and keeps what it wrote, in order."""

    def __init__(self, refuse: Callable[[int, Envelope], bool]) -> None:
        self.refuse = refuse
        self.requests = 0
        self.written: list[Envelope] = []

    def put_records(self, **kwargs: Any) -> Mapping[str, Any]:
        self.requests += 1
        answers: list[dict[str, str]] = []
        for entry in kwargs["Records"]:
            envelope = Envelope.from_bytes(entry["Data"])
            if self.refuse(self.requests, envelope):
                answers.append({"ErrorCode": "ProvisionedThroughputExceededException"})
            else:
                self.written.append(envelope)
                answers.append({"SequenceNumber": "1", "ShardId": "shardId-000000000000"})
        failed = sum("ErrorCode" in a for a in answers)
        return {"FailedRecordCount": failed, "Records": answers}


async def _no_sleep(delay: float) -> None:
    pass


def kinesis_writes(
    batches: Sequence[Sequence[Delivery]], refuse: Callable[[int, Envelope], bool]
) -> list[Envelope]:
    """What the Kinesis sink writes to a shard for ``batches``, one handler call each."""
    shard = Shard(refuse)
    sink = KinesisSink(
        shard, SinkSettings("stream-1", max_attempts=50), rng=lambda: 1.0, sleep=_no_sleep
    )
    for batch in batches:
        asyncio.run(sink.handle_batch(batch))
    return shard.written


def batch(seqs: Sequence[int], *, epoch: int = 1, seq_gen: int = 0) -> list[Delivery]:
    return [Delivery(CID, epoch, s, {"p": s}, "w-1", seq_gen=seq_gen) for s in seqs]


def test_a_message_refused_in_a_connections_first_request_is_not_lost():
    """PutRecords refuses 1 and writes 2 of a connection's first batch; the sink sends
    1 and 2 again. With nothing stored and no gap, 2 first used to be applied and 1
    then skipped as a copy: lost."""
    written = kinesis_writes([batch([1, 2])], lambda request, e: request == 1 and e.seq == 1)
    assert [e.seq for e in written] == [2, 1, 2]
    consumer = Consumer()
    decisions = [consumer.decide(e).decision.value for e in written]
    assert consumer.applied == [(0, 1), (0, 2)]
    assert decisions == ["early", "apply", "apply"]


def run(consumer: Consumer, envelopes: Sequence[Envelope]) -> list[Outcome]:
    return [consumer.decide(e) for e in envelopes]


def test_a_partial_refusal_in_a_first_batch_applies_each_once_in_order():
    """The first batch 1, 2, 3: 1 and 2 refused, 3 written; then 1, 2, 3 again."""
    consumer = Consumer()
    one, two, three = env(1, 0, 1), env(1, 0, 2, prev=1), env(1, 0, 3, prev=2)
    assert run(consumer, [three, one, two, three]) == [
        Outcome(EARLY),
        Outcome(APPLY),
        Outcome(APPLY),
        Outcome(APPLY),
    ]
    assert consumer.applied == [(0, 1), (0, 2), (0, 3)]
    # a copy of the whole batch (the worker's retry) changes nothing
    assert [o.decision for o in run(consumer, [one, two, three])] == [SKIP] * 3


def test_k_plus_1_before_k_in_a_first_batch_is_early_then_both_apply():
    consumer = Consumer()
    k, k1 = env(1, 0, 7), env(1, 0, 8, prev=7)
    assert [o.decision for o in run(consumer, [k1, k, k1])] == [EARLY, APPLY, APPLY]
    assert consumer.applied == [(0, 7), (0, 8)]


def test_a_partial_refusal_in_a_later_batch_applies_each_once_in_order():
    """Batch 11, 12, 13 after 10: 12 refused; the shard holds 11, 13, 12, 13."""
    consumer = Consumer()
    run(consumer, [env(1, 0, s, prev=s - 1 if s > 1 else None) for s in range(1, 11)])
    outcomes = run(
        consumer,
        [env(1, 0, 11), env(1, 0, 13, prev=12), env(1, 0, 12, prev=11), env(1, 0, 13, prev=12)],
    )
    assert outcomes == [
        Outcome(APPLY),
        Outcome(EARLY, stored=Position(1, 0, 11)),
        Outcome(APPLY),
        Outcome(APPLY),
    ]
    assert consumer.applied == [(0, s) for s in range(1, 14)]


def test_a_gap_inside_a_batch_is_applied_once_its_predecessor_is():
    """Batch 11, 14, 15 after 10 (the stream skipped 12 and 13): 14 refused."""
    consumer = Consumer()
    run(consumer, [env(1, 0, 10)])
    shard = [env(1, 0, 11), env(1, 0, 15, prev=14), env(1, 0, 14, prev=11), env(1, 0, 15, prev=14)]
    assert [o.decision for o in run(consumer, shard)] == [APPLY, EARLY, APPLY, APPLY]
    assert consumer.applied == [(0, 10), (0, 11), (0, 14), (0, 15)]
    # 12 and 13 are awaited as late seqs, whatever comes before them
    assert Position.from_item(consumer.items[CID]) == Position(1, 0, 15, frozenset({12, 13}))


def test_a_predecessor_awaited_as_a_late_seq_holds_back_what_follows_it():
    """An older worker's gap left 8 and 9 awaited below 10; then 9 (after 8) and 11
    (after 9) come before 8."""
    consumer = Consumer()
    consumer.items[CID] = item(Position(1, 0, 10, frozenset({8, 9}))) or {}
    outcomes = run(consumer, [env(1, 0, 11, prev=9), env(1, 0, 9, prev=8)])
    assert [o.decision for o in outcomes] == [EARLY, EARLY]
    assert run(consumer, [env(1, 0, 8, prev=7)]) == [Outcome(APPLY, late=True)]
    assert run(consumer, [env(1, 0, 9, prev=8)]) == [Outcome(APPLY, late=True)]
    assert run(consumer, [env(1, 0, 11, prev=9)]) == [Outcome(APPLY)]
    assert consumer.applied == [(0, 8), (0, 9), (0, 11)]


def test_a_partial_refusal_in_a_new_streams_first_batch_loses_nothing():
    """After seq 50 of seq_gen 0, a restart on a new stream: batch 1, 2, 3 of seq_gen
    1, 1 refused; the shard holds 2, 3, 1, 2, 3."""
    consumer = Consumer()
    run(consumer, [env(1, 0, 50)])
    first = [env(1, 1, 1), env(1, 1, 2, prev=1), env(1, 1, 3, prev=2)]
    outcomes = run(consumer, [*first[1:], *first])
    assert [o.decision for o in outcomes] == [EARLY, EARLY, APPLY, APPLY, APPLY]
    assert consumer.applied == [(0, 50), (1, 1), (1, 2), (1, 3)]


def test_an_envelope_without_prev_seq_is_still_applied_late():
    """An older worker's envelopes: 2 first is taken for a gap, 1 applied late."""
    consumer = Consumer()
    run(consumer, [env(1, 0, 1)])
    shard = [env(1, 0, 3), env(1, 0, 2), env(1, 0, 3)]
    assert [o.decision for o in run(consumer, shard)] == [APPLY, APPLY, SKIP]
    assert consumer.applied == [(0, 1), (0, 3), (0, 2)]


class RandomShard:
    """A PutRecords that refuses what ``refuse`` draws in the first ``refusing``
    requests, and keeps what it wrote, in order."""

    def __init__(self, refuse: Callable[[], bool], refusing: int) -> None:
        self.refuse = refuse
        self.refusing = refusing
        self.requests = 0
        self.written: list[Envelope] = []

    async def send(self, entries: list[Envelope]) -> list[Refusal | None]:
        self.requests += 1
        outcomes: list[Refusal | None] = []
        for envelope in entries:
            if self.requests <= self.refusing and self.refuse():
                outcomes.append(Refusal("ProvisionedThroughputExceededException", ""))
            else:
                self.written.append(envelope)
                outcomes.append(None)
        return outcomes


async def write_batches(
    batches: Sequence[Sequence[Delivery]], shard: RandomShard, limits: Limits, attempts: int
) -> None:
    """As the sinks, in requests within ``limits``; a call that fails is made again
    whole, as the worker does (``HANDLER_ERRORS=retry``)."""
    sender: SinkSender[Envelope] = SinkSender(
        limits=limits,
        destination="stream-1",
        max_attempts=attempts,
        report=lambda notice: None,
        rng=lambda: 1.0,
        sleep=_no_sleep,
    )
    for deliveries in batches:
        while True:
            try:
                await sender.send_batch(deliveries, lambda e: (e, 1), shard.send, NOW)
                break
            except SinkSendError:
                continue


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    new_streams=st.lists(st.booleans(), min_size=5, max_size=5),
    two_connections=st.booleans(),
    per_request=st.integers(1, 5),
    attempts=st.integers(2, 4),
    refusing=st.integers(1, 8),
    data=st.data(),
)
def test_random_refusals_resent_in_order_apply_every_message_once_in_order(
    sizes, new_streams, two_connections, per_request, attempts, refusing, data
):
    """Batches of one connection (or two, interleaved), each sent in requests of at
    most ``per_request`` records, with random refusals in the first requests and what
    ``to_send_again`` picks sent again: through the rules, every message sent is
    applied once, in seq order, whatever the shard holds."""
    connections = ["a", "b"] if two_connections else ["a"]
    batches: list[list[Delivery]] = []
    sent: dict[str, list[tuple[int, int]]] = {c: [] for c in connections}
    position = {c: (0, 0) for c in connections}
    for size, new_stream in zip(sizes, new_streams, strict=False):
        deliveries = []
        for index in range(size):
            cid = connections[index % len(connections)]
            seq_gen, seq = position[cid]
            if new_stream and index < len(connections) and seq > 0:
                seq_gen, seq = seq_gen + 1, 0  # a restart on a new stream numbers from 1
            seq += 1
            position[cid] = (seq_gen, seq)
            sent[cid].append((seq_gen, seq))
            deliveries.append(Delivery(cid, 1, seq, None, "w-1", seq_gen=seq_gen))
        batches.append(deliveries)
    shard = RandomShard(lambda: data.draw(st.booleans()), refusing)
    limits = Limits("Test", max_count=per_request, max_bytes=1 << 20, max_record_bytes=1 << 20)
    asyncio.run(write_batches(batches, shard, limits, attempts))

    consumer = Consumer()
    for envelope in shard.written:
        consumer.decide(envelope)
    for cid in connections:
        applied_here = [e.key[1:] for e in consumer.applied_envelopes if e.connection_id == cid]
        assert applied_here == sent[cid], cid
