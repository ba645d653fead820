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
# Protocols as stored (ProtocolSpec.to_item) and secret references.
P1 = '{"name":"json-seq","options":{}}'
P2 = '{"name":"live","options":{}}'
S1 = "websocket-fleet/feeds/a"
S2 = "websocket-fleet/feeds/b"


@pytest.mark.parametrize(
    ("old", "url", "expected"),
    [
        (None, "wss://a", StartVariant()),
        (item(), "wss://a", StartOutcome.ALREADY_STARTED),
        (item(), "wss://b", StartOutcome.CONFLICT),
        (item(**OWNED), "wss://a", StartOutcome.ALREADY_STARTED),
        (item(**OWNED), "wss://b", StartOutcome.CONFLICT),
        (stopped(), "wss://a", StartVariant()),
        (stopped(), "wss://b", StartVariant(stream_changed=True)),
        # stopped, but its owner has not let go yet: the owned variant
        (stopped(**OWNED), "wss://a", StartVariant(owned=True)),
        (stopped(**OWNED), "wss://b", StartVariant(stream_changed=True, owned=True)),
        # A parked connection is re-armed, STARTED or STOPPED, for any URL.
        (item(**PARKED), "wss://a", StartVariant(rearm=True)),
        (item(**PARKED), "wss://b", StartVariant(stream_changed=True, rearm=True)),
        (stopped(**PARKED), "wss://a", StartVariant(rearm=True)),
        (stopped(**PARKED), "wss://b", StartVariant(stream_changed=True, rearm=True)),
    ],
)
def test_start_failure_decisions(old, url, expected):
    assert start_failure(old, url) == expected


@pytest.mark.parametrize(
    ("old", "asked", "expected"),
    [
        # STARTED (not parked): the whole triple (URL, protocol, auth) decides
        (item(protocol=P1, auth_secret=S1), ("wss://a", P1, S1), StartOutcome.ALREADY_STARTED),
        (item(protocol=P1, auth_secret=S1), ("wss://b", P1, S1), StartOutcome.CONFLICT),
        (item(protocol=P1, auth_secret=S1), ("wss://a", P2, S1), StartOutcome.CONFLICT),
        (item(protocol=P1, auth_secret=S1), ("wss://a", None, S1), StartOutcome.CONFLICT),
        (item(protocol=P1, auth_secret=S1), ("wss://a", P1, S2), StartOutcome.CONFLICT),
        (item(protocol=P1, auth_secret=S1), ("wss://a", P1, None), StartOutcome.CONFLICT),
        (item(), ("wss://a", P1, None), StartOutcome.CONFLICT),
        (item(), ("wss://a", None, S1), StartOutcome.CONFLICT),
        (item(**OWNED, protocol=P1), ("wss://a", P1, None), StartOutcome.ALREADY_STARTED),
        (item(**OWNED, auth_secret=S1), ("wss://a", None, S2), StartOutcome.CONFLICT),
        # STOPPED: restarted with any triple; the stream (URL, protocol) decides the reset
        (stopped(protocol=P1, auth_secret=S1), ("wss://a", P1, S1), StartVariant()),
        (stopped(protocol=P1, auth_secret=S1), ("wss://a", P1, S2), StartVariant()),
        (stopped(protocol=P1, auth_secret=S1), ("wss://a", P1, None), StartVariant()),
        (stopped(), ("wss://a", None, S1), StartVariant()),
        (stopped(protocol=P1), ("wss://a", P2, None), StartVariant(stream_changed=True)),
        (stopped(protocol=P1), ("wss://a", None, None), StartVariant(stream_changed=True)),
        (stopped(), ("wss://a", P1, None), StartVariant(stream_changed=True)),
        (stopped(protocol=P1), ("wss://b", P1, None), StartVariant(stream_changed=True)),
        (
            stopped(**OWNED, protocol=P1),
            ("wss://a", P2, S1),
            StartVariant(stream_changed=True, owned=True),
        ),
        (stopped(**OWNED, protocol=P1), ("wss://a", P1, S2), StartVariant(owned=True)),
        # parked, STARTED or not: re-armed with any triple; the stream decides the reset
        (
            item(**PARKED, protocol=P1, auth_secret=S1),
            ("wss://a", P1, S2),
            StartVariant(rearm=True),
        ),
        (
            item(**PARKED, protocol=P1),
            ("wss://a", P2, None),
            StartVariant(stream_changed=True, rearm=True),
        ),
        (stopped(**PARKED), ("wss://a", P1, S1), StartVariant(stream_changed=True, rearm=True)),
    ],
)
def test_start_failure_decides_on_the_triple(old, asked, expected):
    url, protocol, auth = asked
    assert start_failure(old, url, protocol=protocol, auth_secret=auth) == expected


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


