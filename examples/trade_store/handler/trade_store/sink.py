"""Store each trade in a DynamoDB table: ``HANDLER=trade_store.sink:factory``.

A batch handler (``handle_batch``): every message the worker has buffered for one
connection comes in one call. Each trade becomes one item keyed by
``(connection_id, seq)``, written on a condition that makes the sink safe under the
fleet's at-least-once delivery (README.md, "Writing a handler"):

- the same ``(connection_id, seq)`` again (after a crash, up to a checkpoint interval
  of trades is delivered again) overwrites the item with the same trade;
- a write from an owner whose lease ``epoch`` is lower than the one stored is refused
  by DynamoDB and skipped: a superseded owner never overwrites the current one.

Settings, from the worker container's environment (``handler_environment`` of the
construct): ``TRADE_TABLE``, the table, with partition key ``connection_id`` (S) and
sort key ``seq`` (N). The task role needs ``dynamodb:PutItem`` on it
(``table.grant_write_data(fleet.task_role)``). boto3 finds the region and, locally,
``AWS_ENDPOINT_URL_DYNAMODB`` by itself.

A payload that is not a trade is a failure of the handler: the worker retries it, or
skips it with ``HANDLER_ERRORS=skip`` (counted in ``HandlerErrors``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import boto3
from botocore.exceptions import ClientError
from trade_model import Trade

TABLE_ENV = "TRADE_TABLE"


class TradeStore:
    def __init__(self, table: str, client: Any) -> None:
        self._table = table
        self._client = client

    async def handle_batch(self, deliveries: Sequence[Any]) -> None:
        items = [self._item(d) for d in deliveries]
        # boto3 blocks: off the event loop, one thread per call.
        await asyncio.to_thread(self._put_all, items)

    def _item(self, delivery: Any) -> dict[str, Any]:
        trade = Trade.model_validate(delivery.payload)
        return {
            "connection_id": {"S": delivery.connection_id},
            "seq": {"N": str(delivery.seq)},
            "epoch": {"N": str(delivery.epoch)},
            "symbol": {"S": trade.symbol},
            "price": {"N": str(trade.price)},
            "size": {"N": str(trade.size)},
            "ts": {"N": str(trade.ts)},
            "worker": {"S": delivery.worker_id},
        }

    def _put_all(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            try:
                self._client.put_item(
                    TableName=self._table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(seq) OR epoch <= :epoch",
                    ExpressionAttributeValues={":epoch": item["epoch"]},
                )
            except ClientError as error:
                if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
                # A later owner has written this trade: this one is superseded.


def factory() -> TradeStore:
    table = os.environ.get(TABLE_ENV, "").strip()
    if not table:
        raise RuntimeError(f"{TABLE_ENV} is not set: the DynamoDB table the trades go to")
    return TradeStore(table, boto3.client("dynamodb"))
