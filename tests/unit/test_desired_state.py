import itertools

import pytest
from botocore.exceptions import ClientError

from tests.unit.expressions import attempt_kwargs
from wsfleet.desired_state import (
    DesiredStateStore,
    StartContendedError,
    StartOutcome,
    StartVariant,
    start_failure,
    start_update,
    stop_update,
)
from wsfleet.item import ConnectionItem, to_attribute


def failed(item: dict | None) -> ClientError:
    response = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "no"}}
    if item is not None:
        response["Item"] = {k: to_attribute(v) for k, v in item.items()}
    return ClientError(response, "UpdateItem")


class FlippingClient:
    """Every write fails: the item flips between STOPPED-with-another-URL and gone,
    as if other callers kept stopping, deleting and restarting it."""

    def __init__(self) -> None:
        self.calls = 0
        self._olds = itertools.cycle(
            [{"Pk": "CONN#c", "desired_state": "STOPPED", "ws_url": "wss://other"}, None]
        )

    def update_item(self, **kwargs):
        self.calls += 1
        raise failed(next(self._olds))


def test_a_start_that_keeps_losing_races_gives_up_with_a_domain_error():
    client = FlippingClient()
    store = DesiredStateStore(client, "t")  # type: ignore[arg-type]
    with pytest.raises(StartContendedError):
        store.start("c", "wss://mine", 1)
    assert client.calls == 4


def item(**fields) -> ConnectionItem:
    return ConnectionItem(connection_id="c", desired_state="STARTED", ws_url="wss://a", **fields)


def stopped(**fields) -> ConnectionItem:
    return ConnectionItem(connection_id="c", desired_state="STOPPED", ws_url="wss://a", **fields)


PARKED = {"parked_reason": "HTTP 404 from upstream", "parked_at_ms": 3}
OWNED = {"lease_owner": "w1", "owner_session_gen": 4}


@pytest.mark.parametrize(
    ("old", "url", "expected"),
    [
        (None, "wss://a", StartVariant()),
        (item(), "wss://a", StartOutcome.ALREADY_STARTED),
        (item(), "wss://b", StartOutcome.CONFLICT),
        (item(**OWNED), "wss://a", StartOutcome.ALREADY_STARTED),
        (item(**OWNED), "wss://b", StartOutcome.CONFLICT),
        (stopped(), "wss://a", StartVariant()),
        (stopped(), "wss://b", StartVariant(url_changed=True)),
        # stopped, but its owner has not let go yet: the owned variant
        (stopped(**OWNED), "wss://a", StartVariant(owned=True)),
        (stopped(**OWNED), "wss://b", StartVariant(url_changed=True, owned=True)),
        # A parked connection is re-armed, STARTED or STOPPED, for any URL.
        (item(**PARKED), "wss://a", StartVariant(rearm=True)),
        (item(**PARKED), "wss://b", StartVariant(url_changed=True, rearm=True)),
        (stopped(**PARKED), "wss://a", StartVariant(rearm=True)),
        (stopped(**PARKED), "wss://b", StartVariant(url_changed=True, rearm=True)),
    ],
)
def test_start_failure_decisions(old, url, expected):
    assert start_failure(old, url) == expected


# --- the writes, run against items (tests/unit/expressions.py) ----------------------------

NOW = 5_000
# crc32("c1") % 8 == 1
FREE = {"S": "FREE#1"}


def raw(**fields) -> dict:
    """A stored connection item ``c1``; a field given as None is left out."""
    base = {
        "Pk": "CONN#c1",
        "Sk": "CONN",
        "desired_state": "STOPPED",
        "ws_url": "wss://a",
        "lease_epoch": 3,
        "last_seq": 40,
        "start_gen": 2,
        "seq_gen": 1,
        "created_at_ms": 1,
        "expires_at": 99,
    }
    return {k: to_attribute(v) for k, v in (base | fields).items() if v is not None}


def start(url: str = "wss://a", *, url_changed: bool = False, **variant) -> dict:
    return start_update(url, NOW, connection_id="c1", url_changed=url_changed, **variant)


