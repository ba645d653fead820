"""The live view's formatting, with fixed items and a fixed clock."""

from __future__ import annotations

import pytest

from local_stack.fleet_view import (
    Snapshot,
    SnapshotHistory,
    WorkerStatus,
    fit,
    lease_left,
    natural_key,
    rate,
    render,
    snapshot,
    summary_line,
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
    updated_at_ms: int | None = None,
) -> ConnectionItem:
    return ConnectionItem(
        connection_id=connection_id,
        desired_state=state,
        ws_url=f"ws://127.0.0.1:8765/{connection_id}",
        lease_owner=owner,
        lease_expires_at_ms=0 if expires_in_ms is None else NOW_MS + expires_in_ms,
        lease_epoch=epoch,
        last_seq=last_seq,
        updated_at_ms=updated_at_ms,
    )


def rows_by_id(text: str) -> dict[str, list[str]]:
    """Table rows split into cells, keyed by connection id."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("CONNECTION"))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


# --- lease left --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "expires_in_ms", "expected"),
    [
        ("w-1", 17_349, "17.3"),
        ("w-1", 17_360, "17.4"),
        ("w-1", 40, "0.0"),
        ("w-1", 0, "lapsed"),
        ("w-1", -2_500, "lapsed"),
        (None, None, "-"),
        # Released: no owner, expiry 0. Still free however the clock reads.
        (None, -NOW_MS, "-"),
    ],
)
def test_lease_left(owner, expires_in_ms, expected):
    assert lease_left(item("c", owner=owner, expires_in_ms=expires_in_ms), NOW_MS) == expected


# --- rates -------------------------------------------------------------------------------


def test_rate_is_last_seq_delta_over_elapsed_without_write_times():
    before = Snapshot({"c": 100})
    assert rate(item("c", last_seq=125), before, 5.0) == pytest.approx(5.0)
    assert rate(item("c", last_seq=100), before, 5.0) == 0.0


def test_rate_uses_the_write_times_of_both_checkpoints_when_the_item_was_written():
    # Refreshes 3 s apart saw checkpoints written 5 s apart: 25 messages in 5 s.
    before = Snapshot({"c": 100}, {"c": NOW_MS - 6_000})
    after = item("c", last_seq=125, updated_at_ms=NOW_MS - 1_000)
    assert rate(after, before, 3.0) == pytest.approx(5.0)


def test_rate_without_a_new_write_falls_back_to_elapsed():
    before = Snapshot({"c": 100}, {"c": NOW_MS - 1_000})
    assert rate(item("c", last_seq=100, updated_at_ms=NOW_MS - 1_000), before, 3.0) == 0.0


@pytest.mark.parametrize(
    ("previous", "elapsed_s", "last_seq"),
    [
        (None, 5.0, 10),  # first refresh: no baseline
        (Snapshot({"other": 1}), 5.0, 10),  # connection appeared since
        (Snapshot({"c": 1}), 0.0, 10),  # no time passed
        (Snapshot({"c": 50}), 5.0, 0),  # restarted with a new URL: last_seq reset
    ],
)
def test_rate_unknown(previous, elapsed_s, last_seq):
    assert rate(item("c", last_seq=last_seq), previous, elapsed_s) is None


def test_snapshot_keeps_seq_and_write_time():
    snap = snapshot([item("a", last_seq=3, updated_at_ms=7), item("b", last_seq=4)])
    assert snap.last_seq == {"a": 3, "b": 4}
    assert snap.updated_at_ms == {"a": 7}


def test_history_baseline_is_the_newest_snapshot_at_least_a_window_old():
    history = SnapshotHistory(window_s=3.0)
    assert history.baseline(0.0) is None
    snaps = {t: Snapshot({"c": t}) for t in range(8)}
    history.add(0.0, snaps[0])
    # Younger than the window: the oldest one serves until one is old enough.
    assert history.baseline(1.0) == (snaps[0], 1.0)
    for t in range(1, 8):
        history.add(float(t), snaps[t])
    assert history.baseline(7.5) == (snaps[4], 3.5)
    assert history.baseline(8.0) == (snaps[5], 3.0)


def test_history_refuses_an_empty_window():
    with pytest.raises(ValueError, match="window_s"):
        SnapshotHistory(0)


# --- the table ---------------------------------------------------------------------------


def test_render_rows():
    items = [
        item("demo-10", owner="w-2", expires_in_ms=4_960, epoch=3, last_seq=40),
        item("demo-2", owner="w-1", expires_in_ms=17_349, epoch=1, last_seq=125),
        item("demo-3", epoch=2, last_seq=77),  # released: free
        item("demo-4", state="STOPPED", epoch=1, last_seq=9),
        item("demo-5", owner="w-3", expires_in_ms=-1_000, epoch=1, last_seq=12),
    ]
    previous = Snapshot({"demo-2": 100, "demo-10": 40, "demo-3": 77, "demo-5": 12})
    text = render(items, previous, 5.0, NOW_MS)
    rows = rows_by_id(text)
    assert rows["demo-2"] == ["demo-2", "STARTED", "w-1", "17.3", "1", "125", "5.0"]
    assert rows["demo-10"] == ["demo-10", "STARTED", "w-2", "5.0", "3", "40", "0.0"]
    assert rows["demo-3"] == ["demo-3", "STARTED", "-", "-", "2", "77", "0.0"]
    assert rows["demo-4"] == ["demo-4", "STOPPED", "-", "-", "1", "9", "-"]
    assert rows["demo-5"] == ["demo-5", "STARTED", "w-3", "lapsed", "1", "12", "0.0"]
    # Natural order: demo-2 before demo-10.
    assert list(rows) == ["demo-2", "demo-3", "demo-4", "demo-5", "demo-10"]
    assert "5 connections: 3 owned, 2 free, 1 lapsed" in text


def test_render_header_says_the_rate_is_checkpoint_progress():
    text = render([item("a")], Snapshot({"a": 0}), 5.0, NOW_MS)
    header = text.split("\n")[0]
    assert "checkpoint progress" in header
    assert "over the last 5.0 s" in header
    assert "(needs two refreshes)" in render([item("a")], None, 0.0, NOW_MS)


def test_render_columns_line_up():
    items = [
        item("a", owner="local-worker-1", expires_in_ms=5_000, last_seq=7),
        item("much-longer-id", owner="w", expires_in_ms=15_000, last_seq=123456),
    ]
    lines = render(items, None, 0.0, NOW_MS).split("\n")
    table = [line for line in lines if line.startswith(("CONNECTION", "a ", "much"))]
    # Right-aligned numbers end in the same column as their header.
    header, *rows = table
    end = header.index("LAST_SEQ") + len("LAST_SEQ")
    for row in rows:
        assert row[end - 1].isdigit()
        assert row[end] == " "


def test_render_worker_footer():
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
    lines = render(items, None, 0.0, NOW_MS, workers).split("\n")
    footer = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ")}
    assert footer["local-worker-1"].split() == ["alive", "holds", "2"]
    assert footer["local-worker-2"].split() == ["dead", "(signal", "9)", "holds", "1"]
    assert footer["local-worker-3"].split() == ["dead", "(exit", "1)", "holds", "0"]
    # An owner the runner did not start is still accounted for.
    assert footer["elsewhere"].split() == ["not", "started", "here", "holds", "1"]
    assert "workers: 1/3 alive" in "\n".join(lines)


def test_render_empty_table():
    text = render([], None, 0.0, NOW_MS, [WorkerStatus("w-1")])
    assert "(no connections in the table)" in text
    assert "0 connections: 0 owned, 0 free, 0 lapsed | workers: 1/1 alive" in text


def test_worker_status_describe():
    assert WorkerStatus("w").describe() == "alive"
    assert WorkerStatus("w", 0).describe() == "dead (exit 0)"
    assert WorkerStatus("w", -15).describe() == "dead (signal 15)"
    assert not WorkerStatus("w", 0).alive


# --- summary and fitting ---------------------------------------------------------------


def test_summary_line():
    items = [
        item("demo-2", owner="w-2", expires_in_ms=-1, last_seq=30),
        item("demo-1", owner="w-1", expires_in_ms=3_000, last_seq=55),
        item("demo-3", last_seq=0),
    ]
    line = summary_line(
        items,
        Snapshot({"demo-1": 30}),
        5.0,
        NOW_MS,
        [WorkerStatus("w-1"), WorkerStatus("w-2", exit_code=-9)],
    )
    assert line == (
        "workers 1/2 alive | 3 connections, 2 owned | demo-1 seq=55 owner=w-1 5.0/s; "
        "demo-2 seq=30 owner=w-2 (lapsed); demo-3 seq=0 owner=-"
    )


def test_summary_line_names_a_bounded_number_of_connections():
    items = [item(f"c-{i}", last_seq=i) for i in range(20)]
    line = summary_line(items, None, 0.0, NOW_MS)
    assert line.startswith("workers 0/0 alive | 20 connections, 0 owned | c-0 seq=0")
    assert "c-11 seq=11" in line
    assert "c-12" not in line
    assert line.endswith("; ... 8 more")


def test_natural_key():
    ids = ["demo-10", "demo-2", "alpha", "demo-1", "demo-1a"]
    assert sorted(ids, key=natural_key) == ["alpha", "demo-1", "demo-1a", "demo-2", "demo-10"]


def test_fit_truncates_lines_and_rows():
    text = "\n".join(f"line {i} " + "x" * 50 for i in range(10))
    fitted = fit(text, columns=20, rows=4).split("\n")
    assert len(fitted) == 4
    assert all(len(line) <= 20 for line in fitted)
    assert fitted[0] == "line 0 " + "x" * 13
    assert fitted[3].startswith("... 7 more lines")
    assert fit("short\ntext", 80, 24) == "short\ntext"
