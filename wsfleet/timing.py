"""Session timing: defaults derived from the lease, and the rules they must satisfy
(docs/DESIGN.md §3.10)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MAX_DRAIN_SECONDS: Final = 30.0
"""Longest wait for a handler call in flight when a connection ends gracefully."""
MAX_RELEASE_SECONDS: Final = 30.0
"""Longest time spent retrying a release that failed with an error (not a condition)."""
MIN_SHUTDOWN_SECONDS: Final = 20.0
"""The shortest wait of a graceful shutdown for its connections to end."""
DEFAULT_LEASE_SECONDS: Final = 2.2
MIN_LEASE_SECONDS: Final = 1.5
"""The shortest lease a deployment may set: below it a renew has under a second and a
third to land (a slow DynamoDB moment would cost sessions), and the renews, two and a
half a second and more, cost more than they buy."""
DRIFT_RATE: Final = 0.001
"""The most two workers' monotonic clocks may differ in rate (1,000 parts per million:
a free-running crystal is off by tens, and NTP slews by at most 500). Only durations
measured on one worker's own monotonic clock decide safety, never a wall clock nor an
instant compared across workers: a holder fences a little before ``lease`` after its
renew's send, and a reaper waits a little more than ``lease`` after first seeing the
renew (docs/DESIGN.md §3.6)."""
DEFAULT_CHECKPOINT_SECONDS: Final = 5.0
MAX_CHECKPOINT_SECONDS: Final = 300.0
RENEW_ATTEMPTS_IN_FENCE_WINDOW: Final = 3
"""Session renews sent within one fence window: two in a row may fail to land in time
without a pause."""
RENEWS_IN_FLIGHT: Final = 4
"""At most this many session renews are awaited at once (one more goes out every
heartbeat while earlier ones are still unanswered). Four cover a whole fence window at
the default timings (1.98 s / 0.594 s) and at the tests' (1.8 s / 0.5 s)."""
HEARTBEAT_SHARE: Final = 0.27
"""Heartbeat and reconcile pass, as a share of the lease: three renews fit in the fence
window (0.81 of 0.9 lease) with a tenth of a lease to spare, and at the default lease
the renews cost what they did at 0.6 s."""
HEALTH_MIN_SECONDS: Final = 10.0
OWN_CHECK_PASSES: Final = 4
"""Every how many reconcile passes a worker lists its own ``by-owner`` entries, unless
a write with an unknown outcome asks for it sooner (docs/DESIGN.md §4.2)."""


