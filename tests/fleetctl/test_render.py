"""Pure formatting: tables, details, and the fleet table that watch and the live view draw."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleetctl import render


def view(connection_id: str, **changes: Any) -> dict[str, Any]:
    """A view of a connection whose owner's session is alive, checkpointed in its page."""
    base: dict[str, Any] = {
        "connection_id": connection_id,
        "state": "STARTED",
        "ws_url": f"ws://127.0.0.1:8765/{connection_id}",
        "owner": "worker-a",
        "owner_session_gen": 3,
        "owner_session_state": "ALIVE",
        "session_seconds_left": 1.5,
        "epoch": 2,
        "last_seq": 40,
        "checkpoint_at": "2026-11-30T01:00:07.000+00:00",
        "checkpoint_age_seconds": 2.25,
        "last_advanced_at": "2026-11-30T01:00:06.900+00:00",
        "start_gen": 1,
        "created_at": "2026-11-30T01:00:00.000+00:00",
        "updated_at": "2026-11-30T01:00:05.000+00:00",
        "expires_at": None,
        "metadata": None,
    }
    return base | changes


FREE = {
    "owner": None,
    "owner_session_gen": None,
    "owner_session_state": None,
    "session_seconds_left": None,
    "checkpoint_at": None,
    "checkpoint_age_seconds": None,
    "last_advanced_at": None,
}
"""No owner: no session, and the item's own checkpoint."""


def free(connection_id: str, **changes: Any) -> dict[str, Any]:
    return view(connection_id, **FREE) | changes


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), ("3", "-"), (True, "-"), (0, "0.0s"), (1.25, "1.2s"), (19.96, "20.0s")],
)
def test_format_seconds(seconds: Any, shown: str) -> None:
    assert render.format_seconds(seconds) == shown


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({}, "1.5s"),
        ({"session_seconds_left": 0.0}, "lapsed"),
        ({"owner_session_state": "DEAD", "session_seconds_left": 0.0}, "dead"),
        ({"owner_session_state": None, "session_seconds_left": None}, "gone"),
        (FREE, "-"),
    ],
)
def test_format_session(changes: dict[str, Any], shown: str) -> None:
    assert render.format_session(view("c", **changes)) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "-"), ("", "-"), (0, "0"), (True, "yes"), ({"a": [1]}, '{"a":[1]}'), ("x", "x")],
)
def test_cell(value: Any, shown: str) -> None:
    assert render.cell(value) == shown


def test_table_pads_columns_and_right_aligns_numbers() -> None:
    lines = render.table(
        ("CONNECTION", "EPOCH", "OWNER"), [["a", "7", "w-1"], ["longer-id", "12", "-"]]
    )
    assert lines == [
        "CONNECTION  EPOCH  OWNER",
        "a               7  w-1",
        "longer-id      12  -",
    ]


def test_connection_table() -> None:
    lines = render.connection_table([free("demo-2", state="STOPPED"), view("demo-1")])
    assert re.split(" {2,}", lines[0]) == list(render.LIST_COLUMNS)
    assert lines[1].split() == [
        "demo-1",
        "STARTED",
        "worker-a",
        "1.5s",
        "2",
        "40",
        "2.2s",
        "ws://127.0.0.1:8765/demo-1",
    ]
    assert lines[2].split()[:7] == ["demo-2", "STOPPED", "-", "-", "2", "40", "-"]
    assert render.connection_table([]) == ["no connections"]


def test_connection_details() -> None:
    lines = render.connection_details(view("demo-1", metadata={"team": "x"}))
    assert lines[0] == "connection     demo-1"
    assert "owner          worker-a" in lines
    assert "session        #3 ALIVE, 1.5s left" in lines
    assert "last_seq       40" in lines
    assert ("checkpoint     owner's page of 2026-11-30T01:00:07.000+00:00 (2.2s ago)") in lines
    assert "last advanced  2026-11-30T01:00:06.900+00:00" in lines
    assert "expires        -" in lines
    assert 'metadata       {"team":"x"}' in lines
    assert len(lines) == 14


