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
        "parked_reason": None,
        "parked_at": None,
        "failing_since": None,
        "status": "streaming",
        "seconds_since_last_message": 0.4,
        "reconnects": 0,
        "last_error": None,
        "messages_per_second": 5.0,
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
    "status": "pending",
    "seconds_since_last_message": None,
    "reconnects": None,
    "last_error": None,
    "messages_per_second": None,
}
"""No owner: no session, the item's own checkpoint, and no live worker's word."""


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
    lines = render.connection_table(
        [free("demo-2", state="STOPPED", status="stopped"), view("demo-1")]
    )
    assert re.split(" {2,}", lines[0]) == list(render.LIST_COLUMNS)
    assert lines == [
        "CONNECTION  STATE    STATUS     OWNER     SESSION LEFT  EPOCH  LAST_SEQ  CKPT AGE  "
        "LAST MSG  WS_URL",
        "demo-1      STARTED  streaming  worker-a          1.5s      2        40      2.2s      "
        "0.4s  ws://127.0.0.1:8765/demo-1",
        "demo-2      STOPPED  stopped    -                    -      2        40         -         "
        "-  ws://127.0.0.1:8765/demo-2",
    ]
    assert render.connection_table([]) == ["no connections"]


def test_connection_details() -> None:
    lines = render.connection_details(view("demo-1", metadata={"team": "x"}))
    assert lines == [
        "connection     demo-1",
        "state          STARTED",
        "status         streaming",
        "ws_url         ws://127.0.0.1:8765/demo-1",
        "owner          worker-a",
        "session        #3 ALIVE, 1.5s left",
        "epoch          2",
        "last_seq       40",
        "checkpoint     owner's page of 2026-11-30T01:00:07.000+00:00 (2.2s ago)",
        "last advanced  2026-11-30T01:00:06.900+00:00",
        "last message   0.4s ago",
        "messages/s     5.0",
        "start_gen      1",
        "created        2026-11-30T01:00:00.000+00:00",
        "updated        2026-11-30T01:00:05.000+00:00",
        "expires        -",
        'metadata       {"team":"x"}',
    ]


def test_connection_details_show_the_credentials_reference_and_the_protocol_when_set() -> None:
    plain = render.connection_details(view("demo-1", auth=None, protocol=None))
    assert not [line for line in plain if line.startswith(("auth", "protocol"))]
    lines = render.connection_details(
        view(
            "demo-1",
            auth={"secret": "websocket-fleet/feeds/acme"},
            protocol={"name": "live", "options": {}},
        )
    )
    assert lines[3:6] == [
        "ws_url         ws://127.0.0.1:8765/demo-1",
        'auth           {"secret":"websocket-fleet/feeds/acme"}',
        'protocol       {"name":"live","options":{}}',
    ]


def test_connection_details_of_a_troubled_connection() -> None:
    # Reconnects and the last error are shown when set, in place; parking at the end.
    troubled = view(
        "demo-1",
        status="backing_off",
        seconds_since_last_message=12.34,
        messages_per_second=0,
        reconnects=4,
        last_error="HTTP 503",
    )
    lines = render.connection_details(troubled)
    assert lines[2] == "status         backing_off"
    assert lines[10:14] == [
        "last message   12.3s ago",
        "messages/s     0.0",
        "reconnects     4",
        "last error     HTTP 503",
    ]
    parked = free(
        "demo-2",
        status="failed",
        last_error="HTTP 403 from upstream",
        parked_reason="HTTP 403 from upstream",
        parked_at="2026-11-30T01:00:09.000+00:00",
        failing_since="2026-11-30T00:59:00.000+00:00",
    )
    lines = render.connection_details(parked)
    shown = dict(re.split(" {2,}", line, maxsplit=1) for line in lines)
    assert lines[-3:] == [
        "parked         HTTP 403 from upstream",
        "parked at      2026-11-30T01:00:09.000+00:00",
        "failing since  2026-11-30T00:59:00.000+00:00",
    ]
    assert (shown["status"], shown["last error"]) == ("failed", "HTTP 403 from upstream")
    assert (shown["last message"], shown["messages/s"]) == ("-", "-")
    assert "reconnects" not in shown  # null: no live worker runs it


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


PARKED = "no message handled for 300 s: connection refused"
LAPSED = {
    "owner": "w-3",
    "session_seconds_left": 0,
    "status": "pending",
    "seconds_since_last_message": None,
    "reconnects": None,
    "messages_per_second": None,
}
"""An owner whose session lapsed: no live worker runs the connection."""


