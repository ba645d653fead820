"""The session protocol of docs/DESIGN.md §3 as pure functions.

A worker process proves it is alive once per heartbeat by renewing one small
*session* item; its connections carry no liveness of their own. Nothing here reads a
clock or touches the network: callers pass ``now`` in.

Timeline of one session (``L`` = lease, ``r`` = :data:`~wsfleet.timing.DRIFT_RATE`,
each duration on one worker's own monotonic clock)::

    holder: renew sent at s .... lands, beat b ...... fence deadline s + L(1-r) - margin
    reaper:                      sees beat b first at f ...... may reap at f + L(1+r),
                                                               on condition beat = b

A renew lands after it is sent, and is seen after it lands, so ``f`` is after ``s``
and the reap after the fence deadline; every renew changes the beat, so one that lands
meanwhile fails the reap. A reaped session can never be renewed again (the renew
requires ``ALIVE``), and its connections are taken over only after DEAD is seen, so no
connection is ever handled under a session that another worker has reaped. No wall
clock decides anything: the wall times in the items are for people.
"""

from __future__ import annotations

import dataclasses
import enum
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from wsfleet import schema
from wsfleet.item import (
    AttributeReader,
    MalformedItemError,
    describe_malformed,
    from_attributes,
    key_text,
    to_attribute,
)
from wsfleet.lease_rules import ConditionalUpdate
from wsfleet.timing import LeaseTiming
from wsfleet.version import VERSION

Takers = tuple[tuple[str, str | None], ...]
"""A reap's plan of who takes what (:func:`takeover_plan`): ``(worker_id, last)``
parts in the order of the sorted connection ids; a connection belongs to the first
part whose ``last`` id is not below it (``None``: no upper limit, the last part)."""


@dataclass(frozen=True, slots=True)
class SessionItem:
    """One session as listed from its item collection."""

    worker_id: str
    session_gen: int
    state: str | None
    """``ALIVE``, ``DEAD``, or None for an item that has lost it (reaped once lapsed,
    with a condition that matches it as missing)."""
    expires_at_ms: int
    started_at_ms: int = 0
    reaped_at_ms: int | None = None
    reaped_by: str | None = None
    notices: frozenset[str] = field(default_factory=frozenset)
    connections: int = 0
    capacity: int = 0
    takers: Takers | None = None
    """What the reap recorded of who takes which connection (None: a reap by an older
    worker, or a retire: the rules of :func:`takeover_share` apply)."""
    version: str | None = None
    """The version of the worker that opened it; None when an older worker did."""
    beat: int | None = None
    """How many renews it has had (None: an item without one, reaped as such)."""
    protocol: int | None = None
    """The session protocol of the worker that opened it (None: protocol 1)."""
    problem: str | None = None
    """What is damaged on the item (an attribute of the wrong type, a state other than
    ALIVE or DEAD), when :meth:`from_dynamodb` was asked to read it anyway; the
    damaged attributes read as missing."""
    stored_state: Mapping[str, Any] | None = None
    """For a damaged ``state``: the attribute as stored, which a reap conditions on."""
    stored_beat: Mapping[str, Any] | None = None
    """For a damaged ``beat``: the attribute as stored, which a reap conditions on."""

    @classmethod
    def from_dynamodb(cls, raw: Mapping[str, Any], *, damaged: bool = False) -> SessionItem:
        """Raises :class:`MalformedItemError` for an item that cannot be a session: a
        sort key without an integer generation, and, unless ``damaged`` is allowed, a
        state other than ALIVE or DEAD or an attribute of the wrong type (docs/DESIGN.md
        §2.2). A damaged session is still a session: its worker may still renew it, or
        may have died; listed with its :attr:`problem`, it is watched and reaped like
        any other (on condition of its damaged attributes as stored), so its
        connections are never stranded."""
        plain = from_attributes(raw)
        worker_id, _, gen = str(plain.get(schema.SORT_KEY, "")).rpartition("#")
        if not worker_id or not gen.isdigit():
            raise MalformedItemError(
                key_text(raw), "malformed session item: its sort key has no generation"
            )
        read = AttributeReader(plain)
        state = read.text(schema.SESSION_STATE)
        if state not in (schema.ALIVE, schema.DEAD, None):
            read.malformed[schema.SESSION_STATE] = f"{schema.ALIVE} or {schema.DEAD}"
        expires_at = read.integer(schema.SESSION_EXPIRES_AT_MS)
        session = cls(
            worker_id=worker_id,
            session_gen=int(gen),
            state=state,
            expires_at_ms=expires_at or 0,
            started_at_ms=read.integer(schema.SESSION_STARTED_AT_MS) or 0,
            reaped_at_ms=read.integer(schema.SESSION_REAPED_AT_MS),
            reaped_by=read.text(schema.SESSION_REAPED_BY),
            notices=notices_of(plain),
            connections=read.integer(schema.SESSION_CONNECTIONS) or 0,
            capacity=read.integer(schema.SESSION_CAPACITY) or 0,
            takers=_takers(plain.get(schema.SESSION_TAKERS)),
            version=_text_or_none(plain.get(schema.SESSION_VERSION)),
            beat=read.integer(schema.SESSION_BEAT),
            protocol=_integer_or_none(plain.get(schema.SESSION_PROTOCOL)),
        )
        problem = describe_malformed("session item", read.malformed)
        if problem is None:
            return session
        if not damaged:
            raise MalformedItemError(key_text(raw), problem)
        return dataclasses.replace(
            session,
            # A damaged state reads as a state nobody writes: never ALIVE, reapable.
            state=state if state in (schema.ALIVE, schema.DEAD, None) else "DAMAGED",
            problem=problem,
            stored_state=raw.get(schema.SESSION_STATE)
            if schema.SESSION_STATE in read.malformed
            else None,
            stored_beat=raw.get(schema.SESSION_BEAT)
            if schema.SESSION_BEAT in read.malformed
            else None,
        )

    @property
    def alive(self) -> bool:
        return self.state == schema.ALIVE

    @property
    def reapable(self) -> bool:
        """ALIVE, or without a state: what a reap marks DEAD once it has lapsed."""
        return self.state != schema.DEAD

    @property
    def key(self) -> tuple[str, int]:
        return (self.worker_id, self.session_gen)


