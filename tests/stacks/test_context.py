"""Per-environment settings: context changes the template, bad values fail the synth."""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match

from stacks.settings import (
    ENVIRONMENT_KEY,
    ENVIRONMENTS_KEY,
    SettingsError,
    build_settings,
    pinned_powertools_version,
    settings_from_context,
)
from tests.stacks.cfn import ACCOUNT_ROOT, arn, bus_put_events_statements, of_type, only
from tests.stacks.conftest import Synthesized, cdk_json_context, synthesize
from wsfleet import schema

pytestmark = pytest.mark.cdk

TOPIC = "arn:aws:sns:eu-west-1:123456789012:fleet-alarms"
PUTTERS = [
    "arn:aws:iam::210987654321:role/order-service",
    "arn:aws:iam::123456789012:role/ingest",
]
IMPORTED_VPC = {
    "vpcId": "vpc-0123456789abcdef0",
    "availabilityZones": ["eu-west-1a", "eu-west-1b"],
    "subnetIds": ["subnet-0aaaaaaaaaaaaaaa1", "subnet-0bbbbbbbbbbbbbbb2"],
    "assignPublicIp": False,
}
# As `cdk deploy -c fleet:environment=dev -c fleet:minTasks=3 ...` passes them: text.
OVERRIDES = {
    ENVIRONMENT_KEY: "dev",
    "fleet:minTasks": "3",
    "fleet:maxTasks": "7",
    "fleet:tableBilling": "PROVISIONED",
    "fleet:provisionedCapacity": json.dumps({"minWrite": 10, "maxWrite": 200}),
    "fleet:vpc": json.dumps(IMPORTED_VPC),
    "fleet:eventBusName": "fleet-bus",
    "fleet:eventPutterArns": json.dumps(PUTTERS),
    "fleet:alarmTopicArn": TOPIC,
    "fleet:dlqMaxReceiveCount": "3",
    "fleet:routerReservedConcurrency": "25",
    "fleet:startAgeAlarmSeconds": "900",
    "fleet:upstreamConnectBurst": "0",
    "fleet:upstreamConnectsPerSecond": "12.5",
    "fleet:allowedSecretPrefix": "ingest/feeds/",
    "fleet:upstreamProtocols": json.dumps({"tickline": "tickline_plugin.protocol:factory"}),
}


@pytest.fixture(scope="module")
def overridden(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """A second synth (cdk-nag included) with the dev environment and overrides."""
    return synthesize({**cdk_json_context(), **OVERRIDES}, tmp_path_factory.mktemp("dev.out"))


def _targets(synth: Synthesized, namespace: str) -> list[dict[str, Any]]:
    return [
        t["Properties"]
        for t in of_type(synth.resources, "AWS::ApplicationAutoScaling::ScalableTarget").values()
        if t["Properties"]["ServiceNamespace"] == namespace
    ]


def test_dev_environment_and_overrides_are_applied(overridden: Synthesized) -> None:
    s = overridden.settings
    o = s.options
    assert (s.environment, o.dev, o.min_tasks, o.max_tasks) == ("dev", True, 3, 7)
    assert s.stack_name == "WebSocketFleet-dev"
    assert o.service_name == "websocket-fleet-dev"


def test_task_bounds_and_scaling_dimension_follow_context(overridden: Synthesized) -> None:
    (ecs_target,) = _targets(overridden, "ecs")
    assert (ecs_target["MinCapacity"], ecs_target["MaxCapacity"]) == (3, 7)
    policies = of_type(overridden.resources, "AWS::ApplicationAutoScaling::ScalingPolicy")
    (spec,) = [
        p["Properties"]["TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"]
        for p in policies.values()
        if "CustomizedMetricSpecification"
        in p["Properties"].get("TargetTrackingScalingPolicyConfiguration", {})
    ]
    assert spec["Dimensions"] == [{"Name": "Service", "Value": "websocket-fleet-dev"}]


def test_provisioned_billing_scales_the_table_and_every_index(overridden: Synthesized) -> None:
    _, table = only(overridden.resources, "AWS::DynamoDB::Table")
    assert "BillingMode" not in table or table["BillingMode"] == "PROVISIONED"
    assert table["ProvisionedThroughput"]["WriteCapacityUnits"] == 10
    indexes = table["GlobalSecondaryIndexes"]
    assert len(indexes) == 3
    assert all(i["ProvisionedThroughput"]["WriteCapacityUnits"] == 10 for i in indexes)
    targets = _targets(overridden, "dynamodb")
    dims = sorted((t["ScalableDimension"], t["MinCapacity"], t["MaxCapacity"]) for t in targets)
    assert dims == sorted(
        [
            ("dynamodb:table:ReadCapacityUnits", 5, 50),
            ("dynamodb:table:WriteCapacityUnits", 10, 200),
        ]
        + [("dynamodb:index:ReadCapacityUnits", 5, 50)] * 3
        + [("dynamodb:index:WriteCapacityUnits", 10, 200)] * 3
    )
    for name in (schema.STATE_INDEX_NAME, schema.OWNER_INDEX_NAME, schema.UNOWNED_INDEX_NAME):
        scaled = [
            t["ScalableDimension"]
            for t in targets
            if f"/index/{name}" in json.dumps(t["ResourceId"])
        ]
        assert sorted(scaled) == [
            "dynamodb:index:ReadCapacityUnits",
            "dynamodb:index:WriteCapacityUnits",
        ], name


def test_imported_vpc_is_used_without_lookup_or_new_network(overridden: Synthesized) -> None:
    assert of_type(overridden.resources, "AWS::EC2::VPC") == {}
    _, service = only(overridden.resources, "AWS::ECS::Service")
    network = service["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"
    assert network["Subnets"] == IMPORTED_VPC["subnetIds"]
    _, group = only(overridden.resources, "AWS::EC2::SecurityGroup")
    assert group["VpcId"] == IMPORTED_VPC["vpcId"]


def test_named_bus_lets_in_the_account_and_the_listed_principals(
    overridden: Synthesized,
) -> None:
    bus_id, bus = only(overridden.resources, "AWS::Events::EventBus")
    assert bus["Name"] == "fleet-bus"
    _, rule = only(overridden.resources, "AWS::Events::Rule")
    assert rule["EventBusName"] == {"Ref": bus_id}
    statements = bus_put_events_statements(overridden.resources)
    assert {s["Sid"]: s["Principal"] for s in statements} == {
        "cdk-AccountPutsEvents": {"AWS": ACCOUNT_ROOT},
        "cdk-ListedPrincipalsPutEvents": {"AWS": PUTTERS},
    }
    assert all(
        (s["Effect"], s["Action"], s["Resource"]) == ("Allow", "events:PutEvents", arn(bus_id))
        for s in statements
    )


def test_bus_topic_dlq_and_dev_removal_policy(overridden: Synthesized) -> None:
    alarms = of_type(overridden.resources, "AWS::CloudWatch::Alarm").values()
    assert alarms
    assert all(a["Properties"]["AlarmActions"] == [TOPIC] for a in alarms)
    assert all(a["Properties"]["OKActions"] == [TOPIC] for a in alarms)
    overridden.template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"MetricName": "ApproximateAgeOfOldestMessage", "Threshold": 900},
    )
    # A given topic is used as it is: no topic, key or subscription of the stack's own.
    for cfn_type in ("AWS::SNS::Topic", "AWS::KMS::Key", "AWS::SNS::Subscription"):
        assert of_type(overridden.resources, cfn_type) == {}, cfn_type
    queues = of_type(overridden.resources, "AWS::SQS::Queue").values()
    assert [
        q["Properties"]["RedrivePolicy"]["maxReceiveCount"]
        for q in queues
        if "RedrivePolicy" in q["Properties"]
    ] == [3]
    overridden.template.has_resource("AWS::DynamoDB::Table", {"DeletionPolicy": "Delete"})


