"""The worker fleet: an ECS cluster and a Fargate service running the worker image."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Size, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

STOP_TIMEOUT: Final = Duration.seconds(120)
"""Fargate's maximum: time between SIGTERM and SIGKILL for the worker to stop reading,
release every lease with its final checkpoint and send the ``reassign`` hints."""
HEALTH_CHECK_COMMAND: Final = ("CMD", "python", "-m", "worker.health")
"""Fails once the event loop's stamp is older than ``LeaseTiming.stale_health_after``:
three heartbeats and never less than 10 s (10 s at the default 2.2 s lease)."""
HEALTH_CHECK_INTERVAL: Final = Duration.seconds(15)
HEALTH_CHECK_TIMEOUT: Final = Duration.seconds(5)
HEALTH_CHECK_RETRIES: Final = 3
"""Three failed checks in a row, 15 s apart, mark the task unhealthy and ECS replaces
it: a loop stuck for about 40 to 55 s at the defaults. Nothing waits on that: the
stalled worker's session lapses after one lease and is taken over within seconds; the
check only recycles a worker that does not come back (one that does finds its session
reaped and opens a new one). A shorter trigger would restart tasks for pauses they
recover from by themselves."""
HEALTH_CHECK_START_PERIOD: Final = Duration.seconds(30)
"""Failures while the interpreter starts, before the first stamp, do not count."""


class WorkerService(Construct):
    """The task role starts empty; the stack grants it exactly what the worker uses.

    Deployments start new tasks before stopping old ones (100-200 %), and a deployment
    whose tasks fail their health check is rolled back by the circuit breaker. The task
    count is left to the scaling target (``WorkerScaling``): a desired count in the
    template would reset the scaled count on every deployment.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        assign_public_ip: bool,
        image: ecs.ContainerImage,
        environment: Mapping[str, str],
        cpu: int,
        memory_mib: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=vpc, container_insights_v2=ecs.ContainerInsights.ENABLED
        )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention, removal_policy=removal_policy
        )
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=cpu,
            memory_limit_mib=memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        self.container = self.task_definition.add_container(
            "worker",
            image=image,
            environment=dict(environment),
            stop_timeout=STOP_TIMEOUT,
            health_check=ecs.HealthCheck(
                command=list(HEALTH_CHECK_COMMAND),
                interval=HEALTH_CHECK_INTERVAL,
                timeout=HEALTH_CHECK_TIMEOUT,
                retries=HEALTH_CHECK_RETRIES,
                start_period=HEALTH_CHECK_START_PERIOD,
            ),
            # Non-blocking: a slow log pipe must never stall the event loop (a stalled
            # loop misses session renews and pauses every connection); the buffer
            # absorbs bursts.
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix="worker",
                log_group=self.log_group,
                mode=ecs.AwsLogDriverMode.NON_BLOCKING,
                max_buffer_size=Size.mebibytes(25),
            ),
        )
        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            vpc_subnets=subnets,
            assign_public_ip=assign_public_ip,
            min_healthy_percent=100,
            max_healthy_percent=200,
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
            platform_version=ecs.FargatePlatformVersion.LATEST,
            propagate_tags=ecs.PropagatedTagSource.SERVICE,
            enable_ecs_managed_tags=True,
        )
        Validations.of(self.task_definition).acknowledge(
            Acknowledgment(
                id="AwsSolutions-ECS2",
                reason="The environment holds only non-secret settings (table name, queue "
                "URL, timings, capacity, service name). Upstream credentials never pass "
                "through it: the worker reads each connection's secret from Secrets Manager "
                "when it connects, by the reference on the connection item.",
            )
        )
        Validations.of(self.task_definition.obtain_execution_role()).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="ecr:GetAuthorizationToken, which ECS needs to pull the worker "
                "image, supports no resource-level permissions (AWS requires '*'); the "
                "layer pulls are limited to the asset repository.",
            )
        )
