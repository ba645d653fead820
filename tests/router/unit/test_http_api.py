"""HTTP API (payload v2) routes, driven by the event fixtures in tests/router/events."""

from __future__ import annotations

import re
from typing import Any
from zlib import crc32

import pytest

from fleetctl.rates import parse_time_ms
from lambdas.router.main import handler
from lambdas.router.service import ConnectionService, wall_clock_ms
from lambdas.router.settings import RouterSettings
from local_stack.api_server import LocalContext
from tests.router.fixtures import (
    assert_error,
    load_event,
    response_json,
    with_body,
    with_query,
)
from tests.router.unit.conftest import TIMING, Router
from wsfleet.checkpoint_page import PageEntry
from wsfleet.start_messages import StartMessage

FEED = "wss://feeds.example.com/streams/feed-1"


class CountingClient:
    """A DynamoDB client that records the key of every GetItem (as ``"<Pk> <Sk>"``)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.keys: list[str] = []

    def get_item(self, **kwargs: Any) -> Any:
        key = kwargs["Key"]
        self.keys.append(f"{key['Pk']['S']} {key['Sk']['S']}")
        return self._client.get_item(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


VIEW_KEYS = {
    "connection_id",
    "state",
    "ws_url",
    "owner",
    "owner_session_gen",
    "owner_session_state",
    "session_seconds_left",
    "owner_version",
    "epoch",
    "last_seq",
    "checkpoint_at",
    "checkpoint_age_seconds",
    "last_advanced_at",
    "start_gen",
    "created_at",
    "updated_at",
    "expires_at",
    "metadata",
    "auth",
    "protocol",
    "parked_reason",
    "parked_at",
    "failing_since",
    "seq_gen",
    "sequence_reset",
    "status",
    "seconds_since_last_message",
    "reconnects",
    "last_error",
    "messages_per_second",
    "last_keepalive_sent",
    "last_keepalive_answered",
}


def created(router: Router, connection_id: str, ws_url: str) -> None:
    response = router.invoke(
        with_body(load_event("post_create"), {"connection_id": connection_id, "ws_url": ws_url})
    )
    assert response["statusCode"] == 201, response


# --- create / start --------------------------------------------------------------------


def test_create_answers_201_with_the_view_and_sends_one_start_message(router: Router) -> None:
    response = router.call("post_create")

    assert response["statusCode"] == 201
    assert response["headers"]["Content-Type"] == "application/json"
    body = response_json(response)
    assert set(body) == VIEW_KEYS | {"outcome"}
    assert body["outcome"] == "created"
    assert body["connection_id"] == "feed-1"
    assert body["state"] == "STARTED"
    assert body["ws_url"] == FEED
    assert (body["owner"], body["owner_session_gen"]) == (None, None)
    assert (body["owner_session_state"], body["session_seconds_left"]) == (None, None)
    assert (body["checkpoint_at"], body["checkpoint_age_seconds"]) == (None, None)
    assert (body["epoch"], body["last_seq"], body["start_gen"]) == (0, 0, 1)
    assert body["expires_at"] is None
    assert body["metadata"] == {"team": "ingest", "weight": 0.5}
    assert (body["auth"], body["protocol"]) == (None, None)
    assert router.start_messages() == [StartMessage("start", "feed-1")]


def test_a_new_item_carries_every_attribute_the_lease_conditions_name(router: Router) -> None:
    router.call("post_create")
    raw = router.raw_item("feed-1")
    assert raw["desired_state"] == {"S": "STARTED"}
    assert raw["free_shard"]["S"].startswith("FREE#")  # in the unowned index
    assert "lease_expires_at_ms" not in raw  # connections have no expiry of their own
    assert raw["lease_epoch"] == {"N": "0"}
    assert raw["last_seq"] == {"N": "0"}
    assert raw["start_gen"] == {"N": "1"}
    assert "lease_owner" not in raw
    assert "expires_at" not in raw
    assert raw["created_at_ms"] == raw["updated_at_ms"]


def test_metadata_floats_are_stored_as_numbers(router: Router) -> None:
    router.call("post_create")
    assert router.raw_item("feed-1")["metadata"] == {
        "M": {"team": {"S": "ingest"}, "weight": {"N": "0.5"}}
    }
    item = router.item("feed-1")
    assert item is not None
    assert item.extra["metadata"] == {"team": "ingest", "weight": 0.5}


def test_the_same_start_again_is_200_and_changes_nothing(router: Router) -> None:
    router.call("post_create")
    router.start_messages()
    before = router.state()

    response = router.call("post_create")

    assert response["statusCode"] == 200
    assert response_json(response)["outcome"] == "already_started"
    assert router.state() == before
    assert router.start_messages() == []


def test_another_url_while_started_is_a_409_that_changes_nothing(router: Router) -> None:
    router.call("post_create")
    before = router.state()

    assert_error(router.call("post_conflict"), 409, "conflict")

    assert router.state() == before
    item = router.item("feed-1")
    assert item is not None
    assert item.ws_url == FEED


def test_a_generated_id_when_none_is_given(router: Router) -> None:
    response = router.call("post_generated_id")
    assert response["statusCode"] == 201
    connection_id = response_json(response)["connection_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", connection_id)
    assert router.item(connection_id) is not None
    assert router.start_messages() == [StartMessage("start", connection_id)]


def test_two_starts_without_an_id_make_two_connections(router: Router) -> None:
    first = response_json(router.call("post_generated_id"))["connection_id"]
    second = response_json(router.call("post_generated_id"))["connection_id"]
    assert first != second


@pytest.mark.parametrize(
    ("name", "connection_id"),
    [
        ("post_base64_body", "feed-b64"),
        ("post_form_content_type", "feed-curl"),
        ("post_text_content_type", "feed-text"),
    ],
)
def test_json_bodies_are_read_however_they_arrive(
    router: Router, name: str, connection_id: str
) -> None:
    response = router.call(name)
    assert response["statusCode"] == 201, response
    assert response_json(response)["connection_id"] == connection_id


# --- restart ---------------------------------------------------------------------------


def test_restart_with_the_same_url_keeps_the_checkpoint(router: Router) -> None:
    router.call("post_create")
    router.set_last_seq("feed-1", 41)
    assert router.call("delete_found")["statusCode"] == 202
    router.start_messages()

    response = router.call("post_create")

    assert response["statusCode"] == 201
    body = response_json(response)
    assert body["outcome"] == "restarted"
    assert (body["state"], body["last_seq"], body["start_gen"]) == ("STARTED", 41, 2)
    assert body["expires_at"] is None
    assert "expires_at" not in router.raw_item("feed-1")
    assert router.start_messages() == [StartMessage("start", "feed-1")]


def test_restart_with_a_new_url_resets_the_checkpoint(router: Router) -> None:
    router.call("post_create")
    router.set_last_seq("feed-1", 41)
    router.call("delete_found")

    response = router.call("post_restart_new_url")

    assert response["statusCode"] == 201
    body = response_json(response)
    assert body["outcome"] == "restarted"
    assert body["ws_url"] == "wss://feeds.example.com/streams/feed-1-v2"
    assert (body["last_seq"], body["start_gen"]) == (0, 2)


# --- get -------------------------------------------------------------------------------


def test_get_shows_the_connection(router: Router) -> None:
    router.call("post_create")
    response = router.call("get_found")
    assert response["statusCode"] == 200
    body = response_json(response)
    assert set(body) == VIEW_KEYS
    assert (body["connection_id"], body["state"], body["ws_url"]) == ("feed-1", "STARTED", FEED)


def test_get_shows_the_owners_session_and_the_checkpoint_of_its_page(router: Router) -> None:
    router.call("post_create")
    now = wall_clock_ms()
    router.open_session("worker-a", 7, now)
    lease = router.own("feed-1", "worker-a", 7, now)
    entry = PageEntry(epoch=lease.epoch, seq_gen=lease.seq_gen, seq=42, advanced_at_ms=now - 200)
    router.write_page("worker-a", 7, {"feed-1": entry}, now - 100)

    body = response_json(router.call("get_found"))

    assert set(body) == VIEW_KEYS
    assert (body["owner"], body["owner_session_gen"], body["epoch"]) == ("worker-a", 7, 1)
    assert body["owner_session_state"] == "ALIVE"
    assert 0 < body["session_seconds_left"] <= TIMING.lease
    assert body["last_seq"] == 42
    assert parse_time_ms(body["checkpoint_at"]) == now - 100
    assert parse_time_ms(body["last_advanced_at"]) == now - 200
    assert 0.1 <= body["checkpoint_age_seconds"] < 60


def test_get_shows_the_items_checkpoint_when_the_page_entry_is_another_holds(
    router: Router,
) -> None:
    router.call("post_create")
    router.set_last_seq("feed-1", 30)
    now = wall_clock_ms()
    router.open_session("worker-a", 7, now)
    lease = router.own("feed-1", "worker-a", 7, now)
    stale = {
        "feed-1": PageEntry(
            epoch=lease.epoch - 1, seq_gen=lease.seq_gen, seq=99, advanced_at_ms=now
        )
    }
    router.write_page("worker-a", 7, stale, now)

    body = response_json(router.call("get_found"))

    assert (body["owner"], body["owner_session_state"]) == ("worker-a", "ALIVE")
    assert body["last_seq"] == 30
    assert (body["checkpoint_at"], body["checkpoint_age_seconds"]) == (None, None)
    assert body["last_advanced_at"] is None


def test_an_owner_whose_session_is_gone_shows_no_session(router: Router) -> None:
    router.call("post_create")
    router.own("feed-1", "worker-gone", 2, wall_clock_ms())  # no session item at all
    body = response_json(router.call("get_found"))
    assert (body["owner"], body["owner_session_gen"]) == ("worker-gone", 2)
    assert (body["owner_session_state"], body["session_seconds_left"]) == (None, None)
    assert body["checkpoint_at"] is None


# --- list ------------------------------------------------------------------------------


def test_list_pages_through_every_connection_once(router: Router) -> None:
    ids = [f"feed-{i}" for i in range(7)]
    for connection_id in ids:
        created(router, connection_id, f"wss://feeds.example.com/{connection_id}")
    seen: list[str] = []
    event = load_event("list_page")
    pages = 0
    while True:
        response = router.invoke(event)
        assert response["statusCode"] == 200
        body = response_json(response)
        assert set(body) == {"connections", "next_token"}
        assert len(body["connections"]) <= 2
        seen.extend(view["connection_id"] for view in body["connections"])
        pages += 1
        assert pages <= 10
        if body["next_token"] is None:
            break
        event = with_query(load_event("list_page"), limit="2", next_token=body["next_token"])
    assert sorted(seen) == sorted(ids)


def test_list_filters_by_state(router: Router) -> None:
    for i in range(5):
        created(router, f"feed-{i}", f"wss://feeds.example.com/{i}")
    for i in (1, 3):
        stop = load_event("delete_found")
        stop["rawPath"] = stop["requestContext"]["http"]["path"] = f"/connections/feed-{i}"
        assert router.invoke(stop)["statusCode"] == 202

    def listed(state: str) -> list[str]:
        ids: list[str] = []
        event = with_query(load_event("list_started_page"), state=state, limit="2")
        for _ in range(10):
            body = response_json(router.invoke(event))
            ids.extend(view["connection_id"] for view in body["connections"])
            assert {view["state"] for view in body["connections"]} <= {state}
            if body["next_token"] is None:
                return sorted(ids)
            event = with_query(event, state=state, limit="2", next_token=body["next_token"])
        raise AssertionError("more pages than connections")

    assert listed("STARTED") == ["feed-0", "feed-2", "feed-4"]
    assert listed("STOPPED") == ["feed-1", "feed-3"]


def test_a_token_only_works_for_the_listing_that_issued_it(router: Router) -> None:
    for i in range(3):
        created(router, f"feed-{i}", f"wss://feeds.example.com/{i}")
    token = response_json(router.call("list_started_page"))["next_token"]
    assert token
    reused = with_query(load_event("list_all"), state="STOPPED", next_token=token)
    assert_error(router.invoke(reused), 400, "invalid_next_token")
    unfiltered = with_query(load_event("list_all"), next_token=token)
    assert_error(router.invoke(unfiltered), 400, "invalid_next_token")


def test_a_scan_lists_connections_only_and_pages_through_all_of_them(router: Router) -> None:
    ids = [f"feed-{i}" for i in range(5)]
    for connection_id in ids:
        created(router, connection_id, f"wss://feeds.example.com/{connection_id}")
    now = wall_clock_ms()
    for n in range(6):  # sessions in every session shard, each with a page
        router.open_session(f"worker-{n}", 1, now)
        router.write_page(f"worker-{n}", 1, {}, now)
    for limit in ("1", "2", "100"):
        seen: list[str] = []
        event = with_query(load_event("list_all"), limit=limit)
        for _ in range(40):
            response = router.invoke(event)
            assert response["statusCode"] == 200, response
            body = response_json(response)
            assert len(body["connections"]) <= int(limit)
            seen += [view["connection_id"] for view in body["connections"]]
            if body["next_token"] is None:
                break
            event = with_query(load_event("list_all"), limit=limit, next_token=body["next_token"])
        assert sorted(seen) == ids, limit  # each once, and nothing but connections


def test_a_listing_reads_each_owners_session_and_page_once(router: Router) -> None:
    now = wall_clock_ms()
    for n in range(6):
        created(router, f"feed-{n}", f"wss://feeds.example.com/{n}")
    owners = {"feed-0": ("w-1", 1), "feed-1": ("w-1", 1), "feed-2": ("w-1", 1)}
    owners |= {"feed-3": ("w-2", 4), "feed-4": ("w-2", 4)}  # feed-5 stays free
    for worker, gen in set(owners.values()):
        router.open_session(worker, gen, now)
    leases = {cid: router.own(cid, worker, gen, now) for cid, (worker, gen) in owners.items()}
    for worker, gen in set(owners.values()):
        entries = {
            cid: PageEntry(lease.epoch, lease.seq_gen, seq=10 + int(cid[-1]), advanced_at_ms=now)
            for cid, lease in leases.items()
            if owners[cid] == (worker, gen)
        }
        router.write_page(worker, gen, entries, now)
    counting = CountingClient(router.ddb)
    service = ConnectionService(
        dynamodb=counting,  # type: ignore[arg-type]
        sqs=router.sqs,
        settings=RouterSettings.from_env(),
    )
    items = service.list(state=None, limit=100, next_token=None).items
    counting.keys.clear()

    views = service.views(items)

    assert sorted(counting.keys) == sorted(
        [f"SESSIONS#{crc32(w.encode()) % 4} {w}#{g}" for w, g in [("w-1", 1), ("w-2", 4)]]
        + ["PAGE#w-1#1 PAGE", "PAGE#w-2#4 PAGE"]
    )
    shown = {
        v["connection_id"]: (v["owner"], v["owner_session_state"], v["last_seq"]) for v in views
    }
    assert shown == {
        **{cid: (worker, "ALIVE", 10 + int(cid[-1])) for cid, (worker, _) in owners.items()},
        "feed-5": (None, None, 0),
    }


def test_an_empty_table_lists_nothing(router: Router) -> None:
    assert response_json(router.call("list_all")) == {"connections": [], "next_token": None}


# --- stop ------------------------------------------------------------------------------


def test_stop_is_202_and_idempotent(router: Router) -> None:
    router.call("post_create")
    router.start_messages()

    first = router.call("delete_found")
    assert first["statusCode"] == 202
    body = response_json(first)
    assert body["state"] == "STOPPED"
    assert body["expires_at"] is not None
    raw = router.raw_item("feed-1")
    assert raw["desired_state"] == {"S": "STOPPED"}
    ttl = int(raw["expires_at"]["N"])
    assert ttl > int(raw["updated_at_ms"]["N"]) // 1000  # epoch seconds, in the future

    second = router.call("delete_found")
    assert second["statusCode"] == 202
    assert response_json(second)["state"] == "STOPPED"
    assert router.start_messages() == []  # a stop never sends a start hint


# --- refusals --------------------------------------------------------------------------

REFUSALS: list[tuple[str, int, str]] = [
    ("post_malformed_json", 400, "invalid_json"),
    ("post_trailing_garbage", 400, "invalid_json"),
    ("post_deep_nesting", 400, "invalid_json"),
    ("post_metadata_long_integer", 400, "invalid_json"),
    ("post_wrong_types", 400, "validation_error"),
    ("post_metadata_not_object", 400, "validation_error"),
    ("post_unknown_field", 400, "validation_error"),
    ("post_not_an_object", 400, "validation_error"),
    ("post_null_body", 400, "validation_error"),
    ("post_no_body", 400, "validation_error"),
    ("post_missing_url", 400, "validation_error"),
    ("post_empty_url", 400, "validation_error"),
    ("post_invalid_id", 400, "validation_error"),
    ("post_id_too_long", 400, "validation_error"),
    ("post_metadata_too_large", 400, "validation_error"),
    ("post_metadata_too_deep", 400, "validation_error"),
    ("post_metadata_huge_number", 400, "validation_error"),
    ("post_metadata_nan", 400, "validation_error"),
    ("post_metadata_empty_key", 400, "validation_error"),
    ("post_oversized_body", 413, "body_too_large"),
    ("post_oversized_base64", 413, "body_too_large"),
    ("post_invalid_base64", 400, "invalid_body"),
    ("post_not_utf8", 400, "invalid_body"),
    ("post_url_https_scheme", 400, "scheme_not_allowed"),
    ("post_url_insecure_ws", 400, "scheme_not_allowed"),
    ("post_url_credentials", 400, "credentials_in_url"),
    ("post_url_host_not_allowed", 400, "host_not_allowed"),
    ("post_url_metadata_address", 400, "address_not_allowed"),
    ("post_url_decimal_ip", 400, "invalid_url"),
    ("post_url_ipv6_loopback", 400, "address_not_allowed"),
    ("post_url_fragment", 400, "invalid_url"),
    ("post_url_whitespace", 400, "invalid_url"),
    ("post_url_no_host", 400, "invalid_url"),
    ("post_url_bad_port", 400, "invalid_url"),
    ("post_url_unicode_host", 400, "invalid_url"),
    ("post_auth_outside_prefix", 400, "invalid_auth"),
    ("post_protocol_unknown", 400, "invalid_protocol"),
    ("post_conflict", 409, "conflict"),
    ("get_missing", 404, "not_found"),
    ("get_invalid_id", 400, "invalid_connection_id"),
    ("get_id_too_long", 400, "invalid_connection_id"),
    ("list_limit_zero", 400, "validation_error"),
    ("list_limit_too_large", 400, "validation_error"),
    ("list_limit_not_a_number", 400, "validation_error"),
    ("list_limit_repeated", 400, "validation_error"),
    ("list_invalid_state", 400, "invalid_state"),
    ("list_lowercase_state", 400, "invalid_state"),
    ("list_invalid_token", 400, "invalid_next_token"),
    ("list_token_too_long", 400, "validation_error"),
    ("delete_missing", 404, "not_found"),
    ("delete_invalid_id", 400, "invalid_connection_id"),
    ("route_put_connection", 404, "no_such_route"),
    ("route_patch_connection", 404, "no_such_route"),
    ("route_root", 404, "no_such_route"),
    ("route_trailing_slash", 404, "no_such_route"),
    ("route_nested_path", 404, "no_such_route"),
    ("route_delete_collection", 404, "no_such_route"),
    ("route_post_to_item", 404, "no_such_route"),
    ("route_dot_segments", 404, "no_such_route"),
]


def test_every_http_fixture_is_covered() -> None:
    from tests.router.fixtures import event_names

    covered = {name for name, _, _ in REFUSALS} | {
        "post_create",
        "post_authenticated",
        "post_generated_id",
        "post_restart_new_url",
        "post_base64_body",
        "post_form_content_type",
        "post_text_content_type",
        "get_found",
        "list_all",
        "list_page",
        "list_started_page",
        "delete_found",
    }
    http = {n for n in event_names() if not n.startswith(("eventbridge_", "unsupported_"))}
    assert http == covered


@pytest.mark.parametrize(("name", "status", "code"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals_answer_4xx_json_and_change_nothing(
    router: Router, name: str, status: int, code: str
) -> None:
    router.call("post_create")  # something a refused request could wrongly change
    router.call("post_generated_id")
    before = router.state()

    body = assert_error(router.call(name), status, code)

    assert router.state() == before
    assert "Traceback" not in body["message"]


def test_insecure_ws_is_admitted_only_when_the_deployment_allows_it(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lambdas.router.main import service

    assert_error(router.call("post_url_insecure_ws"), 400, "scheme_not_allowed")
    monkeypatch.setenv("ALLOW_INSECURE_WS", "true")
    service.cache_clear()
    assert router.call("post_url_insecure_ws")["statusCode"] == 201


def test_explicitly_allowed_loopback_literal_is_admitted(router: Router) -> None:
    event = with_body(
        load_event("post_create"),
        {"connection_id": "local", "ws_url": "wss://127.0.0.1:8765/demo"},
    )
    assert router.invoke(event)["statusCode"] == 201


def test_a_non_http_non_eventbridge_event_is_refused(router: Router) -> None:
    before = router.state()
    response = router.call("unsupported_event")
    assert_error(response, 400, "unsupported_event")
    assert router.state() == before


@pytest.mark.parametrize("event", [[], "text", 7, None, {"requestContext": "x"}])
def test_odd_payloads_are_refused_not_raised(router: Router, event: Any) -> None:
    context: Any = LocalContext()
    assert_error(handler(event, context), 400, "unsupported_event")


def test_generating_the_openapi_document_leaves_the_handler_working(router: Router) -> None:
    from lambdas.router.http_api import openapi_document

    assert router.call("list_all")["statusCode"] == 200  # the live resolver exists
    openapi_document("0.0.0")  # builds a second resolver around the same routes
    assert router.call("post_create")["statusCode"] == 201
