"""The live view of the local fleet: what the connection table says, as text.

The runner reads the table directly (it has no router client here): one Scan brings
the connection items together with the workers' session items and checkpoint pages,
and each connection is turned into the view the router's API returns for it, with its
owner's session and page (``lambdas/router/views.py``, :func:`views_of_table`), health
included: status, time since the last message, reconnects, last error and the owner's
own messages/s. From there on it is ``fleetctl watch``: the same table and summary
(:mod:`fleetctl.render`). What is local is only what the runner alone knows: the
worker processes it started, alive or dead, and how many connections each owns.

Everything here is pure formatting: the runner does the I/O (Scan, process polling,
terminal output) and passes the results in, with the clock as ``now_ms``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl import render
from fleetctl.rates import RATE_LEGEND
from lambdas.router.views import NO_RECORDS, OwnerRecords, connection_view, owning_session
from wsfleet import schema
from wsfleet.checkpoint_page import CheckpointPage, page_from_dynamodb
from wsfleet.item import ConnectionItem, MalformedItemError
from wsfleet.session_rules import SessionItem

SessionKey = tuple[str, int]
"""``(worker_id, session_gen)``: one worker session."""


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


@dataclass(frozen=True, slots=True)
class TableContents:
    """The items of a table scan, by kind."""

    connections: list[ConnectionItem] = field(default_factory=list)
    owners: dict[SessionKey, OwnerRecords] = field(default_factory=dict)
    """Each session's records (its session item and its checkpoint page)."""


def _page_session(partition_key: str) -> SessionKey | None:
    """``PAGE#<worker_id>#<session_gen>`` -> ``(worker_id, session_gen)``."""
    worker_id, _, gen = partition_key[len(schema.PAGE_KEY_PREFIX) :].rpartition("#")
    return (worker_id, int(gen)) if worker_id and gen.isdigit() else None


def sort_table(raw_items: Iterable[Mapping[str, Any]]) -> TableContents:
    """Connection items, session items and checkpoint pages from one Scan of the
    table (DynamoDB's typed attributes); anything else is left out."""
    connections: list[ConnectionItem] = []
    sessions: dict[SessionKey, SessionItem] = {}
    pages: dict[SessionKey, CheckpointPage] = {}
    for raw in raw_items:
        pk = str(raw.get(schema.PARTITION_KEY, {}).get("S", ""))
        if pk.startswith(schema.KEY_PREFIX):
            connections.append(ConnectionItem.from_dynamodb(raw))
        elif pk.startswith(schema.SESSION_KEY_PREFIX):
            # What cannot be read is left out, as the router leaves it out.
            with contextlib.suppress(MalformedItemError):
                session = SessionItem.from_dynamodb(raw)
                sessions[session.key] = session
        elif pk.startswith(schema.PAGE_KEY_PREFIX):
            key = _page_session(pk)
            if key is not None:
                with contextlib.suppress(MalformedItemError):
                    pages[key] = page_from_dynamodb(raw)
    owners = {
        key: OwnerRecords(session=sessions.get(key), page=pages.get(key))
        # A page without its session is shown as the router shows it: not at all.
        for key in sessions
    }
    return TableContents(connections, owners)


def views_of(
    items: Iterable[ConnectionItem],
    now_ms: int,
    owners: Mapping[SessionKey, OwnerRecords] | None = None,
) -> list[dict[str, Any]]:
    """The items as the API would show them at ``now_ms`` (epoch ms), each with its
    owner's records from ``owners`` (none given: no session or page is known)."""
    known = owners or {}

    def records(item: ConnectionItem) -> OwnerRecords:
        key = owning_session(item)
        return NO_RECORDS if key is None else known.get(key, NO_RECORDS)

    return [connection_view(item, now_ms, records(item)) for item in items]


def views_of_table(raw_items: Iterable[Mapping[str, Any]], now_ms: int) -> list[dict[str, Any]]:
    """The connections of one Scan of the table (every item, typed attributes) as the
    API would show them at ``now_ms``, with their owners' sessions and pages."""
    contents = sort_table(raw_items)
    return views_of(contents.connections, now_ms, contents.owners)


def held_by(views: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many connections each owner holds according to the table (lapsed ones
    included: they stay in the owner's name until another worker takes them)."""
    counts: dict[str, int] = {}
    for view in views:
        owner = view.get("owner")
        if owner:
            counts[str(owner)] = counts.get(str(owner), 0) + 1
    return counts


def workers_alive(workers: Sequence[WorkerStatus]) -> str:
    return f"{sum(1 for worker in workers if worker.alive)}/{len(workers)} alive"


def _worker_lines(views: Sequence[Mapping[str, Any]], workers: Sequence[WorkerStatus]) -> list[str]:
    held = held_by(views)
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


def render_lines(
    views: Sequence[Mapping[str, Any]], workers: Sequence[WorkerStatus] = ()
) -> list[str]:
    """The body of a live view frame: what msg/s means, the fleet table, the fleet's
    totals, then one line per worker (alive or dead, connections held in the table)."""
    return [
        RATE_LEGEND,
        "",
        *render.fleet_table(views),
        "",
        render.fleet_totals(views),
        f"workers: {workers_alive(workers)}",
        *_worker_lines(views, workers),
    ]


def summary(views: Sequence[Mapping[str, Any]], workers: Sequence[WorkerStatus] = ()) -> str:
    """The fleet on one line, for logs and output that is not a terminal::

        workers 2/2 alive | 3 connections, 3 streaming, 15.0 msg/s | demo-1 seq=57 ...

    (:func:`fleetctl.render.summary_line`)."""
    return f"workers {workers_alive(workers)} | {render.summary_line(views)}"
