"""What the API shows of a connection item."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from wsfleet import schema
from wsfleet.item import ConnectionItem


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def connection_view(item: ConnectionItem, now_ms: int) -> dict[str, Any]:
    return {
        "connection_id": item.connection_id,
        "state": item.desired_state,
        "ws_url": item.ws_url,
        "owner": item.lease_owner,
        "owner_session_gen": item.owner_session_gen,
        "epoch": item.lease_epoch,
        "last_seq": item.last_seq,
        "start_gen": item.start_gen,
        "created_at": _iso(item.created_at_ms),
        "updated_at": _iso(item.updated_at_ms),
        "expires_at": _iso(item.expires_at * 1000) if item.expires_at is not None else None,
        "metadata": _json_safe(item.extra.get(schema.METADATA)),
        "parked_reason": item.parked_reason,
        "parked_at": _iso(item.parked_at_ms),
        "failing_since": _iso(item.failing_since_ms),
    }


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | set | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value
