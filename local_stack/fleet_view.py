"""The live view of the local fleet: what the connection table says, as text.

The runner reads the table directly (it has no router client here), so each item is
first turned into the view the router's API returns for it
(``lambdas/router/views.py``). From there on it is ``fleetctl watch``: the same
table and summary (:mod:`fleetctl.render`) and the same msg/s rule
(:mod:`fleetctl.rates`: checkpoint advance over the checkpoints' own write times,
never over refresh times). What is local is only what the runner alone knows: the
worker processes it started, alive or dead, and how many leases each holds.

Everything here is pure formatting: the runner does the I/O (Scan, process polling,
terminal output) and passes the results in, with the clock as ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl import render
from fleetctl.rates import RATE_LEGEND
from lambdas.router.views import connection_view
from wsfleet.item import ConnectionItem


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


def views_of(items: Iterable[ConnectionItem], now_ms: int) -> list[dict[str, Any]]:
    """The items of a Scan as the API would show them at ``now_ms`` (epoch ms)."""
    return [connection_view(item, now_ms) for item in items]


def held_by(views: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many leases each owner holds according to the table (lapsed ones included:
    they stay in the owner's name until another worker takes them)."""
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
    views: Sequence[Mapping[str, Any]],
    rates: Mapping[str, float | None],
    workers: Sequence[WorkerStatus] = (),
) -> list[str]:
    """The body of a live view frame: what msg/s means, the fleet table, the fleet's
    totals, then one line per worker (alive or dead, leases held in the table).
    ``rates`` are the ones to show (:func:`fleetctl.rates.shown_rates`)."""
    return [
        RATE_LEGEND,
        "",
        *render.fleet_table(views, rates),
        "",
        render.fleet_totals(views, rates),
        f"workers: {workers_alive(workers)}",
        *_worker_lines(views, workers),
    ]


def summary(
    views: Sequence[Mapping[str, Any]],
    rates: Mapping[str, float | None],
    workers: Sequence[WorkerStatus] = (),
) -> str:
    """The fleet on one line, for logs and output that is not a terminal::

        workers 2/2 alive | 3 connections, 3 owned | demo-1 seq=57 owner=w-1 5.0/s; ...

    ``rates`` are the ones to show, as for :func:`render_lines`."""
    return f"workers {workers_alive(workers)} | {render.summary_line(views, rates)}"
