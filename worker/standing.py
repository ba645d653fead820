"""Where the worker stands with the table, with no I/O and no clock: its latest session
(generation, live or not, fence deadline), the earlier sessions under which a write
may have landed unseen, and whether it is closing.

Every part of the worker reads it (may work be taken now? under which session? is a
listing of its own entries due?) and the session and the ownership parts move it;
times are the event loop's, passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from wsfleet import lease_rules
from wsfleet.timing import LeaseTiming


@dataclass
class Standing:
    timing: LeaseTiming
    max_connections: int
    gen: int = 0
    """The latest session's generation (the next open takes the one after it)."""
    live: bool = False
    """The latest session is open and not known to be reaped: work is taken and run
    under it, and under no other."""
    deadline: float = 0.0
    """The session's fence deadline (loop time): no handler call at or after it."""
    closing: bool = False
    """The worker is shutting down: it takes no more work and publishes no capacity."""
    doubt: bool = False
    """A write whose outcome is unknown (an acquire or takeover that raised, a release
    that never got an answer): the next reconcile pass lists this session's own entries
    instead of waiting for its turn."""
    slow_path: Callable[[], bool] = field(default=lambda: False)
    """Whether this worker's DynamoDB round trips are longer than a short attempt
    (worker.patient_calls): it is slow but alive, and takes no work it may leave."""
    suspect_gens: dict[int, float] = field(default_factory=dict)
    """Earlier sessions of this worker under which a write may have landed unseen (an
    acquire or takeover without an answer, a give-back that never got one), with when
    that was last so: the own-check lists their entries too."""

    @property
    def session_gen(self) -> int:
        """The generation of the live session (0 while none is open, and from a reap
        until the next one is open)."""
        return self.gen if self.live else 0

    def opened(self, gen: int, sent_at: float) -> None:
        """Session ``gen`` was opened by a write sent at ``sent_at``."""
        self.gen = gen
        self.live = True
        self.deadline = lease_rules.fence_deadline(sent_at, self.timing)

    def renewed(self, sent_at: float) -> None:
        """A renew of the live session sent at ``sent_at`` landed."""
        self.deadline = max(self.deadline, lease_rules.fence_deadline(sent_at, self.timing))

    def ready(self, now: float) -> bool:
        """A session is open and was renewed recently enough to take work under it."""
        return self.session_gen > 0 and self.deadline - now > self.timing.heartbeat

    def published_capacity(self, running: int) -> int:
        """The capacity the session publishes: 0 while closing; while the path is
        slow, what it runs (``running``): no room, so no balance move is sent to it and
        no reap names it as a taker (docs/DESIGN.md §3.11). Only the worker itself
        moves what it runs, and it moves nothing while slow (``Worker.movable``)."""
        if self.closing:
            return 0
        if self.slow_path():
            return min(self.max_connections, running)
        return self.max_connections

    def takeover_room(self, free: int) -> int:
        """Of ``free`` slots, how many this worker names itself for when it reaps: none
        while its path is slow (each takeover would take round trips of seconds)."""
        return 0 if self.slow_path() else free

    def suspect(self, gen: int, now: float) -> None:
        """A write under session ``gen`` got no answer at ``now``."""
        self.doubt = True
        if gen:
            self.suspect_gens[gen] = now

    def take_doubt(self) -> bool:
        doubt, self.doubt = self.doubt, False
        return doubt

    def own_generations(self) -> list[int]:
        """The sessions whose ``by-owner`` entries the own-check lists: the live one,
        and earlier ones under which a write may have landed unseen."""
        live = [self.session_gen] if self.session_gen else []
        return live + sorted(g for g in self.suspect_gens if g != self.session_gen)

    def own_check_found(self, gen: int, entries: int, checked_at: float) -> None:
        """The own-check listed ``entries`` under the earlier session ``gen`` at
        ``checked_at`` (monotonic): once it lists none, a release budget after the
        last write that might land there, that session is settled."""
        marked = self.suspect_gens.get(gen)
        if marked is None or gen == self.session_gen:
            self.suspect_gens.pop(gen, None)
            return
        if entries == 0 and checked_at - marked >= self.timing.release_budget:
            del self.suspect_gens[gen]
