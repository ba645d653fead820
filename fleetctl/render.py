"""Pure formatting of API answers for people: tables, detail blocks, and the fleet
table with its summary lines, which ``fleetctl watch`` and the local live view
(``local_stack/fleet_view.py``) both draw.

Everything takes the router API's connection views (dicts shaped like
``lambdas/router/views.py``) and shows what they say, health included: ``status``,
``seconds_since_last_message``, ``reconnects``, ``last_error`` and
``messages_per_second`` (the owner's own count over its last checkpoint interval: the
views compute no rate of their own). Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

NONE = "-"
_COMMON_COLUMNS = (
    "CONNECTION",
    "STATE",
    "STATUS",
    "OWNER",
    "SESSION LEFT",
    "EPOCH",
    "LAST_SEQ",
    "CKPT AGE",
    "LAST MSG",
)
LIST_COLUMNS = (*_COMMON_COLUMNS, "WS_URL")
FLEET_COLUMNS = (*_COMMON_COLUMNS, "MSG/S", "ERROR")
"""The fleet table of ``fleetctl watch`` and of the local live view."""
SUMMARY_MAX_CONNECTIONS = 12
"""At most this many connections are named in one summary line; the rest are counted."""
ERROR_WIDTH: Final = 40
"""The ERROR cell is clipped to this many characters, its reconnect count kept."""
STATUSES: Final = ("streaming", "connecting", "backing_off", "failed", "pending", "stopped")
"""Every ``status`` of the API's views, in the order the totals count them."""
# Columns holding numbers are right-aligned so digits line up.
_RIGHT = frozenset({"SESSION LEFT", "EPOCH", "LAST_SEQ", "CKPT AGE", "LAST MSG", "MSG/S"})
_DIGITS = re.compile(r"(\d+)")
_SPACES = re.compile(r"\s+")


def cell(value: Any) -> str:
    if value is None or value == "":
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def format_seconds(seconds: Any) -> str:
    """``2.5s``; ``-`` when there is no number."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return NONE
    return f"{seconds:.1f}s"


def format_session(view: Mapping[str, Any]) -> str:
    """The owner session's time left: ``-`` when free, ``gone`` when its session item
    is, ``dead`` once reaped or ended, ``lapsed`` when ALIVE with no time left."""
    if not view.get("owner"):
        return NONE
    state = view.get("owner_session_state")
    if state is None:
        return "gone"
    if state != "ALIVE":
        return str(state).lower()
    left = view.get("session_seconds_left")
    if not isinstance(left, int | float) or left <= 0:
        return "lapsed"
    return format_seconds(left)


def format_rate(rate: Any) -> str:
    """Messages per second: ``12.0``, ``0.5``; below 0.1 with its two significant digits
    (``0.033``), so a slow stream does not read as a stopped one; ``-`` without one."""
    if not isinstance(rate, int | float) or isinstance(rate, bool):
        return NONE
    return f"{rate:.2g}" if 0 < rate < 0.1 else f"{rate:.1f}"


def format_error(view: Mapping[str, Any], width: int = ERROR_WIDTH) -> str:
    """``last_error`` on one line, with the reconnects when there were any (``HTTP 503
    (x4)``), clipped to ``width`` characters (a cut ends in ``~``, the count stays);
    empty when there is no error."""
    error = view.get("last_error")
    if not error:
        return ""
    text = _SPACES.sub(" ", str(error)).strip()
    reconnects = view.get("reconnects")
    counted = isinstance(reconnects, int) and not isinstance(reconnects, bool) and reconnects > 0
    suffix = f" (x{reconnects})" if counted else ""
    room = max(1, width - len(suffix))
    if len(text) > room:
        text = text[: room - 1] + "~"
    return text + suffix


def natural_key(connection_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that puts ``demo-2`` before ``demo-10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in _DIGITS.split(connection_id)
        if part
    )


def by_id(views: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``views`` in natural connection id order (the API's own order is scan order)."""
    return sorted(views, key=lambda v: natural_key(str(v.get("connection_id"))))


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


def _common_cells(view: Mapping[str, Any]) -> list[str]:
    """The cells of :data:`_COMMON_COLUMNS`."""
    return [
        cell(view.get("connection_id")),
        cell(view.get("state")),
        cell(view.get("status")),
        cell(view.get("owner")),
        format_session(view),
        cell(view.get("epoch")),
        cell(view.get("last_seq")),
        format_seconds(view.get("checkpoint_age_seconds")),
        format_seconds(view.get("seconds_since_last_message")),
    ]


