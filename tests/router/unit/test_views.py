"""The connection view: the item, with its owner's session (time left) and the
checkpoint from the owner's page when that entry belongs to the item's hold and
stream. Pure: fixed records and a fixed clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, get_args

import pytest

from lambdas.router.models import ConnectionView
from lambdas.router.views import (
    NO_RECORDS,
    STATUSES,
    OwnerRecords,
    connection_view,
    protocol_view,
)
from wsfleet.checkpoint_page import CheckpointPage, PageEntry
from wsfleet.item import ConnectionItem
from wsfleet.session_rules import SessionItem

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z

ITEM = ConnectionItem(
    connection_id="feed-1",
    desired_state="STARTED",
    ws_url="wss://feeds.example.com/feed-1",
    lease_owner="w-1",
    owner_session_gen=3,
    lease_epoch=5,
    seq_gen=2,
    last_seq=100,
    start_gen=4,
)
SESSION = SessionItem(worker_id="w-1", session_gen=3, state="ALIVE", expires_at_ms=NOW + 1_800)


def page(
    *, epoch: int = 5, seq_gen: int = 2, seq: int = 160, written_ago_ms: int = 2_500
) -> CheckpointPage:
    written = NOW - written_ago_ms
    entry = PageEntry(epoch=epoch, seq_gen=seq_gen, seq=seq, advanced_at_ms=written - 300)
    return CheckpointPage(written_at_ms=written, entries={"feed-1": entry, "other": entry})


def shown(item: ConnectionItem, owner: OwnerRecords) -> dict[str, Any]:
    return connection_view(item, NOW, owner)


def checkpoint(view: dict[str, Any]) -> tuple[Any, ...]:
    return (
        view["last_seq"],
        view["checkpoint_at"],
        view["checkpoint_age_seconds"],
        view["last_advanced_at"],
    )


ITEMS_OWN = (100, None, None, None)
"""The item's own checkpoint: nothing said of a page."""


def test_a_page_entry_of_the_items_hold_and_stream_is_the_checkpoint() -> None:
    view = shown(ITEM, OwnerRecords(SESSION, page()))
    assert checkpoint(view) == (
        160,
        "2025-12-31T23:59:57.500+00:00",
        2.5,
        "2025-12-31T23:59:57.200+00:00",
    )


@pytest.mark.parametrize(
    "stale",
    [
        pytest.param(page(epoch=4), id="an older hold's entry (before a takeover)"),
        pytest.param(page(seq_gen=1), id="the old stream's entry (before a restart, new URL)"),
        pytest.param(
            CheckpointPage(written_at_ms=NOW - 100, entries={}), id="no entry for the connection"
        ),
        pytest.param(None, id="no page yet"),
    ],
)
def test_any_other_entry_leaves_the_items_checkpoint(stale: CheckpointPage | None) -> None:
    assert checkpoint(shown(ITEM, OwnerRecords(SESSION, stale))) == ITEMS_OWN


def test_a_page_entry_behind_the_item_never_moves_the_checkpoint_back() -> None:
    view = shown(ITEM, OwnerRecords(SESSION, page(seq=90)))
    assert view["last_seq"] == 100
    assert view["checkpoint_at"] is not None  # the page is still the latest word on it


def test_an_entry_before_the_first_message_has_no_advance_time() -> None:
    entry = PageEntry(epoch=5, seq_gen=2, seq=100, advanced_at_ms=None)
    view = shown(ITEM, OwnerRecords(SESSION, CheckpointPage(NOW - 1_000, {"feed-1": entry})))
    assert checkpoint(view) == (100, "2025-12-31T23:59:59.000+00:00", 1.0, None)


def test_a_page_written_after_now_by_a_clock_ahead_is_zero_seconds_old() -> None:
    view = shown(ITEM, OwnerRecords(SESSION, page(written_ago_ms=-400)))
    assert view["checkpoint_age_seconds"] == 0.0