def test_router_reserved_concurrency_follows_context(overridden: Synthesized) -> None:
    (function,) = [
        f["Properties"]
        for f in of_type(overridden.resources, "AWS::Lambda::Function").values()
        if f["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    assert function["ReservedConcurrentExecutions"] == 25


def test_connect_pacing_follows_context(overridden: Synthesized) -> None:
    _, task = only(overridden.resources, "AWS::ECS::TaskDefinition")
    (container,) = task["ContainerDefinitions"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env["UPSTREAM_CONNECT_BURST"] == "0"
    assert env["UPSTREAM_CONNECTS_PER_SECOND"] == "12.5"


def test_the_secret_prefix_reaches_the_router_and_the_task_role(overridden: Synthesized) -> None:
    assert overridden.settings.options.allowed_secret_prefix == "ingest/feeds/"
    (function,) = [
        f["Properties"]
        for f in of_type(overridden.resources, "AWS::Lambda::Function").values()
        if f["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    assert function["Environment"]["Variables"]["ALLOWED_SECRET_PREFIX"] == "ingest/feeds/"
    overridden.template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        {
                            "Action": "secretsmanager:GetSecretValue",
                            "Effect": "Allow",
                            "Resource": {
                                "Fn::Join": [
                                    "",
                                    Match.array_with([":secret:ingest/feeds/*"]),
                                ]
                            },
                        }
                    ]
                )
            }
        },
    )
    assert "websocket-fleet/" not in json.dumps(overridden.resources)