OWNER_FIELDS = {"lease_owner": "w1", "owner_session_gen": 4, "owner_key": "w1#4#1"}


@pytest.mark.parametrize(
    ("variant", "stored", "passes"),
    [
        # unowned, same URL: create, or restart a STOPPED one that nobody owns
        ({}, None, True),
        ({}, raw(), True),
        ({}, raw(**OWNER_FIELDS), False),
        ({}, raw(desired_state="STARTED"), False),
        ({}, raw(ws_url="wss://b"), False),
        ({}, raw(parked_reason="x"), False),
        # owned, same URL: only a STOPPED one whose owner is still there
        ({"owned": True}, raw(**OWNER_FIELDS), True),
        ({"owned": True}, raw(), False),
        ({"owned": True}, None, False),
        ({"owned": True}, raw(desired_state="STARTED", **OWNER_FIELDS), False),
        # a new URL
        ({"url_changed": True}, raw(ws_url="wss://b"), True),
        ({"url_changed": True}, raw(ws_url="wss://b", **OWNER_FIELDS), False),
        ({"url_changed": True}, raw(), False),
        ({"url_changed": True}, None, False),
        ({"url_changed": True, "owned": True}, raw(ws_url="wss://b", **OWNER_FIELDS), True),
        ({"url_changed": True, "owned": True}, raw(ws_url="wss://b"), False),
        # re-arming a parked one (a parked item has no owner)
        ({"rearm": True}, raw(parked_reason="x", desired_state="STARTED"), True),
        ({"rearm": True}, raw(parked_reason="x"), True),
        ({"rearm": True}, raw(), False),
        ({"rearm": True}, raw(parked_reason="x", ws_url="wss://b"), False),
        ({"rearm": True, "url_changed": True}, raw(parked_reason="x", ws_url="wss://b"), True),
    ],
)
def test_each_start_variant_takes_exactly_its_items(variant, stored, passes):
    new = attempt_kwargs(start(**variant), stored)
    assert (new is not None) is passes
    if new is None:
        return
    owned = variant.get("owned", False)
    # In the unowned index exactly when nobody owns it; the owner, if any, stays.
    assert new.get("free_shard") == (None if owned else FREE)
    assert ("lease_owner" in new) is owned
    assert new["desired_state"] == {"S": "STARTED"}
    assert new["ws_url"] == {"S": "wss://a"}
    assert "expires_at" not in new  # no TTL while STARTED
    assert not {"parked_reason", "parked_at_ms", "failing_since_ms"} & set(new)


def test_a_created_connection():
    assert attempt_kwargs(start(), None) == {
        "desired_state": {"S": "STARTED"},
        "ws_url": {"S": "wss://a"},
        "lease_epoch": {"N": "0"},
        "created_at_ms": {"N": str(NOW)},
        "updated_at_ms": {"N": str(NOW)},
        "last_seq": {"N": "0"},
        "seq_gen": {"N": "0"},
        "free_shard": FREE,
        "start_gen": {"N": "1"},
    }


@pytest.mark.parametrize("owned", [False, True])
def test_a_restart_with_the_same_url_keeps_the_checkpoint(owned):
    stored = raw(**(OWNER_FIELDS if owned else {}))
    new = attempt_kwargs(start(owned=owned), stored)
    assert new is not None
    assert (new["last_seq"], new["seq_gen"], new["start_gen"]) == (
        {"N": "40"},
        {"N": "1"},
        {"N": "3"},
    )
    assert (new["lease_epoch"], new["created_at_ms"]) == ({"N": "3"}, {"N": "1"})


@pytest.mark.parametrize("owned", [False, True])
def test_a_restart_with_a_new_url_resets_the_checkpoint_and_bumps_seq_gen(owned):
    stored = raw(ws_url="wss://b", **(OWNER_FIELDS if owned else {}))
    new = attempt_kwargs(start(url_changed=True, owned=owned), stored)
    assert new is not None
    assert (new["last_seq"], new["seq_gen"], new["start_gen"]) == (
        {"N": "0"},
        {"N": "2"},
        {"N": "3"},
    )