@pytest.mark.parametrize(
    ("session", "state", "left"),
    [
        pytest.param(SESSION, "ALIVE", 1.8, id="alive"),
        pytest.param(replace(SESSION, expires_at_ms=NOW), "ALIVE", 0.0, id="expiring now"),
        pytest.param(replace(SESSION, expires_at_ms=NOW - 900), "ALIVE", 0.0, id="lapsed"),
        pytest.param(replace(SESSION, state="DEAD"), "DEAD", 0.0, id="reaped or retired"),
        pytest.param(None, None, None, id="session gone"),
        pytest.param(replace(SESSION, session_gen=2), None, None, id="another session's item"),
    ],
)
def test_the_owners_session(
    session: SessionItem | None, state: str | None, left: float | None
) -> None:
    view = shown(ITEM, OwnerRecords(session, page()))
    assert (view["owner"], view["owner_session_gen"]) == ("w-1", 3)
    assert (view["owner_session_state"], view["session_seconds_left"]) == (state, left)


def test_a_free_connection_has_no_session_and_the_items_checkpoint() -> None:
    free = replace(ITEM, lease_owner=None, owner_session_gen=None)
    for owner in (NO_RECORDS, OwnerRecords(SESSION, page())):  # records of nobody's: ignored
        view = shown(free, owner)
        assert (view["owner"], view["owner_session_gen"]) == (None, None)
        assert (view["owner_session_state"], view["session_seconds_left"]) == (None, None)
        assert checkpoint(view) == ITEMS_OWN


def test_the_item_fields_are_kept() -> None:
    item = replace(
        ITEM,
        desired_state="STOPPED",
        created_at_ms=NOW - 60_000,
        updated_at_ms=NOW - 1_000,
        expires_at=NOW // 1000 + 3600,
        parked_reason="HTTP 404 from upstream",
        parked_at_ms=NOW - 2_000,
        failing_since_ms=NOW - 3_000,
        extra={"metadata": {"team": "ingest"}},
    )
    view = shown(item, NO_RECORDS)
    assert {k: view[k] for k in ("state", "ws_url", "epoch", "start_gen", "metadata")} == {
        "state": "STOPPED",
        "ws_url": "wss://feeds.example.com/feed-1",
        "epoch": 5,
        "start_gen": 4,
        "metadata": {"team": "ingest"},
    }
    assert (view["created_at"], view["updated_at"], view["expires_at"]) == (
        "2025-12-31T23:59:00.000+00:00",
        "2025-12-31T23:59:59.000+00:00",
        "2026-01-01T01:00:00.000+00:00",
    )
    assert (view["parked_reason"], view["parked_at"], view["failing_since"]) == (
        "HTTP 404 from upstream",
        "2025-12-31T23:59:58.000+00:00",
        "2025-12-31T23:59:57.000+00:00",
    )
    assert "lease_seconds_left" not in view


# --- health: the owner's word while it runs the connection, the records' otherwise -----


def health(view: dict[str, Any]) -> tuple[Any, ...]:
    return (
        view["status"],
        view["seconds_since_last_message"],
        view["reconnects"],
        view["last_error"],
        view["messages_per_second"],
    )


def page_with(entry: PageEntry) -> CheckpointPage:
    return CheckpointPage(written_at_ms=NOW - 1_000, entries={"feed-1": entry})


STREAMING = PageEntry(5, 2, 160, NOW - 1_300, rate=9.8)
BACKING_OFF = PageEntry(
    5, 2, 100, None, rate=0, status="backing_off", reconnects=3, last_error="HTTP 503"
)
RECOVERED = PageEntry(
    5, 2, 130, NOW - 4_000, rate=0, status="streaming", reconnects=1, last_error="connection lost"
)
DEAD = replace(SESSION, state="DEAD")
LAPSED = replace(SESSION, expires_at_ms=NOW - 1)
FREE = replace(ITEM, lease_owner=None, owner_session_gen=None)


