"""This repository's stack: one :class:`websocket_fleet.WebSocketFleet` with the
options of the selected environment, and the outputs an operator needs; with
``sink=kinesis``, also the stream the workers' Kinesis sink writes to."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kinesis as kinesis
from constructs import Construct

from stacks.settings import FleetSettings
from websocket_fleet import WebSocketFleet, WorkerHandler

FLEET_ID = "Default"
"""CDK leaves a ``Default`` id out of logical ids: the resources keep the ids they had
when the stack defined them itself, so a deploy over a stack of an earlier version
replaces nothing (the table above all)."""


class WebSocketFleetStack(Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, settings: FleetSettings, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        options = settings.options
        values = {f.name: getattr(options, f.name) for f in fields(options)}
        self.sink_stream: kinesis.Stream | None = None
        if settings.sink == "kinesis":
            self.sink_stream = sink_stream(self, dev=options.dev)
            values["handler"] = WorkerHandler.kinesis(self.sink_stream)
        self.fleet = fleet = WebSocketFleet(self, FLEET_ID, **values)
        # A security group's description is its construct path by default, and a new
        # description replaces the group (and redeploys the service): keep the one it
        # had when this stack defined the fleet itself.
        group = fleet.service.connections.security_groups[0].node.default_child
        assert isinstance(group, ec2.CfnSecurityGroup)
        group.group_description = f"{self.stack_name}/Workers/Service/SecurityGroup"
        outputs = {
            "ApiUrl": fleet.api_url,
            "TableName": fleet.table.table_name,
            "QueueUrl": fleet.queue.queue_url,
            "DeadLetterQueueUrl": fleet.dead_letter_queue.queue_url,
            "FailedEventsQueueUrl": fleet.failed_events_queue.queue_url,
            "EventBusName": fleet.event_bus.event_bus_name,
            "EventBusArn": fleet.event_bus.event_bus_arn,
            "AlarmTopicArn": fleet.alarm_topic.topic_arn,
            "DashboardUrl": fleet.dashboard_url,
            "ClusterName": fleet.cluster.cluster_name,
            "WorkerServiceName": fleet.service.service_name,
            "RouterFunctionName": fleet.router_function.function_name,
        }
        if self.sink_stream is not None:
            outputs["SinkStreamName"] = self.sink_stream.stream_name
            outputs["SinkStreamArn"] = self.sink_stream.stream_arn
        for name, value in outputs.items():
            CfnOutput(self, name, value=value)


def sink_stream(scope: Construct, *, dev: bool) -> kinesis.Stream:
    """The stream of ``sink=kinesis``: on demand (no shards to size; it follows the
    fleet's write rate), encrypted with the AWS-managed key ``aws/kinesis`` (a
    customer key would cost per request and need its grants on every consumer too;
    cdk-nag's KDS3 asks for this one), records kept 24 hours. Kept when the stack is
    deleted, as the table is, unless ``dev``."""
    return kinesis.Stream(
        scope,
        "SinkStream",
        stream_mode=kinesis.StreamMode.ON_DEMAND,
        encryption=kinesis.StreamEncryption.MANAGED,
        removal_policy=RemovalPolicy.DESTROY if dev else RemovalPolicy.RETAIN,
    )