def fleet() -> list[dict[str, Any]]:
    """One connection of every status, and a slow stream that reconnected."""
    return [
        view(
            "demo-10",
            owner="w-2",
            session_seconds_left=4.96,
            epoch=3,
            seconds_since_last_message=12.34,
            messages_per_second=0.033,
            reconnects=2,
            last_error="closed by upstream (1011)",
        ),
        view("demo-2", owner="w-1", session_seconds_left=17.349, epoch=1, last_seq=125),
        view(
            "demo-3",
            status="connecting",
            seconds_since_last_message=None,
            messages_per_second=None,
        ),
        view(
            "demo-4",
            owner="w-2",
            session_seconds_left=4.96,
            epoch=3,
            status="backing_off",
            seconds_since_last_message=31.0,
            messages_per_second=0,
            reconnects=4,
            last_error="HTTP 503",
        ),
        free("demo-5", status="failed", last_error=PARKED, parked_reason=PARKED, last_seq=77),
        view("demo-6", **LAPSED, epoch=1, last_seq=12),
        free("demo-7", state="STOPPED", status="stopped", last_seq=9),
    ]


def test_fleet_table() -> None:
    assert render.fleet_table(fleet()) == [
        "CONNECTION  STATE    STATUS       OWNER     SESSION LEFT  EPOCH  LAST_SEQ"
        "  CKPT AGE  LAST MSG  MSG/S  ERROR",
        "demo-2      STARTED  streaming    w-1              17.3s      1       125"
        "      2.2s      0.4s    5.0",
        "demo-3      STARTED  connecting   worker-a          1.5s      2        40"
        "      2.2s         -      -",
        "demo-4      STARTED  backing_off  w-2               5.0s      3        40"
        "      2.2s     31.0s    0.0  HTTP 503 (x4)",
        "demo-5      STARTED  failed       -                    -      2        77"
        "         -         -      -  no message handled for 300 s: connectio~",
        "demo-6      STARTED  pending      w-3             lapsed      1        12"
        "      2.2s         -      -",
        "demo-7      STOPPED  stopped      -                    -      2         9"
        "         -         -      -",
        "demo-10     STARTED  streaming    w-2               5.0s      3        40"
        "      2.2s     12.3s  0.033  closed by upstream (1011) (x2)",  # natural order
    ]
    assert render.fleet_table([]) == ["no connections"]


def test_a_view_without_health_shows_none() -> None:
    # An API from before the health fields: the columns are there, with "-".
    health = ("status", "seconds_since_last_message", "reconnects", "last_error")
    older = {k: v for k, v in view("a").items() if k not in {*health, "messages_per_second"}}
    assert render.fleet_table([older])[1].split() == [
        "a",
        "STARTED",
        "-",
        "worker-a",
        "1.5s",
        "2",
        "40",
        "2.2s",
        "-",
        "-",
    ]
    assert render.fleet_totals([older]) == (
        "1 connection: 1 STARTED (1 unknown), 0 STOPPED; owned by 1 worker; 0.0 msg/s"
    )


@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        (None, "-"),
        ("5", "-"),
        (True, "-"),
        (0, "0.0"),
        (0.0, "0.0"),
        (0.0033, "0.0033"),  # two significant digits, as the owner rounds them
        (0.033, "0.033"),
        (0.1, "0.1"),
        (0.46, "0.5"),
        (12, "12.0"),
        (1200, "1200.0"),
    ],
)
def test_format_rate(rate: Any, shown: str) -> None:
    assert render.format_rate(rate) == shown


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({}, ""),
        ({"last_error": "HTTP 503", "reconnects": 4}, "HTTP 503 (x4)"),
        ({"last_error": "HTTP 503", "reconnects": 0}, "HTTP 503"),
        ({"last_error": "HTTP 403 from upstream", "reconnects": None}, "HTTP 403 from upstream"),
        ({"last_error": "", "reconnects": 3}, ""),  # reconnects alone are not an error
        ({"last_error": "a\n b\tc", "reconnects": 1}, "a b c (x1)"),  # one line
        ({"last_error": "x" * 40, "reconnects": 0}, "x" * 40),
        ({"last_error": "x" * 41, "reconnects": 0}, "x" * 39 + "~"),
        ({"last_error": PARKED, "reconnects": None}, "no message handled for 300 s: connectio~"),
        (
            {"last_error": PARKED, "reconnects": 12},
            "no message handled for 300 s: con~ (x12)",  # the count is kept
        ),
    ],
)
def test_format_error(changes: dict[str, Any], shown: str) -> None:
    error = render.format_error(view("c", **changes))
    assert error == shown
    assert len(error) <= render.ERROR_WIDTH


