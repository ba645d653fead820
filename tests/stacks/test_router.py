"""The router: function, Powertools layer, HTTP API with IAM auth, EventBridge rule."""

from __future__ import annotations

import pytest

from lambdas.router import settings as router_env
from stacks.settings import pinned_powertools_version
from tests.stacks.cfn import ACCOUNT_ROOT, arn, bus_put_events_statements, of_type, only
from tests.stacks.conftest import Synthesized

pytestmark = pytest.mark.cdk

ROUTES = {
    "POST /connections",
    "GET /connections",
    "GET /connections/{id}",
    "DELETE /connections/{id}",
}


def _router(synth: Synthesized) -> tuple[str, dict]:
    (found,) = [
        (k, v["Properties"])
        for k, v in of_type(synth.resources, "AWS::Lambda::Function").items()
        if v["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    return found


def test_function_runtime_handler_and_environment(synth: Synthesized) -> None:
    _, function = _router(synth)
    assert function["Runtime"] == "python3.12"
    assert function["Architectures"] == ["x86_64"]
    env = function["Environment"]["Variables"]
    assert env[router_env.ALLOWED_UPSTREAM_HOSTS] == ",".join(
        synth.settings.options.allowed_upstream_hosts
    )
    assert env[router_env.ALLOW_INSECURE_WS] == "false"
    assert env[router_env.ALLOWED_SECRET_PREFIX] == "websocket-fleet/"
    assert env[router_env.ALLOWED_SECRET_PREFIX] == synth.settings.options.allowed_secret_prefix
    table_id, _ = only(synth.resources, "AWS::DynamoDB::Table")
    assert env[router_env.TABLE_NAME] == {"Ref": table_id}
    assert env[router_env.QUEUE_URL]["Ref"] in synth.resources
    assert env["POWERTOOLS_SERVICE_NAME"]


def test_reserved_concurrency_caps_the_router_at_the_default(synth: Synthesized) -> None:
    _, function = _router(synth)
    assert synth.settings.options.router_reserved_concurrency == 10
    assert function["ReservedConcurrentExecutions"] == 10


def test_powertools_layer_resolves_at_deploy_from_the_public_parameter(
    synth: Synthesized,
) -> None:
    _, function = _router(synth)
    (layer,) = function["Layers"]
    parameter = synth.template.to_json()["Parameters"][layer["Ref"]]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<String>"
    version = pinned_powertools_version()
    assert parameter["Default"] == f"/aws/service/powertools/python/x86_64/python3.12/{version}"


def test_failed_async_invocations_are_bounded_and_kept(synth: Synthesized) -> None:
    function_id, function = _router(synth)
    failed_events = function["DeadLetterConfig"]["TargetArn"]["Fn::GetAtt"][0]
    assert synth.resources[failed_events]["Type"] == "AWS::SQS::Queue"
    _, invoke = only(synth.resources, "AWS::Lambda::EventInvokeConfig")
    assert invoke["FunctionName"] == {"Ref": function_id}
    assert invoke["MaximumRetryAttempts"] == 2
    assert invoke["MaximumEventAgeInSeconds"] <= 3600


def test_every_route_requires_iam_authorization(synth: Synthesized) -> None:
    routes = [
        r["Properties"] for r in of_type(synth.resources, "AWS::ApiGatewayV2::Route").values()
    ]
    assert {r["RouteKey"] for r in routes} == ROUTES
    assert len(routes) == len(ROUTES)
    assert all(r["AuthorizationType"] == "AWS_IAM" for r in routes)
    _, integration = only(synth.resources, "AWS::ApiGatewayV2::Integration")
    function_id, _ = _router(synth)
    assert integration["IntegrationUri"] == arn(function_id)
    assert integration["PayloadFormatVersion"] == "2.0"


def test_stage_writes_access_logs_and_throttles(synth: Synthesized) -> None:
    _, stage = only(synth.resources, "AWS::ApiGatewayV2::Stage")
    assert stage["StageName"] == "$default"
    assert stage["AutoDeploy"] is True
    log_group_id = stage["AccessLogSettings"]["DestinationArn"]["Fn::GetAtt"][0]
    assert synth.resources[log_group_id]["Type"] == "AWS::Logs::LogGroup"
    assert "$context.identity.userArn" in stage["AccessLogSettings"]["Format"]
    assert stage["DefaultRouteSettings"]["ThrottlingRateLimit"] > 0


def test_event_rule_sends_start_and_stop_events_to_the_router(synth: Synthesized) -> None:
    _, rule = only(synth.resources, "AWS::Events::Rule")
    assert rule["EventPattern"] == {
        "source": [synth.settings.options.event_source],
        "detail-type": ["Start Connection", "Stop Connection"],
    }
    (target,) = rule["Targets"]
    function_id, function = _router(synth)
    assert target["Arn"] == arn(function_id)
    assert target["DeadLetterConfig"]["Arn"] == function["DeadLetterConfig"]["TargetArn"]
    assert target["RetryPolicy"]["MaximumRetryAttempts"] <= 5
    assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] <= 3600


def test_events_arrive_on_the_fleets_own_bus_not_the_default_one(synth: Synthesized) -> None:
    bus_id, bus = only(synth.resources, "AWS::Events::EventBus")
    assert bus["Name"] == synth.settings.options.event_bus_name == "WebSocketFleet-prod-events"
    _, rule = only(synth.resources, "AWS::Events::Rule")
    assert rule["EventBusName"] == {"Ref": bus_id}
    outputs = synth.template.to_json()["Outputs"]
    assert outputs["EventBusName"]["Value"] == {"Ref": bus_id}
    assert outputs["EventBusArn"]["Value"] == arn(bus_id)


def test_only_the_account_may_put_events_on_the_bus_by_default(synth: Synthesized) -> None:
    bus_id, _ = only(synth.resources, "AWS::Events::EventBus")
    assert synth.settings.options.event_putter_arns == ()
    assert bus_put_events_statements(synth.resources) == [
        {
            "Sid": "cdk-AccountPutsEvents",
            "Effect": "Allow",
            "Principal": {"AWS": ACCOUNT_ROOT},
            "Action": "events:PutEvents",
            "Resource": arn(bus_id),
        }
    ]


def test_the_construct_names_the_routers_settings_as_the_router_reads_them() -> None:
    from dataclasses import asdict

    from websocket_fleet.router_function import ROUTER_ENVIRONMENT

    names = asdict(ROUTER_ENVIRONMENT)
    assert names == {name: getattr(router_env, name) for name in names}