def start(url: str = "wss://a", *, stream_changed: bool = False, **variant) -> dict:
    return start_update(url, NOW, connection_id="c1", stream_changed=stream_changed, **variant)


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
        ({"stream_changed": True}, raw(ws_url="wss://b"), True),
        ({"stream_changed": True}, raw(ws_url="wss://b", **OWNER_FIELDS), False),
        ({"stream_changed": True}, raw(), False),
        ({"stream_changed": True}, None, False),
        ({"stream_changed": True, "owned": True}, raw(ws_url="wss://b", **OWNER_FIELDS), True),
        ({"stream_changed": True, "owned": True}, raw(ws_url="wss://b"), False),
        # re-arming a parked one (a parked item has no owner)
        ({"rearm": True}, raw(parked_reason="x", desired_state="STARTED"), True),
        ({"rearm": True}, raw(parked_reason="x"), True),
        ({"rearm": True}, raw(), False),
        ({"rearm": True}, raw(parked_reason="x", ws_url="wss://b"), False),
        ({"rearm": True, "stream_changed": True}, raw(parked_reason="x", ws_url="wss://b"), True),
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
    new = attempt_kwargs(start(stream_changed=True, owned=owned), stored)
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
    [{}, {"stream_changed": True}, {"rearm": True}, {"rearm": True, "stream_changed": True}],
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
    [{"owned": True}, {"owned": True, "stream_changed": True}],
)
def test_an_owned_start_leaves_the_unowned_index_alone_and_requires_the_owner(variant):
    update = start(**variant)
    assert "#free" not in update["ExpressionAttributeNames"]
    assert ":free" not in update["ExpressionAttributeValues"]
    assert "#free" not in update["UpdateExpression"]
    assert update["ConditionExpression"].endswith(" AND attribute_exists(#owner)")


def test_the_start_conditions_exactly():
    same = "#url = :url AND attribute_not_exists(#proto)"
    changed = "(#url <> :url OR attribute_exists(#proto))"
    assert start()["ConditionExpression"] == (
        f"attribute_not_exists(#pk) OR (#state = :stopped AND {same}"
        " AND attribute_not_exists(#parked) AND attribute_not_exists(#owner))"
    )
    assert start(owned=True)["ConditionExpression"] == (
        f"#state = :stopped AND {same} AND attribute_not_exists(#parked)"
        " AND attribute_exists(#owner)"
    )
    assert start(stream_changed=True)["ConditionExpression"] == (
        f"#state = :stopped AND {changed} AND attribute_not_exists(#parked)"
        " AND attribute_not_exists(#owner)"
    )
    assert start(rearm=True)["ConditionExpression"] == (
        f"attribute_exists(#parked) AND {same} AND attribute_not_exists(#owner)"
    )
    assert start(rearm=True, stream_changed=True)["ConditionExpression"] == (
        f"attribute_exists(#parked) AND {changed} AND attribute_not_exists(#owner)"
    )


def test_the_start_conditions_with_a_protocol_exactly():
    same = "#url = :url AND #proto = :proto"
    changed = "(#url <> :url OR #proto <> :proto)"
    assert start(protocol=P1)["ConditionExpression"] == (
        f"attribute_not_exists(#pk) OR (#state = :stopped AND {same}"
        " AND attribute_not_exists(#parked) AND attribute_not_exists(#owner))"
    )
    assert start(stream_changed=True, protocol=P1)["ConditionExpression"] == (
        f"#state = :stopped AND {changed} AND attribute_not_exists(#parked)"
        " AND attribute_not_exists(#owner)"
    )
    assert start(rearm=True, stream_changed=True, protocol=P1)["ConditionExpression"] == (
        f"attribute_exists(#parked) AND {changed} AND attribute_not_exists(#owner)"
    )
    # The credentials are stored, never compared: they are no part of the stream.
    with_auth = start(protocol=P1, auth_secret=S1)
    assert "#auth" not in with_auth["ConditionExpression"]
    assert "#auth = :auth" in with_auth["UpdateExpression"]


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


# --- the triple: protocol and credentials (docs/DESIGN.md §2.1) ---------------------------


def stored_as(value: str | None) -> dict | None:
    return None if value is None else {"S": value}


