"""What the API shows of a connection: its item, and what its owner's session item
and checkpoint page say of it.

A connection has no expiry of its own: its owner's liveness is the owner's session
(``session_seconds_left``, ``owner_session_state``), and its freshest checkpoint is
in the owner's page, written every ``CHECKPOINT_SECONDS``, while the item holds the
one written at the last ownership change. The view shows the page's entry when it
belongs to the item's current hold and stream (same ``epoch`` and ``seq_gen``: the
rule a takeover resumes by, :func:`wsfleet.checkpoint_page.resume_seq`), and the
item's own otherwise.

Pure: the caller reads the records (:mod:`lambdas.router.owners` for the router,
a table scan for the local live view) and passes the clock in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from wsfleet import schema
from wsfleet.checkpoint_page import (
    CONNECTING,
    WORKER_STATUSES,
    CheckpointPage,
    PageEntry,
    resume_seq,
)
from wsfleet.item import ConnectionItem
from wsfleet.session_rules import SessionItem


@dataclass(frozen=True, slots=True)
class OwnerRecords:
    """An owning session as read for a view: its session item and its checkpoint
    page, None where there is none (never written, or already forgotten)."""

    session: SessionItem | None = None
    page: CheckpointPage | None = None
    problem: str | None = None
    """Why the session item or the page could not be read (shown as the connection's
    ``last_error``; the record is then None)."""


NO_RECORDS = OwnerRecords()


def owning_session(item: ConnectionItem) -> tuple[str, int] | None:
    """``(worker_id, session_gen)`` of the session the item names as its owner."""
    if item.lease_owner is None or item.owner_session_gen is None:
        return None
    return (item.lease_owner, item.owner_session_gen)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _seconds(ms: int) -> float:
    return max(0, ms) / 1000


def session_fields(
    item: ConnectionItem, session: SessionItem | None, now_ms: int
) -> dict[str, Any]:
    """``owner_session_state``, ``session_seconds_left`` and ``owner_version``: null
    without an owner or when the owner's session item is gone; no time left once it
    lapsed or is DEAD; no version when an older worker opened the session."""
    if session is None or session.key != owning_session(item):
        return {"owner_session_state": None, "session_seconds_left": None, "owner_version": None}
    left = session.expires_at_ms - now_ms if session.alive else 0
    return {
        "owner_session_state": session.state,
        "session_seconds_left": _seconds(left),
        "owner_version": session.version,
    }


def page_entry(item: ConnectionItem, page: CheckpointPage | None) -> PageEntry | None:
    """The page's entry for ``item`` when it belongs to the item's hold and stream."""
    if page is None or owning_session(item) is None:
        return None
    entry = page.entries.get(item.connection_id)
    if entry is None or entry.epoch != item.lease_epoch or entry.seq_gen != item.seq_gen:
        return None
    return entry


def checkpoint_fields(
    item: ConnectionItem, page: CheckpointPage | None, now_ms: int
) -> dict[str, Any]:
    """``last_seq`` (the best checkpoint known) and, when it comes from the owner's
    page, when that page was written (``checkpoint_at``, and its age) and when the
    connection's seq last moved (``last_advanced_at``)."""
    entry = page_entry(item, page)
    if page is None or entry is None:
        return {
            "last_seq": item.last_seq,
            "checkpoint_at": None,
            "checkpoint_age_seconds": None,
            "last_advanced_at": None,
        }
    return {
        "last_seq": resume_seq(item.lease_epoch, item.seq_gen, item.last_seq, entry),
        "checkpoint_at": _iso(page.written_at_ms),
        "checkpoint_age_seconds": _seconds(now_ms - page.written_at_ms),
        "last_advanced_at": _iso(entry.advanced_at_ms),
    }


STOPPED: Final = "stopped"
FAILED: Final = "failed"
PENDING: Final = "pending"
STATUSES: Final = (*WORKER_STATUSES, FAILED, PENDING, STOPPED)
"""Every ``status`` a view shows: the owner's own word for a connection it runs
(``streaming``, ``connecting``, ``backing_off``), or what the records say otherwise."""


