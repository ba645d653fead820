"""The live view of the local fleet: what the connection table says, as text.

Everything here is pure formatting: callers pass the items of a table Scan, the clock
(``now_ms``, epoch milliseconds) and what they know about the worker processes, and get
text back. The runner does the I/O (Scan, process polling, terminal output), so the
formatting is tested with fixed inputs.

The ``msg/s`` column is *checkpoint* progress: how far ``last_seq`` advanced between a
previous snapshot and now, per second. Workers write ``last_seq`` only with each renew
(once per heartbeat), so this trails the messages actually handled by up to one
heartbeat; it is not a count of handled messages. Because a checkpoint moves in steps,
the seconds are taken from the checkpoints themselves when both carry the time they
were written (``updated_at_ms``, set by the same write), else from the refreshes.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from wsfleet.item import ConnectionItem

#: Shown in a cell that has no value (free lease, no baseline for a rate yet).
NONE = "-"
#: Shown as the lease left of a lease whose expiry has passed while it still names an
#: owner: the owner died or is partitioned, and any worker may take it over.
LAPSED = "lapsed"
#: At most this many connections are named in one summary line; the rest are counted.
SUMMARY_MAX_CONNECTIONS = 12

_HEADERS = ("CONNECTION", "STATE", "OWNER", "LEASE LEFT", "EPOCH", "LAST_SEQ", "MSG/S")
# Columns holding numbers are right-aligned so digits line up.
_RIGHT_ALIGNED = frozenset({"LEASE LEFT", "EPOCH", "LAST_SEQ", "MSG/S"})
_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Checkpoints per connection id at one refresh: the baseline of the next rates."""

    last_seq: Mapping[str, int]
    updated_at_ms: Mapping[str, int] = field(default_factory=dict)
    """When each item was last written (absent when the item has no such attribute)."""


def snapshot(items: Iterable[ConnectionItem]) -> Snapshot:
    """The baseline for later rates, taken from the items of one Scan."""
    listed = list(items)
    return Snapshot(
        last_seq={item.connection_id: item.last_seq for item in listed},
        updated_at_ms={
            item.connection_id: item.updated_at_ms
            for item in listed
            if item.updated_at_ms is not None
        },
    )


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """What the runner knows about one worker process it started."""

    worker_id: str
    exit_code: int | None = None
    """None while the process runs; its exit status once it ended (negative: the
    number of the signal that killed it, as :mod:`subprocess` reports it)."""

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def describe(self) -> str:
        """``alive``, ``dead (exit 1)`` or ``dead (signal 9)``."""
        if self.exit_code is None:
            return "alive"
        if self.exit_code < 0:
            return f"dead (signal {-self.exit_code})"
        return f"dead (exit {self.exit_code})"


class SnapshotHistory:
    """Recent snapshots, so a rate can be taken over a fixed window rather than over the
    last refresh alone.

    Checkpoints advance in steps, one per heartbeat; a delta over one 1 s refresh is 0
    most of the time and a whole heartbeat's worth at once. Over a window longer than a
    heartbeat every renewing owner has written at least one checkpoint, so each rate
    has something to measure. Times are the caller's monotonic seconds.
    """

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._entries: deque[tuple[float, Snapshot]] = deque()

    def add(self, at_s: float, snap: Snapshot) -> None:
        """Record ``snap`` taken at ``at_s``; drops entries no baseline will need."""
        self._entries.append((at_s, snap))
        # Keep the newest entry at least one window old; everything before it is spare.
        while len(self._entries) >= 2 and at_s - self._entries[1][0] >= self.window_s:
            self._entries.popleft()

    def baseline(self, now_s: float) -> tuple[Snapshot, float] | None:
        """The snapshot to compute rates against at ``now_s`` and its age in seconds:
        the newest one at least a window old, or the oldest one while none is that old
        yet (early rates span less time). None when there is no earlier snapshot."""
        chosen: tuple[float, Snapshot] | None = None
        for at_s, snap in self._entries:
            if at_s >= now_s:
                break
            if chosen is None or now_s - at_s >= self.window_s:
                chosen = (at_s, snap)
        if chosen is None:
            return None
        return chosen[1], now_s - chosen[0]


