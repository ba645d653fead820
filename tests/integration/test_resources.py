"""``python -m local_stack.resources`` against DynamoDB Local and moto: the table (key
``Pk`` + ``Sk``) with the three indexes the worker and the router query, the start
queue with its DLQ and redrive policy, one JSON line on stdout; running it again
changes nothing; a table of the old shape is refused; an unreachable endpoint is a
clear one-line error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from local_stack.resources import (
    DEMO_SECRET,
    ResourceError,
    create_connection_table,
    create_demo_secret,
    table_indexes,
)
from local_stack.services import free_port, local_client
from tests.conftest import unique_name
from tests.support.processes import run_module
from tests.support.timing import scaled
from wsfleet import schema

pytestmark = pytest.mark.timeout(scaled(90))


def run_resources(
    args: list[str], *, dynamodb: str, sqs: str, home: Path, secrets: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The command with only the endpoints set: no credentials, region, profile or
    AWS files of the machine (it must then use placeholder ones, as the worker does)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    if secrets is not None:
        env["AWS_ENDPOINT_URL_SECRETS_MANAGER"] = secrets
    env.update(
        {
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb,
            "AWS_ENDPOINT_URL_SQS": sqs,
            "AWS_CONFIG_FILE": str(home / "no-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    return run_module("local_stack.resources", args, scaled(60), env=env)


def test_creates_the_table_queue_and_dlq_and_again_changes_nothing(
    dynamodb_endpoint, moto_endpoint, ddb, sqs, tmp_path
):
    table, queue = unique_name("connections"), unique_name("starts")
    args = ["--table", table, "--queue", queue]
    first = run_resources(args, dynamodb=dynamodb_endpoint, sqs=moto_endpoint, home=tmp_path)
    second = run_resources(args, dynamodb=dynamodb_endpoint, sqs=moto_endpoint, home=tmp_path)

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    [line] = first.stdout.splitlines()
    created = json.loads(line)
    assert set(created) == {"table", "queue_url", "dlq_url"}
    assert created["table"] == table
    assert created["queue_url"].endswith(f"/{queue}")
    assert created["dlq_url"].endswith(f"/{queue}-dlq")
    assert second.stdout == first.stdout

    description = ddb.describe_table(TableName=table)["Table"]
    assert description["TableStatus"] == "ACTIVE"
    assert description["KeySchema"] == [
        {"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"},
        {"AttributeName": schema.SORT_KEY, "KeyType": "RANGE"},
    ]
    indexes = {index["IndexName"]: index for index in description["GlobalSecondaryIndexes"]}
    assert set(indexes) == {
        schema.STATE_INDEX_NAME,
        schema.OWNER_INDEX_NAME,
        schema.UNOWNED_INDEX_NAME,
    }
    for name, partition in (
        (schema.STATE_INDEX_NAME, schema.STATE_INDEX_PARTITION_KEY),
        (schema.OWNER_INDEX_NAME, schema.OWNER_KEY),
        (schema.UNOWNED_INDEX_NAME, schema.FREE_SHARD),
    ):
        assert indexes[name]["KeySchema"] == [
            {"AttributeName": partition, "KeyType": "HASH"},
            {"AttributeName": schema.PARTITION_KEY, "KeyType": "RANGE"},
        ], name
    assert indexes[schema.STATE_INDEX_NAME]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert indexes[schema.UNOWNED_INDEX_NAME]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    owner_projection = indexes[schema.OWNER_INDEX_NAME]["Projection"]
    assert owner_projection["ProjectionType"] == "INCLUDE"
    assert set(owner_projection["NonKeyAttributes"]) == set(schema.OWNER_INDEX_PROJECTION)

    dlq_arn = sqs.get_queue_attributes(QueueUrl=created["dlq_url"], AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    attributes = sqs.get_queue_attributes(QueueUrl=created["queue_url"], AttributeNames=["All"])[
        "Attributes"
    ]
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": 5,
    }
    assert attributes["VisibilityTimeout"] == "30"


def test_options_set_the_redrive_and_the_visibility_timeout(
    dynamodb_endpoint, moto_endpoint, sqs, tmp_path
):
    table, queue = unique_name("connections"), unique_name("starts")
    args = ["--table", table, "--queue", queue, "--max-receive-count", "2"]
    result = run_resources(
        [*args, "--visibility-timeout", "7"],
        dynamodb=dynamodb_endpoint,
        sqs=moto_endpoint,
        home=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    queue_url = json.loads(result.stdout)["queue_url"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    assert json.loads(attributes["RedrivePolicy"])["maxReceiveCount"] == 2
    assert attributes["VisibilityTimeout"] == "7"


def create_old_table(ddb, name: str) -> None:
    """The table as it was before sessions: key ``Pk`` alone, one index."""
    ddb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": schema.PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": schema.STATE_INDEX_PARTITION_KEY, "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": schema.STATE_INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": schema.STATE_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": schema.PARTITION_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )


def test_a_table_of_the_old_shape_is_refused_with_a_clear_error(
    dynamodb_endpoint, moto_endpoint, ddb, tmp_path
):
    table = unique_name("connections")
    create_old_table(ddb, table)
    result = run_resources(
        ["--table", table, "--queue", unique_name("starts")],
        dynamodb=dynamodb_endpoint,
        sqs=moto_endpoint,
        home=tmp_path,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    [message] = result.stderr.strip().splitlines()
    assert message.startswith(f"local_stack.resources: table {table} exists with another key")
    assert schema.OWNER_INDEX_NAME in message
    assert schema.UNOWNED_INDEX_NAME in message
    assert "delete it or choose another name" in message
    # Refused, not changed: still the old key and the one index.
    description = ddb.describe_table(TableName=table)["Table"]
    assert description["KeySchema"] == [{"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"}]
    assert [i["IndexName"] for i in description["GlobalSecondaryIndexes"]] == [
        schema.STATE_INDEX_NAME
    ]
    ddb.delete_table(TableName=table)


def test_a_table_with_the_old_key_alone_is_refused_even_with_every_index(ddb):
    """Key ``Pk`` only, but all three indexes: the key is what is wrong."""
    table = unique_name("connections")
    ddb.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": name, "AttributeType": "S"}
            for name in (
                schema.PARTITION_KEY,
                schema.STATE_INDEX_PARTITION_KEY,
                schema.OWNER_KEY,
                schema.FREE_SHARD,
            )
        ],
        KeySchema=[{"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=table_indexes(),
    )
    try:
        with pytest.raises(ResourceError, match=f"table {table} exists with another key"):
            create_connection_table(ddb, table)
    finally:
        ddb.delete_table(TableName=table)


def test_an_unreachable_endpoint_is_a_clear_error(moto_endpoint, tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = run_resources(
        ["--table", "t", "--queue", "q"], dynamodb=nowhere, sqs=moto_endpoint, home=tmp_path
    )
    assert result.returncode == 1
    assert result.stdout == ""
    [message] = result.stderr.strip().splitlines()
    assert message.startswith("local_stack.resources: ")
    assert nowhere in message
    assert "Traceback" not in result.stderr


def test_missing_names_are_a_usage_error(tmp_path):
    result = run_resources(["--table", "t"], dynamodb="", sqs="", home=tmp_path)
    assert result.returncode == 2
    assert "--queue" in result.stderr


def _demo_secret(moto_endpoint: str) -> dict[str, Any] | None:
    client = local_client("secretsmanager", moto_endpoint)
    try:
        value = client.get_secret_value(SecretId=DEMO_SECRET)["SecretString"]
    except client.exceptions.ResourceNotFoundException:
        return None
    finally:
        client.close()
    decoded: dict[str, Any] = json.loads(value)
    return decoded


def _forget_demo_secret(moto_endpoint: str) -> None:
    client = local_client("secretsmanager", moto_endpoint)
    try:
        client.delete_secret(SecretId=DEMO_SECRET, ForceDeleteWithoutRecovery=True)
    except client.exceptions.ResourceNotFoundException:
        pass
    finally:
        client.close()


def test_with_a_secrets_manager_endpoint_the_demo_secret_is_made_once(
    dynamodb_endpoint, moto_endpoint, tmp_path
):
    _forget_demo_secret(moto_endpoint)
    table, queue = unique_name("connections"), unique_name("starts")
    args = ["--table", table, "--queue", queue]
    runs = [
        run_resources(
            args,
            dynamodb=dynamodb_endpoint,
            sqs=moto_endpoint,
            secrets=moto_endpoint,
            home=tmp_path,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert runs[0].stdout == runs[1].stdout  # the same one JSON line
    assert set(json.loads(runs[0].stdout)) == {"table", "queue_url", "dlq_url"}
    secret = _demo_secret(moto_endpoint)
    assert secret is not None
    (key,) = secret["headers"].values()
    assert list(secret) == ["headers"]
    assert list(secret["headers"]) == ["X-Demo-Key"]
    assert len(key) >= 20
    assert all(key not in r.stdout + r.stderr for r in runs)  # never printed


def test_without_a_secrets_manager_endpoint_the_demo_secret_is_skipped_with_a_note(
    dynamodb_endpoint, moto_endpoint, tmp_path
):
    _forget_demo_secret(moto_endpoint)
    args = ["--table", unique_name("connections"), "--queue", unique_name("starts")]
    result = run_resources(args, dynamodb=dynamodb_endpoint, sqs=moto_endpoint, home=tmp_path)
    assert result.returncode == 0
    assert "demo secret not created" in result.stderr
    assert _demo_secret(moto_endpoint) is None


def test_the_demo_secret_follows_the_key_it_is_given(moto_endpoint):
    _forget_demo_secret(moto_endpoint)
    client = local_client("secretsmanager", moto_endpoint)
    try:
        made = create_demo_secret(client)
        assert create_demo_secret(client) == made  # left as it is
        assert create_demo_secret(client, "key-2") == "key-2"
        assert create_demo_secret(client, "key-2") == "key-2"
    finally:
        client.close()
    assert _demo_secret(moto_endpoint) == {"headers": {"X-Demo-Key": "key-2"}}
