"""The example consumer's CDK construct (examples/kinesis_consumer/construct.py) in a
stack of its own with a Kinesis stream, synthesized offline under cdk-nag's
AwsSolutions checks: its tables, its event source, its role, its asset and its
Powertools layer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

# jsii prints a banner on Node 20 unless told not to; set before aws_cdk starts it.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks

from examples.kinesis_consumer.construct import KinesisConsumer
from tests.stacks.cfn import arn, grants, of_type, only, role_permissions
from tests.stacks.conftest import cdk_json_context
from websocket_fleet.sources import pinned_version

STACK = "KinesisConsumerExample"


def build(outdir: Path) -> tuple[cdk.App, cdk.Stack]:
    """A stack with a stream and the consumer, checked by cdk-nag on synth."""
    app = cdk.App(context=cdk_json_context(), outdir=str(outdir))
    stack = cdk.Stack(app, STACK)
    stream = kinesis.Stream(stack, "Envelopes", encryption=kinesis.StreamEncryption.MANAGED)
    KinesisConsumer(stack, "Consumer", stream=stream)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The template and the cloud assembly's directory. The synth itself raises on an
    unacknowledged cdk-nag finding."""
    outdir = tmp_path_factory.mktemp("cdk.out")
    app, _ = build(outdir)
    template = app.synth().get_stack_by_name(STACK).template
    return template, outdir


@pytest.fixture(scope="module")
def resources(synthesized: tuple[dict[str, Any], Path]) -> dict[str, Any]:
    resources: dict[str, Any] = synthesized[0]["Resources"]
    return resources


def test_cdk_nag_is_applied_and_a_finding_fails_the_synth(tmp_path: Path) -> None:
    app, stack = build(tmp_path)
    sqs.Queue(stack, "Unencrypted", encryption=sqs.QueueEncryption.UNENCRYPTED)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()


def test_both_tables_are_on_demand_with_point_in_time_recovery(resources) -> None:
    template = Template.from_json({"Resources": resources})
    template.resource_count_is("AWS::DynamoDB::Table", 2)
    template.all_resources_properties(
        "AWS::DynamoDB::Table",
        {
            "BillingMode": "PAY_PER_REQUEST",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        },
    )
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "connection_id", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "connection_id", "AttributeType": "S"}],
        },
    )
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [
                {"AttributeName": "connection_id", "KeyType": "HASH"},
                {"AttributeName": "item", "KeyType": "RANGE"},
            ]
        },
    )


def _ids(resources: dict[str, Any]) -> dict[str, str]:
    tables = of_type(resources, "AWS::DynamoDB::Table")
    (dedup,) = [k for k, v in tables.items() if len(v["Properties"]["KeySchema"]) == 1]
    (output,) = [k for k in tables if k != dedup]
    function_id, function = only(resources, "AWS::Lambda::Function")
    return {
        "dedup": dedup,
        "output": output,
        "function": function_id,
        "role": function["Role"]["Fn::GetAtt"][0],
        "logs": function["LoggingConfig"]["LogGroup"]["Ref"],
        "queue": only(resources, "AWS::SQS::Queue")[0],
        "stream": only(resources, "AWS::Kinesis::Stream")[0],
    }


def test_the_function_runs_the_handler_with_both_tables(resources) -> None:
    ids = _ids(resources)
    _, function = only(resources, "AWS::Lambda::Function")
    assert function["Handler"] == "handler.handler"
    assert function["Environment"]["Variables"] == {
        "DEDUP_TABLE": {"Ref": ids["dedup"]},
        "OUTPUT_TABLE": {"Ref": ids["output"]},
    }
    assert function["LoggingConfig"]["LogFormat"] == "JSON"
    assert function["LoggingConfig"]["ApplicationLogLevel"] == "INFO"


def test_powertools_comes_from_its_public_layer_of_the_pinned_version(synthesized) -> None:
    """Resolved when the stack deploys, for the function's runtime and architecture."""
    template, _ = synthesized
    _, function = only(template["Resources"], "AWS::Lambda::Function")
    assert (function["Runtime"], function["Architectures"]) == ("python3.14", ["arm64"])
    (layer,) = function["Layers"]
    parameter = template["Parameters"][layer["Ref"]]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<String>"
    version = pinned_version("aws-lambda-powertools")
    assert parameter["Default"] == f"/aws/service/powertools/python/arm64/python3.14/{version}"


