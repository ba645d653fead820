"""A malformed item in the table is that connection's error, never the API's: every
other connection is answered as before, and listings answer 200."""

from __future__ import annotations

from typing import Any

from tests.router.fixtures import load_event, response_json, with_body
from tests.router.unit.conftest import Router

OTHER = "wss://feeds.example.com/streams/other"


def created(router: Router, connection_id: str) -> None:
    event = with_body(load_event("post_create"), {"connection_id": connection_id, "ws_url": OTHER})
    assert router.invoke(event)["statusCode"] == 201


def corrupt(router: Router, connection_id: str, expression: str, **values: Any) -> None:
    args: dict[str, Any] = {
        "TableName": "connections-unit",
        "Key": {"Pk": {"S": f"CONN#{connection_id}"}, "Sk": {"S": "CONN"}},
        "UpdateExpression": expression,
    }
    if values:
        args["ExpressionAttributeValues"] = {f":{k}": v for k, v in values.items()}
    router.ddb.update_item(**args)


def put(router: Router, item: dict[str, Any]) -> None:
    router.ddb.put_item(TableName="connections-unit", Item=item)


def test_a_malformed_item_shows_its_problem_and_the_others_answer_as_before(
    router: Router,
) -> None:
    created(router, "feed-1")
    created(router, "fine")
    corrupt(router, "feed-1", "SET last_seq = :x, metadata = :m", x={"S": "x"}, m={"BS": [b"1"]})
    # A session item whose sort key has no generation, one that sorts like a
    # connection, and a page that is not a page.
    put(router, {"Pk": {"S": "SESSIONS#0"}, "Sk": {"S": "no-generation"}})
    put(router, {"Pk": {"S": "SESSIONS#1"}, "Sk": {"S": "CONN"}})
    put(router, {"Pk": {"S": "PAGE#w#1"}, "Sk": {"S": "PAGE"}, "entries": {"S": "?"}})

    got = router.call("get_found")
    assert got["statusCode"] == 200, got
    view = response_json(got)
    assert view["status"] == "failed"
    assert view["last_error"] == "malformed item: last_seq is not an integer"

    listed = router.call("list_all")
    assert listed["statusCode"] == 200, listed
    views = {v["connection_id"]: v for v in response_json(listed)["connections"]}
    assert set(views) == {"feed-1", "fine"}
    assert views["fine"]["status"] == "pending"
    assert views["fine"]["last_error"] is None


def test_an_owner_whose_session_or_page_does_not_decode_costs_only_its_connections(
    router: Router,
) -> None:
    created(router, "feed-1")
    router.open_session("w1", 1, 1_800_000_000_000)
    router.own("feed-1", "w1", 1, 1_800_000_000_000)
    put(router, {"Pk": {"S": "PAGE#w1#1"}, "Sk": {"S": "PAGE"}, "written_at_ms": {"S": "x"}})
    got = router.call("get_found")
    assert got["statusCode"] == 200, got
    assert (
        response_json(got)["last_error"]
        == "malformed checkpoint page: written_at_ms is not an integer"
    )
