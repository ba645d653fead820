"""Malformed items against DynamoDB Local: a session item, a checkpoint page or a
connection item that does not decode, or cannot be run, costs only itself
(docs/DESIGN.md §2.2)."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from tests.support.stores import STORE_TIMING, T0, URL, won
from tests.support.timing import scaled
from wsfleet import lease_rules, schema
from wsfleet.checkpoint_page import PageEntry, page_item
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection, item_key
from wsfleet.lease_rules import AcquireRefusal, Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.session_rules import RenewRefusal
from wsfleet.session_store import SessionStore

pytestmark = pytest.mark.timeout(scaled(120))

TIMING = STORE_TIMING
LAPSED = T0 + TIMING.lease_ms + 1


@pytest.fixture
def sessions(ddb, table) -> SessionStore:
    return SessionStore(ddb, table, TIMING)


def put(ddb: Any, table: str, item: dict[str, Any]) -> None:
    ddb.put_item(TableName=table, Item=item)


def session_raw(sort_key: str, **attributes: Any) -> dict[str, Any]:
    worker = sort_key.rpartition("#")[0] or sort_key
    item: dict[str, Any] = {
        "Pk": {"S": schema.session_partition(worker)},
        "Sk": {"S": sort_key},
        "state": {"S": "ALIVE"},
        "expires_at_ms": {"N": str(T0 + TIMING.lease_ms)},
    }
    item.update(attributes)
    return item


def set_attributes(ddb: Any, table: str, connection_id: str, **values: Any) -> None:
    """Write typed ``values`` into a connection item (None removes the attribute)."""
    removed = [name for name, value in values.items() if value is None]
    kept = {name: value for name, value in values.items() if value is not None}
    parts = []
    if kept:
        parts.append("SET " + ", ".join(f"#{n} = :{n}" for n in kept))
    if removed:
        parts.append("REMOVE " + ", ".join(f"#{n}" for n in removed))
    args: dict[str, Any] = {
        "TableName": table,
        "Key": item_key(connection_id),
        "UpdateExpression": " ".join(parts),
        "ExpressionAttributeNames": {f"#{n}": n for n in values},
    }
    if kept:
        args["ExpressionAttributeValues"] = {f":{n}": v for n, v in kept.items()}
    ddb.update_item(**args)


def item_of(ddb: Any, table: str, connection_id: str) -> ConnectionItem:
    item = get_connection(ddb, table, connection_id)
    assert item is not None
    return item


# --- sessions and pages -------------------------------------------------------------------


def test_an_item_that_is_no_session_is_left_out_and_a_damaged_one_listed(ddb, table, sessions):
    assert sessions.open("w1", 1, T0, capacity=5)
    assert sessions.open("w2", 4, T0, capacity=5)
    for bad in (
        session_raw("no-generation"),
        session_raw("w9#x"),
        session_raw("w8#2", state={"N": "1"}),
        session_raw("w7#2", capacity={"S": "many"}),
        session_raw("w6#2", expires_at_ms={"S": "later"}),
    ):
        put(ddb, table, bad)
    listed = {s.key: s for s in sessions.list_sessions()}
    # No generation in the key: no connection can be owned by it. A damaged session
    # is still a session: listed, with what is damaged, never ALIVE by a damaged state.
    assert sorted(listed) == [("w1", 1), ("w2", 4), ("w6", 2), ("w7", 2), ("w8", 2)]
    assert [listed[k].problem is None for k in sorted(listed)] == [True, True, False, False, False]
    assert "capacity" in (listed[("w7", 2)].problem or "")
    assert listed[("w7", 2)].alive
    assert not listed[("w8", 2)].alive
    assert listed[("w8", 2)].reapable
    reported: list[str] = []
    sessions.list_sessions(lambda error: reported.append(error.key))
    assert len(reported) == 5
    assert all(key.startswith("SESSIONS#") for key in reported)


@pytest.mark.parametrize(
    "damage",
    [
        {"beat": {"S": "seven"}},
        {"started_at_ms": {"S": "then"}, "beat": {"S": "x"}},
        {"state": {"N": "1"}},
        {"state": {"S": "ZOMBIE"}},
    ],
    ids=["beat", "started and beat", "state a number", "state unknown"],
)
def test_a_damaged_session_is_reaped_on_its_damaged_values_as_stored(ddb, table, sessions, damage):
    assert sessions.open("w1", 1, T0, capacity=5)
    names = {f"#{n}": n for n in damage}
    ddb.update_item(
        TableName=table,
        Key={"Pk": {"S": schema.session_partition("w1")}, "Sk": {"S": "w1#1"}},
        UpdateExpression="SET " + ", ".join(f"#{n} = :{n}" for n in damage),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={f":{n}": v for n, v in damage.items()},
    )
    (listed,) = sessions.list_sessions()
    assert listed.problem is not None
    assert listed.reapable
    assert sessions.reap(listed, "reaper", LAPSED)
    found = sessions.get_session("w1", 1)
    assert found is not None
    assert (found.state, found.reaped_by) == (schema.DEAD, "reaper")
    assert not sessions.reap(listed, "another", LAPSED)  # once, as any reap


def test_a_renew_refused_with_an_undecodable_item_counts_as_reaped(ddb, table, sessions):
    put(ddb, table, session_raw("w1#1", state={"S": "DEAD"}, connections={"S": "x"}))
    assert sessions.renew("w1", 1, T0, connections=0) is RenewRefusal.REAPED


def test_a_renew_of_a_live_session_that_lost_its_expiry_still_lands(ddb, table, sessions):
    put(ddb, table, {k: v for k, v in session_raw("w1#1").items() if k != "expires_at_ms"})
    renewed = sessions.renew("w1", 1, T0, connections=0)
    assert not isinstance(renewed, RenewRefusal), renewed
    found = sessions.get_session("w1", 1)
    assert found is not None
    assert found.expires_at_ms == T0 + TIMING.lease_ms


def test_a_session_without_a_state_is_reaped_once_it_lapsed(ddb, table, sessions):
    put(ddb, table, {k: v for k, v in session_raw("w1#1").items() if k != "state"})
    (listed,) = sessions.list_sessions()
    assert sessions.reap(listed, "reaper", LAPSED)
    found = sessions.get_session("w1", 1)
    assert found is not None
    assert (found.state, found.reaped_by) == (schema.DEAD, "reaper")


def test_a_page_that_does_not_decode_reads_as_no_page(ddb, table, sessions):
    good = page_item("w1", 1, {"c1": PageEntry(3, 0, 40, T0)}, T0)
    truncated = dict(good, entries={"B": good["entries"]["B"][:-4]})
    put(ddb, table, truncated)
    assert sessions.read_page("w1", 1) is None
    reported: list[str] = []
    sessions.read_page("w1", 1, report=lambda error: reported.append(error.key))
    assert reported == ["PAGE#w1#1/PAGE"]
    # A newer version's rows, with a field more, are read by their first five.
    rows = [["c1", 3, 0, 40, 0, "newer"]]
    put(ddb, table, dict(good, entries={"B": zlib.compress(json.dumps(rows).encode())}))
    page = sessions.read_page("w1", 1)
    assert page is not None
    assert page.entries["c1"].seq == 40


# --- connection items ---------------------------------------------------------------------


def test_a_takeover_and_release_pass_on_an_item_missing_its_numbers(
    ddb, table, store: LeaseStore, control, sessions
):
    assert sessions.open("w1", 1, T0, capacity=5)
    for cid in ("one", "many"):
        control.start(cid, URL, T0)
        won(store.acquire(cid, "w1", 1, T0))
        set_attributes(ddb, table, cid, seq_gen=None, start_gen=None, last_seq=None)
    seen = {item.connection_id: item for item in store.owned_by("w1", 1)}
    assert seen["one"].absent == {schema.SEQ_GEN, schema.START_GEN, schema.LAST_SEQ}
    lease = won(store.take_over(seen["one"], "w2", 1, None, LAPSED))
    assert lease.epoch == 2
    released = store.release(lease, 9, LAPSED + 1)
    assert released.released
    assert released.checkpointed
    assert item_of(ddb, table, "one").last_seq == 9
    (result,) = store.take_over_many([seen["many"]], "w2", 1, None, LAPSED).values()
    assert won(result).epoch == 2
    parked = store.park(won(result), 4, "HTTP 404 from upstream", LAPSED + 1)
    assert parked.parked


def test_a_lease_won_on_a_malformed_item_is_parked_without_touching_it(
    ddb, table, store: LeaseStore, control
):
    control.start("bad-seq", URL, T0)
    set_attributes(ddb, table, "bad-seq", last_seq={"S": "seventeen"})
    lease = won(store.acquire("bad-seq", "w1", 1, T0))
    assert lease.malformed == "malformed item: last_seq is not an integer"
    assert store.park_malformed(lease, lease.malformed or "", T0 + 1).parked
    item = item_of(ddb, table, "bad-seq")
    assert item.parked_reason == "malformed item: last_seq is not an integer"
    assert item.lease_owner is None
    assert item.owner_key is None
    assert item.free_shard is None
    assert "last_seq" in item.malformed  # left as it was, for whoever looks into it


def test_a_free_item_whose_epoch_cannot_be_added_to_is_parked(
    ddb, table, store: LeaseStore, control
):
    control.start("bad-epoch", URL, T0)
    set_attributes(ddb, table, "bad-epoch", lease_epoch={"S": "4"})
    assert store.acquire("bad-epoch", "w1", 1, T0) is AcquireRefusal.PARKED
    item = item_of(ddb, table, "bad-epoch")
    assert item.parked_reason == "malformed item: lease_epoch is not an integer"
    assert item.free_shard is None
    assert item.lease_owner is None


def test_a_dead_sessions_malformed_entry_is_parked_in_place(
    ddb, table, store: LeaseStore, control, sessions
):
    assert sessions.open("w1", 1, T0, capacity=5)
    control.start("bad", URL, T0)
    won(store.acquire("bad", "w1", 1, T0))
    set_attributes(ddb, table, "bad", last_seq={"S": "x"})
    (seen,) = store.owned_by("w1", 1)
    assert seen.problem == "malformed item: last_seq is not an integer"
    assert store.park_seen(seen, seen.problem or "", LAPSED)
    item = item_of(ddb, table, "bad")
    assert item.parked_reason == seen.problem
    assert item.lease_owner is None
    assert item.owner_key is None
    assert not store.park_seen(seen, seen.problem or "", LAPSED)  # once


def test_the_listing_of_a_stray_with_a_malformed_entry_parks_it(
    ddb, table, store: LeaseStore, control
):
    control.start("stray", URL, T0)
    lease: Lease = won(store.acquire("stray", "w1", 1, T0))
    set_attributes(ddb, table, "stray", seq_gen={"S": "0"})
    page, _ = store.owned_page(schema.owner_key("w1", 1, "stray"), None, 100)
    assert [entry.problem for entry in page] == ["malformed item: seq_gen is not an integer"]
    held = lease_rules.lease_of_entry(page[0], lease.owner, 1)
    assert store.park_malformed(held, held.malformed or "", T0 + 1).parked
    assert item_of(ddb, table, "stray").parked_reason == page[0].problem


def test_a_protocol_that_is_not_a_string_is_recorded(ddb, table, store: LeaseStore, control):
    control.start("bad-protocol", URL, T0)
    set_attributes(ddb, table, "bad-protocol", protocol={"N": "5"})
    lease = won(store.acquire("bad-protocol", "w1", 1, T0))
    assert lease.malformed == "malformed item: protocol is not a string"
    assert lease.protocol is None
