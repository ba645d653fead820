"""Task count follows the connections the fleet holds (target tracking)."""

from __future__ import annotations

from typing import Final

from aws_cdk import Duration
from aws_cdk import aws_ecs as ecs
from constructs import Construct

from websocket_fleet.fleet_metrics import active_connections_average

SCALE_OUT_COOLDOWN: Final = Duration.minutes(1)
SCALE_IN_COOLDOWN: Final = Duration.minutes(10)
"""Scale-in costs a handoff: the stopped task releases its leases and others take them
over (about a second each, docs/DESIGN.md §3.11). A long cooldown keeps a brief dip in
connections from shuffling leases back and forth."""


class WorkerScaling(Construct):
    """Target tracking on the ``ActiveConnections`` Average with dimension ``Service``
    only (the set each task publishes besides ``[Service, TaskId]``): the desired
    count becomes about ``total connections / target``.

    The target should stay below each task's ``MAX_CONNECTIONS`` so the fleet has room
    for the leases of a stopped or crashed task. Scale-in is safe because ECS stops a
    task with SIGTERM and the worker releases every lease before it exits.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        service: ecs.FargateService,
        service_name: str,
        min_tasks: int,
        max_tasks: int,
        target_connections_per_task: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.scalable = service.auto_scale_task_count(
            min_capacity=min_tasks, max_capacity=max_tasks
        )
        self.scalable.scale_to_track_custom_metric(
            "ActiveConnectionsTracking",
            metric=active_connections_average(service=service_name),
            target_value=target_connections_per_task,
            scale_out_cooldown=SCALE_OUT_COOLDOWN,
            scale_in_cooldown=SCALE_IN_COOLDOWN,
        )
