"""What one worker has seen of the sessions, on its own monotonic clock: when each
session's beat (or state) last changed in its listings. Expiry is decided from this
alone (docs/DESIGN.md §3.6): a session whose beat this worker has seen unchanged for
``expire_after`` may be reaped, on condition of that beat; no wall clock, and no
instant written by another worker, enters the decision.

A worker that has just started has seen nothing change yet: it counts from its first
listing, so it reaps nothing before it has watched for a lease. A stale listing (an
older beat after a newer one) only restarts the count: it can delay a reap, never
bring one forward.

Pure: fed the listings and ``now`` (the event loop's clock), no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from wsfleet import schema
from wsfleet.session_rules import SessionItem
from wsfleet.timing import LeaseTiming

Key = tuple[str, int]

WAKE_MARGIN = 0.01
"""How long after the instant a session lapses a pass is planned to reap it: a timer
that fires a little early finds it not lapsed yet and waits again."""


@dataclass(frozen=True, slots=True)
class _Sighting:
    beat: int | None
    state: str | None
    since: float
    """When this worker first listed the session with this beat and state."""


class SessionWatch:
    def __init__(self, timing: LeaseTiming) -> None:
        self._timing = timing
        self._seen: dict[Key, _Sighting] = {}

    def observe(self, sessions: Iterable[SessionItem], now: float) -> None:
        """A listing whose answer came at ``now``: it read every item before that,
        so each beat it shows landed before ``now`` (the request's send would not
        do: a renew may land between the send and the read). Sessions no longer
        listed are forgotten."""
        seen: dict[Key, _Sighting] = {}
        for session in sessions:
            old = self._seen.get(session.key)
            if old is None or old.beat != session.beat or old.state != session.state:
                old = _Sighting(session.beat, session.state, now)
            seen[session.key] = old
        self._seen = seen

    def reaped(self, session: SessionItem, now: float) -> None:
        """This worker's own reap of ``session`` landed at ``now``."""
        self._seen[session.key] = _Sighting(session.beat, session.state, now)

    def unchanged_for(self, session: SessionItem, now: float) -> float:
        """How long this worker has seen ``session`` as listed now (its beat and state);
        0 for a session it has not seen so."""
        sighting = self._seen.get(session.key)
        if sighting is None or (sighting.beat, sighting.state) != (session.beat, session.state):
            return 0.0
        return max(0.0, now - sighting.since)

    def lapsed(self, session: SessionItem, now: float) -> bool:
        """Reapable (ALIVE, or without a state) and seen unrenewed for ``expire_after``:
        a reap on condition of its beat may pass."""
        return session.reapable and self.unchanged_for(session, now) >= self._timing.expire_after

    def overdue(self, sessions: Iterable[SessionItem], now: float) -> frozenset[Key]:
        """The ALIVE sessions seen unrenewed for a lease or more: not to be counted on
        to take connections (their worker may be gone)."""
        lease = self._timing.lease
        return frozenset(
            session.key
            for session in sessions
            if session.alive and self.unchanged_for(session, now) >= lease
        )

    def next_lapse(self, mine: Key, now: float) -> float | None:
        """The earliest instant after ``now`` at which a session seen ALIVE (not
        ``mine``) lapses if its beat does not change; None when there is none. A live
        session's beat changes every heartbeat, so only one that stopped renewing
        brings a pass forward."""
        after = self._timing.expire_after + WAKE_MARGIN
        instants = (
            sighting.since + after
            for key, sighting in self._seen.items()
            if key != mine and sighting.state != schema.DEAD
        )
        return min((at for at in instants if at > now), default=None)
