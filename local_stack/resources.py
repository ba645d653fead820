"""Create the connection table and the start queue (with its DLQ) on local servers,
with the same key, index and redrive settings as the CDK stack.

``python -m local_stack.resources --table NAME --queue NAME`` does it at the endpoints
in ``AWS_ENDPOINT_URL_DYNAMODB`` and ``AWS_ENDPOINT_URL_SQS`` (boto3 reads them itself)
and prints one JSON line: ``{"table": ..., "queue_url": ..., "dlq_url": ...}``.
Running it again changes nothing and prints the same line. Exit status 0 on success,
1 when a server cannot be reached or refuses, 2 for bad options.

With a Secrets Manager endpoint (``AWS_ENDPOINT_URL_SECRETS_MANAGER``; the local stack
sets it to moto) it also creates the demo secret ``websocket-fleet/demo-feed``, holding
``{"headers": {"X-Demo-Key": "<random>"}}`` (the key the demo feed's ``require_key=1``
streams need), unless it exists. Without one that step is skipped with a note on
stderr; a failure of that step is reported there too and does not change the exit
status (the table and queue are what the command promises).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from local_stack.clock import wait_until
from local_stack.options import whole_number
from local_stack.services import LOCAL_CREDENTIALS, LOCAL_REGION
from wsfleet import table_layout

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

DEMO_SECRET: Final = "websocket-fleet/demo-feed"
"""The demo secret: the header the demo feed's ``require_key=1`` streams need."""
DEMO_KEY_HEADER: Final = "X-Demo-Key"
DEFAULT_MAX_RECEIVE_COUNT: Final = 5
DEFAULT_VISIBILITY_TIMEOUT: Final = 30
TABLE_ACTIVE_TIMEOUT_S: Final = 30.0
_ENDPOINT_VARIABLES: Final = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_SECRETS_MANAGER",
)
_SECRETS_ENDPOINT_VARIABLES: Final = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SECRETS_MANAGER")
# An unreachable server must fail the command in seconds, not after minutes of retries.
_CLIENT_CONFIG: Final = Config(
    connect_timeout=2, read_timeout=10, retries={"mode": "standard", "total_max_attempts": 2}
)
_QUEUE_EXISTS: Final = ("QueueAlreadyExists", "QueueNameExists")


class ResourceError(RuntimeError):
    """A resource exists in a shape the fleet cannot use."""


@dataclass(frozen=True, slots=True)
class Queues:
    queue_url: str
    dlq_url: str


@dataclass(frozen=True, slots=True)
class Resources:
    """What a deployment of the fleet writes to: the table, the start queue, its DLQ."""

    table: str
    queue_url: str
    dlq_url: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def table_indexes() -> list[dict[str, Any]]:
    """The three global secondary indexes of docs/DESIGN.md §2, from
    ``wsfleet.table_layout`` (the CDK stack builds the same ones from it)."""
    return [index.create_table_entry() for index in table_layout.INDEXES]


def create_connection_table(client: DynamoDBClient, table_name: str) -> None:
    """The table of docs/DESIGN.md §2: key ``Pk`` + ``Sk`` and the indexes
    ``by-desired-state``, ``by-owner`` and ``unowned``. A table of that name that
    already exists is used as it is if it has them; returns once it is ACTIVE."""
    indexes = table_indexes()
    partition, sort = table_layout.TABLE_KEY
    try:
        client.create_table(
            TableName=table_name,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[
                {"AttributeName": name, "AttributeType": table_layout.KEY_ATTRIBUTE_TYPE}
                for name in table_layout.key_attributes()
            ],
            KeySchema=[
                {"AttributeName": partition, "KeyType": "HASH"},
                {"AttributeName": sort, "KeyType": "RANGE"},
            ],
            GlobalSecondaryIndexes=indexes,  # type: ignore[arg-type]
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise
        table = client.describe_table(TableName=table_name)["Table"]
        present = {index.get("IndexName") for index in table.get("GlobalSecondaryIndexes", [])}
        missing = sorted({str(index["IndexName"]) for index in indexes} - present)
        keys = [key["AttributeName"] for key in table.get("KeySchema", [])]
        if missing or keys != [partition, sort]:
            raise ResourceError(
                f"table {table_name} exists with another key or without the indexes"
                f" {', '.join(missing) or '(none missing)'}; delete it or choose another name"
            ) from None
    wait_until(
        lambda: client.describe_table(TableName=table_name)["Table"]["TableStatus"] == "ACTIVE",
        TABLE_ACTIVE_TIMEOUT_S,
        f"table {table_name} to be ACTIVE",
    )


def _queue(client: SQSClient, name: str, attributes: dict[str, str]) -> str:
    """Create the queue, or give an existing one of that name these attributes."""
    try:
        return client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in _QUEUE_EXISTS:
            raise
    url = client.get_queue_url(QueueName=name)["QueueUrl"]
    client.set_queue_attributes(QueueUrl=url, Attributes=attributes)  # type: ignore[arg-type]
    return url


def create_start_queue(
    client: SQSClient,
    name: str,
    *,
    max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT,
) -> Queues:
    """The start queue and its dead-letter queue ``<name>-dlq``, joined by a redrive
    policy. Idempotent: existing queues get these settings."""
    dlq_url = _queue(client, f"{name}-dlq", {})
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    redrive = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}
    queue_url = _queue(
        client,
        name,
        {"VisibilityTimeout": str(visibility_timeout), "RedrivePolicy": json.dumps(redrive)},
    )
    return Queues(queue_url=queue_url, dlq_url=dlq_url)


