"""The HTTP API in front of the router: IAM authorization on every route, access logs."""

from __future__ import annotations

import json
from typing import Final

import jsii
from aws_cdk import RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk.aws_apigatewayv2_authorizers import HttpIamAuthorizer
from aws_cdk.aws_apigatewayv2_integrations import HttpLambdaIntegration
from constructs import Construct

ROUTES: Final = (
    ("/connections", apigwv2.HttpMethod.POST),
    ("/connections", apigwv2.HttpMethod.GET),
    ("/connections/{id}", apigwv2.HttpMethod.GET),
    ("/connections/{id}", apigwv2.HttpMethod.DELETE),
)
ACCESS_LOG_FIELDS: Final = {
    "requestId": "$context.requestId",
    "requestTime": "$context.requestTime",
    "routeKey": "$context.routeKey",
    "status": "$context.status",
    "sourceIp": "$context.identity.sourceIp",
    "caller": "$context.identity.caller",
    "userArn": "$context.identity.userArn",
    "responseLength": "$context.responseLength",
    "integrationLatency": "$context.integrationLatency",
    "integrationError": "$context.integrationErrorMessage",
    "authorizerError": "$context.authorizer.error",
}


@jsii.implements(apigwv2.IAccessLogSettings)
class _AccessLogSettings:
    def __init__(self, log_group: logs.ILogGroup) -> None:
        self._destination = apigwv2.LogGroupLogDestination(log_group)

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigw.AccessLogFormat:
        return apigw.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FIELDS))


class RouterApi(Construct):
    """Routes of docs/DESIGN.md §5.1. Callers sign requests with SigV4; the access log
    records who called (``userArn``) and the outcome. Throttling protects the table
    from a runaway client."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: lambda_.IFunction,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.api = apigwv2.HttpApi(
            self,
            "Api",
            description="Start, stop and list upstream WebSocket connections",
            default_authorizer=HttpIamAuthorizer(),
            create_default_stage=False,
        )
        self.access_logs = logs.LogGroup(
            self, "AccessLogs", retention=log_retention, removal_policy=removal_policy
        )
        self.stage = apigwv2.HttpStage(
            self,
            "DefaultStage",
            http_api=self.api,
            stage_name="$default",
            auto_deploy=True,
            access_log_settings=_AccessLogSettings(self.access_logs),
            throttle=apigwv2.ThrottleSettings(rate_limit=50, burst_limit=100),
        )
        integration = HttpLambdaIntegration("Router", handler)
        for path, method in ROUTES:
            self.api.add_routes(path=path, methods=[method], integration=integration)

    @property
    def url(self) -> str:
        return self.stage.url
