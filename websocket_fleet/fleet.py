"""The whole system of docs/DESIGN.md §1 as one construct: the parts and their wiring."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Aws, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from websocket_fleet.alarm_topic import AlarmTopic
from websocket_fleet.alarms import FleetAlarms
from websocket_fleet.assets import worker_image
from websocket_fleet.connection_table import ConnectionTable
from websocket_fleet.dashboard import FleetDashboard
from websocket_fleet.event_bus import FleetEventBus
from websocket_fleet.fleet_metrics import MonitoredFleet
from websocket_fleet.handler import WorkerHandler
from websocket_fleet.network import FleetNetwork
from websocket_fleet.options import (
    DEFAULT_SECRET_PREFIX,
    LOG_RETENTION,
    FleetOptions,
    ImportedVpc,
    ProvisionedCapacity,
)
from websocket_fleet.router_api import RouterApi
from websocket_fleet.router_events import RouterEvents
from websocket_fleet.router_function import ROUTER_ENVIRONMENT, RouterFunction
from websocket_fleet.start_queue import StartQueue
from websocket_fleet.upstream_secrets import grant_upstream_secrets
from websocket_fleet.worker_environment import worker_environment
from websocket_fleet.worker_scaling import WorkerScaling
from websocket_fleet.worker_service import WorkerService
from wsfleet.metric_names import DEFAULT_SERVICE_NAME
from wsfleet.protocol_registry import registry_text
from wsfleet.timing import DEFAULT_LEASE_SECONDS


class WebSocketFleet(Construct):
    """Workers on Fargate that own long-lived outbound WebSocket connections through
    DynamoDB sessions, a router Lambda behind an HTTP API (IAM auth) and on an
    EventBridge bus of the fleet's own, an SQS start queue with a DLQ, and a
    CloudWatch dashboard and alarms; checked against cdk-nag's AwsSolutions rules.

    Every option is keyword-only and validated when the construct is made
    (:class:`websocket_fleet.FleetOptionsError` names the option); the defaults are
    production values. docs/DEPLOY.md describes each.

    Grants are made here, each part granting only the actions it documents: the
    worker's task role and the router's role get nothing else.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        allowed_upstream_hosts: Sequence[str],
        handler: WorkerHandler | None = None,
        worker_settings: Mapping[str, str] | None = None,
        handler_environment: Mapping[str, str] | None = None,
        upstream_protocols: Mapping[str, str] | None = None,
        service_name: str = DEFAULT_SERVICE_NAME,
        allowed_secret_prefix: str = DEFAULT_SECRET_PREFIX,
        max_connections: int = 500,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        min_tasks: int = 2,
        max_tasks: int = 10,
        target_connections_per_task: int = 350,
        dlq_max_receive_count: int = 5,
        vpc: ImportedVpc | None = None,
        table_billing: str = "PAY_PER_REQUEST",
        provisioned_capacity: ProvisionedCapacity | None = None,
        dev: bool = False,
        event_bus_name: str | None = None,
        event_putter_arns: Sequence[str] = (),
        event_source: str = "websocket-fleet",
        log_retention_days: int = 30,
        alarm_topic_arn: str | None = None,
        alarm_email: str | None = None,
        start_age_alarm_seconds: int = 600,
        router_reserved_concurrency: int = 10,
        task_cpu: int = 256,
        task_memory_mib: int = 512,
        powertools_version: str | None = None,
        reassign_on_release: bool = True,
        upstream_connect_burst: int = 200,
        upstream_connects_per_second: float = 100.0,
        dashboard_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.options = s = FleetOptions(
            allowed_upstream_hosts=tuple(allowed_upstream_hosts),
            handler=handler,
            worker_settings=dict(worker_settings or {}),
            handler_environment=dict(handler_environment or {}),
            upstream_protocols=dict(upstream_protocols or {}),
            service_name=service_name,
            allowed_secret_prefix=allowed_secret_prefix,
            max_connections=max_connections,
            lease_seconds=lease_seconds,
            min_tasks=min_tasks,
            max_tasks=max_tasks,
            target_connections_per_task=target_connections_per_task,
            dlq_max_receive_count=dlq_max_receive_count,
            vpc=vpc,
            table_billing=table_billing,
            provisioned_capacity=provisioned_capacity or ProvisionedCapacity(),
            dev=dev,
            event_bus_name=event_bus_name,
            event_putter_arns=tuple(event_putter_arns),
            event_source=event_source,
            log_retention_days=log_retention_days,
            alarm_topic_arn=alarm_topic_arn,
            alarm_email=alarm_email,
            start_age_alarm_seconds=start_age_alarm_seconds,
            router_reserved_concurrency=router_reserved_concurrency,
            task_cpu=task_cpu,
            task_memory_mib=task_memory_mib,
            powertools_version=powertools_version,
            reassign_on_release=reassign_on_release,
            upstream_connect_burst=upstream_connect_burst,
            upstream_connects_per_second=upstream_connects_per_second,
            dashboard_name=dashboard_name,
        ).resolved(Stack.of(scope).stack_name)
        self._build(s)

    def _build(self, s: FleetOptions) -> None:
        # Filled in by FleetOptions.resolved.
        assert s.event_bus_name is not None
        assert s.dashboard_name is not None
        assert s.powertools_version is not None
        removal = RemovalPolicy.DESTROY if s.dev else RemovalPolicy.RETAIN
        retention = LOG_RETENTION[s.log_retention_days]

        table = ConnectionTable(
            self,
            "Connections",
            billing=s.table_billing,
            capacity=s.provisioned_capacity,
            removal_policy=removal,
        )
        starts = StartQueue(
            self, "Starts", max_receive_count=s.dlq_max_receive_count, removal_policy=removal
        )
        network = FleetNetwork(
            self, "Network", imported=s.vpc, flow_log_retention=retention, removal_policy=removal
        )
        workers = WorkerService(
            self,
            "Workers",
            vpc=network.vpc,
            subnets=network.subnets,
            assign_public_ip=network.assign_public_ip,
            image=worker_image(self, s.handler),
            environment=worker_environment(s, table.table.table_name, starts.queue.queue_url),
            cpu=s.task_cpu,
            memory_mib=s.task_memory_mib,
            log_retention=retention,
            removal_policy=removal,
        )
        task_role = workers.task_definition.task_role
        table.grant_worker_access(task_role)
        starts.grant_worker_access(task_role)
        grant_upstream_secrets(task_role, s.allowed_secret_prefix)
        if s.handler is not None and s.handler.grant is not None:
            s.handler.grant(task_role)
        WorkerScaling(
            self,
            "Scaling",
            service=workers.service,
            service_name=s.service_name,
            min_tasks=s.min_tasks,
            max_tasks=s.max_tasks,
            target_connections_per_task=s.target_connections_per_task,
        )

        names = ROUTER_ENVIRONMENT
        # The workers' registry, so that the router admits exactly the plug-ins they
        # load (unset without plug-ins: a template without them stays as it was).
        protocols = (
            {names.UPSTREAM_PROTOCOLS: registry_text(s.upstream_protocols)}
            if s.upstream_protocols
            else {}
        )
        router = RouterFunction(
            self,
            "Router",
            environment={
                names.TABLE_NAME: table.table.table_name,
                names.QUEUE_URL: starts.queue.queue_url,
                names.ALLOWED_UPSTREAM_HOSTS: ",".join(s.allowed_upstream_hosts),
                names.ALLOW_INSECURE_WS: "false",
                names.ALLOWED_SECRET_PREFIX: s.allowed_secret_prefix,
                **protocols,
                "POWERTOOLS_SERVICE_NAME": f"{s.service_name}-router",
            },
            powertools_version=s.powertools_version,
            reserved_concurrency=s.router_reserved_concurrency,
            log_retention=retention,
            removal_policy=removal,
        )
        table.grant_router_access(router.role)
        starts.grant_send(router.role)
        api = RouterApi(
            self, "Api", handler=router.function, log_retention=retention, removal_policy=removal
        )
        bus = FleetEventBus(
            self, "EventBus", bus_name=s.event_bus_name, putter_arns=s.event_putter_arns
        )
        RouterEvents(
            self,
            "Events",
            handler=router.function,
            dead_letter_queue=router.failed_events,
            event_bus=bus.bus,
            source=s.event_source,
        )

        fleet = MonitoredFleet(
            service_name=s.service_name,
            table=table.table,
            index_names=table.index_names,
            queue=starts.queue,
            dead_letter_queue=starts.dead_letter_queue,
            failed_events=router.failed_events,
            cluster=workers.cluster,
            service=workers.service,
            router=router.function,
            api=api.api,
            api_stage=api.stage,
        )
        topic = AlarmTopic(
            self, "AlarmTopic", existing_topic_arn=s.alarm_topic_arn, email=s.alarm_email
        )
        alarms = FleetAlarms(
            self,
            "Alarms",
            fleet=fleet,
            topic=topic.topic,
            start_age_alarm_seconds=s.start_age_alarm_seconds,
        )
        FleetDashboard(
            self, "Dashboard", dashboard_name=s.dashboard_name, fleet=fleet, alarms=alarms.alarms
        )

        self.table: dynamodb.ITable = table.table
        self.queue: sqs.IQueue = starts.queue
        self.dead_letter_queue: sqs.IQueue = starts.dead_letter_queue
        self.failed_events_queue: sqs.IQueue = router.failed_events
        self.event_bus: events.IEventBus = bus.bus
        self.alarm_topic: sns.ITopic = topic.topic
        self.api_url: str = api.url
        self.cluster: ecs.ICluster = workers.cluster
        self.service: ecs.FargateService = workers.service
        self.task_definition: ecs.FargateTaskDefinition = workers.task_definition
        self.task_role: iam.IRole = task_role
        """The workers' role: grant it what the handler writes to."""
        self.router_function: lambda_.IFunction = router.function
        self.dashboard_url: str = (
            f"https://{Aws.REGION}.console.aws.amazon.com/cloudwatch/home"
            f"?region={Aws.REGION}#dashboards/dashboard/{s.dashboard_name}"
        )
