"""The unordered mode's pure part: a message's key, the put that applies it (its
condition evaluated by the expression evaluator, ``tests.unit.expressions``), its
expiry, and what a stored item says about an envelope."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.expressions import holds
from wsfleet.deduper import (
    EXPIRES_AT,
    PARTITION_KEY,
    RETENTION_SECONDS,
    Decision,
    DedupStateError,
    Outcome,
    Position,
    copy_position,
    expires_at,
    message_id,
    message_key,
    message_outcome,
    message_put,
)
from wsfleet.envelope import MAX_NUMBER, Envelope
from wsfleet.schema import is_valid_connection_id

NOW = 1_767_225_600_000
CID = "btc-eth"
APPLY, SKIP = Decision.APPLY, Decision.SKIP


def env(epoch: int, seq_gen: int, seq: int, *, cid: str = CID, prev: int | None = None) -> Envelope:
    return Envelope(cid, epoch, seq_gen, seq, NOW - 5, {"p": seq}, prev_seq=prev)


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ((CID, 0, 1), "btc-eth#0#1"),
        (("a", 12, 345), "a#12#345"),
        (("x.y:z_1-2", MAX_NUMBER, 0), f"x.y:z_1-2#{MAX_NUMBER}#0"),
    ],
)
def test_a_message_is_keyed_by_its_identity(parts, expected):
    assert message_id(*parts) == expected
    assert message_key(env(1, parts[1], parts[2], cid=parts[0])) == {PARTITION_KEY: {"S": expected}}
    assert not is_valid_connection_id(expected)  # never a connection's item


CONNECTION_IDS = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-",
    min_size=1,
    max_size=128,
)
NUMBERS = st.integers(0, MAX_NUMBER)


@settings(max_examples=300)
@given(cid=CONNECTION_IDS, seq_gen=NUMBERS, seq=NUMBERS)
def test_a_message_key_reads_back_as_its_identity(cid, seq_gen, seq):
    """No two identities share a key: the connection id holds no ``#``."""
    assert is_valid_connection_id(cid)
    key = message_id(cid, seq_gen, seq)
    assert not is_valid_connection_id(key)
    back_cid, back_gen, back_seq = key.rsplit("#", 2)
    assert (back_cid, int(back_gen), int(back_seq)) == (cid, seq_gen, seq)


@pytest.mark.parametrize(
    ("now_ms", "retention", "expected"),
    [
        (NOW, RETENTION_SECONDS, NOW // 1000 + 14 * 24 * 3600),
        (NOW, 1, NOW // 1000 + 1),
        (NOW + 1, 60, NOW // 1000 + 61),  # a part of a second counts as a whole one
        (NOW + 999, 60, NOW // 1000 + 61),
        (NOW + 1000, 60, NOW // 1000 + 61),
        (0, 5, 5),
    ],
)
def test_an_item_expires_the_retention_after_it_was_applied(now_ms, retention, expected):
    assert expires_at(now_ms, retention) == expected


def test_the_put_writes_the_messages_item():
    put = message_put(env(3, 2, 9, prev=8), NOW, 3600)
    assert put["Item"] == {
        PARTITION_KEY: {"S": "btc-eth#2#9"},
        "epoch": {"N": "3"},
        "received_at_ms": {"N": str(NOW - 5)},
        "applied_at_ms": {"N": str(NOW)},
        EXPIRES_AT: {"N": str(NOW // 1000 + 3600)},
    }


def _holds(put: dict[str, Any], stored: dict[str, Any] | None) -> bool:
    return holds(
        put["ConditionExpression"],
        stored,
        put["ExpressionAttributeNames"],
        put.get("ExpressionAttributeValues", {}),
    )


ITEMS = [
    None,
    message_put(env(1, 0, 1), NOW, 60)["Item"],  # the same message, another owner's copy
    message_put(env(7, 0, 1), NOW - 10**9, 1)["Item"],  # applied long ago, expired
    {PARTITION_KEY: {"S": "btc-eth#0#1"}},  # a bare key
]


@pytest.mark.parametrize("stored", ITEMS)
@pytest.mark.parametrize("envelope", [env(1, 0, 1), env(2, 0, 1), env(2, 0, 1, prev=0)])
def test_the_put_passes_exactly_when_the_message_has_no_item(stored, envelope):
    """Whatever the copy and whatever the item holds (an expired one included: TTL
    has not deleted it yet), only the absence of the item lets it pass."""
    assert _holds(message_put(envelope, NOW, RETENTION_SECONDS), stored) is (stored is None)


@pytest.mark.parametrize(
    ("item", "envelope", "outcome"),
    [
        (None, env(1, 0, 1), Outcome(APPLY)),
        ({}, env(1, 0, 1), Outcome(APPLY)),
        (ITEMS[1], env(2, 0, 1), Outcome(SKIP, stored=Position(1, 0, 1))),
        (ITEMS[1], env(1, 0, 1, prev=0), Outcome(SKIP, stored=Position(1, 0, 1))),
        (ITEMS[2], env(3, 0, 1), Outcome(SKIP, stored=Position(7, 0, 1))),
        (
            message_put(env(2, 5, 40), NOW, 60)["Item"],
            env(9, 5, 40),
            Outcome(SKIP, stored=Position(2, 5, 40)),
        ),
    ],
)
def test_a_stored_item_makes_a_copy(item, envelope, outcome):
    assert message_outcome(item, envelope) == outcome
    assert copy_position(item, envelope) == outcome.stored


@pytest.mark.parametrize(
    "epoch",
    [None, {"S": "1"}, {"N": "-1"}, {"N": "1.5"}, "1"],
)
def test_a_stored_item_whose_epoch_is_no_whole_number_is_refused(epoch):
    item: dict[str, Any] = {PARTITION_KEY: {"S": "btc-eth#0#1"}}
    if epoch is not None:
        item["epoch"] = epoch
    with pytest.raises(DedupStateError, match="epoch must be a whole number"):
        message_outcome(item, env(1, 0, 1))
