"""Fair shares and balance moves of the fleet's connections, as pure functions.

Every worker publishes on its session how many connections it runs and its capacity
(0 while it drains for shutdown). From one listing of the live sessions, every worker
computes the same fleet-wide plan and carries out its own row of it. Nothing here
reads a clock or touches the network.

**Fair share.** The fleet's connections (the live sessions' plus the unowned ones
seen) are shared in proportion to capacity, no worker above its capacity; what fits
nowhere is left unshared. Sharing in proportion to capacity with a cap at capacity
comes down to one ratio: ``share = capacity * min(1, total / total capacity)``. A
draining worker's share is 0.

**Taking.** A worker takes free connections (from the unowned index or offered by a
giver) only up to ``ceil(share)`` and its capacity: at or above its share it takes
nothing.

**Giving.** A worker gives only when it runs more than ``ceil(share * (1 +
tolerance))``, and then down to ``ceil(share)``, not to the tolerance. Receivers are
the workers below ``floor(share)`` and receive at most up to it. The fleet moves at
most ``max(1, floor(move_fraction * connections))`` per round; several givers divide
that cap, and each receiver's deficit, in proportion to their excess, so givers that
plan from the same listing never pile onto one receiver.

**A draining worker** gives everything it has, not capped by the round: it has a
shutdown budget to keep. Its connections go first to the room below the others' fair
shares (the shares count the draining connections in the total), then to their free
capacity; what fits nowhere is not planned. Several draining workers share each
receiver's room in proportion to their connections. The drains' receptions are
planned before the balance moves, which only get the room left.

**Why this converges without ping-pong.** Moves change neither the total nor the
capacities, so they leave every share as it was. A giver stays at or above
``ceil(share)`` and a receiver at or below ``floor(share)``: a receiver never crosses
the tolerance line that makes a giver, a giver never falls below the share that
makes a receiver, and a worker at or above its share takes no offer. Every round with
a giver and a receiver moves at least one connection, and the givers' total excess
only shrinks, so the moves stop. The round cap bounds the reconnect burst of each
round.

**Determinism.** Loads are read in key order; every split is the largest remainder
method with ties to the earlier key; shares are exact fractions, and the settings are
read as the decimals they are written as (``0.1`` is one tenth), so the same listing
gives the same plan on every worker and ``ceil(100 * 1.1)`` is 110, not 111.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from wsfleet.session_rules import SessionItem


@dataclass(frozen=True, slots=True)
class Load:
    """One live session's published load."""

    key: str
    """``<worker_id>#<session_gen>``; unique in a listing."""
    connections: int
    capacity: int
    """0: draining (takes nothing, gives everything)."""

    def __post_init__(self) -> None:
        if self.connections < 0:
            raise ValueError(f"{self.key}: connections must be >= 0, not {self.connections}")
        if self.capacity < 0:
            raise ValueError(f"{self.key}: capacity must be >= 0, not {self.capacity}")

    @property
    def draining(self) -> bool:
        return self.capacity == 0


@dataclass(frozen=True, slots=True)
class BalanceSettings:
    """How eagerly the fleet rebalances."""

    tolerance: float = 0.05
    """A worker gives only above ``ceil(share * (1 + tolerance))``."""
    move_fraction: float = 0.10
    """Per round, the fleet moves at most this fraction of its connections (at least 1)."""
    round_seconds: float = 5.0
    """Rounds are spaced by this; the caller times them."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"tolerance must be finite and >= 0, not {self.tolerance}")
        if not (0 < self.move_fraction <= 1):
            raise ValueError(f"move_fraction must be in (0, 1], not {self.move_fraction}")
        if not (math.isfinite(self.round_seconds) and self.round_seconds > 0):
            raise ValueError(f"round_seconds must be finite and > 0, not {self.round_seconds}")

    def round_cap(self, total_connections: int) -> int:
        """How many connections the fleet moves at most in one round."""
        return max(1, math.floor(_decimal(self.move_fraction) * total_connections))


@functools.cache
def _decimal(value: float) -> Fraction:
    """A setting as the decimal it is written as (``0.1`` is exactly one tenth)."""
    return Fraction(repr(value))


def _gives_above(share: Fraction, settings: BalanceSettings) -> int:
    """A worker with more connections than this gives: ``ceil(share * (1 + tolerance))``."""
    return math.ceil(share * (1 + _decimal(settings.tolerance)))


def loads_of(sessions: Iterable[SessionItem]) -> list[Load]:
    """The live sessions' loads, in key order."""
    loads = [
        Load(
            key=f"{s.worker_id}#{s.session_gen}",
            connections=s.connections,
            capacity=s.capacity,
        )
        for s in sessions
        if s.alive
    ]
    return sorted(loads, key=lambda load: load.key)


def _in_key_order(loads: Sequence[Load]) -> list[Load]:
    ordered = sorted(loads, key=lambda load: load.key)
    for before, after in itertools.pairwise(ordered):
        if before.key == after.key:
            raise ValueError(f"two loads under one key: {before.key}")
    return ordered


def _shares(ordered: Sequence[Load], unowned: int) -> dict[str, Fraction]:
    if unowned < 0:
        raise ValueError(f"unowned must be >= 0, not {unowned}")
    total = sum(load.connections for load in ordered) + unowned
    capacity = sum(load.capacity for load in ordered)
    ratio = Fraction(min(total, capacity), capacity) if capacity else Fraction(0)
    return {load.key: load.capacity * ratio for load in ordered}


