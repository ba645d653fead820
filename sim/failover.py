"""Invariant 7: a crash's connections run again within the crash failover bound.

Invariant 3 sees darkness only through deliveries, so it must allow a feed's interval
between messages and a second to connect on top of the bound; a failover a second or
two late hides in that slack. This watch measures what docs/DESIGN.md §3.11 promises
exactly: from the kill until another worker's runner has its upstream stream open
(the feed accepted its subscription), for every connection the crashed worker was
running.

The promise has conditions (§3.11), so a crash is judged only when they hold: the
survivors' free slots at the crash cover the dead worker's connections twice over,
and nothing else happened to the fleet in the window (no other fault, pause, crash or
shortage of room; no router request for that connection, no fault of its upstream).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Crash:
    worker: str
    at: float
    room: int
    pending: dict[str, float | None] = field(default_factory=dict)
    """Connection -> when another worker opened its stream (None: not yet)."""


Excused = Callable[[str, float, float], bool]
"""``excused(connection_id, start, end)``: something else happened in that window."""


class FailoverWatch:
    def __init__(self, bound: float) -> None:
        self.bound = bound
        self._crashes: list[_Crash] = []
        self.judged = 0
        """Connections whose failover was measured (not excused)."""
        self.slowest = 0.0

    def crashed(self, worker: str, at: float, running: list[str], room: int) -> None:
        if running:
            self._crashes.append(_Crash(worker, at, room, dict.fromkeys(running)))

    def streaming(self, connection_id: str, worker: str, at: float) -> None:
        for crash in self._crashes:
            if worker != crash.worker and crash.pending.get(connection_id, 0.0) is None:
                crash.pending[connection_id] = at

    def late(self, now: float, excused: Excused) -> list[tuple[str, str, float, float]]:
        """(connection, crashed worker, crash time, seconds to run again) of each
        failover past the bound whose conditions held; judged ones are forgotten."""
        found: list[tuple[str, str, float, float]] = []
        kept: list[_Crash] = []
        for crash in self._crashes:
            deadline = crash.at + self.bound
            if now <= deadline and any(t is None for t in crash.pending.values()):
                kept.append(crash)  # still inside its window
                continue
            if crash.room < 2 * len(crash.pending):
                continue
            for cid, ran in sorted(crash.pending.items()):
                if excused(cid, crash.at, deadline):
                    continue
                took = (ran if ran is not None else now) - crash.at
                self.judged += 1
                self.slowest = max(self.slowest, took)
                if took > self.bound:
                    found.append((cid, crash.worker, crash.at, took))
        self._crashes = kept
        return found