def connection_row(view: Mapping[str, Any]) -> list[str]:
    return [*_common_cells(view), cell(view.get("ws_url"))]


def connection_table(views: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per connection, in natural id order."""
    if not views:
        return ["no connections"]
    return table(LIST_COLUMNS, [connection_row(v) for v in by_id(views)])


def _session_detail(view: Mapping[str, Any]) -> str:
    """``#3 ALIVE, 1.8s left``; ``#3 gone`` once its item is; ``-`` when free."""
    if not view.get("owner"):
        return NONE
    gen = f"#{cell(view.get('owner_session_gen'))}"
    state = view.get("owner_session_state")
    if state is None:
        return f"{gen} gone"
    if state != "ALIVE":
        return f"{gen} {state}"
    shown = format_session(view)
    return f"{gen} ALIVE, {shown} left" if shown != "lapsed" else f"{gen} ALIVE, lapsed"


def _checkpoint_detail(view: Mapping[str, Any]) -> str:
    """Where ``last_seq`` comes from: the owner's page (when written, how long ago)
    or the item (written at the last change of owner)."""
    written = view.get("checkpoint_at")
    if not written:
        return "from the item"
    return f"owner's page of {written} ({format_seconds(view.get('checkpoint_age_seconds'))} ago)"


def _last_message_detail(view: Mapping[str, Any]) -> str:
    """``12.3s ago``; ``-`` when the owner has handled nothing of it (or none runs it)."""
    shown = format_seconds(view.get("seconds_since_last_message"))
    return shown if shown == NONE else f"{shown} ago"


def _rate_detail(view: Mapping[str, Any]) -> str:
    return format_rate(view.get("messages_per_second"))


_Source = str | Callable[[Mapping[str, Any]], str]
_DETAILS: tuple[tuple[str, _Source, bool], ...] = (
    ("connection", "connection_id", True),
    ("state", "state", True),
    ("status", "status", True),
    ("ws_url", "ws_url", True),
    ("auth", "auth", False),
    ("protocol", "protocol", False),
    ("owner", "owner", True),
    ("version", "owner_version", False),
    ("session", _session_detail, True),
    ("epoch", "epoch", True),
    ("last_seq", "last_seq", True),
    ("checkpoint", _checkpoint_detail, True),
    ("last advanced", "last_advanced_at", True),
    ("last message", _last_message_detail, True),
    ("messages/s", _rate_detail, True),
    ("reconnects", "reconnects", False),
    ("last error", "last_error", False),
    ("start_gen", "start_gen", True),
    ("created", "created_at", True),
    ("updated", "updated_at", True),
    ("expires", "expires_at", True),
    ("metadata", "metadata", True),
    ("parked", "parked_reason", False),
    ("parked at", "parked_at", False),
    ("failing since", "failing_since", False),
)
"""Label, the view's key or a function of the whole view, and whether the line is
always shown. The others (credentials, protocol, reconnects, the last error, parking)
only when set: a plain, healthy connection's details stay short."""


def connection_details(view: Mapping[str, Any]) -> list[str]:
    """One ``label  value`` line per field of the connection view."""
    shown_fields = [
        (label, source)
        for label, source, always in _DETAILS
        if always or (isinstance(source, str) and view.get(source))
    ]
    width = max(len(label) for label, _ in shown_fields)
    lines = []
    for label, source in shown_fields:
        shown = cell(view.get(source)) if isinstance(source, str) else source(view)
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


# --- the fleet: watch and the local live view ------------------------------------------


def fleet_row(view: Mapping[str, Any]) -> list[str]:
    """The cells of :data:`FLEET_COLUMNS`."""
    return [*_common_cells(view), format_rate(view.get("messages_per_second")), format_error(view)]


def fleet_table(views: Sequence[Mapping[str, Any]]) -> list[str]:
    """The fleet table (:data:`FLEET_COLUMNS`), one row per connection in natural id
    order."""
    if not views:
        return ["no connections"]
    return table(FLEET_COLUMNS, [fleet_row(v) for v in by_id(views)])


def _rate(view: Mapping[str, Any]) -> float | None:
    rate = view.get("messages_per_second")
    return float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else None


def total_rate(views: Sequence[Mapping[str, Any]]) -> float:
    """The fleet's messages per second: the sum of the views' own rates."""
    return sum(rate for view in views if (rate := _rate(view)) is not None)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def status_counts(views: Sequence[Mapping[str, Any]]) -> str:
    """``3 streaming, 1 backing off``: the views by status, in :data:`STATUSES` order
    (any other after them; ``unknown`` when a view has none)."""
    counts = Counter(str(status) if (status := view.get("status")) else "unknown" for view in views)
    order = [*STATUSES, *sorted(set(counts) - set(STATUSES))]
    return ", ".join(
        f"{counts[status]} {status.replace('_', ' ')}" for status in order if counts[status]
    )


def fleet_totals(views: Sequence[Mapping[str, Any]]) -> str:
    """The fleet in numbers::

        5 connections: 4 STARTED (3 streaming, 1 failed), 1 STOPPED; owned by 2 workers; 29.0 msg/s

    The STARTED ones by status (:func:`status_counts`); the workers are the distinct
    owners named anywhere in the table; the rate is :func:`total_rate`."""
    started = [v for v in views if v.get("state") == "STARTED"]
    by_status = status_counts(started)
    owners = {v.get("owner") for v in views if v.get("owner")}
    return (
        f"{_plural(len(views), 'connection')}: {len(started)} STARTED"
        f"{f' ({by_status})' if by_status else ''}, {len(views) - len(started)} STOPPED; "
        f"owned by {_plural(len(owners), 'worker')}; {total_rate(views):.1f} msg/s"
    )


def summary_line(views: Sequence[Mapping[str, Any]]) -> str:
    """The fleet on one line, for logs::

        3 connections, 2 streaming, 10.0 msg/s | demo-1 seq=57 owner=w-1 streaming 5.0/s; ...

    Names at most :data:`SUMMARY_MAX_CONNECTIONS` connections (natural id order), each
    with its status and, when the view has one, its rate; then counts the rest."""
    ordered = by_id(views)
    streaming = sum(1 for v in ordered if v.get("status") == "streaming")
    parts = []
    for view in ordered[:SUMMARY_MAX_CONNECTIONS]:
        text = (
            f"{cell(view.get('connection_id'))} seq={cell(view.get('last_seq'))} "
            f"owner={cell(view.get('owner'))} {cell(view.get('status'))}"
        )
        rate = _rate(view)
        if rate is not None:
            text += f" {format_rate(rate)}/s"
        parts.append(text)
    if len(ordered) > SUMMARY_MAX_CONNECTIONS:
        parts.append(f"... {len(ordered) - SUMMARY_MAX_CONNECTIONS} more")
    head = (
        f"{_plural(len(ordered), 'connection')}, {streaming} streaming, "
        f"{total_rate(ordered):.1f} msg/s"
    )
    return f"{head} | {'; '.join(parts)}" if parts else head


@dataclass(frozen=True)
class WatchFrame:
    api_url: str
    clock: str
    """Wall-clock time of the poll, already formatted (``12:00:01``)."""
    interval_s: float
    views: Sequence[Mapping[str, Any]]
    error: str | None = None


def watch_lines(frame: WatchFrame) -> list[str]:
    lines = [
        f"fleet at {frame.api_url}  {frame.clock}  every {frame.interval_s:g}s  (Ctrl-C quits)",
        fleet_totals(frame.views),
    ]
    if frame.error:
        lines.append(f"error: {frame.error} (retrying)")
    lines.append("")
    lines.extend(fleet_table(frame.views))
    return lines


def fit(lines: Sequence[str], width: int, height: int) -> list[str]:
    """Clip to a terminal of ``width`` x ``height``, so a redraw in place never wraps or
    scrolls: a cut line ends in ``~``, and the last row kept says how many were left
    out. A size of 0 or less leaves that dimension alone."""
    clipped = [
        line if width <= 0 or len(line) <= width else line[: max(0, width - 1)] + "~"
        for line in lines
    ]
    if height > 0 and len(clipped) > height:
        hidden = len(clipped) - height + 1
        clipped = [*clipped[: height - 1], f"... {hidden} more rows"]
    return clipped
