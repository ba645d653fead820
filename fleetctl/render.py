"""Pure formatting of API answers for people: tables, detail blocks, and the fleet
table with its summary lines, which ``fleetctl watch`` and the local live view
(``local_stack/fleet_view.py``) both draw.

Everything takes the router API's connection views (dicts shaped like
``lambdas/router/views.py``) and, for the MSG/S column, the rates :mod:`fleetctl.rates`
decided to show. Nothing here does I/O or reads a clock; callers pass the time in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl.rates import owner_live

NONE = "-"
_COMMON_COLUMNS = ("CONNECTION", "STATE", "OWNER", "SESSION LEFT", "EPOCH", "LAST_SEQ", "CKPT AGE")
LIST_COLUMNS = (*_COMMON_COLUMNS, "WS_URL")
FLEET_COLUMNS = (*_COMMON_COLUMNS, "MSG/S")
"""The fleet table of ``fleetctl watch`` and of the local live view."""
SUMMARY_MAX_CONNECTIONS = 12
"""At most this many connections are named in one summary line; the rest are counted."""
# Columns holding numbers are right-aligned so digits line up.
_RIGHT = frozenset({"SESSION LEFT", "EPOCH", "LAST_SEQ", "CKPT AGE", "MSG/S"})
_DIGITS = re.compile(r"(\d+)")


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


def format_rate(rate: float | None) -> str:
    return NONE if rate is None else f"{rate:.1f}"


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


def connection_row(view: Mapping[str, Any]) -> list[str]:
    return [
        cell(view.get("connection_id")),
        cell(view.get("state")),
        cell(view.get("owner")),
        format_session(view),
        cell(view.get("epoch")),
        cell(view.get("last_seq")),
        format_seconds(view.get("checkpoint_age_seconds")),
        cell(view.get("ws_url")),
    ]


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


_Source = str | Callable[[Mapping[str, Any]], str]
_DETAILS: tuple[tuple[str, _Source], ...] = (
    ("connection", "connection_id"),
    ("state", "state"),
    ("ws_url", "ws_url"),
    ("owner", "owner"),
    ("session", _session_detail),
    ("epoch", "epoch"),
    ("last_seq", "last_seq"),
    ("checkpoint", _checkpoint_detail),
    ("last advanced", "last_advanced_at"),
    ("start_gen", "start_gen"),
    ("created", "created_at"),
    ("updated", "updated_at"),
    ("expires", "expires_at"),
    ("metadata", "metadata"),
)
"""Label, then the view's key or a function of the whole view."""
_PARKING = (
    ("parked", "parked_reason"),
    ("parked at", "parked_at"),
    ("failing since", "failing_since"),
)
"""Shown only when set: a healthy connection's details stay as they were."""


def connection_details(view: Mapping[str, Any]) -> list[str]:
    """One ``label  value`` line per field of the connection view."""
    shown_fields: list[tuple[str, _Source]] = [
        *_DETAILS,
        *((label, key) for label, key in _PARKING if view.get(key)),
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


def lapsed(view: Mapping[str, Any]) -> bool:
    """The view names an owner whose session is not live (lapsed, DEAD or gone: the
    worker died or is cut off, and another worker takes the connection over)."""
    return bool(view.get("owner")) and not owner_live(view)


def fleet_row(view: Mapping[str, Any], rate: float | None) -> list[str]:
    """:func:`connection_row` with the rate in place of the URL."""
    return [*connection_row(view)[:-1], format_rate(rate)]


def fleet_table(views: Sequence[Mapping[str, Any]], rates: Mapping[str, float | None]) -> list[str]:
    """The fleet table (:data:`FLEET_COLUMNS`), one row per connection in natural id
    order; ``rates`` by connection id fill the MSG/S column (absent: ``-``)."""
    if not views:
        return ["no connections"]
    rows = [fleet_row(v, rates.get(str(v.get("connection_id")))) for v in by_id(views)]
    return table(FLEET_COLUMNS, rows)


def total_rate(rates: Mapping[str, float | None]) -> float:
    return sum(r for r in rates.values() if r is not None)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def fleet_totals(views: Sequence[Mapping[str, Any]], rates: Mapping[str, float | None]) -> str:
    """The fleet in numbers::

        3 connections: 2 STARTED (2 owned, 1 lapsed), 1 STOPPED; owned by 2 workers; ...

    ``owned``: STARTED with an owner named (``lapsed`` ones included: their owner's
    session is not live); the workers are the distinct owners named anywhere in the
    table."""
    started = [v for v in views if v.get("state") == "STARTED"]
    owned = sum(1 for v in started if v.get("owner"))
    gone = sum(1 for v in started if lapsed(v))
    owners = {v.get("owner") for v in views if v.get("owner")}
    return (
        f"{_plural(len(views), 'connection')}: {len(started)} STARTED ({owned} owned, "
        f"{gone} lapsed), {len(views) - len(started)} STOPPED; "
        f"owned by {_plural(len(owners), 'worker')}; {total_rate(rates):.1f} msg/s"
    )


def summary_line(views: Sequence[Mapping[str, Any]], rates: Mapping[str, float | None]) -> str:
    """The fleet on one line, for logs::

        3 connections, 2 owned | demo-1 seq=57 owner=w-1 5.0/s; demo-2 ... (lapsed); ...

    Names at most :data:`SUMMARY_MAX_CONNECTIONS` connections (natural id order), then
    counts the rest; a rate is named when ``rates`` has one."""
    ordered = by_id(views)
    owned = sum(1 for v in ordered if v.get("owner"))
    parts = []
    for view in ordered[:SUMMARY_MAX_CONNECTIONS]:
        text = (
            f"{cell(view.get('connection_id'))} seq={cell(view.get('last_seq'))} "
            f"owner={cell(view.get('owner'))}"
        )
        if lapsed(view):
            text += " (lapsed)"
        measured = rates.get(str(view.get("connection_id")))
        if measured is not None:
            text += f" {measured:.1f}/s"
        parts.append(text)
    if len(ordered) > SUMMARY_MAX_CONNECTIONS:
        parts.append(f"... {len(ordered) - SUMMARY_MAX_CONNECTIONS} more")
    head = f"{_plural(len(ordered), 'connection')}, {owned} owned"
    return f"{head} | {'; '.join(parts)}" if parts else head


@dataclass(frozen=True)
class WatchFrame:
    api_url: str
    clock: str
    """Wall-clock time of the poll, already formatted (``12:00:01``)."""
    interval_s: float
    views: Sequence[Mapping[str, Any]]
    rates: Mapping[str, float | None]
    """The rates to show, by connection id (:func:`fleetctl.rates.shown_rates`)."""
    error: str | None = None


def watch_lines(frame: WatchFrame) -> list[str]:
    lines = [
        f"fleet at {frame.api_url}  {frame.clock}  every {frame.interval_s:g}s  (Ctrl-C quits)",
        fleet_totals(frame.views, frame.rates),
    ]
    if frame.error:
        lines.append(f"error: {frame.error} (retrying)")
    lines.append("")
    lines.extend(fleet_table(frame.views, frame.rates))
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
