"""The connection table and the start queue, as the worker and the router rely on them."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match

from local_stack import resources
from tests.stacks.cfn import arn, of_type, only
from tests.stacks.conftest import Synthesized
from websocket_fleet.start_queue import VISIBILITY_TIMEOUT
from wsfleet import schema, table_layout

pytestmark = pytest.mark.cdk


def test_table_has_the_composite_key_and_the_three_indexes_of_the_design(
    synth: Synthesized,
) -> None:
    _, table = only(synth.resources, "AWS::DynamoDB::Table")
    assert table["KeySchema"] == [
        {"AttributeName": "Pk", "KeyType": "HASH"},
        {"AttributeName": "Sk", "KeyType": "RANGE"},
    ]
    indexes = {index["IndexName"]: index for index in table["GlobalSecondaryIndexes"]}
    # Spelled out, not read from the shared layout: a change there must show here.
    assert indexes == {
        "by-desired-state": {
            "IndexName": "by-desired-state",
            "KeySchema": [
                {"AttributeName": "desired_state", "KeyType": "HASH"},
                {"AttributeName": "Pk", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
        "by-owner": {
            "IndexName": "by-owner",
            "KeySchema": [
                {"AttributeName": "owner_key", "KeyType": "HASH"},
                {"AttributeName": "Pk", "KeyType": "RANGE"},
            ],
            "Projection": {
                "ProjectionType": "INCLUDE",
                "NonKeyAttributes": list(schema.OWNER_INDEX_PROJECTION),
            },
        },
        "unowned": {
            "IndexName": "unowned",
            "KeySchema": [
                {"AttributeName": "free_shard", "KeyType": "HASH"},
                {"AttributeName": "Pk", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
    }
    types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    assert types == {name: "S" for name in ("Pk", "Sk", "desired_state", "owner_key", "free_shard")}


def test_table_is_the_one_local_stack_creates(synth: Synthesized) -> None:
    """``python -m local_stack.resources`` and the stack build one table layout."""
    _, table = only(synth.resources, "AWS::DynamoDB::Table")
    assert table["GlobalSecondaryIndexes"] == resources.table_indexes()
    assert [k["AttributeName"] for k in table["KeySchema"]] == list(table_layout.TABLE_KEY)
    assert sorted(a["AttributeName"] for a in table["AttributeDefinitions"]) == sorted(
        table_layout.key_attributes()
    )
    names = (schema.STATE_INDEX_NAME, schema.OWNER_INDEX_NAME, schema.UNOWNED_INDEX_NAME)
    assert [i["IndexName"] for i in table["GlobalSecondaryIndexes"]] == list(names)


def test_table_has_ttl_pitr_encryption_and_on_demand_billing(synth: Synthesized) -> None:
    _, table = only(synth.resources, "AWS::DynamoDB::Table")
    assert table["TimeToLiveSpecification"] == {
        "AttributeName": schema.EXPIRES_AT,
        "Enabled": True,
    }
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert table["SSESpecification"]["SSEEnabled"] is True
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert "ProvisionedThroughput" not in table


def test_production_keeps_data_on_stack_deletion(synth: Synthesized) -> None:
    assert not synth.settings.options.dev
    synth.template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
            "Properties": Match.object_like({"DeletionProtectionEnabled": True}),
        },
    )
    for queue in of_type(synth.resources, "AWS::SQS::Queue").values():
        assert queue["DeletionPolicy"] == "Retain"


def _start_queue(synth: Synthesized) -> tuple[str, dict]:
    (found,) = [
        (k, v["Properties"])
        for k, v in of_type(synth.resources, "AWS::SQS::Queue").items()
        if "RedrivePolicy" in v["Properties"]
    ]
    return found


def test_start_queue_redrives_to_its_dlq_after_max_receive_count(synth: Synthesized) -> None:
    _, queue = _start_queue(synth)
    redrive = queue["RedrivePolicy"]
    assert redrive["maxReceiveCount"] == synth.settings.options.dlq_max_receive_count == 5
    dlq_id = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]
    assert synth.resources[dlq_id]["Type"] == "AWS::SQS::Queue"
    assert "RedrivePolicy" not in synth.resources[dlq_id]["Properties"]
    assert queue["VisibilityTimeout"] == VISIBILITY_TIMEOUT.to_seconds() == 60


def test_every_queue_is_encrypted_and_refuses_requests_without_tls(synth: Synthesized) -> None:
    queues = of_type(synth.resources, "AWS::SQS::Queue")
    assert len(queues) == 3  # start queue, its DLQ, the router's failed events
    policies = of_type(synth.resources, "AWS::SQS::QueuePolicy").values()
    for queue_id, queue in queues.items():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
        denies = [
            statement
            for policy in policies
            if {"Ref": queue_id} in policy["Properties"]["Queues"]
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]
            if statement["Effect"] == "Deny"
        ]
        assert denies == [
            {
                "Action": "sqs:*",
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Resource": arn(queue_id),
            }
        ], queue_id
