"""The local live view: table items shown through fleetctl's renderer and rate rule,
with fixed items and a fixed clock."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl import rates, render
from lambdas.router.views import connection_view
from local_stack.fleet_view import (
    WorkerStatus,
    held_by,
    render_lines,
    summary,
    views_of,
)
from wsfleet.item import ConnectionItem

NOW_MS = 1_767_225_600_000


def item(
    connection_id: str,
    *,
    state: str = "STARTED",
    owner: str | None = None,
    expires_in_ms: int | None = None,
    epoch: int = 0,
    last_seq: int = 0,
    start_gen: int = 1,
    updated_at_ms: int | None = NOW_MS - 1_000,
) -> ConnectionItem:
    return ConnectionItem(
        connection_id=connection_id,
        desired_state=state,
        ws_url=f"ws://127.0.0.1:8765/{connection_id}",
        lease_owner=owner,
        lease_expires_at_ms=0 if expires_in_ms is None else NOW_MS + expires_in_ms,
        lease_epoch=epoch,
        last_seq=last_seq,
        start_gen=start_gen,
        updated_at_ms=updated_at_ms,
    )


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


class LiveView:
    """What the runner does each refresh: Scan items -> API views -> rule -> frame."""

    def __init__(self) -> None:
        self.progress: dict[str, rates.Progress] = {}

    def refresh(
        self, items: list[ConnectionItem], workers: list[WorkerStatus] | None = None
    ) -> list[str]:
        views = views_of(items, NOW_MS)
        self.progress = rates.track(self.progress, views)
        return render_lines(views, rates.shown_rates(views, self.progress), workers or [])


# --- items as the API shows them ------------------------------------------------------


def test_items_become_the_api_view() -> None:
    items = [item("a", owner="w-1", expires_in_ms=5_000, last_seq=3), item("b")]
    assert views_of(items, NOW_MS) == [connection_view(i, NOW_MS) for i in items]


@pytest.mark.parametrize(
    ("owner", "expires_in_ms", "shown"),
    [
        ("w-1", 17_349, "17.3s"),
        ("w-1", 40, "0.0s"),
        ("w-1", 0, "lapsed"),
        ("w-1", -2_500, "lapsed"),
        (None, None, "-"),
        # Released: no owner, expiry 0. Still free however the clock reads.
        (None, -NOW_MS, "-"),
    ],
)
def test_lease_left(owner: str | None, expires_in_ms: int | None, shown: str) -> None:
    lines = LiveView().refresh([item("c", owner=owner, expires_in_ms=expires_in_ms)])
    assert rows_by_id(lines)["c"][3] == shown


# --- the frame --------------------------------------------------------------------------


def test_the_table_is_fleetctls_fleet_table() -> None:
    items = [
        item("demo-10", owner="w-2", expires_in_ms=4_960, epoch=3, last_seq=40),
        item("demo-2", owner="w-1", expires_in_ms=17_349, epoch=1, last_seq=125),
    ]
    views = views_of(items, NOW_MS)
    shown = {"demo-2": 5.0, "demo-10": None}
    lines = render_lines(views, shown)
    assert lines[0] == rates.RATE_LEGEND
    table = render.fleet_table(views, shown)
    assert lines[2 : 2 + len(table)] == table
    assert lines[2 + len(table) + 1] == render.fleet_totals(views, shown)


@pytest.mark.parametrize(
    ("before", "after", "shown"),
    [
        pytest.param(
            {"last_seq": 100, "updated_at_ms": NOW_MS - 6_000},
            {"last_seq": 125, "updated_at_ms": NOW_MS - 1_000},
            "5.0",
            id="advance: 25 over the 5 s between the two writes",
        ),
        pytest.param(
            {"last_seq": 100, "updated_at_ms": NOW_MS - 6_000},
            {"last_seq": 100, "updated_at_ms": NOW_MS - 1_000},
            "0.0",
            id="written without advance",
        ),
        pytest.param(
            {"last_seq": 100, "updated_at_ms": NOW_MS - 1_000},
            {"last_seq": 100, "updated_at_ms": NOW_MS - 1_000},
            "-",
            id="no checkpoint since the first refresh",
        ),
        pytest.param(
            {"last_seq": 500, "updated_at_ms": NOW_MS - 6_000},
            {"last_seq": 3, "updated_at_ms": NOW_MS - 1_000, "start_gen": 2},
            "-",
            id="restart resets last_seq",
        ),
        pytest.param(
            {"last_seq": 500, "updated_at_ms": NOW_MS - 6_000},
            {"last_seq": 500, "updated_at_ms": NOW_MS - 1_000, "epoch": 2, "owner": "w-2"},
            "-",
            id="a new owner",
        ),
        pytest.param(
            {"last_seq": 100, "updated_at_ms": NOW_MS - 6_000},
            {"last_seq": 125, "updated_at_ms": NOW_MS - 1_000, "owner": None},
            "-",
            id="released: no live lease",
        ),
    ],
)
def test_msg_per_s_over_two_refreshes(
    before: dict[str, Any], after: dict[str, Any], shown: str
) -> None:
    def at(changes: dict[str, Any]) -> ConnectionItem:
        fields: dict[str, Any] = {"owner": "w-1", "expires_in_ms": 10_000, "epoch": 1}
        return item("c", **(fields | changes))

    live = LiveView()
    assert rows_by_id(live.refresh([at(before)]))["c"][-1] == "-"
    assert rows_by_id(live.refresh([at(after)]))["c"][-1] == shown


def test_the_rate_stays_between_checkpoints_whatever_the_refreshes() -> None:
    live = LiveView()
    first = item("c", owner="w-1", expires_in_ms=9_000, epoch=1, last_seq=100)
    second = item(
        "c", owner="w-1", expires_in_ms=9_000, epoch=1, last_seq=125, updated_at_ms=NOW_MS + 4_000
    )
    frames = [live.refresh([checkpoint]) for checkpoint in (first, first, second, second, second)]
    assert [rows_by_id(frame)["c"][-1] for frame in frames] == ["-", "-", "5.0", "5.0", "5.0"]
    totals = next(line for line in frames[-1] if line.startswith("1 connection:"))
    assert totals.endswith("; 5.0 msg/s")


def test_worker_footer() -> None:
    items = [
        item("a", owner="local-worker-1", expires_in_ms=5_000),
        item("b", owner="local-worker-1", expires_in_ms=5_000),
        item("c", owner="local-worker-2", expires_in_ms=-100),
        item("d", owner="elsewhere", expires_in_ms=9_000),
        item("e"),
    ]
    workers = [
        WorkerStatus("local-worker-1"),
        WorkerStatus("local-worker-2", exit_code=-9),
        WorkerStatus("local-worker-3", exit_code=1),
    ]
    lines = LiveView().refresh(items, workers)
    footer = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ")}
    assert footer["local-worker-1"].split() == ["alive", "holds", "2"]
    assert footer["local-worker-2"].split() == ["dead", "(signal", "9)", "holds", "1"]
    assert footer["local-worker-3"].split() == ["dead", "(exit", "1)", "holds", "0"]
    # An owner the runner did not start is still accounted for.
    assert footer["elsewhere"].split() == ["not", "started", "here", "holds", "1"]
    assert "workers: 1/3 alive" in lines
    assert (
        "5 connections: 5 STARTED (4 owned, 1 lapsed), 0 STOPPED; "
        "leases held by 3 workers; 0.0 msg/s"
    ) in lines


def test_empty_table() -> None:
    lines = render_lines([], {}, [WorkerStatus("w-1")])
    assert "no connections" in lines
    assert "workers: 1/1 alive" in lines


def test_held_by() -> None:
    views = views_of(
        [item("a", owner="w-1"), item("b", owner="w-1", expires_in_ms=-5), item("c")], NOW_MS
    )
    assert held_by(views) == {"w-1": 2}


def test_worker_status_describe() -> None:
    assert WorkerStatus("w").describe() == "alive"
    assert WorkerStatus("w", 0).describe() == "dead (exit 0)"
    assert WorkerStatus("w", -15).describe() == "dead (signal 15)"
    assert not WorkerStatus("w", 0).alive


# --- the runner's summary line ----------------------------------------------------------


def test_summary() -> None:
    views = views_of(
        [
            item("demo-2", owner="w-2", expires_in_ms=-1, last_seq=30),
            item("demo-1", owner="w-1", expires_in_ms=3_000, last_seq=55),
            item("demo-3", last_seq=0),
        ],
        NOW_MS,
    )
    line = summary(
        views, {"demo-1": 5.0, "demo-2": None}, [WorkerStatus("w-1"), WorkerStatus("w-2", -9)]
    )
    assert line == (
        "workers 1/2 alive | 3 connections, 2 owned | demo-1 seq=55 owner=w-1 5.0/s; "
        "demo-2 seq=30 owner=w-2 (lapsed); demo-3 seq=0 owner=-"
    )


def test_summary_of_items_without_rates() -> None:
    # The report after shutdown: released leases, final checkpoints, no rates.
    items = [item("demo-1", last_seq=77), item("demo-2", last_seq=76)]
    views = views_of(items, NOW_MS)
    assert summary(views, {}, [WorkerStatus("w-1", 0)]) == (
        "workers 0/1 alive | 2 connections, 0 owned | demo-1 seq=77 owner=-; demo-2 seq=76 owner=-"
    )