def test_the_powertools_version_can_be_chosen(tmp_path: Path) -> None:
    app = cdk.App(context=cdk_json_context(), outdir=str(tmp_path))
    stack = cdk.Stack(app, STACK)
    stream = kinesis.Stream(stack, "Envelopes", encryption=kinesis.StreamEncryption.MANAGED)
    KinesisConsumer(stack, "Consumer", stream=stream, powertools_version="latest")
    parameters = app.synth().get_stack_by_name(STACK).template["Parameters"]
    assert "/aws/service/powertools/python/arm64/python3.14/latest" in [
        p.get("Default") for p in parameters.values()
    ]


def test_the_stream_is_read_in_order_with_partial_failures_bisection_and_a_destination(
    resources,
) -> None:
    ids = _ids(resources)
    _, mapping = only(resources, "AWS::Lambda::EventSourceMapping")
    assert mapping == {
        "BatchSize": 100,
        "BisectBatchOnFunctionError": True,
        "DestinationConfig": {"OnFailure": {"Destination": arn(ids["queue"])}},
        "EventSourceArn": arn(ids["stream"]),
        "FunctionName": {"Ref": ids["function"]},
        "FunctionResponseTypes": ["ReportBatchItemFailures"],
        "MaximumRecordAgeInSeconds": 86400,
        "MaximumRetryAttempts": 10,
        "StartingPosition": "TRIM_HORIZON",
    }
    template = Template.from_json({"Resources": resources})
    template.has_resource_properties(
        "AWS::SQS::Queue", {"MessageRetentionPeriod": 1209600, "SqsManagedSseEnabled": True}
    )
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": [
                    Match.object_like(
                        {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
                    )
                ]
            }
        },
    )


def test_the_role_has_exactly_its_writes_its_logs_its_stream_and_its_destination(
    resources,
) -> None:
    ids = _ids(resources)
    kinesis_reads = [
        "kinesis:DescribeStream",
        "kinesis:DescribeStreamConsumer",
        "kinesis:DescribeStreamSummary",
        "kinesis:GetRecords",
        "kinesis:GetShardIterator",
        "kinesis:ListShards",
        "kinesis:ListStreams",
        "kinesis:SubscribeToShard",
    ]
    expected = (
        # the transaction, item by item: the dedup update, the message and the tally
        grants(["dynamodb:UpdateItem"], arn(ids["dedup"]))
        | grants(["dynamodb:PutItem", "dynamodb:UpdateItem"], arn(ids["output"]))
        | grants(["logs:CreateLogStream", "logs:PutLogEvents"], arn(ids["logs"]))
        # what the event source mapping reads, of this stream only
        | grants(kinesis_reads, arn(ids["stream"]))
        | grants(
            ["sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"], arn(ids["queue"])
        )
    )
    assert role_permissions(resources, ids["role"]) == expected
    assert "ManagedPolicyArns" not in resources[ids["role"]]["Properties"]


def test_the_asset_is_the_handler_and_wsfleet_only_and_needs_no_docker(synthesized) -> None:
    _, outdir = synthesized
    (assets,) = list(outdir.glob("*.assets.json"))
    files = json.loads(assets.read_text())
    assert files["dockerImages"] == {}
    (staged,) = [
        outdir / f["source"]["path"]
        for f in files["files"].values()
        if f["source"].get("packaging") == "zip"
    ]
    assert sorted(p.name for p in staged.iterdir()) == ["handler.py", "wsfleet"]
    shipped = {p.name for p in (staged / "wsfleet").iterdir()}
    assert {"__init__.py", "deduper.py", "envelope.py", "schema.py", "backoff.py"} <= shipped
    assert "__pycache__" not in shipped
    repo = Path(__file__).resolve().parents[2]
    handler = (repo / "examples" / "kinesis_consumer" / "handler.py").read_bytes()
    assert (staged / "handler.py").read_bytes() == handler
