"""The worker's version on its session item, against DynamoDB Local: written by the
open, kept by the renews, shown for a connection's owner, and small enough that a
renew still costs one write unit."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from lambdas.router.owners import OwnerReader
from lambdas.router.views import connection_view
from tests.support.stores import STORE_TIMING, T0, URL, won
from wsfleet import schema, session_rules
from wsfleet.desired_state import DesiredStateStore
from wsfleet.item import from_attributes, to_attribute
from wsfleet.item_io import get_connection
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore
from wsfleet.version import VERSION

# A worker id as long as a Fargate task's: host name, pid and six hex digits.
WORKER_ID = "ip-172-31-100-200.eu-west-1.compute.internal-4711-3fa9c2"
ONE_KB = 1024


def item_size(raw: dict[str, Any]) -> int:
    """DynamoDB's size of an item, in bytes: each attribute's name plus its value
    (strings and binaries by length, numbers at most 21 bytes, sets and lists summed
    with 3 bytes of overhead and 1 per element)."""

    def value_size(typed: dict[str, Any]) -> int:
        (kind, value), *_ = typed.items()
        if kind == "S":
            return len(value.encode())
        if kind == "B":
            return len(value)
        if kind == "N":
            digits = Decimal(value).as_tuple().digits
            return min(21, (len(digits) + 1) // 2 + 1)
        if kind in ("BOOL", "NULL"):
            return 1
        if kind == "SS":
            return 3 + sum(len(v.encode()) + 1 for v in value)
        if kind == "L":
            return 3 + sum(value_size(v) + 1 for v in value)
        if kind == "M":
            return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in value.items())
        raise AssertionError(f"no size rule for {kind}")

    return sum(len(name.encode()) + value_size(value) for name, value in raw.items())


@pytest.fixture
def sessions(ddb, table) -> SessionStore:
    return SessionStore(ddb, table, STORE_TIMING)


def raw_session(ddb, table: str, worker_id: str, gen: int = 1) -> dict[str, Any]:
    key = {k: to_attribute(v) for k, v in schema.session_key(worker_id, gen).items()}
    item: dict[str, Any] = ddb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    return item


def test_the_open_writes_the_version_and_the_renews_keep_it(ddb, table, sessions) -> None:
    assert sessions.open(WORKER_ID, 1, T0, capacity=500)
    assert from_attributes(raw_session(ddb, table, WORKER_ID))[schema.SESSION_VERSION] == VERSION
    for n in range(1, 4):
        renewed = sessions.renew(WORKER_ID, 1, T0 + n * 600, connections=n, capacity=500)
        assert not isinstance(renewed, session_rules.RenewRefusal)
    session = sessions.get_session(WORKER_ID, 1)
    assert session is not None
    assert session.version == VERSION


def test_a_renew_of_a_versioned_session_still_costs_one_write_unit(ddb, table, sessions) -> None:
    assert sessions.open(WORKER_ID, 1, T0, capacity=500)
    raw = raw_session(ddb, table, WORKER_ID)
    without = {k: v for k, v in raw.items() if k != schema.SESSION_VERSION}
    # The figures of README.md, "Versions": the item with and without the version.
    assert item_size(without) < item_size(raw) == item_size(without) + len("version") + len(VERSION)
    assert item_size(raw) < ONE_KB // 4
    update = session_rules.renew_update(
        T0 + 600, STORE_TIMING, connections=500, acted_on=(), capacity=500
    )
    key = {k: to_attribute(v) for k, v in schema.session_key(WORKER_ID, 1).items()}
    answer = ddb.update_item(
        TableName=table, Key=key, ReturnConsumedCapacity="TOTAL", **update.as_kwargs()
    )
    assert answer["ConsumedCapacity"]["CapacityUnits"] == 1.0


def test_a_session_an_older_worker_opened_reads_without_a_version(ddb, table, sessions) -> None:
    assert sessions.open(WORKER_ID, 1, T0, capacity=500)
    key = {k: to_attribute(v) for k, v in schema.session_key(WORKER_ID, 1).items()}
    ddb.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="REMOVE #v",
        ExpressionAttributeNames={"#v": schema.SESSION_VERSION},
    )
    session = sessions.get_session(WORKER_ID, 1)
    assert session is not None
    assert (session.version, session.alive) == (None, True)


def test_a_version_of_the_wrong_type_is_shown_as_none_and_never_makes_the_item_malformed(
    ddb, table, sessions
) -> None:
    assert sessions.open(WORKER_ID, 1, T0, capacity=500)
    key = {k: to_attribute(v) for k, v in schema.session_key(WORKER_ID, 1).items()}
    ddb.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET #v = :v",
        ExpressionAttributeNames={"#v": schema.SESSION_VERSION},
        ExpressionAttributeValues={":v": {"N": "7"}},
    )
    session = sessions.get_session(WORKER_ID, 1)
    assert session is not None
    assert session.version is None


def test_the_connection_view_shows_the_owners_version(ddb, table, sessions) -> None:
    store = LeaseStore(ddb, table, STORE_TIMING)
    DesiredStateStore(ddb, table).start("c-1", URL, T0)
    assert sessions.open(WORKER_ID, 1, T0, capacity=500)
    won(store.acquire("c-1", WORKER_ID, 1, T0))
    item = get_connection(ddb, table, "c-1")
    assert item is not None
    view = connection_view(item, T0 + 100, OwnerReader(ddb, table).records_of(item))
    assert (view["owner"], view["owner_session_state"], view["owner_version"]) == (
        WORKER_ID,
        "ALIVE",
        VERSION,
    )

    DesiredStateStore(ddb, table).start("c-2", URL, T0)
    free = get_connection(ddb, table, "c-2")
    assert free is not None
    assert connection_view(free, T0 + 100)["owner_version"] is None