def test_the_protocol_registry_reaches_the_workers_and_the_router(overridden: Synthesized) -> None:
    registered = '{"tickline":"tickline_plugin.protocol:factory"}'
    assert overridden.settings.options.upstream_protocols == {
        "tickline": "tickline_plugin.protocol:factory"
    }
    _, task = only(overridden.resources, "AWS::ECS::TaskDefinition")
    (container,) = task["ContainerDefinitions"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env["UPSTREAM_PROTOCOLS"] == registered
    (function,) = [
        f["Properties"]
        for f in of_type(overridden.resources, "AWS::Lambda::Function").values()
        if f["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    assert function["Environment"]["Variables"]["UPSTREAM_PROTOCOLS"] == registered


def _settings(context: dict[str, Any]) -> Any:
    return settings_from_context(cdk.App(context=context).node)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"fleet:minTasks": "0"}, "minTasks"),
        ({"fleet:minTasks": "2.5"}, "minTasks"),
        ({"fleet:minTasks": "5", "fleet:maxTasks": "4"}, "minTasks"),
        ({"fleet:targetConnectionsPerTask": "501"}, "targetConnectionsPerTask"),
        ({"fleet:logRetentionDays": "8"}, "logRetentionDays"),
        ({"fleet:dev": "true"}, "prod cannot set dev"),
        ({"fleet:leaseSeconds": "0"}, "leaseSeconds"),
        # under the shortest lease a deployment may set (1.5 s)
        ({"fleet:leaseSeconds": "1"}, "leaseSeconds"),
        ({"fleet:leaseSeconds": "soon"}, "leaseSeconds"),
        ({"fleet:allowedUpstreamHosts": "[]"}, "allowedUpstreamHosts"),
        ({"fleet:allowedSecretPrefix": ""}, "allowedSecretPrefix"),
        ({"fleet:allowedSecretPrefix": "*"}, "allowedSecretPrefix"),
        ({"fleet:allowedSecretPrefix": "feeds/*"}, "allowedSecretPrefix"),
        ({"fleet:allowedSecretPrefix": "has space/"}, "allowedSecretPrefix"),
        ({"fleet:allowedSecretPrefix": "[]"}, "allowedSecretPrefix"),
        ({"fleet:allowedUpstreamHosts": "wss://feed.example.com/x"}, "allowedUpstreamHosts"),
        ({"fleet:taskMemoryMiB": "300"}, "taskMemoryMiB"),
        ({"fleet:tableBilling": "FREE"}, "tableBilling"),
        ({"fleet:alarmEmail": "oncall"}, "alarmEmail"),
        ({"fleet:alarmTopicArn": "arn:aws:sqs:eu-west-1:123456789012:q"}, "alarmTopicArn"),
        ({"fleet:alarmTopicArn": TOPIC, "fleet:alarmEmail": "a@example.com"}, "alarmEmail"),
        ({"fleet:startAgeAlarmSeconds": "30"}, "startAgeAlarmSeconds"),
        ({"fleet:startAgeAlarmSeconds": "600.5"}, "startAgeAlarmSeconds"),
        ({"fleet:startAgeAlarmSeconds": "ten minutes"}, "startAgeAlarmSeconds"),
        ({"fleet:routerReservedConcurrency": "0"}, "routerReservedConcurrency"),
        ({"fleet:routerReservedConcurrency": "901"}, "routerReservedConcurrency"),
        ({"fleet:routerReservedConcurrency": "12.5"}, "routerReservedConcurrency"),
        ({"fleet:routerReservedConcurrency": "true"}, "routerReservedConcurrency"),
        ({"fleet:routerReservedConcurrency": "many"}, "routerReservedConcurrency"),
        ({"fleet:upstreamConnectBurst": "-1"}, "upstreamConnectBurst"),
        ({"fleet:upstreamConnectBurst": "2.5"}, "upstreamConnectBurst"),
        ({"fleet:upstreamConnectsPerSecond": "-1"}, "upstreamConnectsPerSecond"),
        ({"fleet:upstreamConnectsPerSecond": "fast"}, "upstreamConnectsPerSecond"),
        ({"fleet:upstreamConnectsPerSecond": "inf"}, "upstreamConnectsPerSecond"),
        ({"fleet:upstreamProtocols": "tickline"}, "upstreamProtocols"),
        ({"fleet:upstreamProtocols": '["tickline"]'}, "upstreamProtocols"),
        ({"fleet:upstreamProtocols": '{"live": "a.b:c"}'}, "upstreamProtocols: 'live' is a built"),
        ({"fleet:upstreamProtocols": '{"tickline": "a-b:c"}'}, "upstreamProtocols: tickline: the"),
        ({ENVIRONMENT_KEY: "staging"}, "staging"),
        ({"fleet:eventBusName": "default"}, "default bus"),
        ({"fleet:eventBusName": "my bus"}, "eventBusName"),
        ({"fleet:eventPutterArns": "*"}, "eventPutterArns"),
        ({"fleet:eventPutterArns": "arn:aws:iam::12345:role/short-account"}, "eventPutterArns"),
        (
            {"fleet:eventPutterArns": '["arn:aws:sts::123456789012:assumed-role/r/session"]'},
            "eventPutterArns",
        ),
    ],
)
def test_bad_settings_fail_with_the_key_named(override: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        _settings({**cdk_json_context(), **override})


def test_unknown_keys_are_refused() -> None:
    context = cdk_json_context()
    context[ENVIRONMENTS_KEY]["prod"]["minTask"] = 1
    with pytest.raises(SettingsError, match="minTask"):
        _settings(context)


def test_defaults_without_cdk_json_match_the_prod_block() -> None:
    prod = cdk_json_context()[ENVIRONMENTS_KEY]["prod"]
    from_json = build_settings("prod", prod)
    assert (
        build_settings("prod", {"allowedUpstreamHosts": prod["allowedUpstreamHosts"]}) == from_json
    )
    assert from_json.options.powertools_version == pinned_powertools_version()
