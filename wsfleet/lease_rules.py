"""Ownership of one connection (docs/DESIGN.md §3) as pure functions.

A connection's item is written only when its ownership changes: acquire, takeover,
release, park. Nothing renews it: the lease lives exactly as long as the owner's
session (:mod:`wsfleet.session_rules`), whose generation the item names in
``owner_session_gen``. Nothing here reads a clock or touches the network: callers
pass ``now`` in and get back the conditional write to make or the decision to take,
so every rule can be tested with a table of inputs.

Index keys move with ownership only: ``owner_key`` (the ``by-owner`` index) is set by
acquire and takeover and removed by release and park; ``free_shard`` (the sparse
``unowned`` index) exists exactly while the connection is STARTED, unowned and not
parked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from wsfleet import schema
from wsfleet.checkpoint_page import PageEntry
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
    "#sgen": schema.OWNER_SESSION_GEN,
    "#okey": schema.OWNER_KEY,
    "#free": schema.FREE_SHARD,
    "#epoch": schema.LEASE_EPOCH,
    "#token": schema.LEASE_TOKEN,
    "#seq": schema.LAST_SEQ,
    "#gen": schema.START_GEN,
    "#seqgen": schema.SEQ_GEN,
    "#updated": schema.UPDATED_AT_MS,
    "#parked": schema.PARKED_REASON,
    "#parkedat": schema.PARKED_AT_MS,
    "#failing": schema.FAILING_SINCE_MS,
    "#advat": schema.ADVANCED_AT_MS,
    "#advgen": schema.ADVANCED_START_GEN,
    "#resetat": schema.SEQ_RESET_AT_MS,
    "#resetfrom": schema.SEQ_RESET_FROM,
}


def _names(*placeholders: str) -> dict[str, str]:
    return {p: _NAMES[p] for p in placeholders}


def _values(**values: Any) -> dict[str, Any]:
    return {f":{k}": to_attribute(v) for k, v in values.items()}


def _equals(placeholder: str, value: int, absent: frozenset[str]) -> tuple[str, dict[str, Any]]:
    """``#x = :x``, or ``attribute_not_exists(#x)`` when the item was read without the
    attribute: a missing number is matched as missing, never as its default."""
    if _NAMES[placeholder] in absent:
        return f"attribute_not_exists({placeholder})", {}
    return f"{placeholder} = :{placeholder[1:]}", _values(**{placeholder[1:]: value})


STREAM_NUMBERS = frozenset({schema.START_GEN, schema.SEQ_GEN})
"""What a lease remembers as absent: the numbers its release and park compare and
that no acquire or takeover writes."""


# --- acquire ---------------------------------------------------------------------------


def _owner_values(connection_id: str, owner: str, session_gen: int) -> dict[str, Any]:
    return _values(
        me=owner, mygen=session_gen, okey=schema.owner_key(owner, session_gen, connection_id)
    )


_TAKE = "SET #owner = :me, #sgen = :mygen, #okey = :okey, #token = :token, #updated = :now"


def acquire_update(
    connection_id: str, owner: str, session_gen: int, now_ms: int, token: str
) -> ConditionalUpdate:
    """Take a STARTED connection that nobody owns; the epoch goes up by one.

    A connection owned by a session is never acquired, live or dead: a dead session's
    connections move only by :func:`takeover_update`, after the reap. ``token`` is
    random per acquire attempt (not per SDK retry of it): it is how a failed
    condition tells "my own attempt had landed" from "I held this before". A parked
    connection is refused: nobody takes it until the router re-arms it (§3.7).
    """
    return ConditionalUpdate(
        update_expression=f"{_TAKE} REMOVE #free ADD #epoch :one",
        condition_expression=(
            "#state = :started AND attribute_not_exists(#parked) AND attribute_not_exists(#owner)"
        ),
        names=_names(
            "#state", "#parked", "#owner", "#sgen", "#okey", "#token", "#updated", "#free", "#epoch"
        ),
        values=_owner_values(connection_id, owner, session_gen)
        | _values(token=token, now=now_ms, one=1, started=schema.STARTED),
    )


@dataclass(frozen=True, slots=True)
class Lease:
    """A connection this worker's session owns, with what it needs to run it."""

    connection_id: str
    owner: str
    epoch: int
    start_gen: int
    ws_url: str
    last_seq: int
    session_gen: int = 0
    """The owner's session: the lease lives as long as it does."""
    takeover_latency_ms: int | None = None
    """Set when taken over from a dead session (not a first start or a release)."""
    seq_gen: int = 0
    """The item's ``seq_gen`` when acquired: the final checkpoint belongs to it."""
    failing_since_ms: int | None = None
    """When the upstream began failing (no message handled since), as a previous owner
    recorded it: the failing clock goes on from there instead of starting again."""
    protocol: str | None = None
    """The item's protocol spec as stored (None: the worker's default protocol)."""
    auth_secret: str | None = None
    """The item's secret reference (None: no credentials)."""
    advanced_at_ms: int | None = None
    """Epoch ms of the stream's last checkpoint advance under the current start, as the
    previous holder left it (its page entry, or its release); None when unknown. From
    here a stream that cannot resume measures its gap (docs/DESIGN.md §4.6)."""
    absent: frozenset[str] = frozenset()
    """Which of :data:`STREAM_NUMBERS` the item did not have when won: the release and
    the park match them as missing."""
    malformed: str | None = None
    """The item's :attr:`~wsfleet.item.ConnectionItem.problem` when won: such a lease
    is not run but parked at once (:func:`park_malformed_update`)."""