def test_rearming_clears_every_mark():
    stored = raw(parked_reason="x", parked_at_ms=7, failing_since_ms=6, desired_state="STARTED")
    new = attempt_kwargs(start(rearm=True), stored)
    assert new is not None
    assert not {"parked_reason", "parked_at_ms", "failing_since_ms", "expires_at"} & set(new)
    assert new["free_shard"] == FREE


@pytest.mark.parametrize(
    "variant",
    [{}, {"url_changed": True}, {"rearm": True}, {"rearm": True, "url_changed": True}],
)
def test_an_unowned_start_names_the_free_shard_and_requires_no_owner(variant):
    update = start(**variant)
    assert update["ExpressionAttributeNames"]["#free"] == "free_shard"
    assert update["ExpressionAttributeValues"][":free"] == FREE
    assert "#free = :free" in update["UpdateExpression"]
    assert "AND attribute_not_exists(#owner)" in update["ConditionExpression"]
    assert "attribute_exists(#owner)" not in update["ConditionExpression"]


@pytest.mark.parametrize(
    "variant",
    [{"owned": True}, {"owned": True, "url_changed": True}],
)
def test_an_owned_start_leaves_the_unowned_index_alone_and_requires_the_owner(variant):
    update = start(**variant)
    assert "#free" not in update["ExpressionAttributeNames"]
    assert ":free" not in update["ExpressionAttributeValues"]
    assert "#free" not in update["UpdateExpression"]
    assert update["ConditionExpression"].endswith(" AND attribute_exists(#owner)")


def test_the_start_conditions_exactly():
    assert start()["ConditionExpression"] == (
        "attribute_not_exists(#pk) OR (#state = :stopped AND #url = :url"
        " AND attribute_not_exists(#parked) AND attribute_not_exists(#owner))"
    )
    assert start(owned=True)["ConditionExpression"] == (
        "#state = :stopped AND #url = :url AND attribute_not_exists(#parked)"
        " AND attribute_exists(#owner)"
    )
    assert start(url_changed=True)["ConditionExpression"] == (
        "#state = :stopped AND #url <> :url AND attribute_not_exists(#parked)"
        " AND attribute_not_exists(#owner)"
    )
    assert start(rearm=True)["ConditionExpression"] == (
        "attribute_exists(#parked) AND #url = :url AND attribute_not_exists(#owner)"
    )
    assert start(rearm=True, url_changed=True)["ConditionExpression"] == (
        "attribute_exists(#parked) AND #url <> :url AND attribute_not_exists(#owner)"
    )


def test_stop_update_exactly():
    assert stop_update(NOW, ttl_seconds=60) == {
        "UpdateExpression": "SET #state = :stopped, #updated = :now, #ttl = :ttl REMOVE #free",
        "ConditionExpression": "attribute_exists(#pk)",
        "ExpressionAttributeNames": {
            "#pk": "Pk",
            "#free": "free_shard",
            "#state": "desired_state",
            "#updated": "updated_at_ms",
            "#ttl": "expires_at",
        },
        "ExpressionAttributeValues": {
            ":stopped": {"S": "STOPPED"},
            ":now": {"N": str(NOW)},
            ":ttl": {"N": str(NOW // 1000 + 60)},
        },
    }


@pytest.mark.parametrize(
    "stored",
    [
        raw(desired_state="STARTED", free_shard="FREE#1"),
        raw(desired_state="STARTED", **OWNER_FIELDS),
        raw(),
    ],
)
def test_a_stop_takes_the_connection_out_of_the_unowned_index(stored):
    new = attempt_kwargs(stop_update(NOW), stored)
    assert new is not None
    assert "free_shard" not in new
    assert new["desired_state"] == {"S": "STOPPED"}
    assert new["expires_at"] == {"N": str(NOW // 1000 + 7 * 24 * 3600)}
    assert new.get("lease_owner") == stored.get("lease_owner")  # the owner lets go itself


def test_a_stop_of_an_unknown_connection_writes_nothing():
    assert attempt_kwargs(stop_update(NOW), None) is None
