"""Pure formatting of API answers for people: tables, detail blocks, the watch frame.

Nothing here does I/O or reads a clock; callers pass the time in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NONE = "-"
LIST_COLUMNS = ("CONNECTION", "STATE", "OWNER", "LEASE", "EPOCH", "LAST_SEQ", "WS_URL")
WATCH_COLUMNS = ("CONNECTION", "STATE", "OWNER", "LEASE", "EPOCH", "LAST_SEQ", "MSG/S")
_RIGHT = frozenset({"LEASE", "EPOCH", "LAST_SEQ", "MSG/S"})


def cell(value: Any) -> str:
    if value is None or value == "":
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def format_lease(seconds: float | None) -> str:
    """Seconds of lease left: ``-`` when nobody holds it, ``lapsed`` at zero."""
    if seconds is None:
        return NONE
    if seconds <= 0:
        return "lapsed"
    return f"{seconds:.1f}s"


def format_rate(rate: float | None) -> str:
    return NONE if rate is None else f"{rate:.1f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart; numbers right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))

    def line(values: Sequence[str]) -> str:
        cells = [
            value.rjust(widths[i]) if headers[i] in _RIGHT else value.ljust(widths[i])
            for i, value in enumerate(values)
        ]
        return "  ".join(cells).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def connection_row(view: Mapping[str, Any]) -> list[str]:
    return [
        cell(view.get("connection_id")),
        cell(view.get("state")),
        cell(view.get("owner")),
        format_lease(view.get("lease_seconds_left")),
        cell(view.get("epoch")),
        cell(view.get("last_seq")),
        cell(view.get("ws_url")),
    ]


def connection_table(views: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per connection, by id (the API's own order is the table's scan order)."""
    if not views:
        return ["no connections"]
    ordered = sorted(views, key=lambda v: str(v.get("connection_id")))
    return table(LIST_COLUMNS, [connection_row(v) for v in ordered])


_DETAILS = (
    ("connection", "connection_id"),
    ("state", "state"),
    ("ws_url", "ws_url"),
    ("owner", "owner"),
    ("lease left", "lease_seconds_left"),
    ("epoch", "epoch"),
    ("last_seq", "last_seq"),
    ("start_gen", "start_gen"),
    ("created", "created_at"),
    ("updated", "updated_at"),
    ("expires", "expires_at"),
    ("metadata", "metadata"),
)


def connection_details(view: Mapping[str, Any]) -> list[str]:
    """One ``label  value`` line per field of the connection view."""
    width = max(len(label) for label, _ in _DETAILS)
    lines = []
    for label, key in _DETAILS:
        value = view.get(key)
        shown = format_lease(value) if key == "lease_seconds_left" else cell(value)
        lines.append(f"{label.ljust(width)}  {shown}")
    return lines


_OUTCOMES = {
    "created": "created",
    "restarted": "restarted",
    "already_started": "already running (nothing changed)",
}


def start_summary(view: Mapping[str, Any]) -> str:
    outcome = _OUTCOMES.get(str(view.get("outcome")), cell(view.get("outcome")))
    return f"{cell(view.get('connection_id'))}: {outcome}"


def stop_summary(view: Mapping[str, Any]) -> str:
    return (
        f"{cell(view.get('connection_id'))}: {cell(view.get('state'))}"
        " (its owner closes it within one heartbeat)"
    )


# --- watch -----------------------------------------------------------------------------


RATE_WINDOW_S = 10.0
"""Rates are taken over this much history: the checkpoint moves once per heartbeat,
so the delta between two polls a second apart is mostly 0 or a burst."""

Samples = Mapping[str, Sequence[tuple[float, int]]]


def with_sample(
    history: Samples, at: float, seqs: Mapping[str, int], window_s: float = RATE_WINDOW_S
) -> dict[str, list[tuple[float, int]]]:
    """``history`` plus one ``(at, last_seq)`` sample per connection, older samples than
    ``window_s`` dropped (connections no longer listed are forgotten)."""
    return {
        connection_id: [
            *(s for s in history.get(connection_id, ()) if at - s[0] <= window_s),
            (at, seq),
        ]
        for connection_id, seq in seqs.items()
    }


def rate(samples: Sequence[tuple[float, int]]) -> float | None:
    """Messages per second from ``last_seq`` over the samples, counted from the last time
    the checkpoint went back (a restart on a new stream); None with fewer than two."""
    start = 0
    for i in range(1, len(samples)):
        if samples[i][1] < samples[i - 1][1]:
            start = i
    run = samples[start:]
    if len(run) < 2 or run[-1][0] <= run[0][0]:
        return None
    return (run[-1][1] - run[0][1]) / (run[-1][0] - run[0][0])


def rates(history: Samples) -> dict[str, float | None]:
    return {connection_id: rate(samples) for connection_id, samples in history.items()}


@dataclass(frozen=True)
class WatchFrame:
    api_url: str
    clock: str
    """Wall-clock time of the poll, already formatted (``12:00:01``)."""
    interval_s: float
    views: Sequence[Mapping[str, Any]]
    rates: Mapping[str, float | None]
    error: str | None = None


def watch_lines(frame: WatchFrame) -> list[str]:
    views = sorted(frame.views, key=lambda v: str(v.get("connection_id")))
    started = sum(1 for v in views if v.get("state") == "STARTED")
    owned = sum(1 for v in views if v.get("state") == "STARTED" and v.get("owner"))
    owners = {v.get("owner") for v in views if v.get("owner")}
    total_rate = sum(r for r in frame.rates.values() if r is not None)
    lines = [
        f"fleet at {frame.api_url}  {frame.clock}  every {frame.interval_s:g}s  (Ctrl-C quits)",
        (
            f"{len(views)} connections: {started} STARTED ({owned} owned), "
            f"{len(views) - started} STOPPED; {len(owners)} workers; {total_rate:.1f} msg/s"
        ),
    ]
    if frame.error:
        lines.append(f"error: {frame.error} (retrying)")
    lines.append("")
    rows = [
        [
            cell(v.get("connection_id")),
            cell(v.get("state")),
            cell(v.get("owner")),
            format_lease(v.get("lease_seconds_left")),
            cell(v.get("epoch")),
            cell(v.get("last_seq")),
            format_rate(frame.rates.get(str(v.get("connection_id")))),
        ]
        for v in views
    ]
    lines.extend(table(WATCH_COLUMNS, rows) if rows else ["no connections"])
    return lines


def fit(lines: Sequence[str], width: int, height: int) -> list[str]:
    """Clip to a terminal of ``width`` x ``height``, saying how many rows were left out."""
    clipped = [line if len(line) <= width else line[: max(0, width - 1)] + "~" for line in lines]
    if height > 0 and len(clipped) > height:
        hidden = len(clipped) - height + 1
        clipped = [*clipped[: height - 1], f"... {hidden} more rows"]
    return clipped