@pytest.mark.parametrize(
    ("variant", "stored", "passes"),
    [
        # the same stream: the stored protocol is the one asked for, or both are absent
        ({"protocol": P1}, None, True),
        ({"protocol": P1}, raw(protocol=P1), True),
        ({"protocol": P1}, raw(), False),
        ({"protocol": P1}, raw(protocol=P2), False),
        ({}, raw(protocol=P1), False),
        ({"protocol": P1}, raw(ws_url="wss://b", protocol=P1), False),
        # the credentials are no part of the stream
        ({"auth_secret": S2}, raw(auth_secret=S1), True),
        ({}, raw(auth_secret=S1), True),
        ({"protocol": P1, "auth_secret": S1}, raw(protocol=P1), True),
        # a new stream: the URL or the protocol differs
        ({"stream_changed": True, "protocol": P1}, raw(protocol=P2), True),
        ({"stream_changed": True, "protocol": P1}, raw(), True),
        ({"stream_changed": True}, raw(protocol=P1), True),
        ({"stream_changed": True, "protocol": P1}, raw(ws_url="wss://b", protocol=P1), True),
        ({"stream_changed": True, "protocol": P1}, raw(protocol=P1), False),
        ({"stream_changed": True, "protocol": P1}, None, False),
        ({"stream_changed": True, "auth_secret": S2}, raw(auth_secret=S1), False),
        # owned by a worker that has not let go yet
        ({"owned": True, "protocol": P1}, raw(protocol=P1, **OWNER_FIELDS), True),
        ({"owned": True, "protocol": P1}, raw(protocol=P2, **OWNER_FIELDS), False),
        (
            {"owned": True, "stream_changed": True, "protocol": P2},
            raw(protocol=P1, **OWNER_FIELDS),
            True,
        ),
        # re-arming a parked one
        ({"rearm": True, "protocol": P1}, raw(parked_reason="x", protocol=P1), True),
        ({"rearm": True, "protocol": P1}, raw(parked_reason="x"), False),
        ({"rearm": True, "stream_changed": True, "protocol": P1}, raw(parked_reason="x"), True),
        ({"rearm": True, "stream_changed": True}, raw(parked_reason="x", protocol=P1), True),
        (
            {"rearm": True, "stream_changed": True, "protocol": P1},
            raw(parked_reason="x", protocol=P1),
            False,
        ),
    ],
)
def test_the_protocol_is_part_of_the_stream_and_the_credentials_are_not(variant, stored, passes):
    new = attempt_kwargs(start(**variant), stored)
    assert (new is not None) is passes
    if new is None:
        return
    # Whatever was stored, the item now holds exactly the triple asked for.
    assert new["ws_url"] == {"S": "wss://a"}
    assert new.get("protocol") == stored_as(variant.get("protocol"))
    assert new.get("auth_secret") == stored_as(variant.get("auth_secret"))


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"owned": True},
        {"stream_changed": True},
        {"stream_changed": True, "owned": True},
        {"rearm": True},
        {"rearm": True, "stream_changed": True},
    ],
)
def test_a_start_without_protocol_or_auth_removes_them(variant):
    # A new stream here is the same URL without the stored protocol.
    fields = {"auth_secret": S1}
    if variant.get("stream_changed"):
        fields["protocol"] = P1
    if variant.get("owned"):
        fields |= OWNER_FIELDS
    if variant.get("rearm"):
        fields["parked_reason"] = "x"
    new = attempt_kwargs(start(**variant), raw(**fields))
    assert new is not None
    assert "protocol" not in new
    assert "auth_secret" not in new


def test_a_restart_with_a_new_protocol_resets_the_checkpoint_and_bumps_seq_gen():
    stored = raw(protocol=P1, auth_secret=S1)
    new = attempt_kwargs(start(stream_changed=True, protocol=P2, auth_secret=S1), stored)
    assert new is not None
    assert (new["last_seq"], new["seq_gen"], new["start_gen"]) == (
        {"N": "0"},
        {"N": "2"},
        {"N": "3"},
    )
    assert new["protocol"] == {"S": P2}


def test_new_credentials_alone_keep_the_checkpoint():
    stored = raw(protocol=P1, auth_secret=S1)
    new = attempt_kwargs(start(protocol=P1, auth_secret=S2), stored)
    assert new is not None
    assert (new["last_seq"], new["seq_gen"], new["start_gen"]) == (
        {"N": "40"},
        {"N": "1"},
        {"N": "3"},
    )
    assert (new["protocol"], new["auth_secret"]) == ({"S": P1}, {"S": S2})


def test_a_created_connection_with_a_protocol_and_credentials():
    assert attempt_kwargs(start(protocol=P1, auth_secret=S1), None) == {
        "desired_state": {"S": "STARTED"},
        "ws_url": {"S": "wss://a"},
        "protocol": {"S": P1},
        "auth_secret": {"S": S1},
        "lease_epoch": {"N": "0"},
        "created_at_ms": {"N": str(NOW)},
        "updated_at_ms": {"N": str(NOW)},
        "last_seq": {"N": "0"},
        "seq_gen": {"N": "0"},
        "free_shard": FREE,
        "start_gen": {"N": "1"},
    }