def lease_won(
    old: ConnectionItem,
    owner: str,
    session_gen: int,
    *,
    epoch: int | None = None,
    last_seq: int | None = None,
    takeover_latency_ms: int | None = None,
    advanced_at_ms: int | None = None,
) -> Lease:
    """The lease a write created, from the item as it was before it (ALL_OLD).
    ``advanced_at_ms``: the last advance a takeover found on the dead session's page
    (otherwise the item's own, :func:`last_advance_ms`)."""
    return Lease(
        connection_id=old.connection_id,
        owner=owner,
        session_gen=session_gen,
        epoch=old.lease_epoch + 1 if epoch is None else epoch,
        start_gen=old.start_gen,
        ws_url=old.ws_url,
        last_seq=old.last_seq if last_seq is None else last_seq,
        takeover_latency_ms=takeover_latency_ms,
        seq_gen=old.seq_gen,
        failing_since_ms=old.failing_since_ms,
        protocol=old.protocol,
        auth_secret=old.auth_secret,
        advanced_at_ms=last_advance_ms(old) if advanced_at_ms is None else advanced_at_ms,
        absent=old.absent & STREAM_NUMBERS,
        malformed=old.problem,
    )


def lease_of_entry(seen: ConnectionItem, owner: str, session_gen: int) -> Lease:
    """The lease of an entry this session owns (its ``by-owner`` listing) but does not
    run, for its release (or, when malformed, its park)."""
    return Lease(
        connection_id=seen.connection_id,
        owner=owner,
        epoch=seen.lease_epoch,
        start_gen=seen.start_gen,
        ws_url=seen.ws_url,
        last_seq=seen.last_seq,
        session_gen=session_gen,
        seq_gen=seen.seq_gen,
        absent=seen.absent & STREAM_NUMBERS,
        malformed=seen.problem,
    )


def lease_after_takeover(
    seen: ConnectionItem,
    current: ConnectionItem,
    owner: str,
    session_gen: int,
    *,
    resume_seq: int,
    takeover_latency_ms: int | None,
    advanced_at_ms: int | None,
) -> Lease:
    """The lease of a takeover whose write was conditioned on ``seen``, built from
    ``current``, the item read after the write (what the runner needs beyond the
    index's projection: URL, protocol, credentials).

    ``resume_seq`` and ``advanced_at_ms`` were chosen for the stream the condition
    checked. The router may have restarted the connection on a new stream between
    the write and the read (``seq_gen`` moved, ``last_seq`` reset): that resume point
    belongs to the old stream, so the lease takes the item's own checkpoint instead.
    """
    same_stream = current.seq_gen == seen.seq_gen
    return lease_won(
        current,
        owner,
        session_gen,
        epoch=current.lease_epoch,
        last_seq=resume_seq if same_stream else current.last_seq,
        takeover_latency_ms=takeover_latency_ms,
        advanced_at_ms=advanced_at_ms if same_stream else None,
    )