@pytest.mark.parametrize(
    ("item", "owner", "expected"),
    [
        pytest.param(
            ITEM,
            OwnerRecords(SESSION, page_with(STREAMING)),
            ("streaming", 1.3, 0, None, 9.8),
            id="streaming",
        ),
        pytest.param(
            ITEM,
            OwnerRecords(SESSION, page_with(BACKING_OFF)),
            ("backing_off", None, 3, "HTTP 503", 0),
            id="backing off, nothing handled yet",
        ),
        pytest.param(
            ITEM,
            OwnerRecords(SESSION, page_with(RECOVERED)),
            ("streaming", 4.0, 1, "connection lost", 0),
            id="streaming again after a reconnect, quiet",
        ),
        pytest.param(
            ITEM,
            OwnerRecords(SESSION, None),
            ("connecting", None, 0, None, None),
            id="owned, no page line yet",
        ),
        pytest.param(
            ITEM,
            OwnerRecords(SESSION, page_with(replace(STREAMING, epoch=4))),
            ("connecting", None, 0, None, None),
            id="only an older hold's line",
        ),
        pytest.param(
            ITEM,
            OwnerRecords(DEAD, page_with(STREAMING)),
            ("pending", None, None, None, None),
            id="owner's session reaped",
        ),
        pytest.param(
            ITEM,
            OwnerRecords(LAPSED, page_with(STREAMING)),
            ("pending", None, None, None, None),
            id="owner's session lapsed",
        ),
        pytest.param(
            ITEM,
            OwnerRecords(None, page_with(STREAMING)),
            ("pending", None, None, None, None),
            id="owner's session gone",
        ),
        pytest.param(FREE, NO_RECORDS, ("pending", None, None, None, None), id="unowned"),
        pytest.param(
            replace(FREE, parked_reason="HTTP 404 from upstream"),
            NO_RECORDS,
            ("failed", None, None, "HTTP 404 from upstream", None),
            id="parked",
        ),
        pytest.param(
            replace(FREE, desired_state="STOPPED"),
            NO_RECORDS,
            ("stopped", None, None, None, None),
            id="stopped",
        ),
        pytest.param(
            replace(ITEM, desired_state="STOPPED"),
            OwnerRecords(SESSION, page_with(STREAMING)),
            ("stopped", None, None, None, None),
            id="stopped, its owner not yet told",
        ),
    ],
)
def test_health(item: ConnectionItem, owner: OwnerRecords, expected: tuple[Any, ...]) -> None:
    assert health(shown(item, owner)) == expected


def test_the_last_keepalive_and_its_answer_come_from_the_owners_page() -> None:
    kept = replace(STREAMING, keepalive_sent_ms=NOW - 2_000, keepalive_answered_ms=NOW - 1_990)
    view = shown(ITEM, OwnerRecords(SESSION, page_with(kept)))
    assert (view["last_keepalive_sent"], view["last_keepalive_answered"]) == (
        "2025-12-31T23:59:58.000+00:00",
        "2025-12-31T23:59:58.010+00:00",
    )
    plain = shown(ITEM, OwnerRecords(SESSION, page_with(STREAMING)))
    assert (plain["last_keepalive_sent"], plain["last_keepalive_answered"]) == (None, None)


def test_every_status_a_view_shows_is_in_the_api_schema() -> None:
    annotation = ConnectionView.model_fields["status"].annotation
    assert set(get_args(annotation)) == set(STATUSES)


def test_auth_shows_the_reference_and_protocol_the_stored_spec() -> None:
    item = replace(
        ITEM,
        auth_secret="websocket-fleet/feeds/a",
        protocol='{"name":"json-field","options":{"resume":"none","sequence":"/s"}}',
    )
    view = shown(item, NO_RECORDS)
    assert view["auth"] == {"secret": "websocket-fleet/feeds/a"}
    assert view["protocol"] == {
        "name": "json-field",
        "options": {"resume": "none", "sequence": "/s"},
    }
    assert (shown(ITEM, NO_RECORDS)["auth"], shown(ITEM, NO_RECORDS)["protocol"]) == (None, None)


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (None, None),
        ('{"name":"json-seq","options":{}}', {"name": "json-seq", "options": {}}),
        # written by a newer router: shown as stored, not validated again
        ('{"name":"binary","options":{"x":1}}', {"name": "binary", "options": {"x": 1}}),
        ('{"name":"live"}', {"name": "live", "options": {}}),
        ("{", None),
        ('"json-seq"', None),
        ('{"options":{}}', None),
    ],
)
def test_protocol_view(stored: str | None, expected: dict[str, Any] | None) -> None:
    assert protocol_view(stored) == expected
