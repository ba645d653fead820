"""An in-memory DynamoDB for the deterministic fleet simulator.

:class:`DynamoDBEngine` holds tables created from the same ``CreateTable`` request
the local stack sends (``local_stack.resources.create_connection_table``): a key
schema and global secondary indexes with their projections (``KEYS_ONLY``,
``INCLUDE``, ``ALL``), sparse where an item lacks an index key. Its one entry point,
:meth:`DynamoDBEngine.call`, takes an operation (``"update_item"``...) with the exact
parameters of a boto3 low-level client (typed attribute values) and the simulated
time, and returns the response boto3 would return (without ``ResponseMetadata``), or
raises the :class:`botocore.exceptions.ClientError` botocore would raise, with the same
``error.response`` (``Error.Code``, ``Error.Message``, ``Item`` after a failed
condition with ``ReturnValuesOnConditionCheckFailure=ALL_OLD``,
``CancellationReasons`` of a cancelled transaction). Messages are DynamoDB Local's;
``tests/sim/test_dynamodb_conformance.py`` runs the same requests against both.

:class:`SimDynamoDBClient` puts the engine behind the boto3 client's method names, so
the shipped stores run on it unchanged.

Eventual consistency is a fault the caller sets per call. Every item keeps the
versions written in the last ``history_seconds`` (and the one before them), each with
the time it was written. ``stale_by`` makes a read that is not ``ConsistentRead``
(``get_item``, ``batch_get_item``, a query or scan of the table) answer from the table
as it was ``stale_by`` seconds ago; ``index_lag`` makes a query or scan of a global
secondary index answer from the index as it was ``index_lag`` seconds ago. A stale
answer is always one the table really held; strongly consistent reads always see the
latest write.

Deterministic: no clock, no randomness, nothing ordered by string hashing. Calls must
come in order of time. A scan visits partitions in the order of the MD5 of their key
(as DynamoDB visits them by a hash, unlike key order; the order differs from DynamoDB
Local's), items of one partition in sort key order.

Not simulated: capacity, throttling and consumed capacity
(``ReturnConsumedCapacity`` other than ``NONE`` raises NotImplementedError), the 1 MB
page limit, ``UnprocessedKeys`` (always empty), TTL expiry, streams, local secondary
indexes, parallel scans, ``batch_write_item``, ``transact_get_items``, PartiQL, the
legacy parameters (``AttributesToGet``, ``KeyConditions``, ``Expected``...),
transaction conflicts (calls never overlap), and nested paths or bare attribute names
in expressions. What DynamoDB may accept but the engine does not evaluate raises
NotImplementedError rather than answering differently (docs/TESTING.md, "The
simulated DynamoDB").
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Final

import botocore.session
from botocore import xform_name
from botocore.errorfactory import ClientExceptionsFactory
from botocore.exceptions import ClientError, ParamValidationError
from botocore.model import ServiceModel
from botocore.validate import ParamValidator

from sim import expressions as ex
from sim.attributes import (
    MAX_ITEM_BYTES,
    Attr,
    InvalidValueError,
    Item,
    canonical_item,
    copy_item,
    copy_value,
    item_size,
    ordered,
    type_of,
    value_size,
)

IDEMPOTENCY_WINDOW_S: Final = 600.0
"""How long a transaction's ``ClientRequestToken`` is remembered."""
MAX_TRANSACTION_ITEMS: Final = 100
MAX_BATCH_GET_KEYS: Final = 100
MAX_HASH_KEY_BYTES: Final = 2048
MAX_RANGE_KEY_BYTES: Final = 1024
_TOMBSTONE_SWEEP_EVERY: Final = 1024
"""Writes between two sweeps of deleted items whose history is over."""

_NO_RANGE: Final[tuple[()]] = ()
"""The sort key value of a table or index without a sort key."""

Key = tuple[Any, ...]
"""A table key as Python orders it: (partition value, sort value or ())."""
Entry = tuple[Any, Key]
"""One entry of a sorted partition: (sort value or (), table key)."""


# --- botocore: operation names, exception classes, parameter checks --------------------------


@lru_cache(maxsize=1)
def _service_model() -> ServiceModel:
    model: ServiceModel = botocore.session.get_session().get_service_model("dynamodb")
    return model


@lru_cache(maxsize=1)
def client_exceptions() -> Any:
    """The exception classes of a DynamoDB client (``.ConditionalCheckFailedException``
    ...), as ``client.exceptions`` has them."""
    return ClientExceptionsFactory().create_client_exceptions(_service_model())


@lru_cache(maxsize=1)
def _operation_names() -> dict[str, str]:
    return {xform_name(name): name for name in _service_model().operation_names}


def operation_name(operation: str) -> str:
    """``update_item`` -> ``UpdateItem``."""
    return _operation_names()[operation]


def client_error(
    code: str, message: str, operation: str, extra: Mapping[str, Any] | None = None
) -> ClientError:
    """The ClientError (the modeled subclass where DynamoDB's model has one) botocore
    raises for this error of this operation."""
    response: dict[str, Any] = {
        "Error": {"Message": message, "Code": code},
        "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}, "RetryAttempts": 0},
    }
    if extra:
        response.update(extra)
    error_class = client_exceptions().from_code(code)
    error: ClientError = error_class(response, operation_name(operation))
    return error