def create_resources(
    dynamodb: DynamoDBClient,
    sqs: SQSClient,
    *,
    table: str,
    queue: str,
    max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT,
) -> Resources:
    """The table (with its index), the start queue and its DLQ; idempotent."""
    create_connection_table(dynamodb, table)
    queues = create_start_queue(
        sqs, queue, max_receive_count=max_receive_count, visibility_timeout=visibility_timeout
    )
    return Resources(table=table, queue_url=queues.queue_url, dlq_url=queues.dlq_url)


def demo_secret_value(key: str) -> str:
    """The demo secret's SecretString: the feed's key as a handshake header."""
    return json.dumps({"headers": {DEMO_KEY_HEADER: key}})


def create_demo_secret(client: Any, key: str | None = None, *, name: str = DEMO_SECRET) -> str:
    """The demo secret ``name`` with ``key`` as its header value (the secret is created,
    or updated when it holds another value); without ``key``, created with a random one
    unless it exists already (left as it is). Returns the key it holds."""
    try:
        current = client.get_secret_value(SecretId=name).get("SecretString")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise
        current = None
    if current is not None:
        held = _demo_key(current)
        if key is None and held is not None:
            return held
        if key is not None and held == key:
            return key
    chosen = key or secrets.token_urlsafe(18)
    if current is None:
        client.create_secret(Name=name, SecretString=demo_secret_value(chosen))
    else:
        client.put_secret_value(SecretId=name, SecretString=demo_secret_value(chosen))
    return chosen


def _demo_key(value: str) -> str | None:
    try:
        held = json.loads(value)["headers"][DEMO_KEY_HEADER]
    except (ValueError, KeyError, TypeError):
        return None
    return held if isinstance(held, str) else None


# --- the command -----------------------------------------------------------------------


def _session() -> boto3.session.Session:
    """Credentials and region the usual way; placeholder ones for local endpoints
    when none are configured (any key will do there), as the worker does."""
    session = boto3.session.Session()
    region = session.region_name or LOCAL_REGION
    if session.get_credentials() is None and any(os.environ.get(v) for v in _ENDPOINT_VARIABLES):
        return boto3.session.Session(
            aws_access_key_id=LOCAL_CREDENTIALS,
            aws_secret_access_key=LOCAL_CREDENTIALS,
            region_name=region,
        )
    return boto3.session.Session(region_name=region)


def _positive_number(raw: str) -> int:
    return whole_number(raw, minimum=1)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m local_stack.resources",
        description=(
            "Create the connection table (with its index), the start queue and its DLQ at "
            "the endpoints in AWS_ENDPOINT_URL_DYNAMODB and AWS_ENDPOINT_URL_SQS; print "
            "one JSON line with table, queue_url and dlq_url. Idempotent."
        ),
    )
    parser.add_argument("--table", required=True, help="table name")
    parser.add_argument("--queue", required=True, help="start queue name (DLQ: <name>-dlq)")
    parser.add_argument(
        "--max-receive-count",
        type=_positive_number,
        default=DEFAULT_MAX_RECEIVE_COUNT,
        help="receives before a start message moves to the DLQ (default %(default)s)",
    )
    parser.add_argument(
        "--visibility-timeout",
        type=_positive_number,
        default=DEFAULT_VISIBILITY_TIMEOUT,
        help="seconds a received start message stays hidden (default %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    session = _session()
    dynamodb: DynamoDBClient = session.client("dynamodb", config=_CLIENT_CONFIG)
    sqs: SQSClient = session.client("sqs", config=_CLIENT_CONFIG)
    try:
        resources = create_resources(
            dynamodb,
            sqs,
            table=args.table,
            queue=args.queue,
            max_receive_count=args.max_receive_count,
            visibility_timeout=args.visibility_timeout,
        )
    except ResourceError as error:
        print(f"local_stack.resources: {error}", file=sys.stderr)
        return 1
    except (BotoCoreError, ClientError, TimeoutError) as error:
        print(
            f"local_stack.resources: failed with DynamoDB at {dynamodb.meta.endpoint_url} and "
            f"SQS at {sqs.meta.endpoint_url}: {error}",
            file=sys.stderr,
        )
        return 1
    finally:
        dynamodb.close()
        sqs.close()
    _demo_secret(session)
    print(resources.to_json(), flush=True)
    return 0


def _demo_secret(session: boto3.session.Session) -> None:
    """Create the demo secret where a Secrets Manager endpoint is configured; say on
    stderr why not otherwise (never the key)."""
    if not any(os.environ.get(v) for v in _SECRETS_ENDPOINT_VARIABLES):
        print(
            "local_stack.resources: no Secrets Manager endpoint "
            "(AWS_ENDPOINT_URL_SECRETS_MANAGER): demo secret not created",
            file=sys.stderr,
        )
        return
    client = session.client("secretsmanager", config=_CLIENT_CONFIG)
    try:
        create_demo_secret(client)
    except (BotoCoreError, ClientError) as error:
        print(
            f"local_stack.resources: demo secret {DEMO_SECRET} not created "
            f"({type(error).__name__})",
            file=sys.stderr,
        )
    finally:
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
