"""The connection item as code sees it, decoded from DynamoDB's typed attributes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from wsfleet import schema

_deserializer = TypeDeserializer()
_serializer = TypeSerializer()

_KNOWN = {
    schema.PARTITION_KEY,
    schema.DESIRED_STATE,
    schema.WS_URL,
    schema.SORT_KEY,
    schema.LEASE_OWNER,
    schema.OWNER_SESSION_GEN,
    schema.OWNER_KEY,
    schema.FREE_SHARD,
    schema.LEASE_EPOCH,
    schema.LEASE_TOKEN,
    schema.LAST_SEQ,
    schema.START_GEN,
    schema.SEQ_GEN,
    schema.CREATED_AT_MS,
    schema.UPDATED_AT_MS,
    schema.EXPIRES_AT,
    schema.PARKED_REASON,
    schema.PARKED_AT_MS,
    schema.FAILING_SINCE_MS,
    schema.PROTOCOL,
    schema.AUTH_SECRET,
    schema.ADVANCED_AT_MS,
    schema.ADVANCED_START_GEN,
}


def to_attribute(value: Any) -> Any:
    """One Python value as a DynamoDB typed attribute (``{"S": ...}``, ``{"N": ...}``...)."""
    return _serializer.serialize(value)


def from_attributes(raw: Mapping[str, Any]) -> dict[str, Any]:
    """DynamoDB typed attributes as plain Python values (integral numbers as ``int``)."""
    return {name: _plain(_deserializer.deserialize(value)) for name, value in raw.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class ConnectionItem:
    """One row of the connection table (docs/DESIGN.md §2)."""

    connection_id: str
    desired_state: str
    ws_url: str
    lease_owner: str | None = None
    owner_session_gen: int | None = None
    owner_key: str | None = None
    free_shard: str | None = None
    lease_epoch: int = 0
    lease_token: str | None = None
    last_seq: int = 0
    start_gen: int = 0
    seq_gen: int = 0
    created_at_ms: int | None = None
    updated_at_ms: int | None = None
    expires_at: int | None = None
    parked_reason: str | None = None
    parked_at_ms: int | None = None
    failing_since_ms: int | None = None
    protocol: str | None = None
    """The protocol spec as stored (compact JSON, :mod:`wsfleet.protocol_specs`);
    None: the worker's default protocol."""
    auth_secret: str | None = None
    """The secret reference credentials are read from at connect time (never a
    value, :mod:`wsfleet.secret_refs`); None: no credentials."""
    advanced_at_ms: int | None = None
    advanced_start_gen: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dynamodb(cls, raw: Mapping[str, Any]) -> ConnectionItem:
        plain = from_attributes(raw)
        return cls(
            connection_id=schema.connection_id_of(str(plain[schema.PARTITION_KEY])),
            desired_state=str(plain.get(schema.DESIRED_STATE, "")),
            ws_url=str(plain.get(schema.WS_URL, "")),
            lease_owner=plain.get(schema.LEASE_OWNER),
            owner_session_gen=_opt_int(plain.get(schema.OWNER_SESSION_GEN)),
            owner_key=plain.get(schema.OWNER_KEY),
            free_shard=plain.get(schema.FREE_SHARD),
            lease_epoch=int(plain.get(schema.LEASE_EPOCH, 0)),
            lease_token=plain.get(schema.LEASE_TOKEN),
            last_seq=int(plain.get(schema.LAST_SEQ, 0)),
            start_gen=int(plain.get(schema.START_GEN, 0)),
            seq_gen=int(plain.get(schema.SEQ_GEN, 0)),
            created_at_ms=_opt_int(plain.get(schema.CREATED_AT_MS)),
            updated_at_ms=_opt_int(plain.get(schema.UPDATED_AT_MS)),
            expires_at=_opt_int(plain.get(schema.EXPIRES_AT)),
            parked_reason=plain.get(schema.PARKED_REASON),
            parked_at_ms=_opt_int(plain.get(schema.PARKED_AT_MS)),
            failing_since_ms=_opt_int(plain.get(schema.FAILING_SINCE_MS)),
            protocol=plain.get(schema.PROTOCOL),
            auth_secret=plain.get(schema.AUTH_SECRET),
            advanced_at_ms=_opt_int(plain.get(schema.ADVANCED_AT_MS)),
            advanced_start_gen=_opt_int(plain.get(schema.ADVANCED_START_GEN)),
            extra={k: v for k, v in plain.items() if k not in _KNOWN},
        )

    @property
    def started(self) -> bool:
        return self.desired_state == schema.STARTED

    @property
    def parked(self) -> bool:
        """Its upstream was given up on (docs/DESIGN.md §3.7): no worker takes it
        until the router re-arms it with a start."""
        return self.parked_reason is not None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
