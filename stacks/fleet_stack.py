"""This repository's stack: one :class:`websocket_fleet.WebSocketFleet` with the
options of the selected environment, and the outputs an operator needs."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.settings import FleetSettings
from websocket_fleet import WebSocketFleet

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
        self.fleet = fleet = WebSocketFleet(
            self, FLEET_ID, **{f.name: getattr(options, f.name) for f in fields(options)}
        )
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
        for name, value in outputs.items():
            CfnOutput(self, name, value=value)