def test_fleet_table_columns_line_up() -> None:
    lines = render.fleet_table(
        [
            view("a", owner="local-worker-1", last_seq=7, messages_per_second=12.25),
            view(
                "much-longer-id",
                owner="w",
                session_seconds_left=15.0,
                last_seq=123456,
                seconds_since_last_message=1234.5,
                messages_per_second=None,
            ),
        ]
    )
    header, *rows = lines
    for column in ("SESSION LEFT", "EPOCH", "LAST_SEQ", "CKPT AGE", "LAST MSG", "MSG/S"):
        # Numbers are right-aligned: they end where their header ends.
        end = header.index(column) + len(column)
        for row in rows:
            assert row[end - 1] != " "
            assert row[end : end + 1] in ("", " ")
    assert rows[0].endswith("12.2")


def test_fleet_totals() -> None:
    assert render.fleet_totals(fleet()) == (
        "7 connections: 6 STARTED (2 streaming, 1 connecting, 1 backing off, 1 failed, "
        "1 pending), 1 STOPPED; owned by 4 workers; 5.0 msg/s"
    )
    assert render.fleet_totals([]) == (
        "0 connections: 0 STARTED, 0 STOPPED; owned by 0 workers; 0.0 msg/s"
    )


def test_fleet_totals_sum_the_views_rates() -> None:
    views = [
        view("a", owner="w-1", messages_per_second=12.0),
        view("b", owner="w-1", messages_per_second=12.0),
        view("c", owner="w-2", messages_per_second=4.5),
        view("d", owner="w-2", messages_per_second=0.5),
        view("e", owner="w-2", status="failed", messages_per_second=None),
        free("f", state="STOPPED", status="stopped"),
    ]
    assert render.fleet_totals(views) == (
        "6 connections: 5 STARTED (4 streaming, 1 failed), 1 STOPPED; owned by 2 workers; "
        "29.0 msg/s"
    )


def test_fleet_totals_count_a_status_they_do_not_know() -> None:
    views = [view("a"), view("b", status="draining"), view("c", status=None)]
    assert render.fleet_totals(views).startswith(
        "3 connections: 3 STARTED (1 streaming, 1 draining, 1 unknown), 0 STOPPED;"
    )


def test_summary_line() -> None:
    assert render.summary_line(fleet()) == (
        "7 connections, 2 streaming, 5.0 msg/s | "
        "demo-2 seq=125 owner=w-1 streaming 5.0/s; demo-3 seq=40 owner=worker-a connecting; "
        "demo-4 seq=40 owner=w-2 backing_off 0.0/s; demo-5 seq=77 owner=- failed; "
        "demo-6 seq=12 owner=w-3 pending; demo-7 seq=9 owner=- stopped; "
        "demo-10 seq=40 owner=w-2 streaming 0.033/s"
    )
    assert render.summary_line([]) == "0 connections, 0 streaming, 0.0 msg/s"


def test_summary_line_names_a_bounded_number_of_connections() -> None:
    line = render.summary_line([view(f"c-{i}", last_seq=i) for i in range(20)])
    assert line.startswith(
        "20 connections, 20 streaming, 100.0 msg/s | c-0 seq=0 owner=worker-a streaming 5.0/s; "
        "c-1 seq=1"
    )
    assert "c-11 seq=11" in line
    assert "c-12" not in line
    assert line.endswith("; ... 8 more")


def test_watch_frame() -> None:
    frame = render.WatchFrame(
        api_url="http://127.0.0.1:8080",
        clock="12:00:01",
        interval_s=1.0,
        views=[
            view("demo-2", owner="worker-b", last_seq=90, messages_per_second=19.5),
            view("demo-1", messages_per_second=20),
            free("demo-3", state="STOPPED", status="stopped"),
        ],
    )
    assert render.watch_lines(frame) == [
        "fleet at http://127.0.0.1:8080  12:00:01  every 1s  (Ctrl-C quits)",
        "3 connections: 2 STARTED (2 streaming), 1 STOPPED; owned by 2 workers; 39.5 msg/s",
        "",
        # The table is the shared fleet table.
        *render.fleet_table(frame.views),
    ]
    assert render.watch_lines(frame)[4].split() == [
        "demo-1",
        "STARTED",
        "streaming",
        "worker-a",
        "1.5s",
        "2",
        "40",
        "2.2s",
        "0.4s",
        "20.0",
    ]


def test_watch_frame_shows_a_retried_error_and_an_empty_fleet() -> None:
    frame = render.WatchFrame("http://x", "00:00:00", 0.5, [], error="HTTP 503 x: y")
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


def test_details_name_the_owners_version_when_its_session_says_one() -> None:
    lines = render.connection_details(view("c-1", owner_version="1.0.0"))
    assert "version        1.0.0" in lines
    assert lines.index("version        1.0.0") == lines.index("owner          worker-a") + 1
    assert not [line for line in render.connection_details(view("c-1")) if "version" in line]
