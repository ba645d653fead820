"""Create the connection table and the start queue (with its DLQ) on local servers,
with the same key, index and redrive settings as the CDK stack."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wsfleet import schema

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

DEFAULT_MAX_RECEIVE_COUNT = 5
DEFAULT_VISIBILITY_TIMEOUT = 30


def create_connection_table(client: DynamoDBClient, table_name: str) -> None:
    """The table of DESIGN section 2: key ``Pk`` and the keys-only GSI
    ``by-desired-state`` (``desired_state``, ``lease_expires_at_ms``)."""
    client.create_table(
        TableName=table_name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": schema.PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": schema.STATE_INDEX_PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": schema.STATE_INDEX_SORT_KEY, "AttributeType": "N"},
        ],
        KeySchema=[{"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": schema.STATE_INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": schema.STATE_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": schema.STATE_INDEX_SORT_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )
    deadline = time.monotonic() + 30
    while client.describe_table(TableName=table_name)["Table"]["TableStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"table {table_name} not ACTIVE after 30 s")
        time.sleep(0.05)


@dataclass(frozen=True, slots=True)
class Queues:
    queue_url: str
    dlq_url: str


def create_start_queue(
    client: SQSClient,
    name: str,
    *,
    max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT,
) -> Queues:
    """The start queue and its dead-letter queue, joined by a redrive policy."""
    dlq_url = client.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    redrive = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}
    queue_url = client.create_queue(
        QueueName=name,
        Attributes={
            "VisibilityTimeout": str(visibility_timeout),
            "RedrivePolicy": json.dumps(redrive),
        },
    )["QueueUrl"]
    return Queues(queue_url=queue_url, dlq_url=dlq_url)