@pytest.mark.parametrize(
    ("changes", "session", "checkpoint"),
    [
        (FREE, "-", "from the item"),
        ({"owner_session_state": None, "session_seconds_left": None}, "#3 gone", None),
        ({"owner_session_state": "DEAD", "session_seconds_left": 0.0}, "#3 DEAD", None),
        ({"session_seconds_left": 0.0}, "#3 ALIVE, lapsed", None),
        ({"checkpoint_at": None, "checkpoint_age_seconds": None}, None, "from the item"),
    ],
)
def test_connection_details_of_the_owner_and_checkpoint(
    changes: dict[str, Any], session: str | None, checkpoint: str | None
) -> None:
    shown = dict(line.split(None, 1) for line in render.connection_details(view("c", **changes)))
    if session is not None:
        assert shown["session"] == session
    if checkpoint is not None:
        assert shown["checkpoint"] == checkpoint


@pytest.mark.parametrize(
    ("outcome", "summary"),
    [
        ("created", "demo-1: created"),
        ("restarted", "demo-1: restarted"),
        ("already_started", "demo-1: already running (nothing changed)"),
    ],
)
def test_start_summary(outcome: str, summary: str) -> None:
    assert render.start_summary(view("demo-1", outcome=outcome)) == summary


def test_natural_order() -> None:
    ids = ["demo-10", "demo-2", "alpha", "demo-1", "demo-1a"]
    assert sorted(ids, key=render.natural_key) == [
        "alpha",
        "demo-1",
        "demo-1a",
        "demo-2",
        "demo-10",
    ]


# --- the fleet table: fleetctl watch and the local live view --------------------------


def fleet() -> list[dict[str, Any]]:
    return [
        view("demo-10", owner="w-2", session_seconds_left=4.96, epoch=3, last_seq=40),
        view("demo-2", owner="w-1", session_seconds_left=17.349, epoch=1, last_seq=125),
        free("demo-3", last_seq=77),  # released: free
        free("demo-4", state="STOPPED", last_seq=9),
        view("demo-5", owner="w-3", session_seconds_left=0, epoch=1, last_seq=12),  # lapsed
        view(
            "demo-6",
            owner="w-4",
            owner_session_state="DEAD",
            session_seconds_left=0,
            checkpoint_age_seconds=12.0,
            last_seq=8,
        ),  # reaped, not yet taken over
    ]


def test_fleet_table_rows() -> None:
    lines = render.fleet_table(fleet(), {"demo-2": 5.0, "demo-10": 0.0, "demo-5": None})
    assert lines[0] == (
        "CONNECTION  STATE    OWNER  SESSION LEFT  EPOCH  LAST_SEQ  CKPT AGE  MSG/S"
    )
    rows = [line.split() for line in lines[1:]]
    assert rows == [
        ["demo-2", "STARTED", "w-1", "17.3s", "1", "125", "2.2s", "5.0"],
        ["demo-3", "STARTED", "-", "-", "2", "77", "-", "-"],
        ["demo-4", "STOPPED", "-", "-", "2", "9", "-", "-"],
        ["demo-5", "STARTED", "w-3", "lapsed", "1", "12", "2.2s", "-"],
        ["demo-6", "STARTED", "w-4", "dead", "2", "8", "12.0s", "-"],
        ["demo-10", "STARTED", "w-2", "5.0s", "3", "40", "2.2s", "0.0"],  # natural order
    ]
    assert render.fleet_table([], {}) == ["no connections"]