def notices_of(plain: Mapping[str, Any]) -> frozenset[str]:
    """The notices of a session item (plain values); anything but strings reads as none."""
    notices = plain.get(schema.SESSION_NOTICES)
    if not isinstance(notices, set):
        return frozenset()
    return frozenset(n for n in notices if isinstance(n, str))


def foreign(sessions: Iterable[SessionItem]) -> list[SessionItem]:
    """The live sessions of another session protocol: a worker must not share the
    table with them, since each side would read the other's sessions by the wrong
    rules (docs/DEPLOY.md). A protocol-1 session is ALIVE with neither a protocol nor a
    beat; an item that lost its state as well is damaged, not foreign, and is reaped
    like any other once it lapsed (docs/DESIGN.md §2.2)."""
    return [
        session
        for session in sessions
        if session.reapable and _protocol_of(session) != schema.SESSION_PROTOCOL_NOW
    ]


def _protocol_of(session: SessionItem) -> int:
    if session.protocol is not None:
        return session.protocol
    if session.alive and session.beat is None:
        return 1
    return schema.SESSION_PROTOCOL_NOW


def _integer_or_none(raw: Any) -> int | None:
    """Compared, never trusted: anything but an integer reads as absent."""
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _text_or_none(raw: Any) -> str | None:
    """Shown, never decided on: anything but a string reads as absent."""
    return raw if isinstance(raw, str) else None


def _takers(raw: Any) -> Takers | None:
    """The reap's plan as stored; None when absent or not readable as one."""
    if not isinstance(raw, list) or not raw:
        return None
    parts: list[tuple[str, str | None]] = []
    for part in raw:
        if not (isinstance(part, list) and len(part) == 2 and isinstance(part[0], str)):
            return None
        last = part[1]
        if last is not None and not isinstance(last, str):
            return None
        parts.append((part[0], last))
    return tuple(parts)


