"""Typed requests: strict types, no unknown fields, metadata that DynamoDB can store."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from lambdas.router.models import (
    MAX_METADATA_BYTES,
    MAX_METADATA_DEPTH,
    ConnectionView,
    StartDetail,
    StartedConnection,
    StartRequest,
    StopDetail,
    to_dynamodb_value,
)
from lambdas.router.views import OwnerRecords, connection_view
from wsfleet.checkpoint_page import CheckpointPage, PageEntry
from wsfleet.item import ConnectionItem
from wsfleet.session_rules import SessionItem

URL = "wss://feeds.example.com/x"


def nested(depth: int) -> dict[str, Any]:
    """Metadata with ``depth`` levels of objects, itself included."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"d": value}
    return value


def test_a_minimal_request() -> None:
    request = StartRequest.model_validate({"ws_url": URL})
    assert (request.connection_id, request.ws_url, request.metadata) == (None, URL, None)


def test_metadata_up_to_the_limit_is_accepted() -> None:
    overhead = len(json.dumps({"k": ""}, separators=(",", ":")))
    metadata = {"k": "x" * (MAX_METADATA_BYTES - overhead)}
    assert StartRequest.model_validate({"ws_url": URL, "metadata": metadata}).metadata == metadata


def test_metadata_over_4_kb_of_json_is_refused() -> None:
    overhead = len(json.dumps({"k": ""}, separators=(",", ":")))
    metadata = {"k": "x" * (MAX_METADATA_BYTES - overhead + 1)}
    with pytest.raises(ValidationError, match="larger than 4096 bytes"):
        StartRequest.model_validate({"ws_url": URL, "metadata": metadata})


def test_metadata_size_is_measured_on_its_json_encoding() -> None:
    metadata = {"k": "\u00e9" * 1500}  # 1,500 chars, each escaped to 6 bytes of JSON
    with pytest.raises(ValidationError, match="larger than"):
        StartRequest.model_validate({"ws_url": URL, "metadata": metadata})


def test_metadata_depth_limit() -> None:
    StartRequest.model_validate({"ws_url": URL, "metadata": nested(MAX_METADATA_DEPTH)})
    with pytest.raises(ValidationError, match="deeper than"):
        StartRequest.model_validate({"ws_url": URL, "metadata": nested(MAX_METADATA_DEPTH + 1)})