def test_fleet_table_columns_line_up() -> None:
    lines = render.fleet_table(
        [
            view("a", owner="local-worker-1", last_seq=7),
            view("much-longer-id", owner="w", session_seconds_left=15.0, last_seq=123456),
        ],
        {"a": 12.25, "much-longer-id": None},
    )
    header, *rows = lines
    for column in ("SESSION LEFT", "EPOCH", "LAST_SEQ", "CKPT AGE", "MSG/S"):
        # Numbers are right-aligned: they end where their header ends.
        end = header.index(column) + len(column)
        for row in rows:
            assert row[end - 1] != " "
            assert row[end : end + 1] in ("", " ")
    assert rows[0].endswith("12.2")


def test_fleet_totals() -> None:
    rates = {"demo-2": 5.0, "demo-10": 0.5, "demo-5": None}
    assert render.fleet_totals(fleet(), rates) == (
        "6 connections: 5 STARTED (4 owned, 2 lapsed), 1 STOPPED; owned by 4 workers; 5.5 msg/s"
    )
    assert render.fleet_totals([], {}) == (
        "0 connections: 0 STARTED (0 owned, 0 lapsed), 0 STOPPED; owned by 0 workers; 0.0 msg/s"
    )


def test_summary_line() -> None:
    assert render.summary_line(fleet(), {"demo-2": 5.0, "demo-10": 0.0}) == (
        "6 connections, 4 owned | demo-2 seq=125 owner=w-1 5.0/s; demo-3 seq=77 owner=-; "
        "demo-4 seq=9 owner=-; demo-5 seq=12 owner=w-3 (lapsed); "
        "demo-6 seq=8 owner=w-4 (lapsed); demo-10 seq=40 owner=w-2 0.0/s"
    )
    assert render.summary_line([], {}) == "0 connections, 0 owned"


def test_summary_line_names_a_bounded_number_of_connections() -> None:
    line = render.summary_line([view(f"c-{i}", last_seq=i) for i in range(20)], {})
    assert line.startswith("20 connections, 20 owned | c-0 seq=0 owner=worker-a; c-1 seq=1")
    assert "c-11 seq=11" in line
    assert "c-12" not in line
    assert line.endswith("; ... 8 more")


def test_watch_frame() -> None:
    frame = render.WatchFrame(
        api_url="http://127.0.0.1:8080",
        clock="12:00:01",
        interval_s=1.0,
        views=[
            view("demo-2", owner="worker-b", last_seq=90),
            view("demo-1"),
            free("demo-3", state="STOPPED"),
        ],
        rates={"demo-1": 20.0, "demo-2": 19.5, "demo-3": None},
    )
    lines = render.watch_lines(frame)
    assert lines[0] == "fleet at http://127.0.0.1:8080  12:00:01  every 1s  (Ctrl-C quits)"
    assert lines[1] == render.fleet_totals(frame.views, frame.rates)
    assert lines[1].endswith("; owned by 2 workers; 39.5 msg/s")
    assert lines[2] == ""
    # The table is the shared fleet table, unchanged.
    assert lines[3:] == render.fleet_table(frame.views, frame.rates)
    rows = [line.split() for line in lines[4:]]
    assert rows[0] == ["demo-1", "STARTED", "worker-a", "1.5s", "2", "40", "2.2s", "20.0"]
    assert rows[2] == ["demo-3", "STOPPED", "-", "-", "2", "40", "-", "-"]


def test_watch_frame_shows_a_retried_error_and_an_empty_fleet() -> None:
    frame = render.WatchFrame("http://x", "00:00:00", 0.5, [], {}, error="HTTP 503 x: y")
    assert render.watch_lines(frame)[2:] == [
        "error: HTTP 503 x: y (retrying)",
        "",
        "no connections",
    ]


def test_fit_clips_width_and_height() -> None:
    lines = ["a" * 10, "b", "c", "d", "e"]
    assert render.fit(lines, 5, 3) == ["aaaa~", "b", "... 3 more rows"]
    assert render.fit(lines, 80, 10) == lines
    assert render.fit(lines, 0, 0) == lines  # a terminal nobody sized