_NAMES = {
    "#state": schema.SESSION_STATE,
    "#expires": schema.SESSION_EXPIRES_AT_MS,
    "#reapedat": schema.SESSION_REAPED_AT_MS,
    "#reapedby": schema.SESSION_REAPED_BY,
    "#notices": schema.SESSION_NOTICES,
    "#conns": schema.SESSION_CONNECTIONS,
    "#cap": schema.SESSION_CAPACITY,
    "#takers": schema.SESSION_TAKERS,
    "#beat": schema.SESSION_BEAT,
    "#pk": schema.PARTITION_KEY,
}


def _names(*placeholders: str) -> dict[str, str]:
    return {p: _NAMES[p] for p in placeholders}


def _values(**values: Any) -> dict[str, Any]:
    return {f":{k}": to_attribute(v) for k, v in values.items()}


# --- opening and renewing ----------------------------------------------------------------


def new_session_item(
    worker_id: str, session_gen: int, now_ms: int, timing: LeaseTiming, capacity: int
) -> dict[str, Any]:
    """The item a worker puts to open a session (conditional on its absence), with
    the worker's version: a session lives within one process, so the renews leave it."""
    return {
        **{k: to_attribute(v) for k, v in schema.session_key(worker_id, session_gen).items()},
        "worker_id": to_attribute(worker_id),
        "session_gen": to_attribute(session_gen),
        schema.SESSION_STATE: to_attribute(schema.ALIVE),
        schema.SESSION_EXPIRES_AT_MS: to_attribute(now_ms + timing.lease_ms),
        schema.SESSION_STARTED_AT_MS: to_attribute(now_ms),
        schema.SESSION_CONNECTIONS: to_attribute(0),
        schema.SESSION_CAPACITY: to_attribute(capacity),
        schema.SESSION_VERSION: to_attribute(VERSION),
        schema.SESSION_BEAT: to_attribute(0),
        schema.SESSION_PROTOCOL: to_attribute(schema.SESSION_PROTOCOL_NOW),
    }


def renew_update(
    now_ms: int,
    timing: LeaseTiming,
    *,
    connections: int,
    acted_on: Iterable[str] = (),
    capacity: int | None = None,
) -> ConditionalUpdate:
    """Renew the session: add 1 to its beat.

    ``#state = ALIVE``: a reaped session can never pass again. Any renew that lands
    changes the beat, however late it lands and in whatever order, and so fails a reap
    whose reaper had not seen it. The notices the owner has acted on are removed in
    the same write, so acting on a stop costs no write of its own. ``connections`` and
    ``capacity`` publish the worker's load (capacity 0: it is draining), which the
    others read when they list the sessions. The wall-clock expiry is for people.
    """
    acted = sorted(set(acted_on))
    update = "SET #expires = :expires, #conns = :conns"
    names = _names("#state", "#expires", "#conns", "#beat")
    values = _values(alive=schema.ALIVE, expires=now_ms + timing.lease_ms, conns=connections, one=1)
    if capacity is not None:
        update += ", #cap = :cap"
        names |= _names("#cap")
        values |= _values(cap=capacity)
    update += " ADD #beat :one"
    if acted:
        update += " DELETE #notices :acted"
        names |= _names("#notices")
        values[":acted"] = {"SS": acted}
    return ConditionalUpdate(
        update_expression=update,
        # ALIVE only: a reaped session never passes again, however late its renew.
        condition_expression="#state = :alive",
        names=names,
        values=values,
    )


class RenewRefusal(enum.Enum):
    """Why a session renew's condition failed."""

    REAPED = "reaped"
    """DEAD (or gone): every connection of the session is lost; open a new one."""


def renew_failure(old: SessionItem | None) -> RenewRefusal:
    """``old``: the item that refused the renew (None when there is none, or when it
    cannot be decoded): the renew requires nothing but ALIVE, so it was reaped."""
    return RenewRefusal.REAPED


# --- reaping -----------------------------------------------------------------------------


