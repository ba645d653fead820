"""The table the trade_store example writes to, on DynamoDB Local."""

from __future__ import annotations

from typing import Any


def create_trade_table(ddb: Any, name: str) -> None:
    """Key: ``connection_id`` and ``seq``, as examples/trade_store's README creates it."""
    ddb.create_table(
        TableName=name,
        KeySchema=[
            {"AttributeName": "connection_id", "KeyType": "HASH"},
            {"AttributeName": "seq", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "connection_id", "AttributeType": "S"},
            {"AttributeName": "seq", "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