class InvalidTimingError(ValueError):
    """Timing settings that would let a lease lapse before its holder can renew it."""


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """All durations in seconds (floats allowed, so tests can scale time down).

    ``lease`` is the session lease. Only it must be chosen; :meth:`from_lease`
    derives the rest: heartbeat = reconcile = 0.27 x lease (0.594 s at the default
    2.2 s), margin = lease/10 (0.22 s), checkpoint = 5 s.
    """

    lease: float
    heartbeat: float
    reconcile: float
    margin: float
    """Kept between the fence deadline and the earliest reap: for the holder's clock
    running slower than real time (up to :data:`DRIFT_RATE`), and for what happens
    between a runner's check of its deadline and the handler call it allows."""
    checkpoint: float = DEFAULT_CHECKPOINT_SECONDS
    """Seconds between two writes of a session's checkpoint page."""

    @classmethod
    def deployed(
        cls, lease: float = DEFAULT_LEASE_SECONDS, **overrides: float | None
    ) -> LeaseTiming:
        """:meth:`from_lease` for a deployment (the worker's settings, the stack's
        options): also refuses a lease under :data:`MIN_LEASE_SECONDS`."""
        if lease < MIN_LEASE_SECONDS:
            raise InvalidTimingError(f"lease must be >= {MIN_LEASE_SECONDS} s, got {lease}")
        return cls.from_lease(lease, **overrides)

    @classmethod
    def from_lease(
        cls,
        lease: float = DEFAULT_LEASE_SECONDS,
        *,
        heartbeat: float | None = None,
        reconcile: float | None = None,
        margin: float | None = None,
        checkpoint: float | None = None,
    ) -> LeaseTiming:
        timing = cls(
            lease=lease,
            heartbeat=HEARTBEAT_SHARE * lease if heartbeat is None else heartbeat,
            reconcile=HEARTBEAT_SHARE * lease if reconcile is None else reconcile,
            margin=lease / 10 if margin is None else margin,
            checkpoint=DEFAULT_CHECKPOINT_SECONDS if checkpoint is None else checkpoint,
        )
        timing.validate()
        return timing

    def validate(self) -> None:
        """Raise :class:`InvalidTimingError` unless three session renews are sent within
        one fence window (the worker pauses only when three in a row did not land in
        time)."""
        for name in ("lease", "heartbeat", "reconcile", "checkpoint"):
            if not getattr(self, name) > 0:
                raise InvalidTimingError(f"{name} must be > 0 s, got {getattr(self, name)}")
        if not self.margin > 2 * DRIFT_RATE * self.lease:
            raise InvalidTimingError(
                f"need margin > 2*{DRIFT_RATE}*lease (the clocks' drift over a lease):"
                f" {self.margin} <= {2 * DRIFT_RATE * self.lease}"
            )
        attempts = RENEW_ATTEMPTS_IN_FENCE_WINDOW
        if not attempts * self.heartbeat <= self.fence_after:
            raise InvalidTimingError(
                f"need {attempts}*heartbeat <= lease - margin ({attempts} renew attempts"
                f" before fencing): {attempts}*{self.heartbeat} > {self.lease} - {self.margin}"
            )
        if self.checkpoint > MAX_CHECKPOINT_SECONDS:
            raise InvalidTimingError(
                f"checkpoint must be <= {MAX_CHECKPOINT_SECONDS} s, got {self.checkpoint}"
            )

    @property
    def lease_ms(self) -> int:
        return round(self.lease * 1000)

    @property
    def fence_after(self) -> float:
        """Seconds after a session renew was *sent*, on the holder's monotonic clock,
        during which its connections may still handle messages: ``lease - margin``."""
        return self.lease - self.margin

    @property
    def expire_after(self) -> float:
        """Seconds a reaper must have seen a session's renew count unchanged, on its
        own monotonic clock, before it may reap it: ``lease x (1 + DRIFT_RATE)``."""
        return self.lease * (1 + DRIFT_RATE)

    @property
    def renew_attempt_timeout(self) -> float:
        """Bound of one session-renew request: the fence window, the whole span an
        attempt can still extend (it extends the deadline to its send plus the window,
        so an answer after that proves nothing any more; one before it counts, however
        late). Later attempts go out meanwhile, a heartbeat apart (docs/DESIGN.md §3.1)."""
        return self.fence_after

    @property
    def give_up_after(self) -> float:
        """Seconds after the send of the last renew that landed at which the worker gives
        the session up (docs/DESIGN.md §3.6): its fence deadline and one heartbeat more,
        in which the renews still in flight may land and resume it."""
        return self.fence_after + self.heartbeat

    @property
    def stale_health_after(self) -> float:
        """The health check fails once the event loop has not stamped for this long:
        three heartbeats, and never less than 10 s (short heartbeats would otherwise
        turn a garbage-collection pause into a restart)."""
        return max(3 * self.heartbeat, HEALTH_MIN_SECONDS)

    @property
    def drain_budget(self) -> float:
        """Longest wait, from a graceful stop, for the handler call in flight: never
        past the fence deadline of that moment (itself at most ``fence_after`` away),
        and never past :data:`MAX_DRAIN_SECONDS`."""
        return min(self.fence_after, MAX_DRAIN_SECONDS)

    @property
    def release_budget(self) -> float:
        """How long a release that failed with an error is retried: about as long as
        the lease would take to lapse by itself, at most :data:`MAX_RELEASE_SECONDS`."""
        return min(self.lease, MAX_RELEASE_SECONDS)

    @property
    def shutdown_budget(self) -> float:
        """The longest a graceful shutdown waits for its connections to end: the
        drain, the release retries and a second for the rest, and never less than
        :data:`MIN_SHUTDOWN_SECONDS` (a full worker's hundreds of releases and
        ``reassign`` hints take longer than one short lease), well inside ECS's 120 s
        stop timeout at any lease."""
        return max(self.drain_budget + self.release_budget + 1.0, MIN_SHUTDOWN_SECONDS)

    def own_check_bound(self) -> float:
        """How soon a worker notices a connection its session owns but does not run
        (an acquire whose reply was lost) or one stopped without a notice (the router
        failed between its two writes): :data:`OWN_CHECK_PASSES` reconcile passes, at
        +20% jitter, and a second for the release."""
        return OWN_CHECK_PASSES * 1.2 * self.reconcile + 1.0

    def crash_failover_bound(self) -> float:
        """What docs/DESIGN.md §3.11 promises for a crashed holder: its last renew is
        seen within a reconcile pass (+20% jitter), the reap comes ``expire_after``
        later, and a second for the takeover and the connect."""
        return self.expire_after + 1.2 * self.reconcile + 1.0
