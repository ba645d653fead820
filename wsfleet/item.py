"""The connection item as code sees it, decoded from DynamoDB's typed attributes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer

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
    schema.SEQ_RESET_AT_MS,
    schema.SEQ_RESET_FROM,
}


def to_attribute(value: Any) -> Any:
    """One Python value as a DynamoDB typed attribute (``{"S": ...}``, ``{"N": ...}``...)."""
    return _serializer.serialize(value)


def from_attributes(raw: Mapping[str, Any]) -> dict[str, Any]:
    """DynamoDB typed attributes as plain Python values (integral numbers as ``int``)."""
    return {name: _decode(value) for name, value in raw.items()}


def _decode(value: Any) -> Any:
    # Strings and integers are nearly every attribute the fleet reads (every reconcile
    # pass decodes every listed item): they skip the general deserializer, which
    # builds a Decimal for every number.
    if type(value) is dict and len(value) == 1:
        text = value.get("S")
        if type(text) is str:
            return text
        number = value.get("N")
        if type(number) is str and number.isascii() and number.isdigit():
            return int(number)
    return _plain(_deserializer.deserialize(value))


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Binary):
        return bytes(value)  # type: ignore[call-overload]  # the stubs type __bytes__ as str
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


class MalformedItemError(ValueError):
    """An item that cannot be decoded (docs/DESIGN.md §2.2): ``key``
    names it (``<Pk>/<Sk>``), ``problem`` says what is wrong, short and never a value."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


def key_text(raw: Mapping[str, Any]) -> str:
    """``<Pk>/<Sk>`` of a raw item, for logs."""
    return "/".join(
        str(raw.get(name, {}).get("S", "?")) for name in (schema.PARTITION_KEY, schema.SORT_KEY)
    )


def connection_key_text(connection_id: str) -> str:
    """:func:`key_text` of a connection item."""
    return f"{schema.KEY_PREFIX}{connection_id}/{schema.CONNECTION_SORT_KEY}"


INTEGER: Final = "an integer"
STRING: Final = "a string"


class AttributeReader:
    """Reads typed attributes of one item, never raising: an attribute of the wrong
    type reads as missing and is recorded in :attr:`malformed` (name -> what it should
    be); one that is not there at all is recorded in :attr:`absent`."""

    def __init__(self, plain: Mapping[str, Any]) -> None:
        self.plain = plain
        self.absent: set[str] = set()
        self.malformed: dict[str, str] = {}

    def integer(self, name: str) -> int | None:
        value = self.plain.get(name)
        if name not in self.plain:
            self.absent.add(name)
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        self.malformed[name] = INTEGER
        return None

    def text(self, name: str) -> str | None:
        value = self.plain.get(name)
        if name not in self.plain:
            self.absent.add(name)
            return None
        if isinstance(value, str):
            return value
        self.malformed[name] = STRING
        return None


def describe_malformed(what: str, malformed: Mapping[str, str]) -> str | None:
    """``malformed <what>: last_seq is not an integer, ...``; None when nothing is."""
    if not malformed:
        return None
    return f"malformed {what}: " + ", ".join(
        f"{name} is not {kind}" for name, kind in malformed.items()
    )


CONDITION_NUMBERS: Final = frozenset(
    {schema.LEASE_EPOCH, schema.LAST_SEQ, schema.START_GEN, schema.SEQ_GEN}
)
"""The numbers the lease conditions compare; one that is missing is matched as missing
(``attribute_not_exists``), never as its default."""


@dataclass(frozen=True, slots=True)
class ConnectionItem:
    """One row of the connection table (docs/DESIGN.md §2).

    Decoding never raises: an attribute of the wrong type gets its default and is
    recorded in ``malformed`` (such an item cannot be run: it is parked with
    :attr:`problem` as its reason), a missing number of :data:`CONDITION_NUMBERS` gets
    its default and is recorded in ``absent``."""

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
    seq_reset_at_ms: int | None = None
    seq_reset_from: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = frozenset()
    """Which of :data:`CONDITION_NUMBERS` the item does not have (read as 0)."""
    malformed: Mapping[str, str] = field(default_factory=dict)
    """Attributes of the wrong type (read as missing): name -> what it should be."""

    @classmethod
    def from_dynamodb(cls, raw: Mapping[str, Any]) -> ConnectionItem:
        plain = from_attributes(raw)
        read = AttributeReader(plain)
        text, integer = read.text, read.integer
        # Keyword arguments are evaluated in order: absent and malformed come last.
        return cls(
            connection_id=schema.connection_id_of(str(plain[schema.PARTITION_KEY])),
            desired_state=text(schema.DESIRED_STATE) or "",
            ws_url=text(schema.WS_URL) or "",
            lease_owner=text(schema.LEASE_OWNER),
            owner_session_gen=integer(schema.OWNER_SESSION_GEN),
            owner_key=text(schema.OWNER_KEY),
            free_shard=text(schema.FREE_SHARD),
            lease_epoch=integer(schema.LEASE_EPOCH) or 0,
            lease_token=text(schema.LEASE_TOKEN),
            last_seq=integer(schema.LAST_SEQ) or 0,
            start_gen=integer(schema.START_GEN) or 0,
            seq_gen=integer(schema.SEQ_GEN) or 0,
            created_at_ms=integer(schema.CREATED_AT_MS),
            updated_at_ms=integer(schema.UPDATED_AT_MS),
            expires_at=integer(schema.EXPIRES_AT),
            parked_reason=text(schema.PARKED_REASON),
            parked_at_ms=integer(schema.PARKED_AT_MS),
            failing_since_ms=integer(schema.FAILING_SINCE_MS),
            protocol=text(schema.PROTOCOL),
            auth_secret=text(schema.AUTH_SECRET),
            advanced_at_ms=integer(schema.ADVANCED_AT_MS),
            advanced_start_gen=integer(schema.ADVANCED_START_GEN),
            seq_reset_at_ms=integer(schema.SEQ_RESET_AT_MS),
            seq_reset_from=integer(schema.SEQ_RESET_FROM),
            extra={k: v for k, v in plain.items() if k not in _KNOWN},
            absent=frozenset(read.absent & CONDITION_NUMBERS),
            malformed=read.malformed,
        )

    @property
    def started(self) -> bool:
        return self.desired_state == schema.STARTED

    @property
    def parked(self) -> bool:
        """Its upstream was given up on (docs/DESIGN.md §3.7): no worker takes it
        until the router re-arms it with a start."""
        return self.parked_reason is not None or schema.PARKED_REASON in self.malformed

    @property
    def problem(self) -> str | None:
        """Why the item cannot be run (``malformed item: last_seq is not an integer``);
        None when every attribute has its type."""
        return describe_malformed("item", self.malformed)
