"""Starting and stopping connections: the writes the router makes (docs/DESIGN.md §2.1).

The outcome of a start (created, restarted, already running, conflict) is decided
by conditional writes, never by a read followed by a write, so two racing callers
cannot both believe they created the connection.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from wsfleet import schema, session_rules
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
    """Started with another URL, protocol or auth: the caller must stop it first."""

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
    "#owner": schema.LEASE_OWNER,
    "#free": schema.FREE_SHARD,
    "#epoch": schema.LEASE_EPOCH,
    "#seq": schema.LAST_SEQ,
    "#gen": schema.START_GEN,
    "#seqgen": schema.SEQ_GEN,
    "#created": schema.CREATED_AT_MS,
    "#updated": schema.UPDATED_AT_MS,
    "#ttl": schema.EXPIRES_AT,
    "#parked": schema.PARKED_REASON,
    "#parkedat": schema.PARKED_AT_MS,
    "#failing": schema.FAILING_SINCE_MS,
    "#proto": schema.PROTOCOL,
    "#auth": schema.AUTH_SECRET,
}


def start_update(
    ws_url: str,
    now_ms: int,
    *,
    stream_changed: bool,
    rearm: bool = False,
    owned: bool = False,
    protocol: str | None = None,
    auth_secret: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    connection_id: str,
) -> dict[str, Any]:
    """The conditional write of a start.

    A start asks for a triple: the URL, the protocol (``protocol``, the stored form of
    :meth:`wsfleet.protocol_specs.ProtocolSpec.to_item`; None for the worker's default)
    and the credentials (``auth_secret``, a secret reference; None for none). The
    write stores all three, removing ``protocol`` and ``auth_secret`` when the start
    has none. The **stream** is the URL and the protocol: a checkpoint counts the
    messages of one URL as one protocol numbers them, so it survives a restart only
    when both are unchanged. New credentials for the same stream keep it.

    ``stream_changed=False``: create the item, or restart a STOPPED one with the same
    URL and protocol, keeping its checkpoint. ``stream_changed=True``: restart a
    STOPPED one whose URL or protocol differs; the checkpoint of the old stream means
    nothing for the new one, so ``last_seq`` goes back to 0 and ``seq_gen`` goes up by
    one (a final checkpoint of the old stream, released late, must not land on the new
    one).

    ``rearm=True``: the item is parked (docs/DESIGN.md §3.7), whatever its desired
    state; the start re-arms it with the same two stream variants, removes the parked
    and failing marks and puts it back into the unowned index, so the acquire sees it
    again. A parked item has no owner (the park released it and nobody may take it).
    The other variants refuse a parked item, so only this one ever re-arms it.

    ``owned=False``: the item has no owner, so the start puts it into the sparse
    ``unowned`` index (``free_shard``) in the same write, and the write requires that.
    ``owned=True``: a STOPPED item whose owner has not yet let go; the owner is told
    (a notice on its session) and takes it again itself.
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
        "#epoch = if_not_exists(#epoch, :zero)",
        "#created = if_not_exists(#created, :now)",
        "#updated = :now",
    ]
    adds = ["#gen :one"]
    removes = ["#ttl"]
    if stream_changed:
        sets.append("#seq = :zero")
        adds.append("#seqgen :one")
        # A sequence reset of the old stream says nothing about the new one.
        removes += ["#resetat", "#resetfrom"]
    else:
        sets += ["#seq = if_not_exists(#seq, :zero)", "#seqgen = if_not_exists(#seqgen, :zero)"]
    if protocol is None:
        removes.append("#proto")
        same_stream = "#url = :url AND attribute_not_exists(#proto)"
        new_stream = "(#url <> :url OR attribute_exists(#proto))"
    else:
        values[":proto"] = protocol
        sets.append("#proto = :proto")
        same_stream = "#url = :url AND #proto = :proto"
        new_stream = "(#url <> :url OR #proto <> :proto)"
    stream = new_stream if stream_changed else same_stream
    if auth_secret is None:
        removes.append("#auth")
    else:
        values[":auth"] = auth_secret
        sets.append("#auth = :auth")
    names = dict(_START_NAMES)
    if stream_changed:
        names |= {"#resetat": schema.SEQ_RESET_AT_MS, "#resetfrom": schema.SEQ_RESET_FROM}
    if owned:
        del names["#free"]
        ownership = "attribute_exists(#owner)"
    else:
        values[":free"] = schema.free_shard(connection_id)
        sets.append("#free = :free")
        ownership = "attribute_not_exists(#owner)"
    if metadata is not None:
        names["#meta"] = schema.METADATA
        values[":meta"] = dict(metadata)
        sets.append("#meta = :meta")
    if rearm:
        removes += ["#parked", "#parkedat", "#failing"]
        condition = f"attribute_exists(#parked) AND {stream} AND {ownership}"
        del names["#pk"]
        del values[":stopped"]
    else:
        del names["#parkedat"], names["#failing"]
        restart = (
            f"#state = :stopped AND {stream} AND attribute_not_exists(#parked) AND {ownership}"
        )
        if stream_changed or owned:
            condition = restart
            del names["#pk"]
        else:
            condition = f"attribute_not_exists(#pk) OR ({restart})"
    return {
        "UpdateExpression": (
            f"SET {', '.join(sets)} ADD {', '.join(adds)} REMOVE {', '.join(removes)}"
        ),
        "ConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": {k: to_attribute(v) for k, v in values.items()},
    }


