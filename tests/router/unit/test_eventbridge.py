"""EventBridge ``Start Connection`` / ``Stop Connection``: the same validation and
effects as the HTTP API; an invalid event is rejected (logged, not raised, so it is
never retried forever)."""

from __future__ import annotations

import pytest

from tests.router.fixtures import load_event
from tests.router.unit.conftest import Router
from wsfleet.start_messages import StartMessage


def test_start_event_starts_the_connection_and_sends_one_hint(router: Router) -> None:
    result = router.call("eventbridge_start")

    assert result == {"ok": True, "connection_id": "feed-eb", "outcome": "created"}
    item = router.item("feed-eb")
    assert item is not None
    assert (item.desired_state, item.ws_url) == ("STARTED", "wss://feeds.example.com/streams/eb")
    assert (item.start_gen, item.lease_epoch, item.last_seq) == (1, 0, 0)
    assert item.extra["metadata"] == {"source": "eventbridge"}
    assert router.start_messages() == [StartMessage("start", "feed-eb")]


def test_a_retried_start_event_is_idempotent(router: Router) -> None:
    router.call("eventbridge_start")
    router.start_messages()
    before = router.state()

    result = router.call("eventbridge_start")

    assert result["ok"] is True
    assert result["outcome"] == "already_started"
    assert router.state() == before


def test_stop_event_stops_and_a_later_start_restarts(router: Router) -> None:
    router.call("eventbridge_start")
    router.start_messages()

    assert router.call("eventbridge_stop") == {
        "ok": True,
        "connection_id": "feed-eb",
        "outcome": "stopped",
    }
    item = router.item("feed-eb")
    assert item is not None
    assert item.desired_state == "STOPPED"
    assert item.expires_at is not None

    assert router.call("eventbridge_start")["outcome"] == "restarted"
    item = router.item("feed-eb")
    assert item is not None
    assert (item.desired_state, item.start_gen, item.expires_at) == ("STARTED", 2, None)
    assert router.start_messages() == [StartMessage("start", "feed-eb")]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("eventbridge_start_missing_id", "connection_id"),
        ("eventbridge_start_refused_url", "UrlRefusedError"),
        ("eventbridge_start_refused_auth", "InvalidSecretRefError"),
        ("eventbridge_start_invalid_protocol", "InvalidProtocolError"),
        ("eventbridge_start_wrong_types", "connection_id"),
        ("eventbridge_start_unknown_field", "priority"),
        ("eventbridge_start_conflict", "ConnectionConflictError"),
        ("eventbridge_stop_unknown", "ConnectionNotFoundError"),
        ("eventbridge_stop_detail_not_object", "valid dictionary"),
        ("eventbridge_unknown_detail_type", "Restart Connection"),
    ],
)
def test_invalid_events_are_rejected_without_change_or_exception(
    router: Router, name: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    router.call("post_create")  # feed-1, for the conflict case
    before = router.state()

    result = router.call(name)

    assert result["ok"] is False
    assert reason in result["error"]
    assert router.state() == before
    rejected = [r for r in caplog.records if r.getMessage() == "event rejected"]
    assert len(rejected) == 1
    assert rejected[0].__dict__["event_id"] == load_event(name)["id"]


def test_an_event_without_detail_is_rejected(router: Router) -> None:
    event = load_event("eventbridge_start")
    del event["detail"]
    result = router.invoke(event)
    assert result["ok"] is False
