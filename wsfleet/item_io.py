"""Reading and conditionally writing one connection item (the reason of a failed
condition comes back with the failure, so no second read is needed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import ClientError

from wsfleet import schema
from wsfleet.item import ConnectionItem, to_attribute

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


class ConditionFailedError(Exception):
    """A conditional write failed; ``old`` is the item that made it fail (None when
    there is no item). DynamoDB returns it with the failure
    (``ReturnValuesOnConditionCheckFailure=ALL_OLD``), so no second read is needed."""

    def __init__(self, old: ConnectionItem | None) -> None:
        super().__init__("conditional check failed")
        self.old = old


def item_key(connection_id: str) -> dict[str, Any]:
    return {k: to_attribute(v) for k, v in schema.connection_key(connection_id).items()}


def update_connection(
    client: DynamoDBClient,
    table_name: str,
    connection_id: str,
    update: Mapping[str, Any],
    *,
    return_values: Literal["NONE", "ALL_OLD", "ALL_NEW"],
) -> ConnectionItem | None:
    """Run ``update`` (UpdateExpression, ConditionExpression, names, values) and return
    the old (or new) item when asked; raise :class:`ConditionFailedError`."""
    try:
        response = client.update_item(
            TableName=table_name,
            Key=item_key(connection_id),
            ReturnValues=return_values,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
            **update,
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
        raw: Mapping[str, Any] | None = error.response.get("Item")  # type: ignore[assignment]
        raise ConditionFailedError(ConnectionItem.from_dynamodb(raw) if raw else None) from error
    attributes = response.get("Attributes")
    return ConnectionItem.from_dynamodb(attributes) if attributes else None


def get_connection(
    client: DynamoDBClient, table_name: str, connection_id: str, *, consistent: bool = True
) -> ConnectionItem | None:
    response = client.get_item(
        TableName=table_name, Key=item_key(connection_id), ConsistentRead=consistent
    )
    raw = response.get("Item")
    return ConnectionItem.from_dynamodb(raw) if raw else None