def fair_shares(loads: Sequence[Load], unowned: int = 0) -> dict[str, float]:
    """Each worker's fair share of the fleet's connections (those of ``loads`` plus
    ``unowned``), in key order: in proportion to capacity, none above its capacity.
    The shares sum to ``min(total, total capacity)``; a draining worker's is 0."""
    return {key: float(share) for key, share in _shares(_in_key_order(loads), unowned).items()}


def room_to_take(me: str, loads: Sequence[Load], unowned: int = 0) -> int:
    """How many connections ``me`` may take now, from the unowned index or from balance
    offers: up to ``ceil(share)`` (the share counting the ``unowned`` seen) and its
    capacity. 0 at or above its share, while draining, or for a key not listed."""
    ordered = _in_key_order(loads)
    shares = _shares(ordered, unowned)
    for load in ordered:
        if load.key == me:
            limit = min(math.ceil(shares[me]), load.capacity)
            return max(0, limit - load.connections)
    return 0


def _apportion(amount: int, weights: Mapping[str, int]) -> dict[str, int]:
    """``amount`` split in proportion to ``weights`` (keys in order) by the largest
    remainder method, ties to the earlier key. With ``amount <= sum(weights)`` no key
    gets more than its weight, and a key of weight 0 gets nothing."""
    total = sum(weights.values())
    if amount <= 0 or total <= 0:
        return {}
    keys = list(weights)
    # The quota of a key is amount * weight / total: its whole part and its remainder
    # (over the common denominator ``total``).
    parts = [amount * weights[key] // total for key in keys]
    remainders = [amount * weights[key] % total for key in keys]
    left = amount - sum(parts)
    # sorted() is stable: equal remainders keep the key order.
    for i in sorted(range(len(keys)), key=lambda i: -remainders[i])[:left]:
        parts[i] += 1
    return {key: part for key, part in zip(keys, parts, strict=True) if part > 0}


def _split(out: Mapping[str, int], into: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Who gives how many to whom, given what each giver gives (``out``) and each
    receiver receives (``into``), both in key order with equal sums. Each receiver's
    part is divided over the givers in proportion to what they still have to give, so
    every giver spreads over the receivers and the sums come out exact."""
    remaining = dict(out)
    plan: dict[str, dict[str, int]] = {giver: {} for giver in out}
    for receiver, count in into.items():
        for giver, part in _apportion(count, remaining).items():
            plan[giver][receiver] = part
            remaining[giver] -= part
    return {giver: row for giver, row in plan.items() if row}


def _fleet_plan(ordered: Sequence[Load], settings: BalanceSettings) -> dict[str, dict[str, int]]:
    """Every giver's moves this round, computed the same way on every worker."""
    shares = _shares(ordered, 0)
    taking = [load for load in ordered if not load.draining]
    received = {load.key: 0 for load in taking}

    # Draining workers: everything, first into the room below the fair shares, then
    # into free capacity; not capped by the round.
    drains = {load.key: load.connections for load in ordered if load.draining}
    to_place = sum(drains.values())
    below_share = {
        load.key: max(0, math.floor(shares[load.key]) - load.connections) for load in taking
    }
    first = _apportion(min(to_place, sum(below_share.values())), below_share)
    free = {
        load.key: max(0, load.capacity - load.connections - first.get(load.key, 0))
        for load in taking
    }
    then = _apportion(min(to_place - sum(first.values()), sum(free.values())), free)
    drained_into = {
        key: first.get(key, 0) + then.get(key, 0)
        for key in received
        if first.get(key, 0) + then.get(key, 0) > 0
    }
    placed = sum(drained_into.values())
    plan = _split(_apportion(placed, drains), drained_into)
    for key, count in drained_into.items():
        received[key] += count

    # Balance moves: from above the tolerance down to ceil(share), into the room left
    # below floor(share), at most the round cap.
    excess = {
        load.key: load.connections - math.ceil(shares[load.key])
        for load in taking
        if load.connections > _gives_above(shares[load.key], settings)
    }
    deficit = {
        load.key: math.floor(shares[load.key]) - load.connections - received[load.key]
        for load in taking
        if math.floor(shares[load.key]) - load.connections - received[load.key] > 0
    }
    cap = settings.round_cap(sum(load.connections for load in ordered))
    moved = min(cap, sum(excess.values()), sum(deficit.values()))
    plan |= _split(_apportion(moved, excess), _apportion(moved, deficit))
    return plan


def plan_moves(me: str, loads: Sequence[Load], settings: BalanceSettings) -> dict[str, int]:
    """How many of its connections ``me`` hands off this round, to whom (receiver key
    to count, counts > 0 only, receivers in key order); empty when ``me`` gives
    nothing or is not listed. Every worker computing from the same listing gets its
    own row of the same fleet-wide plan (see the module's rules)."""
    return _fleet_plan(_in_key_order(loads), settings).get(me, {})


def imbalance(loads: Sequence[Load]) -> float:
    """Max over mean connections of the non-draining workers; 1.0 for an empty or
    all-zero fleet."""
    counts = [load.connections for load in loads if not load.draining]
    if not counts or sum(counts) == 0:
        return 1.0
    return max(counts) * len(counts) / sum(counts)