def reap_update(
    reaper: str,
    now_ms: int,
    beat: int | None,
    takers: Takers | None = None,
    *,
    state_absent: bool = False,
    stored_state: Mapping[str, Any] | None = None,
    stored_beat: Mapping[str, Any] | None = None,
) -> ConditionalUpdate:
    """Mark a lapsed session DEAD, once and for good, on condition that its beat is
    still the one the reaper saw unchanged for the lease (:class:`SessionWatch`; None:
    the item had none); with ``takers`` (:func:`takeover_plan`), record in the same
    write who takes which of its connections, so that everyone who sees it DEAD reads
    the same plan. ``state_absent``: the session was listed without a state, which the
    condition then matches as missing (nothing writes one back but a reap: a renew
    needs ALIVE). ``now_ms`` is recorded for people."""
    state = "attribute_not_exists(#state)" if state_absent else "#state = :alive"
    values = _values(dead=schema.DEAD, now=now_ms, me=reaper)
    if stored_state is not None:
        # A damaged state: the one listed, exactly as stored.
        state = "#state = :alive"
        values[":alive"] = dict(stored_state)
    elif not state_absent:
        values |= _values(alive=schema.ALIVE)
    if stored_beat is not None:
        same_beat = "#beat = :beat"
        values[":beat"] = dict(stored_beat)
    elif beat is None:
        same_beat = "attribute_not_exists(#beat)"
    else:
        same_beat = "#beat = :beat"
        values |= _values(beat=beat)
    update = ConditionalUpdate(
        update_expression="SET #state = :dead, #reapedat = :now, #reapedby = :me",
        condition_expression=f"{state} AND {same_beat}",
        names=_names("#state", "#reapedat", "#reapedby", "#beat"),
        values=values,
    )
    if not takers:
        return update
    return ConditionalUpdate(
        update_expression=update.update_expression + ", #takers = :takers",
        condition_expression=update.condition_expression,
        names=update.names | _names("#takers"),
        values=update.values | _values(takers=[[worker, last] for worker, last in takers]),
    )


def retire_update(worker_id: str, now_ms: int) -> ConditionalUpdate:
    """A worker ends its own session after its last release (graceful shutdown)."""
    return ConditionalUpdate(
        update_expression="SET #state = :dead, #reapedat = :now, #reapedby = :me",
        condition_expression="#state = :alive",
        names=_names("#state", "#reapedat", "#reapedby"),
        values=_values(dead=schema.DEAD, alive=schema.ALIVE, now=now_ms, me=worker_id),
    )


def notice_update(token: str) -> ConditionalUpdate:
    """The router tells a session's owner that one of its connections was stopped or
    started again; only while the session item exists (a forgotten session has no
    owner left to tell)."""
    return ConditionalUpdate(
        update_expression="ADD #notices :token",
        condition_expression="attribute_exists(#pk)",
        names=_names("#notices", "#pk"),
        values={":token": {"SS": [token]}},
    )


def notice_token(connection_id: str, what: str, now_ms: int, nonce: str) -> str:
    """``<connection_id> <what> <now_ms> <nonce>``: distinct per router write (the random
    ``nonce`` separates two writes of the same millisecond), so removing a notice the
    owner acted on never removes a newer one for the same connection."""
    return f"{connection_id} {what} {now_ms} {nonce}"


def notice_connection_id(token: str) -> str:
    return token.split(" ", 1)[0]


OFFER: Final = "offer"
"""A notice from another worker: it has just released this connection, with its final
checkpoint in the item, for the session to take (a balance move)."""
DRAIN: Final = "drain"
"""The same from a worker that is shutting down: everything it ran must find a home."""
HANDOFFS: Final = frozenset((OFFER, DRAIN))


def notice_at_ms(token: str) -> int | None:
    """When the notice was written (the writer's wall clock), None for a token of
    another shape: between two notices for one connection, the later is the latest
    word."""
    parts = token.split(" ")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def stopped_by_notice(tokens: Iterable[str]) -> set[str]:
    """The connections whose latest word from the router among ``tokens`` is a stop
    (by the time each notice was written; a start of the same millisecond leaves it
    to the read)."""
    latest: dict[str, tuple[int, bool]] = {}
    for token in tokens:
        kind, at = notice_kind(token), notice_at_ms(token)
        if kind not in ("stop", "start") or at is None:
            continue
        cid = notice_connection_id(token)
        word = (at, kind == "start")
        latest[cid] = max(latest.get(cid, word), word)
    return {cid for cid, (_, start) in latest.items() if not start}


