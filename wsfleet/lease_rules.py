"""The lease protocol of docs/DESIGN.md §3 as pure functions.

Nothing here reads a clock or touches the network: callers pass ``now`` in and get
back either the conditional write to make or the decision to take, so every rule
can be tested with a table of inputs.

Timeline of one lease (wall clock of the writer, ``L`` = lease, ``S`` = skew)::

    t0 acquire/renew sent ... expiry = t0 + L ...... others may take it when
    |                                                their now - S > expiry
    |<-- holder may handle until t0 + L - S - margin (fence deadline) -->|

The holder's fence deadline always falls before the earliest moment another
worker's condition can pass, as long as clocks differ by less than ``S``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from wsfleet import schema
from wsfleet.item import ConnectionItem, to_attribute
from wsfleet.timing import LeaseTiming


@dataclass(frozen=True, slots=True)
class ConditionalUpdate:
    """The parts of one ``UpdateItem`` call that the rules decide."""

    update_expression: str
    condition_expression: str
    names: dict[str, str]
    values: dict[str, Any]

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "UpdateExpression": self.update_expression,
            "ConditionExpression": self.condition_expression,
            "ExpressionAttributeNames": self.names,
            "ExpressionAttributeValues": self.values,
        }


_NAMES = {
    "#state": schema.DESIRED_STATE,
    "#owner": schema.LEASE_OWNER,
    "#expiry": schema.LEASE_EXPIRES_AT_MS,
    "#epoch": schema.LEASE_EPOCH,
    "#token": schema.LEASE_TOKEN,
    "#seq": schema.LAST_SEQ,
    "#gen": schema.START_GEN,
    "#seqgen": schema.SEQ_GEN,
    "#updated": schema.UPDATED_AT_MS,
    "#parked": schema.PARKED_REASON,
    "#parkedat": schema.PARKED_AT_MS,
    "#failing": schema.FAILING_SINCE_MS,
}


def _names(*placeholders: str) -> dict[str, str]:
    return {p: _NAMES[p] for p in placeholders}


def _values(**values: Any) -> dict[str, Any]:
    return {f":{k}": to_attribute(v) for k, v in values.items()}


# --- acquire ---------------------------------------------------------------------------


def orphan_cutoff_ms(now_ms: int, timing: LeaseTiming) -> int:
    """Leases that expired before this instant may be taken: ``now - skew``."""
    return now_ms - timing.skew_ms


def acquire_update(owner: str, now_ms: int, timing: LeaseTiming, token: str) -> ConditionalUpdate:
    """Take a STARTED connection whose lease is free or lapsed; the epoch goes up by one.

    ``token`` is random per acquire attempt (not per SDK retry of it): it is how a
    failed condition tells "my own attempt had landed" from "I held this before".
    A parked connection is refused: its lease is free, but its upstream was given up
    on until the router re-arms it (§3.3.1)."""
    return ConditionalUpdate(
        update_expression=(
            "SET #owner = :me, #token = :token, #expiry = :expiry, #updated = :now ADD #epoch :one"
        ),
        condition_expression=(
            "#state = :started AND attribute_not_exists(#parked) AND (attribute_not_exists(#owner)"
            " OR attribute_not_exists(#expiry) OR #expiry < :cutoff)"
        ),
        names=_names("#state", "#parked", "#owner", "#token", "#expiry", "#epoch", "#updated"),
        values=_values(
            me=owner,
            token=token,
            expiry=now_ms + timing.lease_ms,
            now=now_ms,
            one=1,
            started=schema.STARTED,
            cutoff=orphan_cutoff_ms(now_ms, timing),
        ),
    )


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease this worker holds, with what it needs to run the connection."""

    connection_id: str
    owner: str
    epoch: int
    start_gen: int
    ws_url: str
    last_seq: int
    expires_at_ms: int
    takeover_latency_ms: int | None = None
    """Set when the lease was taken over after lapsing (not a first start or a release)."""
    seq_gen: int = 0
    """The item's ``seq_gen`` when acquired: the final checkpoint belongs to it."""
    failing_since_ms: int | None = None
    """When the upstream began failing (no message handled since), as a previous owner
    recorded it: the failing clock goes on from there instead of starting again."""


