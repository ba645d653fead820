"""Lease timing: defaults derived from the lease, and the rules they must satisfy
(docs/DESIGN.md §3.8)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MAX_DRAIN_SECONDS: Final = 30.0
"""Longest wait for a handler call in flight when a connection ends gracefully."""
MAX_RELEASE_SECONDS: Final = 30.0
"""Longest time spent retrying a release that failed with an error (not a condition)."""


class InvalidTimingError(ValueError):
    """Timing settings that would let a lease lapse before its holder can renew it."""


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """All durations in seconds (floats allowed, so tests can scale time down).

    Only ``lease`` must be chosen; :meth:`from_lease` derives the rest:
    heartbeat = lease/4, reconcile = lease/4, skew = lease/20, margin = lease/10.
    """

    lease: float
    heartbeat: float
    reconcile: float
    skew: float
    margin: float

    @classmethod
    def from_lease(
        cls,
        lease: float = 20.0,
        *,
        heartbeat: float | None = None,
        reconcile: float | None = None,
        skew: float | None = None,
        margin: float | None = None,
    ) -> LeaseTiming:
        timing = cls(
            lease=lease,
            heartbeat=lease / 4 if heartbeat is None else heartbeat,
            reconcile=lease / 4 if reconcile is None else reconcile,
            skew=lease / 20 if skew is None else skew,
            margin=lease / 10 if margin is None else margin,
        )
        timing.validate()
        return timing

    def validate(self) -> None:
        """Raise :class:`InvalidTimingError` unless the holder gets two renew attempts
        before it must fence itself, and the skew is small against the lease."""
        for name in ("lease", "heartbeat", "reconcile"):
            if not getattr(self, name) > 0:
                raise InvalidTimingError(f"{name} must be > 0 s, got {getattr(self, name)}")
        for name in ("skew", "margin"):
            if getattr(self, name) < 0:
                raise InvalidTimingError(f"{name} must be >= 0 s, got {getattr(self, name)}")
        if not 2 * self.heartbeat + self.margin < self.lease - self.skew:
            raise InvalidTimingError(
                "need 2*heartbeat + margin < lease - skew (two renew attempts before fencing): "
                f"2*{self.heartbeat} + {self.margin} >= {self.lease} - {self.skew}"
            )
        if not self.skew < self.lease / 4:
            raise InvalidTimingError(f"need skew < lease/4: {self.skew} >= {self.lease / 4}")

    @property
    def lease_ms(self) -> int:
        return round(self.lease * 1000)

    @property
    def skew_ms(self) -> int:
        return round(self.skew * 1000)

    @property
    def fence_after(self) -> float:
        """Seconds after a renew was *sent* during which its holder may still handle
        messages: ``lease - skew - margin``."""
        return self.lease - self.skew - self.margin

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
        drain, the release retries and a second for the rest (well inside ECS's
        120 s stop timeout at any lease)."""
        return self.drain_budget + self.release_budget + 1.0

    def crash_failover_bound(self) -> float:
        """What docs/DESIGN.md §3.9 promises for a crashed holder:
        lease + skew + 1.2 x reconcile + 1 s."""
        return self.lease + self.skew + 1.2 * self.reconcile + 1.0
