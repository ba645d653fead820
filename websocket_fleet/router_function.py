"""The router Lambda: one function for the HTTP API and for EventBridge events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from websocket_fleet.assets import ROUTER_HANDLER, router_code

RUNTIME: Final = lambda_.Runtime.PYTHON_3_12
POWERTOOLS_PARAMETER: Final = "/aws/service/powertools/python/x86_64/python3.12/{version}"
ASYNC_RETRY_ATTEMPTS: Final = 2
ASYNC_MAX_EVENT_AGE: Final = Duration.hours(1)


@dataclass(frozen=True, slots=True)
class RouterEnvironment:
    """The names of the router's settings (``lambdas/router/settings.py``, which
    tests/stacks/test_router.py holds these to: the router's package is not importable
    from an installed copy of this one)."""

    TABLE_NAME: str = "TABLE_NAME"
    QUEUE_URL: str = "QUEUE_URL"
    ALLOWED_UPSTREAM_HOSTS: str = "ALLOWED_UPSTREAM_HOSTS"
    ALLOW_INSECURE_WS: str = "ALLOW_INSECURE_WS"
    ALLOWED_SECRET_PREFIX: str = "ALLOWED_SECRET_PREFIX"
    UPSTREAM_PROTOCOLS: str = "UPSTREAM_PROTOCOLS"


ROUTER_ENVIRONMENT: Final = RouterEnvironment()


class RouterFunction(Construct):
    """Third-party code (Powertools, pydantic v2) comes from the public Powertools layer
    for python3.12 / x86_64. Its ARN is read from AWS's public SSM parameter when the
    stack deploys (a CloudFormation parameter), not looked up at synth.

    Asynchronous invocations (EventBridge) are retried at most twice and then land in
    ``failed_events``, so an event the router cannot handle is kept, never retried
    forever. The role is the stack's to fill: logs to its own group here, the table
    and queue grants in the stack.

    ``reserved_concurrency`` caps the executions that write to the table at once. The
    HTTP API has its own throttle; the EventBridge path has none, so without the cap a
    burst of events would fan out to the account's whole concurrency and write to the
    state index's single hot partition next to the renews. Throttled asynchronous
    invocations wait in Lambda's queue (up to the one-hour event age, then
    ``failed_events``); throttled API calls answer 5xx.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Mapping[str, str],
        powertools_version: str,
        reserved_concurrency: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.failed_events = sqs.Queue(
            self,
            "FailedEvents",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
            removal_policy=removal_policy,
        )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention, removal_policy=removal_policy
        )
        # An own role instead of AWSLambdaBasicExecutionRole, whose logs:CreateLogGroup
        # and PutLogEvents apply to every log group of the account.
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.log_group.grant_write(self.role)
        layer_arn = ssm.StringParameter.value_for_string_parameter(
            self, POWERTOOLS_PARAMETER.format(version=powertools_version)
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=lambda_.Architecture.X86_64,
            handler=ROUTER_HANDLER,
            code=router_code(),
            layers=[lambda_.LayerVersion.from_layer_version_arn(self, "Powertools", layer_arn)],
            environment=dict(environment),
            memory_size=256,
            timeout=Duration.seconds(10),
            reserved_concurrent_executions=reserved_concurrency,
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            dead_letter_queue=self.failed_events,
            retry_attempts=ASYNC_RETRY_ATTEMPTS,
            max_event_age=ASYNC_MAX_EVENT_AGE,
        )
        Validations.of(self.function).acknowledge(
            Acknowledgment(
                id="AwsSolutions-L1",
                reason="Pinned to python3.12 on purpose: the Powertools layer variant "
                "(python3.12/x86_64, with pydantic-core built for it) must match the "
                "runtime; move both together when upgrading.",
            )
        )
