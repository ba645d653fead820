"""Paging through connections: an opaque ``next_token`` that cannot be turned into a
malformed DynamoDB request (a bad token is a 400, never a 500)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wsfleet import schema
from wsfleet.item import ConnectionItem, from_attributes, to_attribute
from wsfleet.item_io import get_connection

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

MAX_TOKEN_CHARS = 2048


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


def decode_token(token: str, state: str | None) -> dict[str, Any]:
    """The ``ExclusiveStartKey`` a token stands for, checked attribute by attribute."""
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidTokenError("next_token is too long")
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidTokenError("next_token is not a token this API issued") from None
    if not isinstance(raw, dict) or raw.get("s") != state or not isinstance(raw.get("k"), dict):
        raise InvalidTokenError("next_token does not belong to this listing")
    key = raw["k"]
    expected: dict[str, type] = {schema.PARTITION_KEY: str}
    if state is not None:
        expected |= {schema.STATE_INDEX_PARTITION_KEY: str, schema.STATE_INDEX_SORT_KEY: int}
    if set(key) != set(expected) or not all(
        isinstance(key[name], kind) and not isinstance(key[name], bool)
        for name, kind in expected.items()
    ):
        raise InvalidTokenError("next_token is not a token this API issued")
    pk = key[schema.PARTITION_KEY]
    if not pk.startswith(schema.KEY_PREFIX) or not schema.is_valid_connection_id(
        pk[len(schema.KEY_PREFIX) :]
    ):
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
    """One page: with a state, through the GSI (keys only, then one read per item);
    without, a plain scan of the table."""
    args: dict[str, Any] = {"TableName": table_name, "Limit": limit}
    if next_token:
        args["ExclusiveStartKey"] = decode_token(next_token, state)
    if state is None:
        page = client.scan(**args)
        items = [ConnectionItem.from_dynamodb(raw) for raw in page.get("Items", [])]
    else:
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
