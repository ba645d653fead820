"""The deduper's pure part: the three decisions, gaps and late seqs, the checks on an
envelope and on a stored item, and every write's condition and update, evaluated
against items by the expression evaluator (``tests.unit.expressions``): each condition
passes exactly where the rules say it should."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.unit.expressions import apply, holds
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
APPLY, SKIP, REFUSE = Decision.APPLY, Decision.SKIP, Decision.REFUSE


def env(epoch: int, seq_gen: int, seq: int, *, cid: str = CID, received: int = NOW) -> Envelope:
    return Envelope(cid, epoch, seq_gen, seq, received, {"p": seq})


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
        (STORED, env(1, 1, 9), REFUSE),  # a stale owner's new message
        (STORED, env(1, 2, 1), REFUSE),  # ... even on a newer stream
        (STORED, env(0, 1, 9), REFUSE),
        # late seqs: jumped over by a gap, applied when they come
        (WITH_LATE, env(2, 1, 5), APPLY),
        (WITH_LATE, env(3, 1, 6), APPLY),
        (WITH_LATE, env(1, 1, 5), REFUSE),  # ... but not from a stale owner
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
    (SKIP or REFUSE, the rules' answer) or is a write whose condition that item
    passes: a second write is enough unless another consumer changed the item."""
    step = plan(stored, envelope, HOLE_HORIZON)
    if isinstance(step, Outcome):
        assert step == Outcome(classify(stored, envelope), stored=stored)
        assert step.decision is not APPLY
    else:
        assert _holds(dedup_update(envelope, NOW, step), stored)


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
        (STORED, env(1, 1, 9), Outcome(REFUSE, stored=STORED)),
        (STORED, env(2, 1, 12), Ahead(STORED)),
        (STORED, env(2, 2, 1), Ahead(STORED)),
        (None, env(2, 1, 12), Ahead(None)),  # the item went away in between
        (WITH_LATE, env(2, 1, 6), Late()),
        (WITH_LATE, env(1, 1, 6), Outcome(REFUSE, stored=WITH_LATE)),
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