def last_advance_ms(item: ConnectionItem) -> int | None:
    """When the item's stream last advanced, as a release wrote it: only under the
    item's current start (a stop and a start since, or a re-arm, begins afresh), and
    only once something was handled (``last_seq`` > 0)."""
    if item.advanced_at_ms is None or item.advanced_start_gen != item.start_gen:
        return None
    return item.advanced_at_ms if item.last_seq > 0 else None


def landed(old: ConnectionItem, owner: str, session_gen: int, token: str) -> bool:
    """The item a failed acquire or takeover returned was written by that very attempt
    (owner, session and token are its own): an SDK retry of a write that had landed is
    being reported as a failure, and the connection is this session's."""
    return (
        old.lease_owner == owner
        and old.owner_session_gen == session_gen
        and old.lease_token == token
    )


class AcquireRefusal(enum.Enum):
    """Why an acquire's (or a takeover's) condition failed."""

    HELD = "held"
    """Another session owns it (or won the race)."""
    STOPPED = "stopped"
    PARKED = "parked"
    """STARTED, but parked (§3.7): nobody takes it until the router re-arms it."""
    UNKNOWN_ID = "unknown_id"


def acquire_failure(
    old: ConnectionItem | None, owner: str, session_gen: int, token: str
) -> AcquireRefusal | Lease:
    """Decide on a failed acquire from the item that made it fail.

    When the stored owner, session and token are this attempt's, an SDK retry of a
    write that had in fact succeeded is being reported: the lease is adopted with its
    stored epoch rather than left held and run by nobody. When only the owner is this
    worker's, the hold is an older one (a runner whose release may still be on its
    way): adopting it could outlive that release, so it counts as held.
    """
    if old is None:
        return AcquireRefusal.UNKNOWN_ID
    if landed(old, owner, session_gen, token):
        return lease_won(old, owner, session_gen, epoch=old.lease_epoch)
    if not old.started:
        return AcquireRefusal.STOPPED
    if old.parked:
        return AcquireRefusal.PARKED
    return AcquireRefusal.HELD


# --- takeover of a dead session's connections -------------------------------------------


def takeover_update(
    seen: ConnectionItem,
    owner: str,
    session_gen: int,
    resume_seq: int,
    now_ms: int,
    token: str,
) -> ConditionalUpdate:
    """Take a STARTED connection of a DEAD session (``seen``: the item as read, from
    the ``by-owner`` index or from a failed attempt's ALL_OLD).

    Conditioned on everything the decision read: the dead owner and session, STARTED,
    the ``start_gen`` (a restart since is the router's newer word), and the
    ``seq_gen`` and ``last_seq`` the resume point was chosen against (a checkpoint
    reset or a final checkpoint written since would make it wrong). Exactly one taker
    wins; the epoch goes up by one.
    """
    clauses = [
        _equals(placeholder, value, seen.absent)
        for placeholder, value in (
            ("#gen", seen.start_gen),
            ("#seqgen", seen.seq_gen),
            ("#seq", seen.last_seq),
            ("#epoch", seen.lease_epoch),
        )
    ]
    read = " AND ".join(clause for clause, _ in clauses)
    return ConditionalUpdate(
        update_expression=f"{_TAKE}, #seq = :resume ADD #epoch :one",
        condition_expression=(
            f"#owner = :dead AND #sgen = :deadgen AND #state = :started AND {read}"
            " AND attribute_not_exists(#parked)"
        ),
        names=_names(
            "#owner",
            "#sgen",
            "#okey",
            "#token",
            "#updated",
            "#seq",
            "#epoch",
            "#state",
            "#gen",
            "#seqgen",
            "#parked",
        ),
        values=_owner_values(seen.connection_id, owner, session_gen)
        | _values(
            token=token,
            now=now_ms,
            resume=resume_seq,
            one=1,
            dead=seen.lease_owner,
            deadgen=seen.owner_session_gen,
            started=schema.STARTED,
        )
        | {name: value for _, values in clauses for name, value in values.items()},
    )


class TakeoverStep(enum.Enum):
    """What to do after a takeover's condition failed."""

    RETRY = "retry"
    """Still the dead session's and STARTED, but changed since read: try again with
    the item the failure returned."""
    CLEAR = "clear"
    """Still the dead session's, but STOPPED: clear the owner instead."""
    GONE = "gone"
    """Someone else owns it now, it is parked, or there is no item: nothing to do."""


