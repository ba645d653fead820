"""Paging through connections: an opaque ``next_token`` that cannot be turned into a
malformed DynamoDB request (a bad token is a 400, never a 500).

The table holds more than connections: each worker session has a session item
(``SESSIONS#<n>``) and a checkpoint page (``PAGE#...``). A listing by state queries
the ``by-desired-state`` index, which only connections are in; a listing of
everything scans the table and keeps the connection items (``Sk = CONN``). A scan
counts the items it skips against its ``Limit``, so one page may take a few scan
calls, and a page may even come back short (or empty) with a ``next_token``: the
listing ends when ``next_token`` is null, never earlier.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from wsfleet import schema
from wsfleet.item import ConnectionItem, from_attributes, to_attribute
from wsfleet.item_io import get_connection

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

MAX_TOKEN_CHARS: Final = 2048
SCAN_CALLS_PER_PAGE: Final = 5
"""At most this many scan calls fill one page of an unfiltered listing; each asks for
no more items than the page still lacks, so a page never overflows."""
_MAX_KEY_BYTES: Final = {schema.PARTITION_KEY: 2048, schema.SORT_KEY: 1024}
"""DynamoDB's limits for key values, in UTF-8 bytes."""


class InvalidTokenError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Page:
    items: list[ConnectionItem]
    next_token: str | None


def encode_token(last_key: dict[str, Any], state: str | None) -> str:
    plain = from_attributes(last_key)
    raw = json.dumps({"k": plain, "s": state}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _is_connection_key(pk: str, sk: str) -> bool:
    return (
        pk.startswith(schema.KEY_PREFIX)
        and schema.is_valid_connection_id(pk[len(schema.KEY_PREFIX) :])
        and sk == schema.CONNECTION_SORT_KEY
    )


def _fits(name: str, value: str) -> bool:
    """Non-empty, valid Unicode (JSON can carry lone surrogates) and within the limit."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 0 < size <= _MAX_KEY_BYTES[name]


def _is_table_key(pk: str, sk: str) -> bool:
    """A key a scan of the table may stop at: a connection, a session or a page."""
    if _is_connection_key(pk, sk):
        return True
    if not (_fits(schema.PARTITION_KEY, pk) and _fits(schema.SORT_KEY, sk)):
        return False
    if pk in schema.session_partitions():
        return True
    return (
        pk.startswith(schema.PAGE_KEY_PREFIX)
        and len(pk) > len(schema.PAGE_KEY_PREFIX)
        and sk == schema.PAGE_SORT_KEY
    )


def decode_token(token: str, state: str | None) -> dict[str, Any]:
    """The ``ExclusiveStartKey`` a token stands for, checked attribute by attribute:
    for a listing by state, an index key of a connection in that state
    (``desired_state``, ``Pk``, ``Sk``); for a scan, the key of an item of the table."""
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidTokenError("next_token is too long")
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidTokenError("next_token is not a token this API issued") from None
    if not isinstance(raw, dict) or raw.get("s") != state or not isinstance(raw.get("k"), dict):
        raise InvalidTokenError("next_token does not belong to this listing")
    key = raw["k"]
    expected = {schema.PARTITION_KEY, schema.SORT_KEY}
    if state is not None:
        expected.add(schema.STATE_INDEX_PARTITION_KEY)
    if set(key) != expected or not all(isinstance(key[name], str) for name in expected):
        raise InvalidTokenError("next_token is not a token this API issued")
    pk, sk = key[schema.PARTITION_KEY], key[schema.SORT_KEY]
    if not (_is_table_key(pk, sk) if state is None else _is_connection_key(pk, sk)):
        raise InvalidTokenError("next_token is not a token this API issued")
    if state is not None and key[schema.STATE_INDEX_PARTITION_KEY] != state:
        raise InvalidTokenError("next_token does not belong to this listing")
    return {name: to_attribute(value) for name, value in key.items()}


def list_connections(
    client: DynamoDBClient,
    table_name: str,
    *,
    state: str | None,
    limit: int,
    next_token: str | None,
) -> Page:
    """One page: with a state, through the index (keys only, then one read per item);
    without, a scan of the table that keeps the connection items."""
    start = decode_token(next_token, state) if next_token else None
    if state is None:
        return _scan_page(client, table_name, limit, start)
    args: dict[str, Any] = {"TableName": table_name, "Limit": limit}
    if start:
        args["ExclusiveStartKey"] = start
    page = client.query(
        IndexName=schema.STATE_INDEX_NAME,
        KeyConditionExpression="#state = :state",
        ExpressionAttributeNames={"#state": schema.STATE_INDEX_PARTITION_KEY},
        ExpressionAttributeValues={":state": to_attribute(state)},
        **args,
    )
    items = []
    for raw in page.get("Items", []):
        connection_id = schema.connection_id_of(raw[schema.PARTITION_KEY]["S"])
        item = get_connection(client, table_name, connection_id)
        if item is not None:  # removed by TTL between the two reads
            items.append(item)
    last = page.get("LastEvaluatedKey")
    return Page(items, encode_token(last, state) if last else None)


def _scan_page(
    client: DynamoDBClient, table_name: str, limit: int, start: dict[str, Any] | None
) -> Page:
    items: list[ConnectionItem] = []
    for _ in range(SCAN_CALLS_PER_PAGE):
        args: dict[str, Any] = {
            "TableName": table_name,
            "Limit": limit - len(items),
            # Both keys: a session item's sort key may read CONN too.
            "FilterExpression": "#sk = :connection AND begins_with(#pk, :prefix)",
            "ExpressionAttributeNames": {"#sk": schema.SORT_KEY, "#pk": schema.PARTITION_KEY},
            "ExpressionAttributeValues": {
                ":connection": to_attribute(schema.CONNECTION_SORT_KEY),
                ":prefix": to_attribute(schema.KEY_PREFIX),
            },
        }
        if start:
            args["ExclusiveStartKey"] = start
        page = client.scan(**args)
        items += [ConnectionItem.from_dynamodb(raw) for raw in page.get("Items", [])]
        start = page.get("LastEvaluatedKey")
        if not start or len(items) >= limit:
            break
    return Page(items, encode_token(start, None) if start else None)
