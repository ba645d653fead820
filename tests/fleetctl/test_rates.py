"""The API's timestamps, read back to the millisecond."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl.rates import parse_time_ms
from lambdas.router.views import OwnerRecords, connection_view
from wsfleet.checkpoint_page import CheckpointPage, PageEntry
from wsfleet.item import ConnectionItem
from wsfleet.session_rules import SessionItem

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-01-01T00:00:00.000+00:00", T0),
        ("2026-01-01T00:00:05.123+00:00", T0 + 5_123),
        ("2026-01-01T01:00:05.123+01:00", T0 + 5_123),
        ("2026-01-01T00:00:05.123Z", T0 + 5_123),
        ("2026-01-01T00:00:05.123", T0 + 5_123),  # naive: UTC
        (None, None),
        ("", None),
        ("yesterday", None),
        (1_767_225_600, None),
    ],
)
def test_parse_time_ms(text: Any, ms: int | None) -> None:
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize("at_ms", [T0, T0 + 1, T0 + 123, T0 + 999, T0 + 86_399_999, 1])
def test_the_views_times_read_back_exactly(at_ms: int) -> None:
    # The API shows the page's written_at_ms as an ISO string: reading it back is exact.
    item = ConnectionItem(
        connection_id="c",
        desired_state="STARTED",
        ws_url="ws://127.0.0.1:8765/x",
        lease_owner="w-1",
        owner_session_gen=1,
        lease_epoch=1,
    )
    session = SessionItem("w-1", 1, "ALIVE", expires_at_ms=at_ms + 10_000)
    page = CheckpointPage(at_ms, {"c": PageEntry(1, 0, 5, at_ms)})
    shown = connection_view(item, at_ms, OwnerRecords(session, page))
    assert parse_time_ms(shown["checkpoint_at"]) == at_ms
    assert parse_time_ms(shown["last_advanced_at"]) == at_ms
