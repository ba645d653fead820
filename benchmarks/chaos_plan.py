"""What a chaos run will do, decided up front from its seed: the options, the fault
schedule and the connections (pure: no clock, no processes)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from wsfleet.timing import LeaseTiming

FAULT_KINDS = ("sigkill", "sigterm", "sigstop", "blackhole", "delay", "scale_out", "scale_in")
"""Every fault the run applies to the fleet."""
TARGETED = frozenset(("sigkill", "sigterm", "sigstop", "blackhole", "delay", "scale_in"))
"""Faults aimed at one worker."""
UPSTREAM_FAULTS = ("drop_after", "close_after", "garbage_after", "oversize_after", "mute_after")
"""Feed parameters that make an upstream misbehave (never ``gap_after``: a deliberate
upstream gap would read as loss)."""


@dataclass(frozen=True, slots=True)
class Options:
    duration: float = 120.0
    """Seconds of the fault phase."""
    seed: int = 7
    workers: int = 4
    connections: int = 60
    lease_seconds: float = 2.0
    rate: float = 10.0
    """Messages per second per connection."""
    work_dir: Path | None = None
    keep: bool = False

    @property
    def timing(self) -> LeaseTiming:
        return LeaseTiming.from_lease(self.lease_seconds)

    @property
    def min_workers(self) -> int:
        """Scale-in stops here."""
        return max(2, self.workers - 2)

    @property
    def max_workers(self) -> int:
        """Scale-out stops here."""
        return self.workers + 2


DEFAULTS = Options()


@dataclass(frozen=True, slots=True)
class PlannedFault:
    at: float
    """Seconds after the fault phase began."""
    kind: str
    hold: float = 0.0
    """How long a pause or partition lasts; for sigkill/sigterm, when the replacement
    starts."""
    delay: float = 0.0
    """For ``delay``: how late each chunk is forwarded."""


def plan_faults(rng: random.Random, duration: float, timing: LeaseTiming) -> list[PlannedFault]:
    """The fault schedule: kinds dealt from decks holding every kind once, each deck
    shuffled by ``rng`` (so any seven consecutive faults from a deck's start cover every
    kind), at intervals of 0.5-1.5 leases. The plan ends with the first fault that
    would outlast ``duration``. Holds: a pause 1.5-2.5 leases (past the lease), a
    blackhole 0.3-2.5 leases, a delay of 1.5-3 heartbeats held 1-2.5 leases, a
    replacement 0.5-1.5 s after a SIGKILL or SIGTERM."""
    plan: list[PlannedFault] = []
    at = rng.uniform(0.25, 0.75) * timing.lease
    deck: list[str] = []
    while True:
        if not deck:
            deck = list(FAULT_KINDS)
            rng.shuffle(deck)
        kind = deck.pop()
        hold = 0.0
        delay = 0.0
        if kind in ("sigkill", "sigterm"):
            hold = rng.uniform(0.5, 1.5)
        elif kind == "sigstop":
            hold = rng.uniform(1.5, 2.5) * timing.lease
        elif kind == "blackhole":
            hold = rng.uniform(0.3, 2.5) * timing.lease
        elif kind == "delay":
            hold = rng.uniform(1.0, 2.5) * timing.lease
            delay = rng.uniform(1.5, 3.0) * timing.heartbeat
        if at + hold > duration:
            return plan
        plan.append(PlannedFault(round(at, 3), kind, round(hold, 3), round(delay, 3)))
        at += rng.uniform(0.5, 1.5) * timing.lease


@dataclass(frozen=True, slots=True)
class PlannedConnection:
    connection_id: str
    params: dict[str, int | float]
    """Feed query parameters."""
    upstream_fault: str | None
    protocol: str | None = None
    """The plug-in protocol it speaks (None: the built-in default)."""


def plan_connections(
    rng: random.Random, count: int, rate: float, plugin: str | None = None
) -> list[PlannedConnection]:
    """``count`` connections at ``rate`` msg/s; every third one carries an upstream fault
    (the kinds in turn) that fires every 20-60 messages, again on every reconnect (the
    feed counts messages per upstream connection); every second one speaks
    ``plugin`` when given (a registered plug-in beside the built-in protocol)."""
    planned = []
    for i in range(count):
        params: dict[str, int | float] = {"rate": rate}
        fault = None
        if i % 3 == 0:
            fault = UPSTREAM_FAULTS[(i // 3) % len(UPSTREAM_FAULTS)]
            params[fault] = rng.randint(20, 60)
        protocol = plugin if i % 2 else None
        planned.append(PlannedConnection(f"c{i:04d}", params, fault, protocol))
    return planned
