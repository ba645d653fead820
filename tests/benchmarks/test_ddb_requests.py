"""The DynamoDB meter of benchmarks/ddb_requests.py: how it classifies calls, and the
units it computes by the billing rules for the real writes and reads of the session
design against DynamoDB Local, beside what DynamoDB Local reports."""

from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks import cost_model as cm
from benchmarks import ddb_requests as dr
from local_stack import services
from local_stack.fleet import CLIENT_CONFIG
from tests.support.timing import scaled
from wsfleet import lease_rules, schema, session_rules
from wsfleet.desired_state import DesiredStateStore
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(scaled(60))

TIMING = LeaseTiming.from_lease()


def _update(pk: str, expression: str) -> dict[str, Any]:
    return {"Key": {schema.PARTITION_KEY: {"S": pk}}, "UpdateExpression": expression}


def test_classify_session_and_page_writes() -> None:
    session = schema.session_partition("w")
    renew = session_rules.renew_update(0, TIMING, connections=3)
    acted = session_rules.renew_update(0, TIMING, connections=3, acted_on=["x stop 1"])
    with_capacity = session_rules.renew_update(0, TIMING, connections=3, capacity=500)
    reap = session_rules.reap_update("me", 0, 7)
    notice = session_rules.notice_update("x stop 1")
    assert dr.classify("UpdateItem", _update(session, renew.update_expression)) == dr.RENEW
    assert dr.classify("UpdateItem", _update(session, acted.update_expression)) == dr.RENEW
    assert dr.classify("UpdateItem", _update(session, with_capacity.update_expression)) == dr.RENEW
    assert dr.classify("UpdateItem", _update(session, reap.update_expression)) == dr.SESSION_END
    assert dr.classify("UpdateItem", _update(session, notice.update_expression)) == dr.NOTICE
    assert dr.classify("PutItem", {"Item": {"Pk": {"S": session}}}) == dr.SESSION_OPEN
    page = schema.page_key("w", 1)[schema.PARTITION_KEY]
    assert dr.classify("PutItem", {"Item": {"Pk": {"S": page}}}) == dr.PAGE
    assert dr.classify("DeleteItem", {"Key": {"Pk": {"S": page}}}) == dr.SESSION_END


def test_classify_connection_writes_by_their_rule() -> None:
    pk = schema.partition_key("abc")
    lease = Lease("abc", "me", 1, 1, "ws://x", 0, 1)
    acquire = lease_rules.acquire_update("abc", "me", 1, 0, "t")
    release = lease_rules.release_update(lease, 5, 0)
    park = lease_rules.park_update(lease, 5, "gone", 0)
    assert dr.classify("UpdateItem", _update(pk, acquire.update_expression)) == dr.ACQUIRE
    assert dr.classify("UpdateItem", _update(pk, release.update_expression)) == dr.RELEASE
    assert dr.classify("UpdateItem", _update(pk, park.update_expression)) == dr.CONNECTION_OTHER


def test_classify_reads() -> None:
    owner = {"IndexName": schema.OWNER_INDEX_NAME}
    assert dr.classify("Query", owner) == dr.OWNER_QUERY
    assert dr.classify("Query", {"IndexName": schema.UNOWNED_INDEX_NAME}) == dr.UNOWNED_QUERY
    sessions = {"ExpressionAttributeValues": {":pk": {"S": "SESSIONS#2"}}}
    assert dr.classify("Query", sessions) == dr.SESSION_LIST
    page = schema.page_key("w", 1)[schema.PARTITION_KEY]
    assert dr.classify("GetItem", {"Key": {"Pk": {"S": page}}}) == dr.PAGE_READ
    conn = schema.partition_key("abc")
    assert dr.classify("GetItem", {"Key": {"Pk": {"S": conn}}}) == dr.CONNECTION_READ


@pytest.fixture
def metered(dynamodb_endpoint: str):
    """A client with the meter on it, and the meter (its own reads on another client)."""
    client = services.local_client("dynamodb", dynamodb_endpoint, config=CLIENT_CONFIG)
    inspector = services.local_client("dynamodb", dynamodb_endpoint, config=CLIENT_CONFIG)
    meter = dr.Meter(inspector)
    meter.register(client)
    yield client, meter
    client.close()
    inspector.close()


