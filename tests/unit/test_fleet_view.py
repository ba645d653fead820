"""The local live view: one Scan of the table (connections, worker sessions, checkpoint
pages) shown through the router's view and fleetctl's renderer, health and the owners'
own messages/s included, with fixed items and a fixed clock."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl import rates, render
from lambdas.router.views import OwnerRecords, connection_view
from local_stack.fleet_view import (
    WorkerStatus,
    held_by,
    render_lines,
    sort_table,
    summary,
    views_of,
    views_of_table,
)
from wsfleet import schema
from wsfleet.checkpoint_page import CheckpointPage, PageEntry, page_item
from wsfleet.item import ConnectionItem, to_attribute
from wsfleet.session_rules import SessionItem

NOW_MS = 1_767_225_600_000
GEN = 1


def connection(
    connection_id: str,
    *,
    state: str = "STARTED",
    owner: str | None = None,
    epoch: int = 1,
    last_seq: int = 0,
    start_gen: int = 1,
    parked_reason: str | None = None,
) -> dict[str, Any]:
    """A connection item as a Scan returns it (typed attributes)."""
    plain: dict[str, Any] = {
        **schema.connection_key(connection_id),
        schema.DESIRED_STATE: state,
        schema.WS_URL: f"ws://127.0.0.1:8765/{connection_id}",
        schema.LEASE_EPOCH: epoch,
        schema.LAST_SEQ: last_seq,
        schema.START_GEN: start_gen,
        schema.SEQ_GEN: 0,
        schema.UPDATED_AT_MS: NOW_MS - 60_000,  # the last change of owner, long ago
    }
    if owner is not None:
        plain |= {schema.LEASE_OWNER: owner, schema.OWNER_SESSION_GEN: GEN}
    if parked_reason is not None:
        plain |= {schema.PARKED_REASON: parked_reason, schema.PARKED_AT_MS: NOW_MS - 5_000}
    return {name: to_attribute(value) for name, value in plain.items()}


def session(worker_id: str, *, left_ms: int = 1_500, state: str = "ALIVE") -> dict[str, Any]:
    plain = {
        **schema.session_key(worker_id, GEN),
        schema.SESSION_STATE: state,
        schema.SESSION_EXPIRES_AT_MS: NOW_MS + left_ms,
        schema.SESSION_STARTED_AT_MS: NOW_MS - 100_000,
    }
    return {name: to_attribute(value) for name, value in plain.items()}


def page(
    worker_id: str, written_at_ms: int, **seqs: int | tuple[int, int] | PageEntry
) -> dict[str, Any]:
    """``worker_id``'s page: ``connection=seq`` (epoch 1, advanced 100 ms before the
    write, 5 msg/s, streaming), ``connection=(epoch, seq)``, or a whole entry."""
    entries = {}
    for cid, value in seqs.items():
        if not isinstance(value, PageEntry):
            epoch, seq = value if isinstance(value, tuple) else (1, value)
            value = PageEntry(epoch, 0, seq, written_at_ms - 100, rate=5.0)
        entries[cid.replace("_", "-")] = value
    return page_item(worker_id, GEN, entries, written_at_ms)


def refresh(
    scanned: list[dict[str, Any]],
    workers: list[WorkerStatus] | None = None,
    now_ms: int = NOW_MS,
) -> list[str]:
    """What the runner does each refresh: Scan -> API views -> frame."""
    return render_lines(views_of_table(scanned, now_ms), workers or [])


def rows_by_id(lines: list[str]) -> dict[str, list[str]]:
    """Table rows split into cells, keyed by connection id."""
    start = next(i for i, line in enumerate(lines) if line.startswith("CONNECTION"))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


STATUS, SESSION_LEFT, LAST_SEQ, CKPT_AGE, LAST_MSG, MSG_S = 2, 4, 6, 7, 8, 9


# --- a Scan as the API shows it -------------------------------------------------------


def test_a_scan_becomes_the_api_views_with_each_owners_session_and_page() -> None:
    scanned = [
        connection("a", owner="w-1", last_seq=3),
        session("w-1"),
        page("w-1", NOW_MS - 2_000, a=40),
        connection("b"),
        session("w-2", state="DEAD"),  # a session of nobody's connections
    ]
    views = views_of_table(scanned, NOW_MS)
    a, b = (ConnectionItem.from_dynamodb(scanned[i]) for i in (0, 3))
    w1 = OwnerRecords(
        SessionItem.from_dynamodb(scanned[1]),
        CheckpointPage(NOW_MS - 2_000, {"a": PageEntry(1, 0, 40, NOW_MS - 2_100, rate=5.0)}),
    )
    assert views == [connection_view(a, NOW_MS, w1), connection_view(b, NOW_MS)]
    assert (views[0]["last_seq"], views[0]["checkpoint_age_seconds"]) == (40, 2.0)
    assert (views[0]["owner_session_state"], views[0]["session_seconds_left"]) == ("ALIVE", 1.5)
    assert (views[0]["status"], views[0]["messages_per_second"]) == ("streaming", 5.0)
    assert views[0]["seconds_since_last_message"] == 2.1


def test_sessions_and_pages_are_never_rows() -> None:
    contents = sort_table([session("w-1"), page("w-1", NOW_MS, a=1), connection("a")])
    assert [item.connection_id for item in contents.connections] == ["a"]
    assert set(contents.owners) == {("w-1", GEN)}
    lines = refresh([session("w-1"), page("w-1", NOW_MS)])
    assert "no connections" in lines


def test_a_page_without_its_session_is_not_shown() -> None:
    # Forgetting a session deletes its item, then its page: in between, as the router.
    views = views_of_table([connection("a", owner="w-1"), page("w-1", NOW_MS, a=9)], NOW_MS)
    assert (views[0]["owner_session_state"], views[0]["last_seq"]) == (None, 0)


def test_views_of_items_without_records_show_no_session() -> None:
    item = ConnectionItem.from_dynamodb(connection("a", owner="w-1", last_seq=5))
    assert views_of([item], NOW_MS) == [connection_view(item, NOW_MS)]


@pytest.mark.parametrize(
    ("owner", "records", "shown"),
    [
        ("w-1", [session("w-1", left_ms=17_349)], "17.3s"),
        ("w-1", [session("w-1", left_ms=40)], "0.0s"),
        ("w-1", [session("w-1", left_ms=0)], "lapsed"),
        ("w-1", [session("w-1", left_ms=-2_500)], "lapsed"),
        ("w-1", [session("w-1", left_ms=5_000, state="DEAD")], "dead"),
        ("w-1", [], "gone"),
        (None, [session("w-1")], "-"),
    ],
)
def test_session_left(owner: str | None, records: list[dict[str, Any]], shown: str) -> None:
    lines = refresh([connection("c", owner=owner), *records])
    assert rows_by_id(lines)["c"][SESSION_LEFT] == shown


@pytest.mark.parametrize(
    ("entry", "last_seq", "age"),
    [
        pytest.param(55, "55", "2.5s", id="the owner's page: its seq and age"),
        pytest.param((0, 99), "7", "-", id="an entry of an older hold: the item's"),
    ],
)
def test_the_checkpoint_comes_from_the_owners_page(
    entry: int | tuple[int, int], last_seq: str, age: str
) -> None:
    scanned = [connection("c", owner="w-1", last_seq=7), session("w-1")]
    lines = refresh([*scanned, page("w-1", NOW_MS - 2_500, c=entry)])
    assert rows_by_id(lines)["c"][LAST_SEQ : CKPT_AGE + 1] == [last_seq, age]


# --- the frame --------------------------------------------------------------------------


def test_the_table_is_fleetctls_fleet_table() -> None:
    scanned = [
        connection("demo-10", owner="w-2", epoch=3, last_seq=40),
        connection("demo-2", owner="w-1", last_seq=125),
        session("w-1", left_ms=17_349),
        session("w-2", left_ms=4_960),
        page("w-1", NOW_MS - 2_000, demo_2=130),
    ]
    views = views_of_table(scanned, NOW_MS)
    lines = render_lines(views)
    assert lines[0] == rates.RATE_LEGEND
    table = render.fleet_table(views)
    assert lines[2 : 2 + len(table)] == table
    assert lines[2 + len(table) + 1] == render.fleet_totals(views)
    assert lines[2 + len(table) + 1] == (
        "2 connections: 2 STARTED (1 streaming, 1 connecting), 0 STOPPED; owned by 2 workers; "
        "5.0 msg/s"
    )


OWNED = [connection("c", owner="w-1"), session("w-1", left_ms=10_000)]


def entry(**health: Any) -> PageEntry:
    """The entry of ``c`` in a page written at ``NOW_MS - 2_000``: seq 100, advanced
    100 ms before the write, 5 msg/s, streaming, unless ``health`` says otherwise."""
    return PageEntry(1, 0, 100, NOW_MS - 2_100, **({"rate": 5.0} | health))


@pytest.mark.parametrize(
    ("scanned", "status", "last_msg", "msg_s", "error"),
    [
        pytest.param(
            [*OWNED, page("w-1", NOW_MS - 2_000, c=entry())],
            "streaming",
            "2.1s",
            "5.0",
            "",
            id="streaming: the owner's rate, time since the message",
        ),
        pytest.param(
            [
                *OWNED,
                page(
                    "w-1",
                    NOW_MS - 2_000,
                    c=entry(rate=0, status="backing_off", reconnects=4, last_error="HTTP 503"),
                ),
            ],
            "backing_off",
            "2.1s",
            "0.0",
            "HTTP 503 (x4)",
            id="backing off after failures",
        ),
        pytest.param(
            [
                *OWNED,
                page(
                    "w-1",
                    NOW_MS - 2_000,
                    c=PageEntry(1, 0, 0, None, rate=None, status="connecting"),
                ),
            ],
            "connecting",
            "-",
            "-",
            "",
            id="connecting: nothing handled yet",
        ),
        pytest.param(OWNED, "connecting", "-", "-", "", id="owned, no page line yet"),
        pytest.param(
            [OWNED[0], session("w-1", state="DEAD"), page("w-1", NOW_MS - 2_000, c=entry())],
            "pending",
            "-",
            "-",
            "",
            id="the owner's session reaped: its page no longer counts",
        ),
        pytest.param(
            [OWNED[0], session("w-1", left_ms=-100), page("w-1", NOW_MS - 2_000, c=entry())],
            "pending",
            "-",
            "-",
            "",
            id="the owner's session lapsed",
        ),
        pytest.param([connection("c")], "pending", "-", "-", "", id="free"),
        pytest.param(
            [connection("c", parked_reason="HTTP 403 from upstream")],
            "failed",
            "-",
            "-",
            "HTTP 403 from upstream",
            id="parked",
        ),
        pytest.param([connection("c", state="STOPPED")], "stopped", "-", "-", "", id="stopped"),
    ],
)
def test_health_comes_from_the_owners_page(
    scanned: list[dict[str, Any]], status: str, last_msg: str, msg_s: str, error: str
) -> None:
    line = next(line for line in refresh(scanned) if line.startswith("c "))
    cells = line.split()
    assert (cells[STATUS], cells[LAST_MSG], cells[MSG_S]) == (status, last_msg, msg_s)
    assert " ".join(cells[MSG_S + 1 :]) == error


def test_the_rate_is_the_owners_whatever_the_refreshes() -> None:
    # Nothing is measured between refreshes: every refresh of the same page shows the
    # rate the owner wrote into it, from the first one on.
    scanned = [*OWNED, page("w-1", NOW_MS, c=entry(rate=6.2))]
    frames = [refresh(scanned, now_ms=NOW_MS + at_ms) for at_ms in (0, 800, 4_100, 5_000)]
    assert [rows_by_id(frame)["c"][MSG_S] for frame in frames] == ["6.2"] * 4
    totals = next(line for line in frames[-1] if line.startswith("1 connection:"))
    assert totals == (
        "1 connection: 1 STARTED (1 streaming), 0 STOPPED; owned by 1 worker; 6.2 msg/s"
    )


def test_worker_footer() -> None:
    scanned = [
        connection("a", owner="local-worker-1"),
        connection("b", owner="local-worker-1"),
        connection("c", owner="local-worker-2"),
        connection("d", owner="elsewhere"),
        connection("e"),
        session("local-worker-1"),
        session("local-worker-2", left_ms=-100),
        session("elsewhere", left_ms=9_000),
    ]
    workers = [
        WorkerStatus("local-worker-1"),
        WorkerStatus("local-worker-2", exit_code=-9),
        WorkerStatus("local-worker-3", exit_code=1),
    ]
    lines = refresh(scanned, workers)
    footer = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ")}
    assert footer["local-worker-1"].split() == ["alive", "holds", "2"]
    assert footer["local-worker-2"].split() == ["dead", "(signal", "9)", "holds", "1"]
    assert footer["local-worker-3"].split() == ["dead", "(exit", "1)", "holds", "0"]
    # An owner the runner did not start is still accounted for.
    assert footer["elsewhere"].split() == ["not", "started", "here", "holds", "1"]
    assert "workers: 1/3 alive" in lines
    assert (
        "5 connections: 5 STARTED (3 connecting, 2 pending), 0 STOPPED; owned by 3 workers; "
        "0.0 msg/s"
    ) in lines


def test_empty_table() -> None:
    lines = render_lines([], [WorkerStatus("w-1")])
    assert "no connections" in lines
    assert "workers: 1/1 alive" in lines


def test_held_by() -> None:
    scanned = [connection("a", owner="w-1"), connection("b", owner="w-1"), connection("c")]
    assert held_by(views_of_table([*scanned, session("w-1", left_ms=-5)], NOW_MS)) == {"w-1": 2}


def test_worker_status_describe() -> None:
    assert WorkerStatus("w").describe() == "alive"
    assert WorkerStatus("w", 0).describe() == "dead (exit 0)"
    assert WorkerStatus("w", -15).describe() == "dead (signal 15)"
    assert not WorkerStatus("w", 0).alive


# --- the runner's summary line ----------------------------------------------------------


def test_summary() -> None:
    views = views_of_table(
        [
            connection("demo-2", owner="w-2", last_seq=30),
            connection("demo-1", owner="w-1"),
            connection("demo-3"),
            session("w-1", left_ms=3_000),
            session("w-2", left_ms=-1),
            page("w-1", NOW_MS, demo_1=55),
        ],
        NOW_MS,
    )
    line = summary(views, [WorkerStatus("w-1"), WorkerStatus("w-2", -9)])
    assert line == (
        "workers 1/2 alive | 3 connections, 1 streaming, 5.0 msg/s | "
        "demo-1 seq=55 owner=w-1 streaming 5.0/s; demo-2 seq=30 owner=w-2 pending; "
        "demo-3 seq=0 owner=- pending"
    )


def test_summary_of_items_without_rates() -> None:
    # The report after shutdown: released connections, final checkpoints, no rates.
    scanned = [connection("demo-1", last_seq=77), connection("demo-2", last_seq=76)]
    assert summary(views_of_table(scanned, NOW_MS), [WorkerStatus("w-1", 0)]) == (
        "workers 0/1 alive | 2 connections, 0 streaming, 0.0 msg/s | "
        "demo-1 seq=77 owner=- pending; demo-2 seq=76 owner=- pending"
    )
