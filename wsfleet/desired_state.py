"""Starting and stopping connections: the writes the router makes (docs/DESIGN.md §2.1).

The outcome of a start (created, restarted, already running, conflict) is decided
by conditional writes, never by a read followed by a write, so two racing callers
cannot both believe they created the connection.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wsfleet import schema
from wsfleet.item import ConnectionItem, to_attribute
from wsfleet.item_io import ConditionFailedError, update_connection

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

STOPPED_TTL_SECONDS = 7 * 24 * 3600
"""How long a STOPPED item stays readable before DynamoDB's TTL removes it."""


class StartOutcome(enum.Enum):
    CREATED = "created"
    RESTARTED = "restarted"
    ALREADY_STARTED = "already_started"
    CONFLICT = "conflict"
    """Started with another URL: the caller must stop it first."""

    @property
    def sends_start_message(self) -> bool:
        return self in (StartOutcome.CREATED, StartOutcome.RESTARTED)


@dataclass(frozen=True, slots=True)
class StartResult:
    outcome: StartOutcome
    item: ConnectionItem | None = None
    """The item before the write (None for a new connection)."""


class StartContendedError(RuntimeError):
    """Concurrent starts and stops of the same id kept changing the item between our
    writes; nothing was written by this call. Retrying later is safe."""


class StopOutcome(enum.Enum):
    STOPPED = "stopped"
    NOT_FOUND = "not_found"


_START_NAMES = {
    "#pk": schema.PARTITION_KEY,
    "#state": schema.DESIRED_STATE,
    "#url": schema.WS_URL,
    "#expiry": schema.LEASE_EXPIRES_AT_MS,
    "#epoch": schema.LEASE_EPOCH,
    "#seq": schema.LAST_SEQ,
    "#gen": schema.START_GEN,
    "#seqgen": schema.SEQ_GEN,
    "#created": schema.CREATED_AT_MS,
    "#updated": schema.UPDATED_AT_MS,
    "#ttl": schema.EXPIRES_AT,
}


def start_update(
    ws_url: str,
    now_ms: int,
    *,
    url_changed: bool,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The conditional write of a start.

    ``url_changed=False``: create the item, or restart a STOPPED one with the same
    URL, keeping its checkpoint. ``url_changed=True``: restart a STOPPED one whose
    URL differs; the checkpoint of the old stream means nothing for the new one, so
    ``last_seq`` goes back to 0 and ``seq_gen`` goes up by one (a final checkpoint of
    the old stream, released late, must not land on the new one).
    """
    values: dict[str, Any] = {
        ":started": schema.STARTED,
        ":stopped": schema.STOPPED,
        ":url": ws_url,
        ":zero": 0,
        ":one": 1,
        ":now": now_ms,
    }
    sets = [
        "#state = :started",
        "#url = :url",
        "#expiry = if_not_exists(#expiry, :zero)",
        "#epoch = if_not_exists(#epoch, :zero)",
        "#created = if_not_exists(#created, :now)",
        "#updated = :now",
    ]
    adds = ["#gen :one"]
    if url_changed:
        sets.append("#seq = :zero")
        adds.append("#seqgen :one")
    else:
        sets += ["#seq = if_not_exists(#seq, :zero)", "#seqgen = if_not_exists(#seqgen, :zero)"]
    names = dict(_START_NAMES)
    if metadata is not None:
        names["#meta"] = schema.METADATA
        values[":meta"] = dict(metadata)
        sets.append("#meta = :meta")
    if url_changed:
        condition = "#state = :stopped AND #url <> :url"
        del names["#pk"]
    else:
        condition = "attribute_not_exists(#pk) OR (#state = :stopped AND #url = :url)"
    return {
        "UpdateExpression": f"SET {', '.join(sets)} ADD {', '.join(adds)} REMOVE #ttl",
        "ConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": {k: to_attribute(v) for k, v in values.items()},
    }


def start_failure(old: ConnectionItem | None, ws_url: str) -> StartOutcome | None:
    """Decide on a failed start write. ``None`` means: the other variant of the
    write applies (the item is STOPPED with another URL, or appeared/vanished)."""
    if old is None or not old.started:
        return None
    return StartOutcome.ALREADY_STARTED if old.ws_url == ws_url else StartOutcome.CONFLICT


def stop_update(now_ms: int, ttl_seconds: int = STOPPED_TTL_SECONDS) -> dict[str, Any]:
    values = {
        ":stopped": schema.STOPPED,
        ":now": now_ms,
        ":ttl": now_ms // 1000 + ttl_seconds,
    }
    return {
        "UpdateExpression": "SET #state = :stopped, #updated = :now, #ttl = :ttl",
        "ConditionExpression": "attribute_exists(#pk)",
        "ExpressionAttributeNames": {
            "#pk": schema.PARTITION_KEY,
            "#state": schema.DESIRED_STATE,
            "#updated": schema.UPDATED_AT_MS,
            "#ttl": schema.EXPIRES_AT,
        },
        "ExpressionAttributeValues": {k: to_attribute(v) for k, v in values.items()},
    }


class DesiredStateStore:
    """Start and stop connections in the table (the router's writes)."""

    _ATTEMPTS = 4

    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self._table = table_name

    def start(
        self,
        connection_id: str,
        ws_url: str,
        now_ms: int,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> StartResult:
        url_changed = False
        # Each failed write tells which variant applies next; a few rounds cover a
        # concurrent stop or start flipping the state between two of our writes.
        for _ in range(self._ATTEMPTS):
            update = start_update(ws_url, now_ms, url_changed=url_changed, metadata=metadata)
            try:
                old = self._update(connection_id, update)
            except ConditionFailedError as failed:
                decided = start_failure(failed.old, ws_url)
                if decided is not None:
                    return StartResult(decided, failed.old)
                url_changed = failed.old is not None and failed.old.ws_url != ws_url
                continue
            outcome = StartOutcome.CREATED if old is None else StartOutcome.RESTARTED
            return StartResult(outcome, old)
        raise StartContendedError(f"start of {connection_id} kept racing with other writes")

    def stop(self, connection_id: str, now_ms: int) -> StopOutcome:
        try:
            self._update(connection_id, stop_update(now_ms))
        except ConditionFailedError:
            return StopOutcome.NOT_FOUND
        return StopOutcome.STOPPED

    def _update(self, connection_id: str, update: dict[str, Any]) -> ConnectionItem | None:
        return update_connection(
            self._client, self._table, connection_id, update, return_values="ALL_OLD"
        )