def lease_won(old: ConnectionItem, owner: str, now_ms: int, timing: LeaseTiming) -> Lease:
    """The lease an acquire created, from the item as it was before the write (ALL_OLD)."""
    lapsed_holder = old.lease_owner is not None and old.lease_expires_at_ms > 0
    return Lease(
        connection_id=old.connection_id,
        owner=owner,
        epoch=old.lease_epoch + 1,
        start_gen=old.start_gen,
        ws_url=old.ws_url,
        last_seq=old.last_seq,
        expires_at_ms=now_ms + timing.lease_ms,
        takeover_latency_ms=max(0, now_ms - old.lease_expires_at_ms) if lapsed_holder else None,
        seq_gen=old.seq_gen,
        failing_since_ms=old.failing_since_ms,
    )


class AcquireRefusal(enum.Enum):
    """Why an acquire's condition failed."""

    HELD = "held"
    """Another worker holds a live lease (or won the race)."""
    STOPPED = "stopped"
    PARKED = "parked"
    """STARTED, but parked (§3.3.1): nobody takes it until the router re-arms it."""
    UNKNOWN_ID = "unknown_id"


def acquire_failure(old: ConnectionItem | None, owner: str, token: str) -> AcquireRefusal | Lease:
    """Decide on a failed acquire from the item that made it fail.

    When the stored owner and token are this attempt's, an SDK retry of a write that
    had in fact succeeded is being reported: the lease is adopted with its stored
    epoch rather than left idle until it lapses. When only the owner is this worker's,
    the hold is an older one (a runner that was fenced, whose release may still be on
    its way): adopting it could outlive that release while another worker takes the
    lease, so it counts as held, and lapses or is released like any other.
    """
    if old is None:
        return AcquireRefusal.UNKNOWN_ID
    if old.lease_owner == owner and old.lease_token == token:
        return Lease(
            connection_id=old.connection_id,
            owner=owner,
            epoch=old.lease_epoch,
            start_gen=old.start_gen,
            ws_url=old.ws_url,
            last_seq=old.last_seq,
            expires_at_ms=old.lease_expires_at_ms,
            seq_gen=old.seq_gen,
            failing_since_ms=old.failing_since_ms,
        )
    if not old.started:
        return AcquireRefusal.STOPPED
    if old.parked:
        return AcquireRefusal.PARKED
    return AcquireRefusal.HELD


# --- renew -----------------------------------------------------------------------------


def renew_update(
    lease: Lease, last_seq: int, now_ms: int, timing: LeaseTiming
) -> ConditionalUpdate:
    """Extend the lease and write the checkpoint in the same write.

    ``#expiry <= :expiry`` stops an older renew that arrives late from moving the
    expiry backwards; a retry of the same renew writes the same value and passes.
    """
    return ConditionalUpdate(
        update_expression="SET #expiry = :expiry, #seq = :seq, #updated = :now",
        condition_expression=(
            "#owner = :me AND #epoch = :epoch AND #gen = :gen"
            " AND #state = :started AND #expiry <= :expiry"
        ),
        names=_names("#owner", "#epoch", "#gen", "#state", "#expiry", "#seq", "#updated"),
        values=_values(
            me=lease.owner,
            epoch=lease.epoch,
            gen=lease.start_gen,
            started=schema.STARTED,
            expiry=now_ms + timing.lease_ms,
            seq=last_seq,
            now=now_ms,
        ),
    )


class RenewRefusal(enum.Enum):
    """Why a renew's condition failed, and so what the holder must do."""

    LOST = "lost"
    """Another owner or epoch: stop at once and release nothing."""
    STOPPED = "stopped"
    """The router stopped the connection: close gracefully and release."""
    RESTARTED = "restarted"
    """A newer start (new ``start_gen``): close gracefully and release; the URL may differ."""
    GONE = "gone"
    """The item was deleted: stop at once; there is nothing left to release."""
    SUPERSEDED = "superseded"
    """A later renew of this holder already landed; this late one changes nothing."""

    @property
    def keeps_lease(self) -> bool:
        return self is RenewRefusal.SUPERSEDED

    @property
    def graceful(self) -> bool:
        """The lease is still this holder's, so it closes in order and releases."""
        return self in (RenewRefusal.STOPPED, RenewRefusal.RESTARTED)


