"""Typed requests and views of the router (HTTP API bodies and EventBridge details)."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from wsfleet.protocol_specs import MAX_SPEC_BYTES, PROTOCOL_NAMES
from wsfleet.schema import CONNECTION_ID_PATTERN

MAX_METADATA_BYTES = 4096
MAX_METADATA_DEPTH = 16
"""Levels of objects and arrays in metadata, the metadata object itself included
(DynamoDB stores 32 levels; labels need far fewer)."""
# What a DynamoDB number can hold: 38 significant digits, magnitude 1E-130 .. <1E126.
_MAX_INT_DIGITS = 38
_SMALLEST = Decimal("1E-130")
_TOO_LARGE = Decimal("1E126")

ConnectionId = Annotated[str, Field(pattern=CONNECTION_ID_PATTERN, min_length=1, max_length=128)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _check_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    # Shape first (iteratively): json.dumps below recurses, and DynamoDB refuses what
    # it cannot store with an error that would otherwise surface as a 5xx.
    _check_storable(value)
    encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
    if len(encoded.encode()) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is larger than {MAX_METADATA_BYTES} bytes of JSON")
    return value


def _check_storable(metadata: dict[str, Any]) -> None:
    """Refuse metadata DynamoDB cannot store: nesting deeper than
    ``MAX_METADATA_DEPTH``, empty keys, strings that are not valid Unicode, numbers
    outside DynamoDB's range or precision."""
    pending: list[tuple[Any, int]] = [(metadata, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            if depth > MAX_METADATA_DEPTH:
                raise ValueError(f"metadata nests deeper than {MAX_METADATA_DEPTH} levels")
            if isinstance(value, dict):
                for key in value:
                    if key == "":
                        raise ValueError("metadata keys must not be empty")
                    _check_text(key)
                children = list(value.values())
            else:
                children = value
            pending.extend((child, depth + 1) for child in children)
        elif isinstance(value, str):
            _check_text(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            _check_number(value)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("metadata strings must be valid Unicode") from None


def _check_number(number: int | float) -> None:
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError("metadata numbers must be finite")
    if isinstance(number, int):
        if abs(number) >= 10**_MAX_INT_DIGITS:
            raise ValueError(f"metadata integers are limited to {_MAX_INT_DIGITS} digits")
        return
    magnitude = abs(Decimal(repr(number)))
    if magnitude and not _SMALLEST <= magnitude < _TOO_LARGE:
        raise ValueError("metadata numbers must lie within 1E-130 and 1E126 in magnitude")


class AuthRef(_Strict):
    """Credentials by reference: the worker reads the secret when it connects; the
    connection item, the API and the logs only ever hold the reference."""

    secret: str = Field(
        description="a Secrets Manager secret name or ARN under the deployment's"
        " ALLOWED_SECRET_PREFIX; its SecretString is a JSON object"
        ' {"headers": {...}, "query": {...}, "<field>": "..."}'
    )


class SequenceReset(BaseModel):
    at: str | None = Field(description="when the owner saw the upstream start over")
    previous_last_seq: int | None = Field(
        description="the checkpoint of the numbering before: where it ended"
    )


class ProtocolChoice(_Strict):
    """The upstream protocol and its options. Which names and options exist, and what
    they mean, is decided by ``wsfleet.protocol_specs`` (docs/DESIGN.md §4.6) and, for
    plug-ins, by the deployment's ``UPSTREAM_PROTOCOLS``; a refused spec is a 400
    ``invalid_protocol`` with that module's message."""

    name: str = Field(
        description="the protocol: a built-in ("
        + ", ".join(PROTOCOL_NAMES)
        + ") or a plug-in the deployment registers in UPSTREAM_PROTOCOLS (a name of"
        " a-z, 0-9 and -); any other name is refused with the list of those it has",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="the protocol's options (json-field: sequence, payload, resume,"
        " resume_param, prev; json-seq and json-field: restarts; any built-in: a"
        " subscribe frame with ${from_seq}, ${last_seq} and ${secret:<field>}"
        " placeholders, inflate, keepalive, answers; a plug-in: any"
        f" object, its own); the whole spec is at most {MAX_SPEC_BYTES} bytes of compact"
        " JSON",
    )

    def as_raw(self) -> dict[str, Any]:
        """The spec as a start carries it, for ``wsfleet.protocol_specs.parse_spec``."""
        return {"name": self.name, "options": self.options}


_AUTH_DESCRIPTION = (
    "credentials by reference: the secret the worker reads when it connects (headers"
    " for the handshake, query parameters, subscribe fields); absent: none"
)
_PROTOCOL_DESCRIPTION = (
    "the upstream protocol and its options; absent: the worker's default protocol"
    " (UPSTREAM_PROTOCOL). A restart with another protocol starts the stream from the"
    " beginning, as another URL does"
)


class StartRequest(_Strict):
    """``POST /connections`` body; ``connection_id`` is generated when absent."""

    connection_id: ConnectionId | None = None
    ws_url: Annotated[str, Field(min_length=1, max_length=2048)]
    metadata: dict[str, Any] | None = None
    auth: AuthRef | None = Field(default=None, description=_AUTH_DESCRIPTION)
    protocol: ProtocolChoice | None = Field(default=None, description=_PROTOCOL_DESCRIPTION)

    _metadata = field_validator("metadata")(_check_metadata)


class StartDetail(_Strict):
    """EventBridge ``Start Connection`` detail (the id is required: events are retried)."""

    connection_id: ConnectionId
    ws_url: Annotated[str, Field(min_length=1, max_length=2048)]
    metadata: dict[str, Any] | None = None
    auth: AuthRef | None = Field(default=None, description=_AUTH_DESCRIPTION)
    protocol: ProtocolChoice | None = Field(default=None, description=_PROTOCOL_DESCRIPTION)

    _metadata = field_validator("metadata")(_check_metadata)


class StopDetail(_Strict):
    """EventBridge ``Stop Connection`` detail."""

    connection_id: ConnectionId


def to_dynamodb_value(value: Any) -> Any:
    """JSON metadata as DynamoDB can store it: floats become Decimals."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("metadata numbers must be finite")
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: to_dynamodb_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_dynamodb_value(v) for v in value]
    return value


# --- answers, as the OpenAPI document describes them (views.py builds them) ----------


class ConnectionView(BaseModel):
    """One connection as the API shows it.

    A connection has no lease expiry of its own (the former ``lease_seconds_left`` is
    gone): its owner is a worker session, alive while that worker renews it, so the
    time left is the owner session's (``session_seconds_left``). ``last_seq`` is the
    best checkpoint known: the one in the owner's checkpoint page when it belongs to
    the connection's current owner and stream (then ``checkpoint_at`` and
    ``checkpoint_age_seconds`` say when that page was written), else the item's own,
    written at the last change of owner (then both are null).
    """

    model_config = ConfigDict(extra="forbid")

    connection_id: str
    state: Literal["STARTED", "STOPPED"]
    ws_url: str
    owner: str | None = Field(description="worker whose session owns it; null when free")
    owner_session_gen: int | None = Field(
        description="the owning session's generation (a worker opens a new one when it"
        " restarts or loses its session); null when free"
    )
    owner_session_state: Literal["ALIVE", "DEAD"] | None = Field(
        description="ALIVE while the owner renews its session; DEAD once reaped or ended"
        " (another worker then takes the connection over); null when free or when the"
        " session item is already gone"
    )
    session_seconds_left: float | None = Field(
        description="seconds until the owner's session expires unless renewed; 0 once it"
        " lapsed or is DEAD; null when owner_session_state is null"
    )
    owner_version: str | None = Field(
        default=None,
        description="the websocket-fleet version of the owner's worker, from its session"
        " item; null when owner_session_state is null or an older worker opened it",
    )
    epoch: int = Field(description="lease_epoch: the fencing token of the current owner")
    last_seq: int = Field(description="highest contiguous seq handled, as last checkpointed")
    checkpoint_at: str | None = Field(
        description="when the owner's checkpoint page holding last_seq was written; null"
        " when last_seq is the item's own"
    )
    checkpoint_age_seconds: float | None = Field(
        description="seconds since checkpoint_at, at the time of this answer; null with it"
    )
    last_advanced_at: str | None = Field(
        description="when last_seq last moved, per the owner's page; null when last_seq"
        " is the item's own or nothing was handled yet under this owner"
    )
    start_gen: int
    created_at: str | None
    updated_at: str | None
    expires_at: str | None = Field(description="when a STOPPED item is removed (TTL)")
    metadata: dict[str, Any] | None
    auth: AuthRef | None = Field(
        description="the secret the worker reads credentials from: the reference only,"
        " never a value; null: no credentials"
    )
    protocol: ProtocolChoice | None = Field(
        description="the upstream protocol and its options as stored; null: the"
        " worker's default protocol (UPSTREAM_PROTOCOL)"
    )
    parked_reason: str | None = Field(
        default=None,
        description="why the upstream was given up on; no worker runs a parked connection"
        " until a POST /connections re-arms it; null when not parked",
    )
    parked_at: str | None = Field(default=None, description="when it was parked")
    failing_since: str | None = Field(
        default=None,
        description="since when the upstream has failed with no message handled; null"
        " when it is not failing",
    )
    seq_gen: int = Field(
        default=0,
        description="the sequence generation last_seq counts in: it goes up by one when"
        " the upstream starts its numbering over (and when a start names another"
        " stream); (seq_gen, seq) names a message downstream",
    )
    sequence_reset: SequenceReset | None = Field(
        default=None,
        description="the upstream's last restart of its numbering on this stream; null: none seen",
    )
    status: Literal["streaming", "connecting", "backing_off", "failed", "pending", "stopped"] = (
        Field(
            description="streaming: connected upstream (quiet or not); connecting: opening"
            " the upstream connection or waiting for the host's connect pacing;"
            " backing_off: waiting after a failed or lost upstream connection; failed:"
            " parked (see parked_reason); pending: started but run by no live worker yet"
            " (unowned, or its owner's session ended); stopped. The first three are the"
            " owner's word, from its checkpoint page: as fresh as CHECKPOINT_SECONDS"
        )
    )
    seconds_since_last_message: float | None = Field(
        description="seconds since the owner last handled a message of it, per its"
        " checkpoint page; null when nothing was handled yet under this owner"
    )
    reconnects: int | None = Field(
        description="upstream connections lost or refused since the current owner took"
        " it; null when no live worker runs it"
    )
    last_error: str | None = Field(
        description="what ended the last upstream connection under this owner (short,"
        " never a URL), or the parked reason when failed; null when none"
    )
    messages_per_second: float | None = Field(
        description="messages handled per second over the owner's last checkpoint"
        " interval, two significant digits; null when no live worker runs it or its"
        " owner has not written a checkpoint page for it yet"
    )
    last_keepalive_sent: str | None = Field(
        default=None,
        description="when the owner last sent the protocol's application-level keepalive"
        " (its spec's keepalive), as of its last checkpoint page; null without one",
    )
    last_keepalive_answered: str | None = Field(
        default=None,
        description="when the upstream last answered it (the keepalive's pong); null when never",
    )


class StartedConnection(ConnectionView):
    outcome: Literal["created", "restarted", "already_started"]


class ConnectionPage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    connections: list[ConnectionView] = Field(
        description="at most `limit`; a page may hold fewer, even none, and still have a next_token"
    )
    next_token: str | None = Field(description="pass back to get the next page; null at the end")


class ErrorBody(BaseModel):
    """Every refusal: a machine-readable code and a sentence for people."""

    model_config = ConfigDict(extra="forbid")

    error: str
    message: str