@dataclass(frozen=True, slots=True)
class StartVariant:
    """Which conditional start write applies to the item as last seen."""

    stream_changed: bool = False
    rearm: bool = False
    owned: bool = False


def start_failure(
    old: ConnectionItem | None,
    ws_url: str,
    *,
    protocol: str | None = None,
    auth_secret: str | None = None,
) -> StartOutcome | StartVariant:
    """Decide on a failed start write from the item that made it fail: the outcome,
    or the variant of the write that applies to that item (a parked item, STOPPED or
    not, is re-armed; a STOPPED one restarted; an item that vanished, created).

    A STARTED item (not parked) is already started when it runs the same triple (URL,
    protocol, auth) and a conflict otherwise; the stream (URL and protocol) alone
    decides whether a restart or a re-arm resets the checkpoint."""
    if old is None:
        return StartVariant()
    stream_changed = old.ws_url != ws_url or old.protocol != protocol
    owned = old.lease_owner is not None
    if old.parked:
        return StartVariant(stream_changed=stream_changed, rearm=True, owned=owned)
    if not old.started:
        return StartVariant(stream_changed=stream_changed, owned=owned)
    if stream_changed or old.auth_secret != auth_secret:
        return StartOutcome.CONFLICT
    return StartOutcome.ALREADY_STARTED


def stop_update(now_ms: int, ttl_seconds: int = STOPPED_TTL_SECONDS) -> dict[str, Any]:
    values = {
        ":stopped": schema.STOPPED,
        ":now": now_ms,
        ":ttl": now_ms // 1000 + ttl_seconds,
    }
    return {
        "UpdateExpression": "SET #state = :stopped, #updated = :now, #ttl = :ttl REMOVE #free",
        "ConditionExpression": "attribute_exists(#pk)",
        "ExpressionAttributeNames": {
            "#pk": schema.PARTITION_KEY,
            "#free": schema.FREE_SHARD,
            "#state": schema.DESIRED_STATE,
            "#updated": schema.UPDATED_AT_MS,
            "#ttl": schema.EXPIRES_AT,
        },
        "ExpressionAttributeValues": {k: to_attribute(v) for k, v in values.items()},
    }


class DesiredStateStore:
    """Start and stop connections in the table (the router's writes)."""

    _ATTEMPTS = 4

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        tokens: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        """``tokens(n)``: ``n`` random bytes as hex, for the notices' nonces."""
        self._client = client
        self._table = table_name
        self._tokens = tokens

    def start(
        self,
        connection_id: str,
        ws_url: str,
        now_ms: int,
        *,
        protocol: str | None = None,
        auth_secret: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> StartResult:
        """Start ``connection_id`` with the triple ``ws_url``, ``protocol`` (the stored
        form of a spec, None for the worker's default) and ``auth_secret`` (a secret
        reference, never a value; None for no credentials)."""
        variant = StartVariant()
        # Each failed write tells which variant applies next; a few rounds cover a
        # concurrent stop or start (or a park) changing the item between two writes.
        for _ in range(self._ATTEMPTS):
            update = start_update(
                ws_url,
                now_ms,
                stream_changed=variant.stream_changed,
                rearm=variant.rearm,
                owned=variant.owned,
                protocol=protocol,
                auth_secret=auth_secret,
                metadata=metadata,
                connection_id=connection_id,
            )
            try:
                old = self._update(connection_id, update)
            except ConditionFailedError as failed:
                decided = start_failure(
                    failed.old, ws_url, protocol=protocol, auth_secret=auth_secret
                )
                if isinstance(decided, StartOutcome):
                    return StartResult(decided, failed.old)
                variant = decided
                continue
            outcome = StartOutcome.CREATED if old is None else StartOutcome.RESTARTED
            if old is not None:
                self._notify_owner(old, "start", now_ms)
            return StartResult(outcome, old)
        raise StartContendedError(f"start of {connection_id} kept racing with other writes")

    def stop(self, connection_id: str, now_ms: int) -> StopOutcome:
        try:
            new = update_connection(
                self._client,
                self._table,
                connection_id,
                stop_update(now_ms),
                return_values="ALL_NEW",
            )
        except ConditionFailedError:
            return StopOutcome.NOT_FOUND
        if new is not None:
            self._notify_owner(new, "stop", now_ms)
        return StopOutcome.STOPPED

    def _notify_owner(self, item: ConnectionItem, what: str, now_ms: int) -> None:
        """Tell the owning session (from the item this write returned) that its
        connection was stopped or started again: the owner's next session renew
        returns the notice, so it acts within a heartbeat without reading all of its
        connections. Only while the session item exists: a session that is gone has
        no owner left to tell, and its taker reads the item afresh."""
        if item.lease_owner is None or item.owner_session_gen is None:
            return
        update = session_rules.notice_update(
            session_rules.notice_token(item.connection_id, what, now_ms, self._tokens(4))
        )
        key = schema.session_key(item.lease_owner, item.owner_session_gen)
        try:
            self._client.update_item(
                TableName=self._table,
                Key={k: to_attribute(v) for k, v in key.items()},
                **update.as_kwargs(),
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise

    def _update(self, connection_id: str, update: dict[str, Any]) -> ConnectionItem | None:
        return update_connection(
            self._client, self._table, connection_id, update, return_values="ALL_OLD"
        )