# --- the store's rounds, against one item held by the expression evaluator ------------------


class TableOfOne:
    """A DynamoDB client holding one connection item (``c1``) and nothing else: each
    ``update_item`` runs through the expression evaluator, a failed condition answers
    with the item as DynamoDB does (``ALL_OLD``); a notice to a session is recorded."""

    def __init__(self, stored: dict | None) -> None:
        self.item = stored
        self.writes = 0
        self.notices = 0

    def update_item(self, **kwargs):
        if kwargs["Key"]["Pk"]["S"].startswith("SESSIONS#"):
            self.notices += 1
            return {}
        self.writes += 1
        new = attempt_kwargs(kwargs, self.item)
        if new is None:
            response = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "no"}}
            if self.item is not None:
                response["Item"] = self.item
            raise ClientError(response, "UpdateItem")
        old, self.item = self.item, {"Pk": {"S": "CONN#c1"}, "Sk": {"S": "CONN"}} | new
        return {"Attributes": old} if old is not None else {}


@pytest.mark.parametrize(
    ("stored", "asked", "outcome", "checkpoint"),
    [
        # STARTED: the same triple is already started, any other is a conflict
        (raw(desired_state="STARTED", protocol=P1, auth_secret=S1), (P1, S1), "already", None),
        (raw(desired_state="STARTED", protocol=P1, auth_secret=S1), (P2, S1), "conflict", None),
        (raw(desired_state="STARTED", protocol=P1, auth_secret=S1), (P1, S2), "conflict", None),
        (raw(desired_state="STARTED", protocol=P1, auth_secret=S1), (P1, None), "conflict", None),
        (raw(desired_state="STARTED"), (None, None), "already", None),
        (raw(desired_state="STARTED"), (None, S1), "conflict", None),
        # STOPPED: restarted; a new protocol resets the checkpoint, new credentials keep it
        (raw(protocol=P1, auth_secret=S1), (P1, S1), "restarted", (40, 1)),
        (raw(protocol=P1, auth_secret=S1), (P1, S2), "restarted", (40, 1)),
        (raw(protocol=P1, auth_secret=S1), (P1, None), "restarted", (40, 1)),
        (raw(protocol=P1, auth_secret=S1), (P2, S1), "restarted", (0, 2)),
        (raw(protocol=P1, auth_secret=S1), (None, S1), "restarted", (0, 2)),
        (raw(), (P1, None), "restarted", (0, 2)),
        (raw(**OWNER_FIELDS, protocol=P1), (P2, None), "restarted", (0, 2)),
        (raw(**OWNER_FIELDS, protocol=P1), (P1, S2), "restarted", (40, 1)),
        # parked, STARTED or not: re-armed, by the same rule
        (
            raw(desired_state="STARTED", parked_reason="x", protocol=P1),
            (P1, S2),
            "restarted",
            (40, 1),
        ),
        (
            raw(desired_state="STARTED", parked_reason="x", protocol=P1),
            (P2, S2),
            "restarted",
            (0, 2),
        ),
        (raw(parked_reason="x"), (P1, None), "restarted", (0, 2)),
        # nothing there yet
        (None, (P1, S1), "created", (0, 0)),
    ],
)
def test_the_outcome_of_a_start_with_the_triple(stored, asked, outcome, checkpoint):
    client = TableOfOne(stored)
    store = DesiredStateStore(client, "t")  # type: ignore[arg-type]
    protocol, auth = asked
    before = client.item

    result = store.start("c1", "wss://a", NOW, protocol=protocol, auth_secret=auth)

    expected = {
        "already": StartOutcome.ALREADY_STARTED,
        "conflict": StartOutcome.CONFLICT,
        "restarted": StartOutcome.RESTARTED,
        "created": StartOutcome.CREATED,
    }[outcome]
    assert result.outcome is expected
    assert client.writes <= 2  # the first guess, then the variant the item names
    if checkpoint is None:
        assert client.item == before  # a refusal changes nothing
        return
    after = client.item
    assert after is not None
    assert (int(after["last_seq"]["N"]), int(after["seq_gen"]["N"])) == checkpoint
    assert after.get("protocol") == stored_as(protocol)
    assert after.get("auth_secret") == stored_as(auth)
    assert after["desired_state"] == {"S": "STARTED"}
    assert not {"parked_reason", "parked_at_ms", "failing_since_ms"} & set(after)
    assert client.notices == (1 if "lease_owner" in after else 0)