def renew_failure(old: ConnectionItem | None, lease: Lease) -> RenewRefusal:
    """Decide on a failed renew from the item that made it fail (ALL_OLD)."""
    if old is None:
        return RenewRefusal.GONE
    if old.lease_owner != lease.owner or old.lease_epoch != lease.epoch:
        return RenewRefusal.LOST
    if not old.started:
        return RenewRefusal.STOPPED
    if old.start_gen != lease.start_gen:
        return RenewRefusal.RESTARTED
    return RenewRefusal.SUPERSEDED


# --- release ---------------------------------------------------------------------------


def release_update(lease: Lease, last_seq: int | None, now_ms: int) -> ConditionalUpdate:
    """Give the lease back so others may take it at once (expiry 0).

    With ``last_seq`` the final checkpoint is written, but only while ``seq_gen`` is
    still the one it belongs to: a restart with the same URL keeps the stream (and
    so this checkpoint), while a restart with a new URL resets ``last_seq`` and bumps
    ``seq_gen``, and an old checkpoint must not overwrite that reset. Without
    ``last_seq`` (``None``) only the lease is given back.
    """
    names = _names("#owner", "#token", "#epoch", "#expiry", "#updated")
    values = _values(me=lease.owner, epoch=lease.epoch, zero=0, now=now_ms)
    update = "REMOVE #owner, #token SET #expiry = :zero, #updated = :now"
    condition = "#owner = :me AND #epoch = :epoch"
    if last_seq is not None:
        names |= _names("#seq", "#seqgen")
        values |= _values(seq=last_seq, seqgen=lease.seq_gen)
        update += ", #seq = :seq"
        condition += " AND #seqgen = :seqgen"
    return ConditionalUpdate(update, condition, names, values)


class ReleaseOutcome(enum.Enum):
    RELEASED = "released"
    NOT_HELD = "not_held"
    """Another owner or epoch, or no item: nothing of ours to release."""
    RETRY_WITHOUT_CHECKPOINT = "retry_without_checkpoint"
    """Still ours, but the checkpoint was reset since (a restart with a new URL):
    release without writing the old checkpoint."""


def release_failure(old: ConnectionItem | None, lease: Lease) -> ReleaseOutcome:
    if old is None or old.lease_owner != lease.owner or old.lease_epoch != lease.epoch:
        return ReleaseOutcome.NOT_HELD
    return ReleaseOutcome.RETRY_WITHOUT_CHECKPOINT


# --- parking and the failing clock ------------------------------------------------------
#
#   first failed connect ... failing_since_ms written (once per streak)
#   |                        ... a handled message removes it (one write)
#   |<-------- fail_after with no message handled -------->| park: the lease is
#                                                           | released, expiry set
#   router start (re-arm): parked fields removed, expiry 0  | to PARKED_EXPIRY_MS
#   -> the orphan query and the acquire see it again        | and parked_reason set


MAX_REASON_CHARS = 200
"""A parked reason is a short sentence, never a dump."""


def park_update(lease: Lease, last_seq: int, reason: str, now_ms: int) -> ConditionalUpdate:
    """Give the lease back and park the connection: nobody takes it again until the
    router re-arms it (§3.3.1).

    Conditioned like a release with its checkpoint (owner, epoch, ``seq_gen``) and,
    beyond it, on the start this holder runs (``STARTED`` under its ``start_gen``):
    a stop or a start that came since is the router's newer word, which a park must
    not overwrite; the caller then releases instead. The expiry goes to
    :data:`~wsfleet.schema.PARKED_EXPIRY_MS`, which keeps the item out of the orphan
    query; ``parked_reason`` makes the acquire refuse it.
    """
    return ConditionalUpdate(
        update_expression=(
            "REMOVE #owner, #token, #failing SET #expiry = :parked_expiry, #seq = :seq,"
            " #parked = :reason, #parkedat = :now, #updated = :now"
        ),
        condition_expression=(
            "#owner = :me AND #epoch = :epoch AND #seqgen = :seqgen"
            " AND #state = :started AND #gen = :gen"
        ),
        names=_names(
            "#owner",
            "#token",
            "#failing",
            "#expiry",
            "#seq",
            "#parked",
            "#parkedat",
            "#updated",
            "#epoch",
            "#seqgen",
            "#state",
            "#gen",
        ),
        values=_values(
            me=lease.owner,
            epoch=lease.epoch,
            seqgen=lease.seq_gen,
            started=schema.STARTED,
            gen=lease.start_gen,
            parked_expiry=schema.PARKED_EXPIRY_MS,
            seq=last_seq,
            reason=reason[:MAX_REASON_CHARS],
            now=now_ms,
        ),
    )