def test_very_deep_metadata_is_refused_without_recursion() -> None:
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    with pytest.raises(ValidationError, match="deeper than"):
        StartDetail.model_validate({"connection_id": "c", "ws_url": URL, "metadata": {"a": value}})


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ({"": 1}, "keys must not be empty"),
        ({"a": {"": 1}}, "keys must not be empty"),
        ({"a": float("nan")}, "finite"),
        ({"a": float("inf")}, "finite"),
        ({"a": [float("-inf")]}, "finite"),
        ({"a": 10**38}, "38 digits"),
        ({"a": -(10**38)}, "38 digits"),
        ({"a": 1e126}, "1E-130 and 1E126"),
        ({"a": -1e200}, "1E-130 and 1E126"),
        ({"a": 1e-131}, "1E-130 and 1E126"),
        ({"a": 5e-324}, "1E-130 and 1E126"),
        ({"a": "\ud800"}, "valid Unicode"),
        ({"\udfff": "x"}, "valid Unicode"),
    ],
)
def test_metadata_dynamodb_cannot_store_is_refused(metadata: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        StartRequest.model_validate({"ws_url": URL, "metadata": metadata})


@pytest.mark.parametrize(
    "metadata",
    [
        {},
        {"a": ""},
        {"a": None, "b": True, "c": False},
        {"a": [], "b": {}},
        {"a": 10**38 - 1, "b": -(10**38) + 1},
        {"a": 9.99e125, "b": 1e-130, "c": 0.0, "d": -0.0},
        {"a": "\u00e9\u4e2d\U0001f600"},
    ],
)
def test_metadata_dynamodb_can_store_is_accepted(metadata: dict[str, Any]) -> None:
    assert StartRequest.model_validate({"ws_url": URL, "metadata": metadata}).metadata == metadata


def test_floats_become_decimals_for_dynamodb() -> None:
    converted = to_dynamodb_value({"a": 0.1, "b": [1.5, {"c": 2.25}], "d": 3, "e": True})
    assert converted == {
        "a": Decimal("0.1"),
        "b": [Decimal("1.5"), {"c": Decimal("2.25")}],
        "d": 3,
        "e": True,
    }
    assert isinstance(converted["a"], Decimal)
    assert str(converted["a"]) == "0.1"  # the float's shortest repr, not its binary expansion
    assert converted["e"] is True


@pytest.mark.parametrize(
    "body",
    [
        {"ws_url": 42},
        {"ws_url": None},
        {"ws_url": ["wss://feeds.example.com/x"]},
        {"ws_url": URL, "connection_id": 7},
        {"ws_url": URL, "connection_id": ""},
        {"ws_url": URL, "connection_id": "has space"},
        {"ws_url": URL, "connection_id": "x" * 129},
        {"ws_url": URL, "connection_id": "caf\u00e9"},
        {"ws_url": URL, "metadata": "text"},
        {"ws_url": URL, "metadata": [1]},
        {"ws_url": URL, "unknown": 1},
        {"ws_url": "x" * 2049},
        {"ws_url": ""},
        {},
    ],
)
def test_wrong_types_unknown_fields_and_bad_ids_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        StartRequest.model_validate(body)


def test_auth_and_protocol_are_typed_objects() -> None:
    request = StartRequest.model_validate(
        {
            "ws_url": URL,
            "auth": {"secret": "websocket-fleet/a"},
            "protocol": {"name": "json-seq"},
        }
    )
    assert request.auth is not None
    assert request.auth.secret == "websocket-fleet/a"
    assert request.protocol is not None
    assert request.protocol.as_raw() == {"name": "json-seq", "options": {}}
    detail = StartDetail.model_validate(
        {"connection_id": "c", "ws_url": URL, "protocol": {"name": "live", "options": {"a": 1}}}
    )
    assert detail.protocol is not None
    assert detail.protocol.as_raw() == {"name": "live", "options": {"a": 1}}
    assert detail.auth is None


@pytest.mark.parametrize(
    "fields",
    [
        {"auth": "websocket-fleet/a"},
        {"auth": {"secret": 1}},
        {"auth": {"secret": "websocket-fleet/a", "value": "s3cr3t"}},
        {"protocol": {"name": "json-seq", "options": "x"}},
        {"protocol": {"options": {}}},
        {"protocol": {"name": "json-seq", "extra": 1}},
    ],
)
def test_malformed_auth_and_protocol_objects_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        StartRequest.model_validate({"ws_url": URL} | fields)


def test_protocol_names_and_options_are_left_to_the_shared_rules() -> None:
    # An unknown name or option passes the model: wsfleet.protocol_specs refuses it
    # with its own message (a 400 invalid_protocol), not pydantic.
    request = StartRequest.model_validate(
        {"ws_url": URL, "protocol": {"name": "binary", "options": {"x": 1}}}
    )
    assert request.protocol is not None
    assert request.protocol.name == "binary"


def test_event_details_require_the_id() -> None:
    with pytest.raises(ValidationError):
        StartDetail.model_validate({"ws_url": URL})
    with pytest.raises(ValidationError):
        StopDetail.model_validate({})
    with pytest.raises(ValidationError):
        StopDetail.model_validate({"connection_id": "c", "ws_url": URL})
    assert StopDetail.model_validate({"connection_id": "c"}).connection_id == "c"


OWNED = ConnectionItem(
    connection_id="b",
    desired_state="STOPPED",
    ws_url=URL,
    lease_owner="worker-1",
    owner_session_gen=4,
    lease_epoch=3,
    last_seq=17,
    start_gen=2,
    created_at_ms=1,
    updated_at_ms=2,
    expires_at=3,
    extra={"metadata": {"team": "x", "weights": [0.5, 2]}},
    auth_secret="websocket-fleet/feeds/b",
    protocol='{"name":"json-field","options":{"resume":"none","sequence":"/s"}}',
)
SESSION = SessionItem(worker_id="worker-1", session_gen=4, state="ALIVE", expires_at_ms=2_500)
OWNER = OwnerRecords(
    session=SESSION,
    page=CheckpointPage(
        written_at_ms=400, entries={"b": PageEntry(epoch=3, seq_gen=0, seq=40, advanced_at_ms=350)}
    ),
)


@pytest.mark.parametrize(
    ("item", "owner"),
    [
        (ConnectionItem(connection_id="a", desired_state="STARTED", ws_url=URL, start_gen=1), None),
        (OWNED, None),
        (OWNED, OWNER),
        (OWNED, OwnerRecords(session=replace(SESSION, state="DEAD"))),
    ],
    ids=["free", "owned, session gone", "owned, live, page", "owned, dead, no page"],
)
def test_the_documented_view_matches_what_the_api_returns(
    item: ConnectionItem, owner: OwnerRecords | None
) -> None:
    view = connection_view(item, 500, owner or OwnerRecords())
    assert ConnectionView.model_validate(view).model_dump() == view
    StartedConnection.model_validate({**view, "outcome": "created"})


def test_the_view_documents_every_field_it_shows() -> None:
    view = connection_view(OWNED, 500, OWNER)
    assert set(view) == set(ConnectionView.model_fields)
    assert "lease_seconds_left" not in ConnectionView.model_fields
    assert "lease_seconds_left" in (ConnectionView.__doc__ or "")  # says it is gone
