"""The whole system of docs/DESIGN.md §1 in one stack: the constructs and their
wiring."""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, CfnOutput, RemovalPolicy, Stack
from constructs import Construct

from lambdas.router import settings as router_env
from stacks.alarm_topic import AlarmTopic
from stacks.alarms import FleetAlarms
from stacks.connection_table import ConnectionTable
from stacks.dashboard import FleetDashboard
from stacks.event_bus import FleetEventBus
from stacks.fleet_metrics import MonitoredFleet
from stacks.network import FleetNetwork
from stacks.router_api import RouterApi
from stacks.router_events import RouterEvents
from stacks.router_function import RouterFunction
from stacks.settings import LOG_RETENTION, FleetSettings
from stacks.start_queue import StartQueue
from stacks.upstream_secrets import grant_upstream_secrets
from stacks.worker_scaling import WorkerScaling
from stacks.worker_service import WorkerService
from worker import config as worker_env
from wsfleet import metric_names


class WebSocketFleetStack(Stack):
    """Grants are made here, each construct granting only the actions it documents:
    the worker's task role and the router's role get nothing else."""

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: FleetSettings, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = s = settings
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
        WorkerScaling(
            self,
            "Scaling",
            service=workers.service,
            service_name=s.service_name,
            min_tasks=s.min_tasks,
            max_tasks=s.max_tasks,
            target_connections_per_task=s.target_connections_per_task,
        )

        router = RouterFunction(
            self,
            "Router",
            environment={
                router_env.TABLE_NAME: table.table.table_name,
                router_env.QUEUE_URL: starts.queue.queue_url,
                router_env.ALLOWED_UPSTREAM_HOSTS: ",".join(s.allowed_upstream_hosts),
                router_env.ALLOW_INSECURE_WS: "false",
                router_env.ALLOWED_SECRET_PREFIX: s.allowed_secret_prefix,
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
            self, "Dashboard", dashboard_name=s.stack_name, fleet=fleet, alarms=alarms.alarms
        )

        outputs = {
            "ApiUrl": api.url,
            "TableName": table.table.table_name,
            "QueueUrl": starts.queue.queue_url,
            "DeadLetterQueueUrl": starts.dead_letter_queue.queue_url,
            "FailedEventsQueueUrl": router.failed_events.queue_url,
            "EventBusName": bus.bus.event_bus_name,
            "EventBusArn": bus.bus.event_bus_arn,
            "AlarmTopicArn": topic.topic.topic_arn,
            "DashboardUrl": (
                f"https://{Aws.REGION}.console.aws.amazon.com/cloudwatch/home"
                f"?region={Aws.REGION}#dashboards/dashboard/{s.stack_name}"
            ),
            "ClusterName": workers.cluster.cluster_name,
            "WorkerServiceName": workers.service.service_name,
            "RouterFunctionName": router.function.function_name,
        }
        for name, value in outputs.items():
            CfnOutput(self, name, value=value)


def worker_environment(s: FleetSettings, table_name: str, queue_url: str) -> dict[str, str]:
    """The worker's settings (names from worker.config). ``WORKER_ID`` is never set: it
    must be unique per process, and the worker derives it from host, pid and chance."""
    env = {
        worker_env.TABLE_NAME: table_name,
        worker_env.QUEUE_URL: queue_url,
        worker_env.LEASE_SECONDS: f"{s.lease_seconds:g}",
        worker_env.MAX_CONNECTIONS: str(s.max_connections),
        worker_env.REASSIGN_ON_RELEASE: "true" if s.reassign_on_release else "false",
        worker_env.UPSTREAM_CONNECT_BURST: str(s.upstream_connect_burst),
        worker_env.UPSTREAM_CONNECTS_PER_SECOND: f"{s.upstream_connects_per_second:g}",
        worker_env.METRICS_NAMESPACE: metric_names.DEFAULT_NAMESPACE,
        worker_env.SERVICE_NAME: s.service_name,
        worker_env.HEALTH_FILE: worker_env.DEFAULT_HEALTH_FILE,
    }
    if s.worker_handler:
        env[worker_env.HANDLER] = s.worker_handler
    return env
