"""The connections a worker holds, as plain bookkeeping: a runner per connection it
runs, the acquisitions in flight, the tasks the shutdown waits for, the hand-offs
under way, and what is remembered of recent releases.

The ownership part fills it and empties it; the session, the notices, the pages and
the shutdown read it. It does no I/O and keeps no clock: times are passed in.
"""

from __future__ import annotations

import asyncio
from typing import Any

from worker.connection import ConnectionRunner
from wsfleet.checkpoint_page import PageEntry

RELEASED_RECENTLY_SECONDS = 5.0
"""A connection released this long ago may still show as ours in the eventually
consistent ``by-owner`` index: not a stray."""


class Holdings:
    def __init__(self) -> None:
        self.runners: dict[str, ConnectionRunner] = {}
        self.acquiring: dict[str, asyncio.Task[Any]] = {}
        """The acquisition or takeover in flight, by connection id."""
        self.owning: set[asyncio.Task[Any]] = set()
        """Every task the shutdown waits for: each runner's, each acquisition's and
        takeover's, and each acting on notices."""
        self.own_tasks: dict[str, asyncio.Task[None]] = {}
        """Each runner's task, by connection id."""
        self.handing_off: dict[str, asyncio.Future[bool]] = {}
        """Connections being handed off: whether their release landed."""
        self.released: dict[str, float] = {}
        """When each connection was last released (loop time)."""
        self.unanswered: dict[str, PageEntry] = {}
        """Final checkpoints of releases that never got an answer: the connection may
        still be this worker's, so its checkpoint stays on the page, and the stray
        release of the own-check writes it (instead of the older ``last_seq`` the
        index shows)."""

    def holds(self, connection_id: str) -> bool:
        return connection_id in self.runners or connection_id in self.acquiring

    def owned(self) -> dict[str, int]:
        """Connection id -> lease epoch, for every connection this worker runs."""
        return {cid: runner.lease.epoch for cid, runner in self.runners.items()}

    def movable(self, session_gen: int) -> list[str]:
        """Connections that may be handed off: run under the session ``session_gen``
        (the open one), not ending, not being handed off already."""
        return [
            cid
            for cid, runner in self.runners.items()
            if runner.lease.session_gen == session_gen
            and not runner.ending
            and cid not in self.handing_off
        ]

    def recently_released(self, connection_id: str, now: float) -> bool:
        if connection_id in self.unanswered:
            # Given up without an answer: it may still be this session's, and only the
            # own-check's stray release settles it (a restart meanwhile waits on it).
            return False
        released = self.released.get(connection_id)
        return released is not None and now - released < RELEASED_RECENTLY_SECONDS

    def own_entries_listed(self, connection_ids: set[str]) -> None:
        """The own-check listed these entries: an unanswered release whose connection
        is no longer listed as this worker's has landed, or someone else holds it."""
        for cid in set(self.unanswered) - connection_ids:
            del self.unanswered[cid]

    def settled(self, connection_id: str, task: asyncio.Task[Any] | None) -> None:
        """``task``'s attempt at ``connection_id`` is decided: the id is no longer
        being acquired by it (another attempt may have it by now)."""
        if self.acquiring.get(connection_id) is task:
            del self.acquiring[connection_id]

    def keep(self, task: asyncio.Task[Any]) -> None:
        """A task the shutdown waits for, until it ends."""
        self.owning.add(task)
        task.add_done_callback(self.owning.discard)
