"""Pure formatting: tables, details, the watch frame and its message rates."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl import render


def view(connection_id: str, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "connection_id": connection_id,
        "state": "STARTED",
        "ws_url": f"ws://127.0.0.1:8765/{connection_id}",
        "owner": "worker-a",
        "lease_seconds_left": 1.5,
        "epoch": 2,
        "last_seq": 40,
        "start_gen": 1,
        "created_at": "2026-11-30T01:00:00.000+00:00",
        "updated_at": "2026-11-30T01:00:05.000+00:00",
        "expires_at": None,
        "metadata": None,
    }
    return base | changes


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (0, "lapsed"), (-1, "lapsed"), (1.25, "1.2s"), (19.96, "20.0s")],
)
def test_format_lease(seconds: float | None, shown: str) -> None:
    assert render.format_lease(seconds) == shown


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
    lines = render.connection_table([view("demo-2", owner=None, state="STOPPED"), view("demo-1")])
    assert lines[0].split() == list(render.LIST_COLUMNS)
    assert lines[1].split() == [
        "demo-1",
        "STARTED",
        "worker-a",
        "1.5s",
        "2",
        "40",
        "ws://127.0.0.1:8765/demo-1",
    ]
    assert lines[2].split()[:3] == ["demo-2", "STOPPED", "-"]
    assert render.connection_table([]) == ["no connections"]


def test_connection_details() -> None:
    lines = render.connection_details(view("demo-1", metadata={"team": "x"}))
    assert lines[0] == "connection  demo-1"
    assert "lease left  1.5s" in lines
    assert "expires     -" in lines
    assert 'metadata    {"team":"x"}' in lines
    assert len(lines) == 12


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


def test_samples_keep_a_window_and_forget_vanished_connections() -> None:
    history = render.with_sample({}, 0.0, {"a": 0, "b": 0}, window_s=10)
    history = render.with_sample(history, 6.0, {"a": 30, "b": 0}, window_s=10)
    history = render.with_sample(history, 12.0, {"a": 60}, window_s=10)
    assert history == {"a": [(6.0, 30), (12.0, 60)]}


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([], None),
        ([(0.0, 5)], None),  # nothing to compare with yet
        ([(0.0, 5), (0.0, 9)], None),  # no time passed
        ([(0.0, 0), (1.0, 0), (2.0, 40)], 20.0),  # a checkpoint per heartbeat: over the window
        ([(0.0, 10), (1.0, 10)], 0.0),
        ([(0.0, 500), (1.0, 520), (2.0, 3), (4.0, 13)], 5.0),  # restarted on a new stream
        ([(0.0, 500), (1.0, 3)], None),
    ],
)
def test_rate_from_checkpoint_samples(
    samples: list[tuple[float, int]], expected: float | None
) -> None:
    assert render.rate(samples) == expected


def test_rates_per_connection() -> None:
    assert render.rates({"a": [(0.0, 0), (2.0, 10)], "b": [(2.0, 7)]}) == {"a": 5.0, "b": None}


def test_watch_frame() -> None:
    frame = render.WatchFrame(
        api_url="http://127.0.0.1:8080",
        clock="12:00:01",
        interval_s=1.0,
        views=[
            view("demo-2", owner="worker-b", last_seq=90),
            view("demo-1"),
            view("demo-3", state="STOPPED", owner=None, lease_seconds_left=None),
        ],
        rates={"demo-1": 20.0, "demo-2": 19.5, "demo-3": None},
    )
    lines = render.watch_lines(frame)
    assert lines[0] == "fleet at http://127.0.0.1:8080  12:00:01  every 1s  (Ctrl-C quits)"
    assert lines[1] == ("3 connections: 2 STARTED (2 owned), 1 STOPPED; 2 workers; 39.5 msg/s")
    assert lines[2] == ""
    assert lines[3].split() == list(render.WATCH_COLUMNS)
    rows = [line.split() for line in lines[4:]]
    assert [row[0] for row in rows] == ["demo-1", "demo-2", "demo-3"]  # sorted
    assert rows[0] == ["demo-1", "STARTED", "worker-a", "1.5s", "2", "40", "20.0"]
    assert rows[2] == ["demo-3", "STOPPED", "-", "-", "2", "40", "-"]


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