def takeover_failure(old: ConnectionItem | None, seen: ConnectionItem) -> TakeoverStep:
    if (
        old is None
        or old.lease_owner != seen.lease_owner
        or old.owner_session_gen != seen.owner_session_gen
        or old.parked
    ):
        return TakeoverStep.GONE
    return TakeoverStep.RETRY if old.started else TakeoverStep.CLEAR


def clear_owner_update(
    seen: ConnectionItem, now_ms: int, resume: int | None = None
) -> ConditionalUpdate:
    """A STOPPED connection of a DEAD session: remove the dead owner, so the item
    leaves the ``by-owner`` index. A start on the same stream later resumes from the
    item's checkpoint, so the dead session's page entry (``resume``, by
    :func:`checkpoint_page.resume_seq`), when it is ahead, is written with it,
    conditioned on the stream and checkpoint it was chosen against, as a takeover's
    is: without it, that start would deliver the whole dead hold again."""
    update = "REMOVE #owner, #sgen, #okey, #token SET #updated = :now"
    condition = "#owner = :dead AND #sgen = :deadgen AND #state = :stopped"
    names = _names("#owner", "#sgen", "#okey", "#token", "#updated", "#state")
    values = _values(
        now=now_ms, dead=seen.lease_owner, deadgen=seen.owner_session_gen, stopped=schema.STOPPED
    )
    if resume is not None and resume > seen.last_seq:
        update += ", #seq = :resume"
        for clause, clause_values in (
            _equals("#seqgen", seen.seq_gen, seen.absent),
            _equals("#seq", seen.last_seq, seen.absent),
        ):
            condition += f" AND {clause}"
            values |= clause_values
        names |= _names("#seq", "#seqgen")
        values |= _values(resume=resume)
    return ConditionalUpdate(
        update_expression=update,
        condition_expression=condition,
        names=names,
        values=values,
    )


# --- release ---------------------------------------------------------------------------


def release_update(
    lease: Lease,
    last_seq: int | None,
    now_ms: int,
    *,
    started: bool = True,
    advanced_at_ms: int | None = None,
) -> ConditionalUpdate:
    """Give the connection back so others may take it at once.

    With ``last_seq`` the final checkpoint is written, but only while ``seq_gen`` is
    still the one it belongs to: a restart with the same URL keeps the stream (and
    so this checkpoint), while a restart with a new URL resets ``last_seq`` and bumps
    ``seq_gen``, and an old checkpoint must not overwrite that reset. Without
    ``last_seq`` (``None``) only the ownership is given back.

    ``advanced_at_ms`` (with the checkpoint only): when the checkpoint last moved,
    written with the start the holder ran under, for the next holder's gap.

    ``started``: the desired state the caller expects. A STARTED connection goes into
    the ``unowned`` index (``free_shard``) in the same write; a STOPPED one does not.
    The write is conditioned on it, so the index key is never wrong.
    """
    names = _names("#owner", "#sgen", "#okey", "#token", "#epoch", "#updated", "#state")
    values = _values(me=lease.owner, epoch=lease.epoch, now=now_ms)
    update = "REMOVE #owner, #sgen, #okey, #token SET #updated = :now"
    condition = "#owner = :me AND #epoch = :epoch"
    if started:
        names |= _names("#free")
        values |= _values(free=schema.free_shard(lease.connection_id), started=schema.STARTED)
        update += ", #free = :free"
        condition += " AND #state = :started"
    else:
        values |= _values(started=schema.STARTED)
        condition += " AND #state <> :started"
    if last_seq is not None:
        stream_clause, stream_values = _equals("#seqgen", lease.seq_gen, lease.absent)
        names |= _names("#seq", "#seqgen")
        values |= _values(seq=last_seq) | stream_values
        update += ", #seq = :seq"
        condition += f" AND {stream_clause}"
        if advanced_at_ms is not None:
            names |= _names("#advat", "#advgen")
            values |= _values(advat=advanced_at_ms, advgen=lease.start_gen)
            update += ", #advat = :advat, #advgen = :advgen"
    return ConditionalUpdate(update, condition, names, values)


