"""Least privilege: the exact actions and resources of the worker's and router's roles."""

from __future__ import annotations

import pytest

from tests.stacks.cfn import arn, as_list, canonical, grants, of_type, only, role_permissions
from tests.stacks.conftest import Synthesized
from wsfleet import schema

pytestmark = pytest.mark.cdk


def _ids(synth: Synthesized) -> dict[str, str]:
    queues = of_type(synth.resources, "AWS::SQS::Queue")
    (start,) = [k for k, v in queues.items() if "RedrivePolicy" in v["Properties"]]
    functions = of_type(synth.resources, "AWS::Lambda::Function")
    (router,) = [
        v["Properties"]
        for v in functions.values()
        if v["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    _, task = only(synth.resources, "AWS::ECS::TaskDefinition")
    return {
        "table": only(synth.resources, "AWS::DynamoDB::Table")[0],
        "start_queue": start,
        "failed_events": router["DeadLetterConfig"]["TargetArn"]["Fn::GetAtt"][0],
        "router_role": router["Role"]["Fn::GetAtt"][0],
        "router_logs": router["LoggingConfig"]["LogGroup"]["Ref"],
        "task_role": task["TaskRoleArn"]["Fn::GetAtt"][0],
    }


def secrets_under(prefix: str) -> dict:
    """The secrets under ``prefix`` in the stack's own partition, region and account."""
    return {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":secretsmanager:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                f":secret:{prefix}*",
            ],
        ]
    }


def _index(table_id: str, name: str) -> dict:
    return {"Fn::Join": ["", [arn(table_id), f"/index/{name}"]]}


def test_worker_task_role_has_exactly_the_session_lease_and_queue_actions(
    synth: Synthesized,
) -> None:
    ids = _ids(synth)
    table, queue = ids["table"], ids["start_queue"]
    expected = (
        # sessions and pages (open, renew, reap, forget, list), connections (take,
        # release, park, read)
        grants(
            [
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
                "dynamodb:Query",
            ],
            arn(table),
        )
        # a session's connections, and the connections waiting for an owner
        | grants(
            ["dynamodb:Query"],
            _index(table, schema.OWNER_INDEX_NAME),
            _index(table, schema.UNOWNED_INDEX_NAME),
        )
        | grants(
            [
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:SendMessage",
            ],
            arn(queue),
        )
        # upstream credentials: the secrets under the allowed prefix, read at connect time
        | grants(["secretsmanager:GetSecretValue"], secrets_under("websocket-fleet/"))
    )
    assert role_permissions(synth.resources, ids["task_role"]) == expected
    assert "ManagedPolicyArns" not in synth.resources[ids["task_role"]]["Properties"]


def test_router_role_has_exactly_its_table_queue_and_log_actions(synth: Synthesized) -> None:
    ids = _ids(synth)
    table = ids["table"]
    expected = (
        # start/stop and the owner's session notice; a connection, its owner's session
        # and page; the listing without a state (scan) or of the table
        grants(
            ["dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query", "dynamodb:Scan"],
            arn(table),
        )
        # the listing by state: the router's index only
        | grants(["dynamodb:Query"], _index(table, schema.STATE_INDEX_NAME))
        # the start hint, and the function's own dead-letter queue for failed events
        | grants(["sqs:SendMessage"], arn(ids["start_queue"]), arn(ids["failed_events"]))
        | grants(["logs:CreateLogStream", "logs:PutLogEvents"], arn(ids["router_logs"]))
    )
    assert role_permissions(synth.resources, ids["router_role"]) == expected
    assert "ManagedPolicyArns" not in synth.resources[ids["router_role"]]["Properties"]


def test_no_policy_in_the_stack_allows_a_wildcard_action(synth: Synthesized) -> None:
    documents = [
        p["Properties"]["PolicyDocument"]
        for p in of_type(synth.resources, "AWS::IAM::Policy").values()
    ] + [
        inline["PolicyDocument"]
        for role in of_type(synth.resources, "AWS::IAM::Role").values()
        for inline in role["Properties"].get("Policies", [])
    ]
    actions = [
        action
        for document in documents
        for statement in document["Statement"]
        for action in as_list(statement["Action"])
    ]
    assert actions
    assert [a for a in actions if "*" in a] == []


def test_only_the_worker_may_read_secrets_and_only_under_the_prefix(synth: Synthesized) -> None:
    ids = _ids(synth)
    readers = {
        (role_id, action, resource)
        for role_id in of_type(synth.resources, "AWS::IAM::Role")
        for action, resource in role_permissions(synth.resources, role_id)
        if action.startswith("secretsmanager:")
    }
    assert readers == {
        (
            ids["task_role"],
            "secretsmanager:GetSecretValue",
            canonical(secrets_under("websocket-fleet/")),
        )
    }