class _RefusedError(Exception):
    """A DynamoDB error answer, raised inside the engine and turned into a ClientError
    at :meth:`DynamoDBEngine.call`."""

    def __init__(self, code: str, message: str, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.extra = extra


def _invalid(message: str) -> _RefusedError:
    return _RefusedError("ValidationException", message)


_NO_TABLE: Final = "Cannot do operations on a non-existent table"
_CONDITION_FAILED: Final = "The conditional request failed"


# --- table definitions -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexDefinition:
    name: str
    hash_key: str
    range_key: str | None
    projection_type: str
    """``KEYS_ONLY``, ``INCLUDE`` or ``ALL``."""
    projected: frozenset[str] | None
    """Every attribute the index holds (keys of the table and of the index, and the
    ``NonKeyAttributes``); None for ``ALL``."""

    @property
    def projected_names(self) -> tuple[str, ...] | None:
        """:attr:`projected` in a fixed order (None for ``ALL``)."""
        return None if self.projected is None else tuple(sorted(self.projected))


@dataclass(frozen=True, slots=True)
class TableDefinition:
    name: str
    hash_key: str
    range_key: str | None
    attribute_types: Mapping[str, str]
    indexes: tuple[IndexDefinition, ...]
    create_request: Mapping[str, Any]

    @property
    def key_attributes(self) -> tuple[str, ...]:
        return (self.hash_key,) if self.range_key is None else (self.hash_key, self.range_key)

    @classmethod
    def from_create_table(cls, params: Mapping[str, Any]) -> TableDefinition:
        """From the parameters of a ``create_table`` call."""
        if params.get("LocalSecondaryIndexes"):
            raise NotImplementedError("local secondary indexes are not simulated")
        types = {d["AttributeName"]: d["AttributeType"] for d in params["AttributeDefinitions"]}
        hash_key, range_key = _key_schema(params["KeySchema"])
        table_keys = {hash_key} | ({range_key} if range_key else set())
        indexes = []
        for index in params.get("GlobalSecondaryIndexes", []):
            index_hash, index_range = _key_schema(index["KeySchema"])
            projection = index.get("Projection", {})
            kind = projection.get("ProjectionType", "ALL")
            keys = table_keys | {index_hash} | ({index_range} if index_range else set())
            projected: frozenset[str] | None
            if kind == "ALL":
                projected = None
            elif kind == "INCLUDE":
                projected = frozenset(keys | set(projection.get("NonKeyAttributes", [])))
            else:
                projected = frozenset(keys)
            indexes.append(
                IndexDefinition(index["IndexName"], index_hash, index_range, kind, projected)
            )
        return cls(params["TableName"], hash_key, range_key, types, tuple(indexes), dict(params))

    def describe(self, item_count: int) -> dict[str, Any]:
        """A ``DescribeTable`` answer (the parts a caller reads)."""
        request = self.create_request
        description: dict[str, Any] = {
            "TableName": self.name,
            "TableStatus": "ACTIVE",
            "KeySchema": [dict(k) for k in request["KeySchema"]],
            "AttributeDefinitions": [dict(d) for d in request["AttributeDefinitions"]],
            "ItemCount": item_count,
            "BillingModeSummary": {"BillingMode": request.get("BillingMode", "PROVISIONED")},
        }
        if request.get("GlobalSecondaryIndexes"):
            description["GlobalSecondaryIndexes"] = [
                {
                    "IndexName": index["IndexName"],
                    "KeySchema": [dict(k) for k in index["KeySchema"]],
                    "Projection": dict(index.get("Projection", {})),
                    "IndexStatus": "ACTIVE",
                }
                for index in request["GlobalSecondaryIndexes"]
            ]
        return description


def _key_schema(schema: Sequence[Mapping[str, str]]) -> tuple[str, str | None]:
    by_type = {k["KeyType"]: k["AttributeName"] for k in schema}
    return by_type["HASH"], by_type.get("RANGE")


# --- stored items ----------------------------------------------------------------------------


class _Record:
    """One item's versions, oldest first: (time written, item or None once deleted)."""

    __slots__ = ("size", "versions")

    def __init__(self) -> None:
        self.versions: list[tuple[float, Item | None]] = []
        self.size = 0
        """Bytes of the latest version toward the item size limit."""

    @property
    def latest(self) -> Item | None:
        return self.versions[-1][1] if self.versions else None

    def as_of(self, moment: float) -> Item | None:
        versions = self.versions
        index = bisect.bisect_right(versions, moment, key=_written_at) - 1
        return None if index < 0 else versions[index][1]

    def trim(self, horizon: float) -> None:
        """Drop versions no read at or after ``horizon`` can see (keeping the newest
        one written at or before it)."""
        versions = self.versions
        drop = 0
        last = len(versions) - 1
        while drop < last and versions[drop + 1][0] <= horizon:
            drop += 1
        if drop:
            del versions[:drop]


def _written_at(version: tuple[float, Item | None]) -> float:
    return version[0]


class _Index:
    __slots__ = ("definition", "partitions")

    def __init__(self, definition: IndexDefinition) -> None:
        self.definition = definition
        self.partitions: dict[Any, list[Entry]] = {}

    def place(self, item: Item | None, key: Key) -> tuple[Any, Entry] | None:
        """Where the item sits in the index: (partition value, entry); None when it
        lacks an index key (a sparse index leaves it out)."""
        if item is None:
            return None
        definition = self.definition
        hash_value = item.get(definition.hash_key)
        if hash_value is None:
            return None
        if definition.range_key is None:
            return ordered(hash_value), (_NO_RANGE, key)
        range_value = item.get(definition.range_key)
        if range_value is None:
            return None
        return ordered(hash_value), (ordered(range_value), key)

    @property
    def key_names(self) -> tuple[str, ...]:
        definition = self.definition
        if definition.range_key is None:
            return (definition.hash_key,)
        return (definition.hash_key, definition.range_key)


def _insert(partitions: dict[Any, list[Entry]], partition: Any, entry: Entry) -> None:
    entries = partitions.get(partition)
    if entries is None:
        partitions[partition] = [entry]
    else:
        bisect.insort(entries, entry)


def _remove(partitions: dict[Any, list[Entry]], partition: Any, entry: Entry) -> None:
    entries = partitions[partition]
    index = bisect.bisect_left(entries, entry)
    del entries[index]
    if not entries:
        del partitions[partition]


class _Table:
    def __init__(self, definition: TableDefinition) -> None:
        self.definition = definition
        self.records: dict[Key, _Record] = {}
        self.partitions: dict[Any, list[Entry]] = {}
        self.indexes = {d.name: _Index(d) for d in definition.indexes}
        self.log: deque[tuple[float, Key]] = deque()
        """(time, key) of every write in the history window, oldest first."""
        self.deleted: dict[Key, float] = {}
        self.live = 0
        self.writes = 0

    # --- keys and checked items ------------------------------------------------------

    def key_of(self, item: Mapping[str, Attr]) -> Key:
        definition = self.definition
        hash_value = ordered(item[definition.hash_key])
        if definition.range_key is None:
            return (hash_value, _NO_RANGE)
        return (hash_value, ordered(item[definition.range_key]))

    def key_attributes(self, item: Mapping[str, Attr]) -> Item:
        return {name: item[name] for name in self.definition.key_attributes}

    def checked_key(self, raw: Any) -> tuple[Key, Item]:
        """A request's ``Key``, checked: the table key and the key as an item."""
        names = self.definition.key_attributes
        if not isinstance(raw, Mapping) or len(raw) != len(names):
            raise _invalid("The number of conditions on the keys is invalid")
        if any(name not in raw for name in names):
            raise _invalid("One of the required keys was not given a value")
        try:
            key_item = canonical_item(raw)
        except InvalidValueError as error:
            raise _invalid(error.detail) from None
        self._check_key_values(key_item)
        return self.key_of(key_item), key_item

    def _check_key_values(self, item: Mapping[str, Attr]) -> None:
        definition = self.definition
        for name, limit in (
            (definition.hash_key, MAX_HASH_KEY_BYTES),
            (definition.range_key, MAX_RANGE_KEY_BYTES),
        ):
            if name is None:
                continue
            value = item[name]
            kind = type_of(value)
            if kind != definition.attribute_types.get(name):
                raise _invalid("One or more parameter values were invalid: Type mismatch for key")
            content = value[kind]
            if kind in ("S", "B") and not content:
                raise _invalid(
                    "One or more parameter values are not valid. The AttributeValue for a key "
                    f"attribute cannot contain an empty string value. Key: {name}"
                )
            if _key_size(value) > limit:
                raise _invalid(
                    "Hash primary key values must be under 2048 bytes, and range primary key "
                    "values must be under 1024 bytes"
                )

    def checked_item(self, raw: Any) -> Item:
        """A ``PutItem`` item, checked and canonical."""
        try:
            item = canonical_item(raw)
        except InvalidValueError as error:
            raise _invalid(error.detail) from None
        if any(name not in item for name in self.definition.key_attributes):
            raise _invalid("One of the required keys was not given a value")
        self._check_key_values(item)
        self.check_index_keys(item, updating=False)
        if item_size(item) > MAX_ITEM_BYTES:
            raise _invalid("Item size has exceeded the maximum allowed size")
        return item

    def size_of(self, key: Key) -> int:
        record = self.records.get(key)
        return 0 if record is None or record.latest is None else record.size

    def check_index_keys(
        self, item: Item, *, updating: bool, only: Sequence[str] | None = None
    ) -> None:
        """The index key attributes of an item to write (``only``: of these names)."""
        types = self.definition.attribute_types
        for index in self.definition.indexes:
            for name, limit in (
                (index.hash_key, MAX_HASH_KEY_BYTES),
                (index.range_key, MAX_RANGE_KEY_BYTES),
            ):
                if name is None or name not in item or (only is not None and name not in only):
                    continue
                value = item[name]
                kind = type_of(value)
                if kind != types.get(name):
                    raise _invalid(
                        "One or more parameter values were invalid: Type mismatch for Index Key"
                    )
                content = value[kind]
                if kind in ("S", "B") and not content:
                    if updating:
                        raise _invalid(
                            "One or more parameter values are not valid. The update expression "
                            "attempted to update a secondary index key to a value that is not "
                            "supported. The AttributeValue for a key attribute cannot contain "
                            "an empty string value."
                        )
                    raise _invalid(
                        "One or more parameter values are not valid. A value specified for a "
                        "secondary index key is not supported. The AttributeValue for a key "
                        "attribute cannot contain an empty string value. IndexName: "
                        f"{index.name}, IndexKey: {name}"
                    )
                if _key_size(value) > limit:
                    raise _invalid("One or more parameter values were invalid: Size limit exceeded")

    # --- reading ---------------------------------------------------------------------

    def latest(self, key: Key) -> Item | None:
        record = self.records.get(key)
        return None if record is None else record.latest

    def read(self, key: Key, moment: float | None) -> Item | None:
        record = self.records.get(key)
        if record is None:
            return None
        return record.latest if moment is None else record.as_of(moment)

    def changed_since(self, moment: float) -> set[Key]:
        changed: set[Key] = set()
        for written, key in reversed(self.log):
            if written <= moment:
                break
            changed.add(key)
        return changed

    def entries(self, index: _Index | None, partition: Any, moment: float | None) -> list[Entry]:
        """The sorted entries of one partition of the table or of an index, as of
        ``moment`` (None: now)."""
        partitions = self.partitions if index is None else index.partitions
        current = partitions.get(partition, [])
        if moment is None:
            return current
        changed = self.changed_since(moment)
        if not changed:
            return current
        entries = [entry for entry in current if entry[1] not in changed]
        for key in changed:
            placed = self._place(index, self.read(key, moment), key)
            if placed is not None and placed[0] == partition:
                entries.append(placed[1])
        entries.sort()
        return entries

    def all_entries(self, index: _Index | None, moment: float | None) -> list[tuple[Any, Entry]]:
        """Every (partition, entry) of the table or of an index as of ``moment``, in
        scan order."""
        placed_all: list[tuple[Any, Entry]] = []
        if moment is None:
            partitions = self.partitions if index is None else index.partitions
            for partition, entries in partitions.items():
                placed_all += [(partition, entry) for entry in entries]
        else:
            for key, record in self.records.items():
                placed = self._place(index, record.as_of(moment), key)
                if placed is not None:
                    placed_all.append(placed)
        placed_all.sort(key=lambda p: (_scan_hash(p[0]), p[1]))
        return placed_all

    def _place(self, index: _Index | None, item: Item | None, key: Key) -> tuple[Any, Entry] | None:
        if index is not None:
            return index.place(item, key)
        if item is None:
            return None
        return key[0], (key[1], key)

    # --- writing ---------------------------------------------------------------------

    def write(
        self, key: Key, new: Item | None, now: float, history: float, size: int | None = None
    ) -> None:
        """Write the item's next version (None: delete it) at ``now``; ``size``: its
        size when the caller knows it."""
        record = self.records.get(key)
        if record is None:
            record = self.records[key] = _Record()
        old = record.latest
        record.size = 0 if new is None else (item_size(new) if size is None else size)
        if old is None and new is None:
            return
        if old is None:
            _insert(self.partitions, key[0], (key[1], key))
            self.live += 1
        elif new is None:
            _remove(self.partitions, key[0], (key[1], key))
            self.live -= 1
        for index in self.indexes.values():
            if (
                old is not None
                and new is not None
                and all(old.get(name) is new.get(name) for name in index.key_names)
            ):
                continue  # the same key values (an update leaves untouched ones as they were)
            before, after = index.place(old, key), index.place(new, key)
            if before == after:
                continue
            if before is not None:
                _remove(index.partitions, *before)
            if after is not None:
                _insert(index.partitions, *after)
        versions = record.versions
        if versions and versions[-1][0] == now:
            versions[-1] = (now, new)  # no read can see a version replaced at the same instant
        else:
            versions.append((now, new))
        horizon = now - history
        record.trim(horizon)
        if new is None:
            self.deleted[key] = now
        else:
            self.deleted.pop(key, None)
        log = self.log
        log.append((now, key))
        while log and log[0][0] < horizon:
            log.popleft()
        self.writes += 1
        if self.writes % _TOMBSTONE_SWEEP_EVERY == 0:
            self.sweep(horizon)

    def sweep(self, horizon: float) -> None:
        """Forget deleted items no read within the history can see any more."""
        for key, deleted_at in list(self.deleted.items()):
            if deleted_at < horizon:
                del self.records[key]
                del self.deleted[key]


@lru_cache(maxsize=65536)
def _scan_hash(partition: Any) -> bytes:
    if isinstance(partition, bytes):
        raw = partition
    elif isinstance(partition, Decimal):
        raw = format(partition, "f").encode()
    else:
        raw = str(partition).encode("utf-8")
    return hashlib.md5(raw, usedforsecurity=False).digest()


# --- a request's expressions -----------------------------------------------------------------


@dataclass(slots=True)
class _Expressions:
    names: dict[str, str]
    values: dict[str, Attr]
    condition: ex.Condition | None = None
    update: ex.Update | None = None
    projection: list[str] | None = None
    key_condition: ex.KeyCondition | None = None
    filter: ex.Condition | None = None
    touched: list[str] | None = None

    def holds(self, item: Item | None) -> bool:
        if self.condition is None:
            return True
        return self.condition.test({} if item is None else item, self.names, self.values)

    def filter_names(self) -> list[str]:
        if self.filter is None:
            return []
        return [self.names[p] for p in self.filter.placeholders if p.startswith("#")]


def _expressions(params: Mapping[str, Any]) -> _Expressions:
    """Check a request's expressions against its names and values, in DynamoDB's order:
    values, syntax and placeholders, overlapping paths, unused placeholders."""
    given_names = params.get("ExpressionAttributeNames")
    given_values = params.get("ExpressionAttributeValues")
    if given_names is not None and not given_names:
        raise _invalid("ExpressionAttributeNames must not be empty")
    if given_values is not None and not given_values:
        raise _invalid("ExpressionAttributeValues must not be empty")
    values = ex.validate_values(given_values)
    names = ex.validate_names(given_names)
    found = _Expressions(names, values)
    parsed: list[Any] = []
    if (text := params.get("ConditionExpression")) is not None:
        found.condition = ex.parse_condition(text, "ConditionExpression")
        parsed.append(found.condition)
    if (text := params.get("UpdateExpression")) is not None:
        found.update = ex.parse_update(text)
        parsed.append(found.update)
    if (text := params.get("KeyConditionExpression")) is not None:
        found.key_condition = ex.parse_key_condition(text)
        parsed.append(found.key_condition)
    if (text := params.get("FilterExpression")) is not None:
        found.filter = ex.parse_condition(text, "FilterExpression")
        parsed.append(found.filter)
    projection = None
    if (text := params.get("ProjectionExpression")) is not None:
        projection = ex.parse_projection(text)
        parsed.append(projection)
    if not parsed:
        if given_names is not None:
            raise _invalid("ExpressionAttributeNames can only be specified when using expressions")
        if given_values is not None:
            raise _invalid("ExpressionAttributeValues can only be specified when using expressions")
        return found
    for expression in parsed:
        expression.bind(names, values)
    if found.update is not None:
        found.touched = found.update.touched(names)
    if projection is not None:
        found.projection = projection.attributes(names)
    ex.check_all_used(parsed, names, values)
    return found


def _project(item: Item, attributes: list[str] | None) -> Item:
    if attributes is None:
        return copy_item(item)
    return {name: copy_value(item[name]) for name in attributes if name in item}


def _refuse_legacy(params: Mapping[str, Any], *names: str) -> None:
    for name in names:
        if name in params:
            raise NotImplementedError(f"the legacy parameter {name} is not simulated")


def _refuse_capacity(params: Mapping[str, Any]) -> None:
    if params.get("ReturnConsumedCapacity", "NONE") != "NONE":
        raise NotImplementedError("consumed capacity is not simulated")


def _return_values(params: Mapping[str, Any], allowed: tuple[str, ...]) -> str:
    chosen = params.get("ReturnValues", "NONE")
    if chosen not in allowed:
        raise _invalid("Return values set to invalid value")
    return str(chosen)


def _on_failure(params: Mapping[str, Any]) -> str:
    chosen = params.get("ReturnValuesOnConditionCheckFailure", "NONE")
    if chosen not in ("ALL_OLD", "NONE"):
        raise _invalid(
            f"1 validation error detected: Value '{chosen}' at "
            "'returnValuesOnConditionCheckFailure' failed to satisfy constraint: Member must "
            "satisfy enum value set: [ALL_OLD, NONE]"
        )
    return str(chosen)


def _condition_failed(old: Item | None, on_failure: str) -> _RefusedError:
    extra = {"Item": copy_item(old)} if on_failure == "ALL_OLD" and old is not None else None
    return _RefusedError("ConditionalCheckFailedException", _CONDITION_FAILED, extra)


def _fingerprint(value: Any) -> str:
    def encode(thing: Any) -> Any:
        if isinstance(thing, bytes | bytearray):
            return {"__bytes__": base64.b64encode(bytes(thing)).decode()}
        raise TypeError(f"cannot fingerprint {type(thing).__name__}")

    return json.dumps(value, sort_keys=True, default=encode)


@dataclass(frozen=True, slots=True)
class _Moment:
    """The time of a call and the faults set for it."""

    now: float
    stale_by: float
    index_lag: float

    def table_view(self, consistent: bool) -> float | None:
        """The moment a table read answers from (None: the latest)."""
        if consistent or self.stale_by <= 0:
            return None
        return self.now - self.stale_by

    def index_view(self) -> float | None:
        return None if self.index_lag <= 0 else self.now - self.index_lag


@dataclass(slots=True)
class _TransactionStep:
    operation: str
    table: _Table
    key: Key
    key_item: Item
    body: Mapping[str, Any]
    expressions: _Expressions
    on_failure: str
    item: Item | None = None
    """The item a Put writes."""


# --- the engine ------------------------------------------------------------------------------


class DynamoDBEngine:
    """Tables in memory, answering boto3 low-level client calls (see the module)."""

    def __init__(self, *, history_seconds: float = 10.0) -> None:
        if history_seconds < 0:
            raise ValueError("history_seconds must not be negative")
        self.history_seconds = history_seconds
        self._tables: dict[str, _Table] = {}
        self._tokens: dict[str, tuple[float, str]] = {}
        self._token_order: deque[tuple[float, str]] = deque()
        self._last_now = float("-inf")
        self.calls: Counter[str] = Counter()
        """Calls so far, by operation."""
        self._handlers: dict[str, Callable[[Mapping[str, Any], _Moment], dict[str, Any]]] = {
            "create_table": self._create_table,
            "delete_table": self._delete_table,
            "describe_table": self._describe_table,
            "list_tables": self._list_tables,
            "get_item": self._get_item,
            "put_item": self._put_item,
            "update_item": self._update_item,
            "delete_item": self._delete_item,
            "query": self._query,
            "scan": self._scan,
            "batch_get_item": self._batch_get_item,
            "transact_write_items": self._transact_write_items,
        }

    @property
    def operations(self) -> tuple[str, ...]:
        return tuple(self._handlers)

    def call(
        self,
        operation: str,
        params: Mapping[str, Any],
        *,
        now: float,
        stale_by: float = 0.0,
        index_lag: float = 0.0,
    ) -> dict[str, Any]:
        """Run one client call at simulated time ``now`` (seconds); ``stale_by`` and
        ``index_lag`` (seconds, at most ``history_seconds``) are the eventual
        consistency faults of this call (see the module)."""
        handler = self._handlers.get(operation)
        if handler is None:
            raise NotImplementedError(f"{operation} is not simulated")
        if now < self._last_now:
            raise ValueError(f"time went backwards: {now} after {self._last_now}")
        for name, lag in (("stale_by", stale_by), ("index_lag", index_lag)):
            if not 0 <= lag <= self.history_seconds:
                raise ValueError(
                    f"{name}={lag} is outside 0 .. history_seconds={self.history_seconds}"
                )
        self._last_now = now
        self.calls[operation] += 1
        try:
            return handler(params, _Moment(now, stale_by, index_lag))
        except _RefusedError as refused:
            raise client_error(refused.code, refused.message, operation, refused.extra) from None
        except ex.ExpressionError as error:
            raise client_error("ValidationException", error.message, operation) from None

    # --- inspection --------------------------------------------------------------------

    def items(self, table_name: str) -> list[Item]:
        """Every item of a table now, copies, in key order (for checks and tests)."""
        table = self._tables[table_name]
        found = [(key, record.latest) for key, record in table.records.items() if record.latest]
        found.sort(key=lambda pair: pair[0])
        return [copy_item(item) for _, item in found]

    def table_names(self) -> list[str]:
        return sorted(self._tables)

    def versions_kept(self, table_name: str) -> int:
        """Item versions the table holds, deleted items' included (the history's cost)."""
        return sum(len(r.versions) for r in self._tables[table_name].records.values())

    # --- tables --------------------------------------------------------------------------

    def _table(self, params: Mapping[str, Any]) -> _Table:
        table = self._tables.get(params.get("TableName", ""))
        if table is None:
            raise _RefusedError("ResourceNotFoundException", _NO_TABLE)
        return table

    def _create_table(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        if params["TableName"] in self._tables:
            raise _RefusedError("ResourceInUseException", "Cannot create preexisting table")
        definition = TableDefinition.from_create_table(params)
        self._tables[definition.name] = _Table(definition)
        return {"TableDescription": definition.describe(0)}

    def _delete_table(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        del self._tables[table.definition.name]
        return {"TableDescription": table.definition.describe(table.live)}

    def _describe_table(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        return {"Table": table.definition.describe(table.live)}

    def _list_tables(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        return {"TableNames": sorted(self._tables)}

    # --- single items -------------------------------------------------------------------

    def _get_item(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        _refuse_legacy(params, "AttributesToGet")
        _refuse_capacity(params)
        expressions = _expressions(params)
        key, _ = table.checked_key(params.get("Key"))
        item = table.read(key, moment.table_view(bool(params.get("ConsistentRead"))))
        if item is None:
            return {}
        return {"Item": _project(item, expressions.projection)}

    def _put_item(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        _refuse_legacy(params, "Expected", "ConditionalOperator")
        _refuse_capacity(params)
        returned = _return_values(params, ("NONE", "ALL_OLD"))
        on_failure = _on_failure(params)
        expressions = _expressions(params)
        item = table.checked_item(params.get("Item"))
        key = table.key_of(item)
        old = table.latest(key)
        if not expressions.holds(old):
            raise _condition_failed(old, on_failure)
        table.write(key, item, moment.now, self.history_seconds)
        if returned == "ALL_OLD" and old is not None:
            return {"Attributes": copy_item(old)}
        return {}

    def _update_item(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        _refuse_legacy(params, "AttributeUpdates", "Expected", "ConditionalOperator")
        _refuse_capacity(params)
        returned = _return_values(
            params, ("NONE", "ALL_OLD", "UPDATED_OLD", "ALL_NEW", "UPDATED_NEW")
        )
        on_failure = _on_failure(params)
        expressions = _expressions(params)
        key, key_item = table.checked_key(params.get("Key"))
        touched = expressions.touched or []
        ex.check_key_update(touched, table.definition.key_attributes)
        old = table.latest(key)
        if not expressions.holds(old):
            raise _condition_failed(old, on_failure)
        new, size = self._updated(table, expressions, old, key_item, table.size_of(key))
        table.write(key, new, moment.now, self.history_seconds, size)
        if returned == "ALL_OLD":
            return {} if old is None else {"Attributes": copy_item(old)}
        if returned == "ALL_NEW":
            return {"Attributes": copy_item(new)}
        if returned in ("UPDATED_OLD", "UPDATED_NEW"):
            source = (old or {}) if returned == "UPDATED_OLD" else new
            changed = {name: copy_value(source[name]) for name in touched if name in source}
            return {"Attributes": changed} if changed else {}
        return {}

    @staticmethod
    def _updated(
        table: _Table, expressions: _Expressions, old: Item | None, key_item: Item, old_size: int
    ) -> tuple[Item, int]:
        """The item after an update and its size (counted from the old size and the
        attributes the update touched)."""
        if old is None:
            base, size = dict(key_item), item_size(key_item)
        else:
            base, size = old, old_size
        if expressions.update is None:
            return dict(base), size
        new = expressions.update.apply(base, expressions.names, expressions.values)
        touched = expressions.touched or []
        table.check_index_keys(new, updating=True, only=touched)
        for name in touched:
            before, after = base.get(name), new.get(name)
            if before is not None:
                size -= len(name.encode("utf-8")) + value_size(before)
            if after is not None:
                size += len(name.encode("utf-8")) + value_size(after)
        if size > MAX_ITEM_BYTES:
            raise _invalid("Item size to update has exceeded the maximum allowed size")
        return new, size

    def _delete_item(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        _refuse_legacy(params, "Expected", "ConditionalOperator")
        _refuse_capacity(params)
        returned = _return_values(params, ("NONE", "ALL_OLD"))
        on_failure = _on_failure(params)
        expressions = _expressions(params)
        key, _ = table.checked_key(params.get("Key"))
        old = table.latest(key)
        if not expressions.holds(old):
            raise _condition_failed(old, on_failure)
        if old is not None:
            table.write(key, None, moment.now, self.history_seconds)
        if returned == "ALL_OLD" and old is not None:
            return {"Attributes": copy_item(old)}
        return {}

    # --- queries and scans -------------------------------------------------------------------

    def _index(self, table: _Table, params: Mapping[str, Any]) -> _Index | None:
        name = params.get("IndexName")
        if name is None:
            return None
        index = table.indexes.get(name)
        if index is None:
            raise _invalid(f"The table does not have the specified index: {name}")
        if params.get("ConsistentRead"):
            raise _invalid("Consistent reads are not supported on global secondary indexes")
        return index

    @staticmethod
    def _select(params: Mapping[str, Any], index: _Index | None, expressions: _Expressions) -> str:
        select = params.get("Select")
        if select is None:
            if expressions.projection is not None:
                return "SPECIFIC_ATTRIBUTES"
            return "ALL_ATTRIBUTES" if index is None else "ALL_PROJECTED_ATTRIBUTES"
        if (
            select == "ALL_ATTRIBUTES"
            and index is not None
            and index.definition.projection_type != "ALL"
        ):
            raise _invalid(
                "One or more parameter values were invalid: Select type ALL_ATTRIBUTES is "
                f"not supported for global secondary index {index.definition.name} because "
                "its projection type is not ALL"
            )
        if select == "SPECIFIC_ATTRIBUTES" and expressions.projection is None:
            raise NotImplementedError("Select=SPECIFIC_ATTRIBUTES without a projection")
        if select != "SPECIFIC_ATTRIBUTES" and expressions.projection is not None:
            raise _invalid(
                "Cannot specify the AttributesToGet or ProjectionExpression when choosing to "
                f"get {select}"
            )
        return str(select)

    @staticmethod
    def _check_index_projection(index: _Index | None, expressions: _Expressions) -> None:
        if index is None or index.definition.projected is None:
            return
        projected = index.definition.projected
        if expressions.projection is not None:
            missing = [a for a in expressions.projection if a not in projected]
            if missing:
                raise _invalid(
                    "One or more parameter values were invalid: Global secondary index "
                    f"{index.definition.name} does not project [{', '.join(missing)}]"
                )
        missing = [a for a in dict.fromkeys(expressions.filter_names()) if a not in projected]
        if missing:
            raise _invalid(
                "One or more parameter values were invalid: Secondary index "
                f"{index.definition.name} does not project one or more filter attributes: "
                f"[{', '.join(missing)}]"
            )

    def _start_entry(self, table: _Table, index: _Index | None, raw: Any) -> tuple[Any, Entry]:
        """An ``ExclusiveStartKey``: (partition, entry) of the position it names."""
        definition = table.definition
        names = list(definition.key_attributes)
        if index is not None:
            names += [
                n
                for n in (index.definition.hash_key, index.definition.range_key)
                if n is not None and n not in names
            ]
        if not isinstance(raw, Mapping):
            raise _invalid("The provided starting key is invalid")
        if index is None and len(raw) != len(names):
            raise _invalid("Exclusive Start Key must have same size as table's key schema")
        if set(raw) != set(names):
            raise _invalid("The provided starting key is invalid")
        try:
            start = canonical_item(raw)
        except InvalidValueError as error:
            raise _invalid(f"The provided starting key is invalid: {error.detail}") from None
        types = definition.attribute_types
        if any(type_of(start[n]) != types.get(n) for n in names):
            raise _invalid("The provided starting key is invalid")
        key = table.key_of(start)
        if index is None:
            return key[0], (key[1], key)
        placed = index.place(start, key)
        assert placed is not None
        return placed

    def _query(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        _refuse_legacy(
            params, "KeyConditions", "QueryFilter", "AttributesToGet", "ConditionalOperator"
        )
        _refuse_capacity(params)
        index = self._index(table, params)
        if params.get("KeyConditionExpression") is None:
            raise _invalid(
                "Either the KeyConditions or KeyConditionExpression parameter must be "
                "specified in the request."
            )
        expressions = _expressions(params)
        select = self._select(params, index, expressions)
        self._check_index_projection(index, expressions)
        hash_key = table.definition.hash_key if index is None else index.definition.hash_key
        range_key = table.definition.range_key if index is None else index.definition.range_key
        assert expressions.key_condition is not None
        partition, bounds = self._key_condition(
            table, expressions.key_condition, expressions, hash_key, range_key
        )
        if index is None:
            moment_seen = moment.table_view(bool(params.get("ConsistentRead")))
        else:
            moment_seen = moment.index_view()
        entries = table.entries(index, partition, moment_seen)
        low, high = bounds(entries)
        forward = params.get("ScanIndexForward", True)
        if "ExclusiveStartKey" in params:
            start_partition, start = self._start_entry(table, index, params["ExclusiveStartKey"])
            if start_partition != partition or bounds([start]) != (0, 1):
                raise _invalid("The provided starting key does not match the range key predicate")
            if forward:
                low = max(low, bisect.bisect_right(entries, start))
            else:
                high = min(high, bisect.bisect_left(entries, start))
        positions: Iterator[int] = (
            iter(range(low, high)) if forward else iter(range(high - 1, low - 1, -1))
        )
        return self._page(
            table, index, entries, positions, moment_seen, params, expressions, select
        )

    def _key_condition(
        self,
        table: _Table,
        condition: ex.KeyCondition,
        expressions: _Expressions,
        hash_key: str,
        range_key: str | None,
    ) -> tuple[Any, Callable[[list[Entry]], tuple[int, int]]]:
        names, values = expressions.names, expressions.values
        by_attribute: dict[str, ex.KeyTerm] = {}
        for term in condition.terms:
            name = names[term.placeholder]
            if name in by_attribute:
                raise _invalid("KeyConditionExpressions must only contain one condition per key")
            by_attribute[name] = term
        hash_term = by_attribute.get(hash_key)
        if hash_term is None:
            raise _invalid("Query condition missed key schema element")
        if hash_term.operator != "=":
            raise _invalid("Query key condition not supported")
        range_term = by_attribute.get(range_key) if range_key is not None else None
        if len(by_attribute) != 1 + (range_term is not None):
            raise _invalid("Query condition missed key schema element")
        types = table.definition.attribute_types
        for term in condition.terms:
            wanted = types.get(names[term.placeholder])
            if any(type_of(values[v]) != wanted for v in term.values):
                raise _invalid(
                    "One or more parameter values were invalid: Condition parameter type does "
                    "not match schema type"
                )
        partition = ordered(values[hash_term.values[0]])
        if range_term is None:
            return partition, lambda entries: (0, len(entries))
        operator = range_term.operator
        bounds: list[Any] = [ordered(values[v]) for v in range_term.values]
        if operator == "BETWEEN" and bounds[0] > bounds[1]:
            raise _invalid(
                "Invalid KeyConditionExpression: The BETWEEN operator requires upper bound to "
                "be greater than or equal to lower bound; lower bound operand: AttributeValue: "
                f"{_show(values[range_term.values[0]])}, upper bound operand: AttributeValue: "
                f"{_show(values[range_term.values[1]])}"
            )

        def limits(entries: list[Entry]) -> tuple[int, int]:
            def left(value: Any) -> int:
                return bisect.bisect_left(entries, value, key=_sort_value)

            def right(value: Any) -> int:
                return bisect.bisect_right(entries, value, key=_sort_value)

            value = bounds[0]
            if operator == "=":
                return left(value), right(value)
            if operator == "<":
                return 0, left(value)
            if operator == "<=":
                return 0, right(value)
            if operator == ">":
                return right(value), len(entries)
            if operator == ">=":
                return left(value), len(entries)
            if operator == "BETWEEN":
                return left(value), right(bounds[1])
            start = end = left(value)
            while end < len(entries) and entries[end][0].startswith(value):
                end += 1
            return start, end

        return partition, limits

    def _page(
        self,
        table: _Table,
        index: _Index | None,
        entries: Sequence[Entry],
        positions: Iterator[int],
        moment_seen: float | None,
        params: Mapping[str, Any],
        expressions: _Expressions,
        select: str,
    ) -> dict[str, Any]:
        limit = params.get("Limit")
        if limit is not None and limit < 1:
            raise _invalid(
                f"1 validation error detected: Value '{limit}' at 'limit' failed to satisfy "
                "constraint: Member must have value greater than or equal to 1"
            )
        found: list[Item] = []
        count = scanned = 0
        last: Item | None = None
        test = expressions.filter
        names, values = expressions.names, expressions.values
        shown: Sequence[str] | None = expressions.projection
        if shown is None and index is not None:
            shown = index.definition.projected_names
        records = table.records
        counting = select == "COUNT"
        for position in positions:
            record = records[entries[position][1]]
            item = record.latest if moment_seen is None else record.as_of(moment_seen)
            assert item is not None
            scanned += 1
            # A filter reads only projected attributes (checked above): the stored item
            # answers it as the index's copy would.
            if test is None or test.test(item, names, values):
                count += 1
                if not counting:
                    found.append(copy_item(item) if shown is None else _copy_some(item, shown))
            if limit is not None and scanned >= limit:
                last = item
                break
        answer: dict[str, Any] = {}
        if not counting:
            answer["Items"] = found
        answer["Count"] = count
        answer["ScannedCount"] = scanned
        if last is not None:
            key_names = list(table.definition.key_attributes)
            if index is not None:
                key_names += [n for n in index.key_names if n not in key_names]
            answer["LastEvaluatedKey"] = {n: copy_value(last[n]) for n in key_names}
        return answer

    def _scan(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        table = self._table(params)
        _refuse_legacy(params, "ScanFilter", "AttributesToGet", "ConditionalOperator")
        _refuse_capacity(params)
        if "Segment" in params or "TotalSegments" in params:
            raise NotImplementedError("parallel scans are not simulated")
        index = self._index(table, params)
        expressions = _expressions(params)
        select = self._select(params, index, expressions)
        self._check_index_projection(index, expressions)
        moment_seen = (
            moment.table_view(bool(params.get("ConsistentRead")))
            if index is None
            else moment.index_view()
        )
        placed = table.all_entries(index, moment_seen)
        start = 0
        if "ExclusiveStartKey" in params:
            partition, entry = self._start_entry(table, index, params["ExclusiveStartKey"])
            start = bisect.bisect_right(
                placed, (_scan_hash(partition), entry), key=lambda p: (_scan_hash(p[0]), p[1])
            )
        entries = [entry for _, entry in placed]
        return self._page(
            table,
            index,
            entries,
            iter(range(start, len(entries))),
            moment_seen,
            params,
            expressions,
            select,
        )

    # --- batches and transactions -----------------------------------------------------------

    def _batch_get_item(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        _refuse_capacity(params)
        requests = params.get("RequestItems") or {}
        if not requests:
            raise _invalid("BatchGetItem must have some requests set")
        if sum(len(r.get("Keys", [])) for r in requests.values()) > MAX_BATCH_GET_KEYS:
            raise _invalid("Too many items requested for the BatchGetItem call")
        plans = []
        for table_name, request in requests.items():
            table = self._table({"TableName": table_name})
            _refuse_legacy(request, "AttributesToGet")
            expressions = _expressions(request)
            keys = [table.checked_key(raw)[0] for raw in request.get("Keys", [])]
            if len(set(keys)) != len(keys):
                raise _invalid("Provided list of item keys contains duplicates")
            plans.append((table_name, table, keys, request, expressions))
        responses: dict[str, list[Item]] = {}
        for table_name, table, keys, request, expressions in plans:
            view = moment.table_view(bool(request.get("ConsistentRead")))
            found = responses.setdefault(table_name, [])
            for key in keys:
                item = table.read(key, view)
                if item is not None:
                    found.append(_project(item, expressions.projection))
        return {"Responses": responses, "UnprocessedKeys": {}}

    def _transact_write_items(self, params: Mapping[str, Any], moment: _Moment) -> dict[str, Any]:
        _refuse_capacity(params)
        actions = params.get("TransactItems") or []
        if len(actions) > MAX_TRANSACTION_ITEMS:
            raise _invalid(
                "1 validation error detected: Value at 'transactItems' failed to satisfy "
                "constraint: Member must have length less than or equal to 100"
            )
        token = params.get("ClientRequestToken")
        fingerprint = _fingerprint(actions)
        if token is not None:
            self._forget_tokens(moment.now)
            seen = self._tokens.get(token)
            if seen is not None:
                if seen[1] != fingerprint:
                    raise _RefusedError("IdempotentParameterMismatchException", "", {"Message": ""})
                return {}
        steps = [self._transaction_step(action) for action in actions]
        keys = [(step.table.definition.name, step.key) for step in steps]
        if len(set(keys)) != len(keys):
            raise _invalid("Transaction request cannot include multiple operations on one item")
        reasons: list[dict[str, Any]] = []
        cancelled = False
        for step in steps:
            old = step.table.latest(step.key)
            if step.expressions.holds(old):
                reasons.append({"Code": "None"})
                continue
            cancelled = True
            message = _CONDITION_FAILED + ("." if step.operation == "ConditionCheck" else "")
            reason: dict[str, Any] = {"Code": "ConditionalCheckFailed", "Message": message}
            if step.on_failure == "ALL_OLD" and old is not None:
                reason["Item"] = copy_item(old)
            reasons.append(reason)
        if cancelled:
            message = (
                "Transaction cancelled, please refer cancellation reasons for specific reasons "
                f"[{', '.join(r['Code'] for r in reasons)}]"
            )
            raise _RefusedError(
                "TransactionCanceledException",
                message,
                {"Message": message, "CancellationReasons": reasons},
            )
        writes: list[tuple[_Table, Key, Item | None, int | None]] = []
        for step in steps:
            old = step.table.latest(step.key)
            if step.operation == "Put":
                writes.append((step.table, step.key, step.item, None))
            elif step.operation == "Delete":
                writes.append((step.table, step.key, None, None))
            elif step.operation == "Update":
                updated, size = self._updated(
                    step.table, step.expressions, old, step.key_item, step.table.size_of(step.key)
                )
                writes.append((step.table, step.key, updated, size))
        for table, key, written, known in writes:
            table.write(key, written, moment.now, self.history_seconds, known)
        if token is not None:
            self._tokens[token] = (moment.now, fingerprint)
            self._token_order.append((moment.now, token))
        return {}

    def _transaction_step(self, action: Mapping[str, Any]) -> _TransactionStep:
        kinds = [k for k in ("ConditionCheck", "Put", "Delete", "Update") if k in action]
        if len(kinds) != 1:
            raise _invalid("TransactItems can only contain one of Check, Put, Update or Delete")
        operation = kinds[0]
        body = action[operation]
        table = self._table(body)
        on_failure = _on_failure(body)
        if operation == "ConditionCheck" and body.get("ConditionExpression") is None:
            raise _invalid("The ConditionExpression parameter must be specified")
        if operation == "Update" and body.get("UpdateExpression") is None:
            raise _invalid("The UpdateExpression parameter must be specified")
        expressions = _expressions(body)
        if operation == "Put":
            item = table.checked_item(body.get("Item"))
            key = table.key_of(item)
            return _TransactionStep(
                operation,
                table,
                key,
                table.key_attributes(item),
                body,
                expressions,
                on_failure,
                item,
            )
        key, key_item = table.checked_key(body.get("Key"))
        if operation == "Update":
            ex.check_key_update(expressions.touched or [], table.definition.key_attributes)
        return _TransactionStep(operation, table, key, key_item, body, expressions, on_failure)

    def _forget_tokens(self, now: float) -> None:
        order = self._token_order
        while order and order[0][0] <= now - IDEMPOTENCY_WINDOW_S:
            written, token = order.popleft()
            if self._tokens.get(token, (None,))[0] == written:
                del self._tokens[token]


def _copy_some(item: Item, names: Sequence[str]) -> Item:
    """:func:`copy_item` of the named attributes the item has (inlined: this runs for
    every item a query returns)."""
    return {
        name: dict(value) if "S" in value or "N" in value else copy_value(value)
        for name in names
        if (value := item.get(name)) is not None
    }


def _key_size(value: Attr) -> int:
    ((kind, content),) = value.items()
    if kind == "S":
        return len(content.encode("utf-8"))
    return len(content)


def _sort_value(entry: Entry) -> Any:
    return entry[0]


def _show(value: Attr) -> str:
    ((kind, content),) = value.items()
    return f"{{{kind}:{content}}}"


# --- the client ------------------------------------------------------------------------------


class _Paginator:
    def __init__(self, client: SimDynamoDBClient, operation: str) -> None:
        self._client = client
        self._operation = operation

    def paginate(self, **params: Any) -> Iterator[dict[str, Any]]:
        params.pop("PaginationConfig", None)
        while True:
            page = self._client._call(self._operation, params)
            yield page
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            params = {**params, "ExclusiveStartKey": last}


class SimDynamoDBClient:
    """A boto3 DynamoDB client's methods over a :class:`DynamoDBEngine`: each call
    checks its parameters as botocore does (``ParamValidationError``), then runs at
    ``now()`` with this client's faults (``stale_by``, ``index_lag``; the simulator may
    change them between calls)."""

    def __init__(
        self,
        engine: DynamoDBEngine,
        now: Callable[[], float],
        *,
        stale_by: float = 0.0,
        index_lag: float = 0.0,
        validate_params: bool = True,
    ) -> None:
        self.engine = engine
        self._now = now
        self.stale_by = stale_by
        self.index_lag = index_lag
        self._validate = validate_params
        self._validator = ParamValidator()

    @property
    def exceptions(self) -> Any:
        return client_exceptions()

    def _call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        if self._validate:
            shape = _service_model().operation_model(operation_name(operation)).input_shape
            assert shape is not None
            report = self._validator.validate(params, shape)
            if report.has_errors():
                raise ParamValidationError(report=report.generate_report())
        return self.engine.call(
            operation, params, now=self._now(), stale_by=self.stale_by, index_lag=self.index_lag
        )

    def get_item(self, **params: Any) -> dict[str, Any]:
        return self._call("get_item", params)

    def put_item(self, **params: Any) -> dict[str, Any]:
        return self._call("put_item", params)

    def update_item(self, **params: Any) -> dict[str, Any]:
        return self._call("update_item", params)

    def delete_item(self, **params: Any) -> dict[str, Any]:
        return self._call("delete_item", params)

    def query(self, **params: Any) -> dict[str, Any]:
        return self._call("query", params)

    def scan(self, **params: Any) -> dict[str, Any]:
        return self._call("scan", params)

    def batch_get_item(self, **params: Any) -> dict[str, Any]:
        return self._call("batch_get_item", params)

    def transact_write_items(self, **params: Any) -> dict[str, Any]:
        return self._call("transact_write_items", params)

    def create_table(self, **params: Any) -> dict[str, Any]:
        return self._call("create_table", params)

    def describe_table(self, **params: Any) -> dict[str, Any]:
        return self._call("describe_table", params)

    def delete_table(self, **params: Any) -> dict[str, Any]:
        return self._call("delete_table", params)

    def list_tables(self, **params: Any) -> dict[str, Any]:
        return self._call("list_tables", params)

    def get_paginator(self, operation: str) -> _Paginator:
        if operation not in ("scan", "query"):
            raise NotImplementedError(f"no simulated paginator for {operation}")
        return _Paginator(self, operation)

    def close(self) -> None:
        """Nothing to release (as a boto3 client's ``close``)."""