def natural_key(connection_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that puts ``demo-2`` before ``demo-10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in _DIGITS.split(connection_id)
        if part
    )


def lease_left(item: ConnectionItem, now_ms: int) -> str:
    """Seconds until the lease lapses, one decimal; ``-`` when nobody holds it and
    ``lapsed`` when the expiry has passed but the item still names an owner."""
    if item.lease_owner is None:
        return NONE
    left_ms = item.lease_expires_at_ms - now_ms
    if left_ms <= 0:
        return LAPSED
    return f"{left_ms / 1000:.1f}"


def rate(item: ConnectionItem, previous: Snapshot | None, elapsed_s: float) -> float | None:
    """Checkpoint progress in messages per second: the ``last_seq`` delta since
    ``previous``, over the time between the two writes that stored them when the item
    was written since (``updated_at_ms`` on both sides), else over ``elapsed_s``.

    None when there is no baseline for this connection, no time has passed, or
    ``last_seq`` went down (a restart with a new URL resets it).
    """
    if previous is None:
        return None
    before = previous.last_seq.get(item.connection_id)
    if before is None or item.last_seq < before:
        return None
    written_before = previous.updated_at_ms.get(item.connection_id)
    if (
        written_before is not None
        and item.updated_at_ms is not None
        and item.updated_at_ms > written_before
    ):
        # Exact: each checkpoint carries the time of the write that stored it. Refresh
        # times would see the steps early or late, alternating 0 and double rates.
        return (item.last_seq - before) * 1000 / (item.updated_at_ms - written_before)
    if not elapsed_s > 0:
        return None
    return (item.last_seq - before) / elapsed_s


def _format_rate(value: float | None) -> str:
    return NONE if value is None else f"{value:.1f}"


def _row(
    item: ConnectionItem, previous: Snapshot | None, elapsed_s: float, now_ms: int
) -> tuple[str, ...]:
    return (
        item.connection_id,
        item.desired_state or NONE,
        item.lease_owner or NONE,
        lease_left(item, now_ms),
        str(item.lease_epoch),
        str(item.last_seq),
        _format_rate(rate(item, previous, elapsed_s)),
    )


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(cells[col]) for cells in (_HEADERS, *rows)) for col in range(len(_HEADERS))]
    lines = []
    for cells in (_HEADERS, *rows):
        padded = [
            cell.rjust(width) if header in _RIGHT_ALIGNED else cell.ljust(width)
            for cell, width, header in zip(cells, widths, _HEADERS, strict=True)
        ]
        lines.append("  ".join(padded).rstrip())
    return lines


def held_by(items: Iterable[ConnectionItem]) -> dict[str, int]:
    """How many leases each owner holds according to the table (lapsed ones included:
    they stay in the owner's name until another worker takes them)."""
    counts: dict[str, int] = {}
    for item in items:
        if item.lease_owner is not None:
            counts[item.lease_owner] = counts.get(item.lease_owner, 0) + 1
    return counts


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _totals(items: Sequence[ConnectionItem], workers: Sequence[WorkerStatus], now_ms: int) -> str:
    owned = sum(1 for item in items if item.lease_owner is not None)
    lapsed = sum(1 for item in items if lease_left(item, now_ms) == LAPSED)
    alive = sum(1 for worker in workers if worker.alive)
    text = (
        f"{_plural(len(items), 'connection')}: {owned} owned, {len(items) - owned} free, "
        f"{lapsed} lapsed | workers: {alive}/{len(workers)} alive"
    )
    return text