def health_fields(
    item: ConnectionItem,
    session: SessionItem | None,
    page: CheckpointPage | None,
    now_ms: int,
    problem: str | None = None,
) -> dict[str, Any]:
    """``status``, ``seconds_since_last_message``, ``reconnects``, ``last_error`` and
    ``messages_per_second``. What a live owner says comes from its checkpoint page, so
    it is as fresh as one ``CHECKPOINT_SECONDS``; a connection that no live session
    runs is ``pending`` (unowned, or its owner's session ended: a worker takes it
    within the failover bound), a parked one ``failed`` with its reason, and so is one
    whose item cannot be run (its problem as the error). ``problem``: why the owner's
    session item or page could not be read, the error when nothing else says one."""
    fields: dict[str, Any] = {
        "status": None,
        "seconds_since_last_message": None,
        "reconnects": None,
        "last_error": item.problem or problem,
        "messages_per_second": None,
        "last_keepalive_sent": None,
        "last_keepalive_answered": None,
    }
    if item.desired_state != schema.STARTED:
        return fields | {"status": STOPPED}
    if item.parked_reason is not None:
        return fields | {"status": FAILED, "last_error": item.parked_reason}
    if item.problem is not None:
        return fields | {"status": FAILED}
    live = (
        session is not None
        and session.key == owning_session(item)
        and session.alive
        and session.expires_at_ms > now_ms
    )
    if not live:
        return fields | {"status": PENDING}
    entry = page_entry(item, page)
    if entry is None:
        return fields | {"status": CONNECTING, "reconnects": 0}
    since = None if entry.advanced_at_ms is None else _seconds(now_ms - entry.advanced_at_ms)
    return {
        "status": entry.status,
        "seconds_since_last_message": since,
        "reconnects": entry.reconnects,
        "last_error": entry.last_error or problem,
        "messages_per_second": entry.rate,
        "last_keepalive_sent": _iso(entry.keepalive_sent_ms),
        "last_keepalive_answered": _iso(entry.keepalive_answered_ms),
    }


def connection_view(
    item: ConnectionItem, now_ms: int, owner: OwnerRecords = NO_RECORDS
) -> dict[str, Any]:
    """The view of ``item`` at ``now_ms``; ``owner``: the records of the session the
    item names as its owner (:func:`owning_session`; ignored when it names none)."""
    owned = owning_session(item) is not None
    session = owner.session if owned else None
    page = owner.page if owned else None
    problem = owner.problem if owned else None
    return {
        "connection_id": item.connection_id,
        "state": item.desired_state,
        "ws_url": item.ws_url,
        "owner": item.lease_owner,
        "owner_session_gen": item.owner_session_gen if owned else None,
        **session_fields(item, session, now_ms),
        "epoch": item.lease_epoch,
        **checkpoint_fields(item, page, now_ms),
        "start_gen": item.start_gen,
        "created_at": _iso(item.created_at_ms),
        "updated_at": _iso(item.updated_at_ms),
        "expires_at": _iso(item.expires_at * 1000) if item.expires_at is not None else None,
        "metadata": _json_safe(item.extra.get(schema.METADATA)),
        "auth": None if item.auth_secret is None else {"secret": item.auth_secret},
        "protocol": protocol_view(item.protocol),
        "parked_reason": item.parked_reason,
        "parked_at": _iso(item.parked_at_ms),
        "failing_since": _iso(item.failing_since_ms),
        "seq_gen": item.seq_gen,
        "sequence_reset": None
        if item.seq_reset_at_ms is None
        else {"at": _iso(item.seq_reset_at_ms), "previous_last_seq": item.seq_reset_from},
        **health_fields(item, session, page, now_ms, problem),
    }


def protocol_view(stored: str | None) -> dict[str, Any] | None:
    """The stored protocol spec as the API shows it, ``{"name", "options"}``; None
    when the item has none. Shown as stored, not validated again: a spec that a newer
    router wrote is still shown. A stored value that is not a JSON object (the router
    never writes one) shows as null."""
    if stored is None:
        return None
    try:
        raw = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    options = raw.get("options")
    return {"name": raw["name"], "options": options if isinstance(options, dict) else {}}


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | set | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value