class ReleaseOutcome(enum.Enum):
    NOT_HELD = "not_held"
    """Another owner or epoch, parked, or no item: nothing of ours to release."""
    RETRY = "retry"
    """Still ours, but the desired state or the checkpoint's ``seq_gen`` differ from
    what the write assumed: write again with :func:`release_retry`'s variant."""
    LANDED = "landed"
    """Nobody's, not parked, under this hold's own epoch: a release of this hold has
    already landed (an earlier try whose answer was lost). Only the hold itself frees
    the item without adding to its epoch (an acquire or takeover adds one), apart from
    the sweep clearing a stopped one under a dead session: free either way."""


@dataclass(frozen=True, slots=True)
class ReleaseVariant:
    started: bool
    with_checkpoint: bool


def release_failure(old: ConnectionItem | None, lease: Lease) -> ReleaseOutcome:
    if old is not None and old.lease_owner is None and old.lease_epoch == lease.epoch:
        return ReleaseOutcome.NOT_HELD if old.parked else ReleaseOutcome.LANDED
    if old is None or old.lease_owner != lease.owner or old.lease_epoch != lease.epoch:
        return ReleaseOutcome.NOT_HELD
    return ReleaseOutcome.RETRY


def release_retry(old: ConnectionItem, lease: Lease, with_checkpoint: bool) -> ReleaseVariant:
    """The release that fits the item a failed one returned: its desired state, and
    the checkpoint only while the stream is the one it belongs to."""
    return ReleaseVariant(
        started=old.started, with_checkpoint=with_checkpoint and same_stream(old, lease)
    )


def same_stream(item: ConnectionItem, lease: Lease) -> bool:
    """The item's ``seq_gen`` is the one the lease was won under (missing both times
    counts as the same)."""
    missing = schema.SEQ_GEN in item.absent
    return missing == (schema.SEQ_GEN in lease.absent) and (
        missing or item.seq_gen == lease.seq_gen
    )


def unanswered_checkpoint(kept: PageEntry | None, seen: ConnectionItem) -> int:
    """The checkpoint a stray release writes: the final one of the hold's release
    that never got an answer, when ``kept`` belongs to the hold and stream listed
    (``seen``: same epoch and ``seq_gen``) and is ahead; otherwise the listed one."""
    if kept is None or kept.epoch != seen.lease_epoch or kept.seq_gen != seen.seq_gen:
        return seen.last_seq
    return max(seen.last_seq, kept.seq)


# --- parking and the failing clock ------------------------------------------------------
#
#   first failed connect ... failing_since_ms written (once per streak)
#   |                        ... a handled message removes it (one write)
#   |<-------- fail_after with no message handled -------->| park: the owner is
#                                                           | removed, parked_reason
#   router start (re-arm): parked fields removed, back in   | set, not in the
#   the unowned index: the acquire sees it again            | unowned index


MAX_REASON_CHARS = 200
"""A parked reason is a short sentence, never a dump."""


def park_update(lease: Lease, last_seq: int, reason: str, now_ms: int) -> ConditionalUpdate:
    """Give the lease back and park the connection: nobody takes it again until the
    router re-arms it (§3.7).

    Conditioned like a release with its checkpoint (owner, epoch, ``seq_gen``) and,
    beyond it, on the start this holder runs (``STARTED`` under its ``start_gen``):
    a stop or a start that came since is the router's newer word, which a park must
    not overwrite; the caller then releases instead. The item does not go into the
    ``unowned`` index, and ``parked_reason`` makes the acquire refuse it.
    """
    stream_clause, stream_values = _equals("#seqgen", lease.seq_gen, lease.absent)
    start_clause, start_values = _equals("#gen", lease.start_gen, lease.absent)
    return ConditionalUpdate(
        update_expression=(
            "REMOVE #owner, #sgen, #okey, #token, #failing SET #seq = :seq,"
            " #parked = :reason, #parkedat = :now, #updated = :now"
        ),
        condition_expression=(
            f"#owner = :me AND #epoch = :epoch AND {stream_clause}"
            f" AND #state = :started AND {start_clause}"
        ),
        names=_names(
            "#owner",
            "#sgen",
            "#okey",
            "#token",
            "#failing",
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
            started=schema.STARTED,
            seq=last_seq,
            reason=reason[:MAX_REASON_CHARS],
            now=now_ms,
        )
        | stream_values
        | start_values,
    )


