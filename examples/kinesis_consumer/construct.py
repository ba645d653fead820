"""The example consumer as a CDK construct: the function of ``handler.py`` on a
Kinesis stream of envelopes, its dedup table, its output table and where records go
that could not be handled.

Synth only copies files (``handler.py`` and the ``wsfleet`` package, which the function
imports; boto3 comes from the runtime, Powertools from its public layer): no Docker, no
bundling, no network.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Final

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

import wsfleet
from websocket_fleet.sources import pinned_version
from wsfleet import deduper

HERE: Final = Path(__file__).resolve().parent
HANDLER: Final = "handler.handler"
RUNTIME: Final = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE: Final = lambda_.Architecture.ARM_64
# The layer's variant must match the function's runtime and architecture.
POWERTOOLS_PARAMETER: Final = (
    f"/aws/service/powertools/python/{ARCHITECTURE.name}/{RUNTIME.name}/{{version}}"
)
_LEFT_OUT: Final = ("__pycache__", "*.pyc")


def function_code() -> lambda_.Code:
    """``handler.py`` and ``wsfleet/``, staged into a directory of their own so that
    an edit to the README, the construct or the tests does not change the asset."""
    staged = Path(tempfile.mkdtemp(prefix="kinesis-consumer-"))
    atexit.register(shutil.rmtree, staged, ignore_errors=True)
    shutil.copy2(HERE / "handler.py", staged / "handler.py")
    shutil.copytree(
        Path(wsfleet.__file__).resolve().parent,
        staged / "wsfleet",
        ignore=shutil.ignore_patterns(*_LEFT_OUT),
    )
    return lambda_.Code.from_asset(str(staged))


class KinesisConsumer(Construct):
    """Reads ``stream`` from its oldest record (a replay is harmless: the dedup table
    skips what was applied) in batches of ``batch_size``.

    A record the function reports failed is given again with every later record of its
    shard; after ``retry_attempts`` it is passed over and its metadata (shard and
    sequence numbers, not the data) goes to ``failures``, a queue kept 14 days, so it
    can be read again from the stream while the stream still holds it. Passed-over
    records show in the function's log as a gap on the next message of their
    connection. ``bisect_batch_on_error`` splits a batch whose invocation failed as a
    whole (a timeout), so one slow record does not fail its neighbours' retries.

    The handler's batch processing is Powertools', from the public Powertools layer
    of ``powertools_version`` (the fleet's pin of aws-lambda-powertools unless given),
    whose ARN is read from AWS's public SSM parameter when the stack deploys (a
    CloudFormation parameter), not looked up at synth.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        stream: kinesis.IStream,
        batch_size: int = 100,
        retry_attempts: int = 10,
        max_record_age: Duration | None = None,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        powertools_version: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        version = powertools_version or pinned_version("aws-lambda-powertools")
        self.dedup_table = dynamodb.Table(
            self,
            "Dedup",
            partition_key=dynamodb.Attribute(
                name=deduper.PARTITION_KEY, type=dynamodb.AttributeType.STRING
            ),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=removal_policy,
        )
        self.output_table = dynamodb.Table(
            self,
            "Output",
            partition_key=dynamodb.Attribute(
                name="connection_id", type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(name="item", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=removal_policy,
        )
        self.failures = sqs.Queue(
            self,
            "Failures",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
            removal_policy=removal_policy,
        )
        Validations.of(self.failures).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This queue is the event source's on-failure destination: a queue "
                "of last resort, read by people, with nothing further to hand on to.",
            )
        )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention, removal_policy=removal_policy
        )
        # An own role: AWSLambdaBasicExecutionRole would allow writing to every log
        # group of the account.
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.log_group.grant_write(self.role)
        # The transaction is authorised item by item: the dedup update, the message's
        # put, the tally's update. Nothing is read.
        self.dedup_table.grant(self.role, "dynamodb:UpdateItem")
        self.output_table.grant(self.role, "dynamodb:PutItem", "dynamodb:UpdateItem")
        layer_arn = ssm.StringParameter.value_for_string_parameter(
            self, POWERTOOLS_PARAMETER.format(version=version)
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=HANDLER,
            code=function_code(),
            layers=[lambda_.LayerVersion.from_layer_version_arn(self, "Powertools", layer_arn)],
            environment={
                "DEDUP_TABLE": self.dedup_table.table_name,
                "OUTPUT_TABLE": self.output_table.table_name,
            },
            memory_size=256,
            timeout=Duration.seconds(60),
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
        )
        self.function.add_event_source(
            sources.KinesisEventSource(
                stream,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=batch_size,
                bisect_batch_on_error=True,
                report_batch_item_failures=True,
                retry_attempts=retry_attempts,
                max_record_age=max_record_age or Duration.days(1),
                on_failure=sources.SqsDlq(self.failures),
            )
        )