def per_call(tally: dr.Tally, kind: str, source: str) -> float:
    return tally.units(kind, source) / tally.get(kind, "calls")


def test_the_session_designs_calls_metered_against_dynamodb_local(
    metered: tuple[Any, dr.Meter], table: str
) -> None:
    client, meter = metered
    now = int(time.time() * 1000)
    sessions = SessionStore(client, table, TIMING)
    leases = LeaseStore(client, table, TIMING)
    router = DesiredStateStore(client, table)
    assert sessions.open("w1", 1, now, 500)
    for n in range(3):
        assert not isinstance(
            sessions.renew("w1", 1, now + n + 1, connections=500), session_rules.RenewRefusal
        )
    ids = cm.uuid_hex_ids(6, seed=7)
    for cid in ids:
        router.start(cid, f"wss://stream.example.com/{cid}", now)
        assert isinstance(leases.acquire(cid, "w1", 1, now), Lease)
    entries = cm.page_entries(500)
    assert sessions.write_page("w1", 1, entries, now + 10, 1)
    assert sessions.write_page("w1", 1, entries, now + 20, 2)
    assert not sessions.write_page("w1", 1, entries, now + 5, 1)  # an older page: refused
    assert len(sessions.list_sessions()) == 1
    owned = leases.owned_by("w1", 1)
    assert len(owned) == 6
    assert leases.find_unowned(schema.free_shards()[:2], 10) == []
    # A held connection refuses another session's acquire: a failed condition.
    assert isinstance(leases.acquire(ids[0], "w2", 1, now), lease_rules.AcquireRefusal)
    taken = leases.take_over(owned[0], "w2", 1, None, now)
    assert isinstance(taken, Lease)
    assert leases.release(taken, taken.last_seq, now).released
    tally = meter.snapshot()

    # Writes: the billing rules and DynamoDB Local agree, kind by kind.
    page_units = cm.write_units(cm.item_size(cm.page_item_of(500)))
    assert page_units == 13
    expected = {dr.RENEW: 1, dr.SESSION_OPEN: 1, dr.TAKEOVER: 3, dr.RELEASE: 3}
    for kind, units in expected.items():
        assert per_call(tally, kind, "computed") == units, kind
        assert tally.units(kind, "consumed") == tally.units(kind, "computed"), kind
    assert tally.get(dr.PAGE, "calls") == 3
    assert tally.get(dr.PAGE, "failed") == 1
    # Two puts of 13 units; the refused one is billed on the page that is there.
    assert tally.units(dr.PAGE, "computed") == 3 * page_units
    assert tally.units(dr.PAGE, "consumed") == 2 * page_units  # Local reports no failure
    # Six acquires of 3 units (table, by-owner put, unowned delete) and a refused one.
    assert tally.get(dr.ACQUIRE, "calls") == 7
    assert tally.get(dr.ACQUIRE, "failed") == 1
    assert tally.units(dr.ACQUIRE, "computed") == 6 * 3 + 1
    assert tally.units(dr.ACQUIRE, "consumed") == 6 * 3
    assert [p.entries for p in meter.pages] == [500, 500]
    assert [p.units for p in meter.pages] == [page_units, page_units]
    # Index entries, per index.
    assert tally.get(dr.TAKEOVER, f"computed:{schema.OWNER_INDEX_NAME}") == 2
    assert tally.get(dr.ACQUIRE, f"computed:{schema.UNOWNED_INDEX_NAME}") == 6

    # Reads: a non-empty query agrees; an empty one is 0.5 by the rules, 0 in Local.
    shards = {schema.shard_of(cid, schema.OWNER_SHARDS) for cid in ids}
    assert tally.units(dr.OWNER_QUERY, "computed") == schema.OWNER_SHARDS * 0.5
    assert tally.units(dr.OWNER_QUERY, "consumed") == len(shards) * 0.5
    assert tally.units(dr.UNOWNED_QUERY, "computed") == 2 * 0.5
    assert tally.units(dr.UNOWNED_QUERY, "consumed") == 0.0
    listing = tally.units(dr.SESSION_LIST, "computed")
    assert listing == schema.SESSION_SHARDS * 0.5
    assert tally.units(dr.SESSION_LIST, "consumed") == 0.5  # three empty partitions: 0
    assert tally.get(dr.RENEW, "errors") == 0