def _worker_lines(items: Sequence[ConnectionItem], workers: Sequence[WorkerStatus]) -> list[str]:
    held = held_by(items)
    known = {worker.worker_id for worker in workers}
    rows = [(w.worker_id, w.describe(), f"holds {held.get(w.worker_id, 0)}") for w in workers]
    # Owners the runner did not start (a worker run by hand against the same table).
    rows += [
        (owner, "not started here", f"holds {count}")
        for owner, count in sorted(held.items())
        if owner not in known
    ]
    if not rows:
        return []
    id_width = max(len(row[0]) for row in rows)
    state_width = max(len(row[1]) for row in rows)
    return [
        f"  {wid.ljust(id_width)}  {state.ljust(state_width)}  {holds}"
        for wid, state, holds in rows
    ]


def render(
    items: Iterable[ConnectionItem],
    previous: Snapshot | None,
    elapsed_s: float,
    now_ms: int,
    workers: Sequence[WorkerStatus] = (),
) -> str:
    """The fleet as a table, one row per connection (in natural id order), then a
    totals line and one line per worker (alive or dead, leases held in the table).

    ``previous`` and ``elapsed_s`` give the ``msg/s`` column (see :func:`rate`); pass
    ``None`` and ``0`` when there is no earlier snapshot. ``now_ms`` is the epoch
    milliseconds the lease expiries are compared with. No trailing newline.
    """
    ordered = sorted(items, key=lambda item: natural_key(item.connection_id))
    if previous is not None and elapsed_s > 0:
        window = f"over the last {elapsed_s:.1f} s"
    else:
        window = "(needs two refreshes)"
    lines = [
        f"msg/s = checkpoint progress: last_seq advance {window}; "
        "workers write last_seq with each lease renew",
        "",
    ]
    if ordered:
        lines += _table([_row(item, previous, elapsed_s, now_ms) for item in ordered])
    else:
        lines.append("(no connections in the table)")
    lines += ["", _totals(ordered, workers, now_ms), *_worker_lines(ordered, workers)]
    return "\n".join(lines)


def summary_line(
    items: Iterable[ConnectionItem],
    previous: Snapshot | None,
    elapsed_s: float,
    now_ms: int,
    workers: Sequence[WorkerStatus] = (),
) -> str:
    """The fleet on one line, for logs and non-terminal output::

        workers 2/2 alive | 3 connections, 3 owned | demo-1 seq=57 owner=w-1 5.0/s; ...

    Names at most :data:`SUMMARY_MAX_CONNECTIONS` connections, then counts the rest.
    ``previous``, ``elapsed_s`` and ``now_ms`` mean what they do for :func:`render`.
    """
    ordered = sorted(items, key=lambda item: natural_key(item.connection_id))
    alive = sum(1 for worker in workers if worker.alive)
    owned = sum(1 for item in ordered if item.lease_owner is not None)
    parts = []
    for item in ordered[:SUMMARY_MAX_CONNECTIONS]:
        text = f"{item.connection_id} seq={item.last_seq} owner={item.lease_owner or NONE}"
        if item.lease_owner is not None and lease_left(item, now_ms) == LAPSED:
            text += " (lapsed)"
        measured = rate(item, previous, elapsed_s)
        if measured is not None:
            text += f" {measured:.1f}/s"
        parts.append(text)
    if len(ordered) > SUMMARY_MAX_CONNECTIONS:
        parts.append(f"... {len(ordered) - SUMMARY_MAX_CONNECTIONS} more")
    head = (
        f"workers {alive}/{len(workers)} alive | "
        f"{_plural(len(ordered), 'connection')}, {owned} owned"
    )
    return f"{head} | {'; '.join(parts)}" if parts else head


def fit(text: str, columns: int, rows: int) -> str:
    """``text`` cut to a terminal of ``columns`` x ``rows``, so redrawing in place never
    wraps or scrolls: long lines are truncated, and when there are too many lines the
    last one kept says how many were left out."""
    lines = [line[:columns] for line in text.split("\n")]
    if rows >= 1 and len(lines) > rows:
        hidden = len(lines) - (rows - 1)
        lines = [*lines[: rows - 1], f"... {hidden} more lines (enlarge the terminal)"[:columns]]
    return "\n".join(lines)
