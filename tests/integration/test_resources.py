"""``python -m local_stack.resources`` against DynamoDB Local and moto: the table with
the index the worker and the router query, the start queue with its DLQ and redrive
policy, one JSON line on stdout; running it again changes nothing; an unreachable
endpoint is a clear one-line error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from local_stack.services import free_port
from tests.conftest import unique_name
from tests.support.processes import run_module
from tests.support.timing import scaled
from wsfleet import schema

pytestmark = pytest.mark.timeout(scaled(90))


def run_resources(
    args: list[str], *, dynamodb: str, sqs: str, home: Path
) -> subprocess.CompletedProcess[str]:
    """The command with only the endpoints set: no credentials, region, profile or
    AWS files of the machine (it must then use placeholder ones, as the worker does)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
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
    assert description["KeySchema"] == [{"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"}]
    [index] = description["GlobalSecondaryIndexes"]
    assert index["IndexName"] == schema.STATE_INDEX_NAME
    assert index["KeySchema"] == [
        {"AttributeName": schema.STATE_INDEX_PARTITION_KEY, "KeyType": "HASH"},
        {"AttributeName": schema.STATE_INDEX_SORT_KEY, "KeyType": "RANGE"},
    ]
    assert index["Projection"]["ProjectionType"] == "KEYS_ONLY"

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