_PARK_UNRUN_NAMES = (
    "#owner",
    "#sgen",
    "#okey",
    "#token",
    "#free",
    "#parked",
    "#parkedat",
    "#updated",
)
_PARK_UNRUN = (
    "REMOVE #owner, #sgen, #okey, #token, #free"
    " SET #parked = :reason, #parkedat = :now, #updated = :now"
)
"""Parks an item nobody can run: ownership and the ``unowned`` index key go, the reason
comes; nothing of its stream (``last_seq``, ``seq_gen``...) is touched, so the item
stays as it was found for whoever looks into it."""


def park_malformed_update(lease: Lease, reason: str, now_ms: int) -> ConditionalUpdate:
    """Park the item a lease was won on when it cannot be run (an attribute of the wrong
    type): conditioned on this holder's owner and epoch only, the attributes an acquire
    or a takeover could not have won with if they were malformed."""
    return ConditionalUpdate(
        update_expression=_PARK_UNRUN,
        condition_expression="#owner = :me AND #epoch = :epoch",
        names=_names(*_PARK_UNRUN_NAMES, "#epoch"),
        values=_values(
            me=lease.owner, epoch=lease.epoch, reason=reason[:MAX_REASON_CHARS], now=now_ms
        ),
    )


def park_seen_update(seen: ConnectionItem, reason: str, now_ms: int) -> ConditionalUpdate:
    """Park, without taking it, a STARTED item that cannot be run, as read (``seen``):
    free (the acquire cannot add to its epoch) or a dead session's (its takeover would
    compare attributes of the wrong type). Conditioned on what placed it there: no
    owner, or that very ``owner_key`` (the dead session's, which only a takeover or a
    clear moves)."""
    if seen.owner_key is None:
        held, held_values = "attribute_not_exists(#owner)", {}
    else:
        held, held_values = "#okey = :okey", _values(okey=seen.owner_key)
    return ConditionalUpdate(
        update_expression=_PARK_UNRUN,
        condition_expression=(f"{held} AND #state = :started AND attribute_not_exists(#parked)"),
        names=_names(*_PARK_UNRUN_NAMES, "#state"),
        values=_values(reason=reason[:MAX_REASON_CHARS], now=now_ms, started=schema.STARTED)
        | held_values,
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


def new_generation_update(
    lease: Lease, seq_gen: int, first_seq: int, previous_last: int, now_ms: int
) -> ConditionalUpdate:
    """The upstream started its sequence over at ``first_seq``: the item's stream goes
    on as generation ``seq_gen`` (the lease's plus one), checkpointed just before that
    message, while the lease and the start are this holder's.

    ``lease`` carries the generation the holder counts in now. The write is made
    before the message is handed on, and may be made again when its answer was lost:
    the item already at ``seq_gen`` matches too (nothing of the new generation was
    handled before an answer came). A start of another stream since (a new
    ``start_gen``) fails it, so the router's reset of ``seq_gen`` is never overwritten.
    """
    stream_clause, stream_values = _equals("#seqgen", lease.seq_gen, lease.absent)
    start_clause, start_values = _equals("#gen", lease.start_gen, lease.absent)
    return ConditionalUpdate(
        update_expression=(
            "SET #seqgen = :newgen, #seq = :seq, #resetat = :now, #resetfrom = :prevlast,"
            " #updated = :now"
        ),
        condition_expression=(
            f"#owner = :me AND #epoch = :epoch AND #state = :started AND {start_clause}"
            f" AND ({stream_clause} OR #seqgen = :newgen)"
        ),
        names=_names(
            "#seqgen",
            "#seq",
            "#resetat",
            "#resetfrom",
            "#updated",
            "#owner",
            "#epoch",
            "#state",
            "#gen",
        ),
        values=_values(
            newgen=seq_gen,
            seq=first_seq - 1,
            now=now_ms,
            me=lease.owner,
            epoch=lease.epoch,
            started=schema.STARTED,
            prevlast=previous_last,
        )
        | stream_values
        | start_values,
    )


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


# --- fencing ---------------------------------------------------------------------------


def fence_deadline(renew_sent_at: float, timing: LeaseTiming) -> float:
    """Monotonic instant after which no connection of a session may hand a message to
    the handler: ``sent_at(last successful session renew) + lease - margin``."""
    return renew_sent_at + timing.fence_after


def may_handle(now: float, deadline: float) -> bool:
    """True strictly before the fence deadline."""
    return now < deadline
