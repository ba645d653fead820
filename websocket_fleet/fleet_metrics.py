"""CloudWatch metrics the worker publishes (EMF), as the scaling policy, the dashboard
and the alarms read them. Names, namespace and dimensions come from
``wsfleet.metric_names``, the module the worker publishes with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs

from wsfleet import metric_names as names

ONE_MINUTE = Duration.minutes(1)


def fleet_metric(
    metric_name: str,
    *,
    service: str,
    statistic: str = cw.Stats.SUM,
    period: Duration = ONE_MINUTE,
    label: str | None = None,
) -> cw.Metric:
    """A worker metric over the whole fleet: dimension set ``[Service]`` exactly, the
    one every task publishes alongside its per-task set."""
    return cw.Metric(
        namespace=names.DEFAULT_NAMESPACE,
        metric_name=metric_name,
        dimensions_map={names.SERVICE_DIMENSION: service},
        statistic=statistic,
        period=period,
        label=label,
    )


def per_task_search(
    metric_name: str,
    *,
    service: str,
    statistic: str = cw.Stats.AVERAGE,
    period: Duration = ONE_MINUTE,
    label: str = "",
) -> cw.MathExpression:
    """One line per task from the ``[Service, TaskId]`` dimension set. Task ids change
    with every task, so a SEARCH finds them instead of a fixed list."""
    schema = f"{{{names.DEFAULT_NAMESPACE},{names.SERVICE_DIMENSION},{names.TASK_DIMENSION}}}"
    query = f'{schema} MetricName="{metric_name}" {names.SERVICE_DIMENSION}="{service}"'
    return cw.MathExpression(
        expression=f"SEARCH('{query}', '{statistic}', {int(period.to_seconds())})",
        using_metrics={},
        period=period,
        label=label,
    )


def active_connections_average(*, service: str) -> cw.Metric:
    """What the scaling policy tracks: connections per task, averaged over tasks (each
    task publishes one gauge value per period, zeros included)."""
    return fleet_metric(names.ACTIVE_CONNECTIONS, service=service, statistic=cw.Stats.AVERAGE)


@dataclass(frozen=True, slots=True)
class MonitoredFleet:
    """The resources the dashboard and the alarms read metrics from."""

    service_name: str
    """The ``Service`` dimension value the workers publish with."""
    table: dynamodb.ITable
    index_names: tuple[str, ...]
    """The table's global secondary indexes, each reported by DynamoDB on its own."""
    queue: sqs.IQueue
    dead_letter_queue: sqs.IQueue
    failed_events: sqs.IQueue
    cluster: ecs.ICluster
    service: ecs.FargateService
    router: lambda_.IFunction
    api: apigwv2.HttpApi
    api_stage: apigwv2.HttpStage

    def worker(self, metric_name: str, **options: Any) -> cw.Metric:
        return fleet_metric(metric_name, service=self.service_name, **options)

    def dynamodb(self, metric_name: str, *, index: str | None = None) -> cw.Metric:
        """A DynamoDB metric of the table, or of one of its indexes."""
        dimensions = {"TableName": self.table.table_name}
        if index is not None:
            dimensions["GlobalSecondaryIndexName"] = index
        return cw.Metric(
            namespace="AWS/DynamoDB",
            metric_name=metric_name,
            dimensions_map=dimensions,
            statistic=cw.Stats.SUM,
            period=ONE_MINUTE,
            label=f"{index or 'table'} {metric_name}",
        )

    def container_insights(self, metric_name: str, statistic: str = cw.Stats.AVERAGE) -> cw.Metric:
        return cw.Metric(
            namespace="ECS/ContainerInsights",
            metric_name=metric_name,
            dimensions_map={
                "ClusterName": self.cluster.cluster_name,
                "ServiceName": self.service.service_name,
            },
            statistic=statistic,
            period=ONE_MINUTE,
            label=metric_name,
        )