class ParkOutcome(enum.Enum):
    NOT_HELD = "not_held"
    """Another owner or epoch, or no item: nothing of ours to park or release."""
    RELEASE_INSTEAD = "release_instead"
    """Still ours, but stopped or started again since (or its checkpoint was reset):
    an ordinary release decides the checkpoint and notices the restart."""


def park_failure(old: ConnectionItem | None, lease: Lease) -> ParkOutcome:
    if old is None or old.lease_owner != lease.owner or old.lease_epoch != lease.epoch:
        return ParkOutcome.NOT_HELD
    return ParkOutcome.RELEASE_INSTEAD


def failing_since_update(lease: Lease, since_ms: int, now_ms: int) -> ConditionalUpdate:
    """Record when the upstream began failing, while the lease is this holder's."""
    return ConditionalUpdate(
        update_expression="SET #failing = :since, #updated = :now",
        condition_expression="#owner = :me AND #epoch = :epoch",
        names=_names("#failing", "#updated", "#owner", "#epoch"),
        values=_values(since=since_ms, now=now_ms, me=lease.owner, epoch=lease.epoch),
    )


def failing_cleared_update(lease: Lease, now_ms: int) -> ConditionalUpdate:
    """A message was handled again: the failing streak is over."""
    return ConditionalUpdate(
        update_expression="REMOVE #failing SET #updated = :now",
        condition_expression="#owner = :me AND #epoch = :epoch",
        names=_names("#failing", "#updated", "#owner", "#epoch"),
        values=_values(now=now_ms, me=lease.owner, epoch=lease.epoch),
    )


def restarted_since(item: ConnectionItem, lease: Lease) -> bool:
    """The router started the connection again after ``lease`` was acquired (it is
    STARTED under a newer ``start_gen``): whoever notices first, renew or release,
    takes it again at once instead of waiting for a reconcile."""
    return item.started and item.start_gen != lease.start_gen


# --- orphans and fencing ---------------------------------------------------------------


def orphan_query(now_ms: int, timing: LeaseTiming) -> dict[str, Any]:
    """Key condition of the GSI query that finds STARTED connections with a lapsed or
    free lease (``lease_expires_at_ms`` is 0 when never taken or released)."""
    return {
        "IndexName": schema.STATE_INDEX_NAME,
        "KeyConditionExpression": "#state = :started AND #expiry < :cutoff",
        "ExpressionAttributeNames": _names("#state", "#expiry"),
        "ExpressionAttributeValues": _values(
            started=schema.STARTED, cutoff=orphan_cutoff_ms(now_ms, timing)
        ),
    }


def is_orphan(item: ConnectionItem, now_ms: int, timing: LeaseTiming) -> bool:
    """True when an acquire at ``now_ms`` would pass its condition."""
    return (
        item.started
        and not item.parked
        and (
            item.lease_owner is None or item.lease_expires_at_ms < orphan_cutoff_ms(now_ms, timing)
        )
    )


def fence_deadline(renew_sent_at: float, timing: LeaseTiming) -> float:
    """Monotonic instant after which the holder must not hand a message to the handler:
    ``sent_at(last successful acquire or renew) + lease - skew - margin``."""
    return renew_sent_at + timing.fence_after


def may_handle(now: float, deadline: float) -> bool:
    """True strictly before the fence deadline."""
    return now < deadline
