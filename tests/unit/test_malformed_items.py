"""Items that do not decode, or decode to something that cannot be run, cost only
themselves (docs/DESIGN.md §2.2): a connection item always decodes,
with what was missing or of the wrong type recorded, and the conditions match a
missing attribute as missing; a page row with more fields than this version knows is
read by its first fields; a session item without a state is reaped once it lapsed."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from lambdas.router.views import connection_view
from tests.support.stores import with_attributes
from tests.unit.expressions import attempt
from wsfleet import lease_rules, schema, session_rules
from wsfleet.checkpoint_page import decode_entries
from wsfleet.item import ConnectionItem, MalformedItemError, from_attributes
from wsfleet.protocol_specs import InvalidProtocolError, spec_from_item
from wsfleet.session_rules import SessionItem
from wsfleet.session_watch import SessionWatch
from wsfleet.timing import LeaseTiming

TIMING = LeaseTiming.from_lease(2.5)
NOW = 1_800_000_000_000


def stored(**attributes: Any) -> dict[str, Any]:
    """A connection item of a dead session's hold, as a worker and the router write it,
    with ``attributes`` changed (None removes one)."""
    item: dict[str, Any] = {
        "Pk": {"S": "CONN#c1"},
        "Sk": {"S": "CONN"},
        "desired_state": {"S": "STARTED"},
        "ws_url": {"S": "wss://feed.example/a"},
        "lease_owner": {"S": "dead"},
        "owner_session_gen": {"N": "3"},
        "owner_key": {"S": schema.owner_key("dead", 3, "c1")},
        "lease_epoch": {"N": "4"},
        "last_seq": {"N": "17"},
        "start_gen": {"N": "2"},
        "seq_gen": {"N": "1"},
    }
    return with_attributes(item, attributes)


# --- connection items ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("last_seq", {"S": "17"}, "last_seq is not an integer"),
        ("lease_epoch", {"M": {}}, "lease_epoch is not an integer"),
        ("seq_gen", {"N": "1.5"}, "seq_gen is not an integer"),
        ("owner_session_gen", {"S": "x"}, "owner_session_gen is not an integer"),
        ("protocol", {"N": "5"}, "protocol is not a string"),
        ("auth_secret", {"SS": ["a"]}, "auth_secret is not a string"),
        ("failing_since_ms", {"S": "soon"}, "failing_since_ms is not an integer"),
        ("start_gen", {"NULL": True}, "start_gen is not an integer"),
    ],
)
def test_an_attribute_of_the_wrong_type_is_recorded_not_raised(
    name: str, value: dict[str, Any], problem: str
) -> None:
    item = ConnectionItem.from_dynamodb(stored(**{name: value}))
    assert item.connection_id == "c1"
    assert item.problem == f"malformed item: {problem}"
    assert name in item.malformed
    assert ConnectionItem.from_dynamodb(stored()).problem is None


def test_missing_numbers_are_recorded_as_absent_with_their_defaults() -> None:
    item = ConnectionItem.from_dynamodb(stored(seq_gen=None, start_gen=None, last_seq=None))
    assert (item.seq_gen, item.start_gen, item.last_seq) == (0, 0, 0)
    assert item.absent == {schema.SEQ_GEN, schema.START_GEN, schema.LAST_SEQ}
    assert item.problem is None  # missing is not malformed: the conditions match it


def test_a_stored_protocol_that_is_not_a_string_is_an_invalid_protocol() -> None:
    with pytest.raises(InvalidProtocolError):
        spec_from_item(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "missing", [["seq_gen"], ["start_gen"], ["last_seq"], ["seq_gen", "start_gen", "last_seq"]]
)
def test_a_takeover_matches_missing_numbers_as_missing(missing: list[str]) -> None:
    raw = stored(**dict.fromkeys(missing))
    seen = ConnectionItem.from_dynamodb(raw)
    update = lease_rules.takeover_update(seen, "w2", 1, seen.last_seq, NOW, "t" * 16)
    after = attempt(update, raw)
    assert after is not None, update.condition_expression
    assert after["lease_owner"] == {"S": "w2"}
    # ... and the lease won on it releases and parks with conditions that match too.
    lease = lease_rules.lease_won(ConnectionItem.from_dynamodb(raw), "w2", 1)
    released = attempt(lease_rules.release_update(lease, 40, NOW), after)
    assert released is not None
    assert released["last_seq"] == {"N": "40"}
    parked = attempt(lease_rules.park_update(lease, 40, "HTTP 404 from upstream", NOW), after)
    assert parked is not None


def test_a_present_number_is_still_matched_by_value() -> None:
    raw = stored(seq_gen=None)
    seen = ConnectionItem.from_dynamodb(raw)
    update = lease_rules.takeover_update(seen, "w2", 1, 17, NOW, "t" * 16)
    assert attempt(update, stored(seq_gen={"N": "0"})) is None  # set since: changed
    assert attempt(update, stored(seq_gen=None, last_seq={"N": "18"})) is None


# --- checkpoint pages ------------------------------------------------------------------


def test_a_page_row_with_more_fields_than_this_version_knows_is_read_by_its_first_five() -> None:
    rows = [["c1", 4, 1, 90, 250, "a field of a newer version"], ["c2", 2, 0, 7, -1, {}, 3]]
    entries = decode_entries(zlib.compress(json.dumps(rows).encode()), NOW)
    assert (entries["c1"].epoch, entries["c1"].seq_gen, entries["c1"].seq) == (4, 1, 90)
    assert entries["c1"].advanced_at_ms == NOW - 250
    assert (entries["c2"].seq, entries["c2"].advanced_at_ms) == (7, None)


# --- session items ---------------------------------------------------------------------


def session(**attributes: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "Pk": {"S": schema.session_partition("w1")},
        "Sk": {"S": "w1#2"},
        "state": {"S": "ALIVE"},
        "expires_at_ms": {"N": str(NOW)},
        "started_at_ms": {"N": str(NOW - 60_000)},
    }
    return with_attributes(item, attributes)


def test_a_session_without_a_state_is_reaped_once_it_lapsed() -> None:
    raw = session(state=None, beat={"N": "7"})
    item = SessionItem.from_dynamodb(raw)
    watch = SessionWatch(TIMING)
    watch.observe([item], 100.0)
    assert not watch.lapsed(item, 100.0 + TIMING.expire_after - 0.001)
    assert watch.lapsed(item, 100.0 + TIMING.expire_after + 1e-9)
    reap = session_rules.reap_update("w2", NOW, item.beat, state_absent=item.state is None)
    after = attempt(reap, raw)
    assert after is not None
    assert from_attributes(after)["state"] == schema.DEAD
    # A renew never brings it back, and a reap never passes on a renewed one.
    assert attempt(session_rules.renew_update(NOW, TIMING, connections=0), raw) is None
    assert attempt(reap, session(state=None, beat={"N": "8"})) is None


def test_a_session_without_a_beat_is_reaped_as_such() -> None:
    """An item that lost its beat (a hand edit) is watched like any other: unchanged
    for the lease, it is reaped on condition that it still has none."""
    raw = session()
    item = SessionItem.from_dynamodb(raw)
    assert item.beat is None
    watch = SessionWatch(TIMING)
    watch.observe([item], 0.0)
    assert watch.lapsed(item, TIMING.expire_after)
    reap = session_rules.reap_update("w2", NOW, item.beat)
    assert attempt(reap, raw) is not None
    assert attempt(reap, session(beat={"N": "1"})) is None  # renewed meanwhile


def test_a_session_whose_beat_is_not_a_number_is_malformed() -> None:
    with pytest.raises(MalformedItemError, match="beat"):
        SessionItem.from_dynamodb(session(beat={"S": "x"}))


# --- what the router shows ---------------------------------------------------------------


def test_the_view_of_a_malformed_item_shows_its_problem_as_its_error() -> None:
    item = ConnectionItem.from_dynamodb(
        stored(lease_owner=None, owner_key=None, owner_session_gen=None, last_seq={"S": "x"})
    )
    view = connection_view(item, NOW)
    json.dumps(view)  # answerable
    assert view["status"] == "failed"
    assert view["last_error"] == "malformed item: last_seq is not an integer"
    assert view["last_seq"] == 0


def test_a_session_without_a_state_is_not_swept_before_it_is_reaped() -> None:
    """Its owner may still be handling until its fence deadline: only DEAD is swept."""
    stateless = SessionItem("w1", 2, None, NOW, reaped_at_ms=NOW, reaped_by="w2")
    assert not session_rules.may_sweep(stateless, "w2", 10.0, 0.0)
    assert session_rules.may_sweep(
        SessionItem("w1", 2, schema.DEAD, NOW, reaped_at_ms=NOW, reaped_by="w2"),
        "w2",
        0.0,
        0.0,
    )