def notice_kind(token: str) -> str:
    """``start``, ``stop`` (the router's), :data:`OFFER` or :data:`DRAIN` (another
    worker's)."""
    parts = token.split(" ")
    return parts[1] if len(parts) > 1 else ""


def handed_to(session: SessionItem) -> list[str]:
    """The connections other workers released for this session (its offers and
    drains): free in the table, each waiting for this session's next renew. For a
    DEAD session that renew never comes."""
    return sorted({notice_connection_id(t) for t in session.notices if notice_kind(t) in HANDOFFS})


def offer_update(tokens: Iterable[str]) -> ConditionalUpdate:
    """A worker hands connections it has just released to a live session, in one
    write (``tokens``: :func:`notice_token` with :data:`OFFER` or :data:`DRAIN`);
    refused when the
    session is no longer ALIVE (the connections then wait in the ``unowned`` index)."""
    return ConditionalUpdate(
        update_expression="ADD #notices :tokens",
        condition_expression="#state = :alive",
        names=_names("#notices", "#state"),
        values={":tokens": {"SS": sorted(set(tokens))}, ":alive": to_attribute(schema.ALIVE)},
    )


# --- sweeping a dead session -------------------------------------------------------------


def reaper_of(session: SessionItem) -> str | None:
    """The worker the others leave a DEAD session's connections to: its reaper, or
    nobody when its own worker retired it. A graceful retire leaves nothing to take; a
    session given up (docs/DESIGN.md §3.6) leaves everything, and its worker has just
    shown that it cannot keep them."""
    if session.reaped_by == session.worker_id:
        return None
    return session.reaped_by


def may_sweep(session: SessionItem, me: str, dead_for: float, grace: float) -> bool:
    """Whether this worker looks at a DEAD session's connections now. When the reap
    recorded its plan (:func:`takeover_plan`), everyone goes at once: each takes its
    own part. Without one (a reap that found nothing to plan, a retire) the reaper goes
    at once (it takes all it has room for) and the others wait until they have seen
    it DEAD for ``grace`` (``dead_for``, on their own clock) and take what is left (the
    excess), so they do not race the reaper's writes; a session
    retired by its own worker has no reaper to wait for (:func:`reaper_of`): everyone
    goes at once."""
    # DEAD only: a session without a state is reaped first (its owner may still be
    # handling until its fence deadline).
    if session.state != schema.DEAD or session.reaped_at_ms is None:
        return False
    if session.takers is not None:
        return True
    return session.reaped_by in (me, session.worker_id) or dead_for >= grace


Overdue = Collection[tuple[str, int]]
"""The sessions this worker has seen go unrenewed for a lease or more
(:meth:`SessionWatch.overdue`): alive as listed, but not to be counted on."""


def can_take(session: SessionItem, overdue: Overdue) -> bool:
    """A session that takes over connections, as listed: ALIVE, renewed within the
    lease as this worker has seen it, and with room in the load it last published."""
    room = session.capacity - session.connections
    return session.alive and session.key not in overdue and room > 0


def takeover_plan(
    remaining: Sequence[str],
    *,
    reaper: str,
    room: int,
    sessions: Iterable[SessionItem],
    overdue: Overdue,
) -> Takers:
    """Who takes which of a lapsed session's STARTED connections (``remaining``), as
    the reaper decides it just before its reap and records it in the reap's write.

    One part per taker, in the order of the sorted ids: the reaper's first, then those
    of the other sessions that :func:`can_take`, in the order of their worker ids. The
    parts bring the takers towards the fair share they will have once everything is
    taken over (the balancer's: the takers' connections and these, shared in
    proportion to capacity, none above it; docs/DESIGN.md §4.3): each part in
    proportion to how far its taker is below that share, never beyond it, nor beyond
    its room. The reaper counts with its free slots at the reap (``room``), not the
    load it published a heartbeat ago; the others with the load they published. When
    everyone's room does not hold them all, everyone gets its room and the rest stays
    in the last part.

    Each part is recorded by its last id, so a connection's taker does not depend on
    which of the others have been taken since (the listing shrinks as takeovers land)
    nor on loads published after the reap: every worker reads the same plan from the
    DEAD session.
    """
    ids = sorted(remaining)
    loads: dict[str, tuple[int, int]] = {}  # worker -> (connections, capacity)
    own = [s.capacity for s in sessions if s.alive and s.worker_id == reaper]
    capacity = max(own) if own else max(0, room)
    loads[reaper] = (capacity - min(max(0, room), capacity), capacity)
    for session in sessions:
        if session.worker_id == reaper or not can_take(session, overdue):
            continue
        known = loads.get(session.worker_id)
        if known is None or session.capacity - session.connections > known[1] - known[0]:
            loads[session.worker_id] = (session.connections, session.capacity)
    order = [reaper, *sorted(w for w in loads if w != reaper)]
    total = sum(n for n, _ in loads.values()) + len(ids)
    fleet = sum(c for _, c in loads.values())
    wants = []
    for worker in order:
        connections, cap = loads[worker]
        # share = cap * min(1, total / fleet); below it by ceil(share - connections)
        below = -(-(cap * min(total, fleet) - connections * fleet) // fleet) if fleet else 0
        wants.append(max(0, min(cap - connections, below)))
    counts = _apportion(len(ids), wants)
    parts = [(w, n) for w, n in zip(order, counts, strict=True) if n > 0]
    if not parts:
        return ((reaper, None),)
    takers: list[tuple[str, str | None]] = []
    position = 0
    for worker, count in parts[:-1]:
        position += count
        takers.append((worker, ids[position - 1]))
    takers.append((parts[-1][0], None))
    return tuple(takers)


def _apportion(total: int, rooms: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``rooms``, none above its room (largest
    remainders, ties to the earlier); everyone's whole room when they add up to no more
    than ``total``."""
    cap = sum(rooms)
    if total >= cap:
        return list(rooms)
    counts = [total * r // cap for r in rooms]
    order = sorted(range(len(rooms)), key=lambda i: (-(total * rooms[i] % cap), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def planned_taker(connection_id: str, takers: Takers) -> str:
    """The worker the reap's plan gives ``connection_id`` to: exactly one for every id,
    including one the reaper's listing missed."""
    for worker, last in takers:
        if last is None or connection_id <= last:
            return worker
    return takers[-1][0]


def open_taker(connection_id: str, sessions: Iterable[SessionItem], overdue: Overdue) -> str | None:
    """Who takes a connection whose planned taker cannot (gone, expired, or full as
    published): the session that :func:`can_take` with the highest
    ``crc32(<id> <worker>)`` (rendezvous hashing: every worker with the same listing
    picks the same one, and one leaving moves only what it had)."""
    best: tuple[int, str] | None = None
    for session in sessions:
        if can_take(session, overdue):
            score = (zlib.crc32(f"{connection_id} {session.worker_id}".encode()), session.worker_id)
            if best is None or score > best:
                best = score
    return None if best is None else best[1]


def planned_share(
    remaining: Sequence[str],
    *,
    me: str,
    takers: Takers,
    sessions: Sequence[SessionItem],
    free: int,
    overdue: Overdue,
) -> list[str]:
    """Which of a dead session's remaining STARTED connections this worker takes now,
    by the reap's plan: its own part, at once, and any connection whose planned taker
    cannot take it and that :func:`open_taker` gives to this worker; sorted, at most
    ``free``."""
    if free <= 0 or not takers:
        return []
    able = {session.worker_id for session in sessions if can_take(session, overdue)}
    share: list[str] = []
    for connection_id in sorted(remaining):
        taker = planned_taker(connection_id, takers)
        if taker != me and (taker in able or open_taker(connection_id, sessions, overdue) != me):
            continue
        share.append(connection_id)
        if len(share) >= free:
            break
    return share


def takeover_share(
    remaining: Sequence[str], *, reaper: bool, reaper_room: int | None, free: int
) -> list[str]:
    """Which of a dead session's remaining STARTED connections (``remaining``, sorted)
    this worker takes now, so that takers do not race each other's writes, when the
    reap recorded no plan (an older worker's reap, a retire) or its fallback has passed.

    The reaper takes from the front, as many as it has room for (``free``). Another
    worker takes from the back, and only the excess beyond what the reaper has room
    for (``reaper_room``, from the reaper's session as listed); ``None`` means there is
    no reaper to leave them to (its session is gone, or the fallback time after the
    reap has passed): anything, from the back.
    """
    if free <= 0:
        return []
    if reaper:
        return list(remaining[:free])
    excess = remaining if reaper_room is None else remaining[max(0, reaper_room) :]
    return list(reversed(excess))[:free]


PREDECESSORS_SWEPT = 3
"""How many of a worker's earlier sessions the sweep of its DEAD session also lists."""


def unlisted_predecessors(
    session: SessionItem, listed: Iterable[tuple[str, int]], depth: int = PREDECESSORS_SWEPT
) -> list[int]:
    """The generations of the same worker's earlier sessions, up to ``depth`` back,
    that are no longer listed (forgotten). A worker's generations only go up, and a
    new one is opened only after the one before was reaped (or never opened), so an
    earlier session that is not listed was DEAD and deleted: anything still owned by
    it is owned by nobody alive, and is swept like the DEAD session's own."""
    known = set(listed)
    first = max(1, session.session_gen - depth)
    return [
        gen for gen in range(first, session.session_gen) if (session.worker_id, gen) not in known
    ]


REAPER_FALLBACK_LEASES = 4
"""How long after a reap the others wait for a taker that is alive, has room, and has
not taken its part (stuck, or slow with hundreds of takeovers), in leases, before
anyone takes anything. A taker that died meanwhile, or filled up, is seen at once (its
session is no longer ALIVE, or publishes no room)."""


def reaper_fallback_due(dead_for: float, timing: LeaseTiming) -> bool:
    """Whether anyone now takes any of a dead session's connections: once this worker
    has seen it DEAD for :data:`REAPER_FALLBACK_LEASES` leases."""
    return dead_for >= REAPER_FALLBACK_LEASES * timing.lease


def sweep_share(
    session: SessionItem,
    remaining: Sequence[str],
    *,
    me: str,
    sessions: Sequence[SessionItem],
    free: int,
    dead_for: float,
    overdue: Overdue,
    timing: LeaseTiming,
) -> list[str]:
    """Which of a DEAD ``session``'s remaining STARTED connections this worker takes
    over now (once :func:`may_sweep` let it look): by the reap's plan when it recorded
    one (:func:`planned_share`), by :func:`takeover_share` when it did not; and
    anything, from the back, once :func:`reaper_fallback_due` (``dead_for``: how long
    this worker has seen it DEAD)."""
    ids = sorted(remaining)
    reaper_id = reaper_of(session)
    reaper = reaper_id == me
    if reaper_fallback_due(dead_for, timing):
        return takeover_share(ids, reaper=reaper, reaper_room=None, free=free)
    if session.takers is not None:
        return planned_share(
            ids, me=me, takers=session.takers, sessions=sessions, free=free, overdue=overdue
        )
    room = reaper_room(sessions, reaper_id)
    return takeover_share(ids, reaper=reaper, reaper_room=room, free=free)


def reaper_room(sessions: Iterable[SessionItem], reaper: str | None) -> int | None:
    """Free capacity of the reaper's live session as last renewed (None when it has
    none listed: nobody to leave the connections to)."""
    for session in sessions:
        if session.alive and session.worker_id == reaper:
            return max(0, session.capacity - session.connections)
    return None


def may_forget(unseen_for: float, timing: LeaseTiming) -> bool:
    """A DEAD session and its page are deleted once no connection has been seen under
    it for a full lease (the owner index is eventually consistent)."""
    return unseen_for >= timing.lease


def forget_condition() -> dict[str, Any]:
    """Only a DEAD session is ever deleted."""
    return {
        "ConditionExpression": "#state = :dead",
        "ExpressionAttributeNames": _names("#state"),
        "ExpressionAttributeValues": _values(dead=schema.DEAD),
    }


def takeover_latency_ms(session: SessionItem, now_ms: int) -> int:
    """From the moment the dead session's lease lapsed, by its writer's wall clock, to
    this takeover by this worker's: a figure for people, off by the two clocks'
    offset."""
    return max(0, now_ms - session.expires_at_ms)
