"""The worker service: image, task settings, graceful stop, health, network, scaling."""

from __future__ import annotations

import io
import json

import pytest

from tests.stacks.cfn import of_type, only
from tests.stacks.conftest import Synthesized
from websocket_fleet.worker_service import HEALTH_CHECK_COMMAND
from worker import config as worker_env
from worker.metrics import FleetMetrics
from wsfleet import metric_names
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.cdk

LEASE = 2.2


def _container(synth: Synthesized) -> dict:
    _, task = only(synth.resources, "AWS::ECS::TaskDefinition")
    (container,) = task["ContainerDefinitions"]
    return container


def _environment(synth: Synthesized) -> dict[str, object]:
    return {e["Name"]: e["Value"] for e in _container(synth)["Environment"]}


def _worker_config(synth: Synthesized) -> worker_env.WorkerConfig:
    """The config the worker builds from the task definition's environment (tokens
    such as the table name stand in as text)."""
    env = _environment(synth)
    return worker_env.WorkerConfig.from_env(
        {k: v if isinstance(v, str) else "x" for k, v in env.items()}
    )


def test_container_stops_gracefully_and_is_health_checked(synth: Synthesized) -> None:
    container = _container(synth)
    assert container["StopTimeout"] == 120
    assert container["HealthCheck"]["Command"] == ["CMD", "python", "-m", "worker.health"]
    assert tuple(container["HealthCheck"]["Command"]) == HEALTH_CHECK_COMMAND
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"


def test_health_check_replaces_only_a_worker_stuck_well_past_its_session_lease(
    synth: Synthesized,
) -> None:
    check = _container(synth)["HealthCheck"]
    assert (check["Interval"], check["Timeout"], check["Retries"], check["StartPeriod"]) == (
        15,
        5,
        3,
        30,
    )
    # The command itself fails once the loop's stamp is older than this (worker.health).
    timing = _worker_config(synth).timing
    assert timing.stale_health_after == max(3 * 0.594, 10.0) == 10.0
    # One check answers before the next starts.
    assert check["Timeout"] < check["Interval"]
    # Marked unhealthy only after `Retries` failed checks in a row: a loop stuck for
    # at least stale_after + (Retries - 1) x Interval, by when its session has long
    # been reaped and its connections taken over.
    stuck_for = timing.stale_health_after + (check["Retries"] - 1) * check["Interval"]
    assert stuck_for == 40
    assert stuck_for > 5 * timing.crash_failover_bound()


def test_worker_environment_uses_the_worker_names_and_never_sets_worker_id(
    synth: Synthesized,
) -> None:
    env = _environment(synth)
    assert worker_env.WORKER_ID not in env
    table_id, _ = only(synth.resources, "AWS::DynamoDB::Table")
    assert env[worker_env.TABLE_NAME] == {"Ref": table_id}
    assert env[worker_env.QUEUE_URL]["Ref"] in synth.resources
    assert env[worker_env.LEASE_SECONDS] == "2.2"
    assert env[worker_env.MAX_CONNECTIONS] == "500"
    assert env[worker_env.REASSIGN_ON_RELEASE] == "true"
    assert env[worker_env.UPSTREAM_CONNECT_BURST] == "200"
    assert env[worker_env.UPSTREAM_CONNECTS_PER_SECOND] == "100"
    assert env[worker_env.METRICS_NAMESPACE] == metric_names.DEFAULT_NAMESPACE
    assert env[worker_env.SERVICE_NAME] == synth.settings.options.service_name
    assert str(env[worker_env.HEALTH_FILE]).startswith("/tmp/")
    # The config the worker would build from this environment is valid.
    config = _worker_config(synth)
    assert config.max_connections == 500
    assert config.timing == synth.settings.options.timing
    assert (config.upstream_connect_burst, config.upstream_connects_per_second) == (200, 100)


def test_worker_timing_is_the_session_design_default(synth: Synthesized) -> None:
    """lease 2.2 s, heartbeat = reconcile = 0.594 s, margin 0.22 s, checkpoint 5 s: the
    worker's own defaults, none of them overridden in the task definition."""
    env = _environment(synth)
    for name in (
        worker_env.HEARTBEAT_SECONDS,
        worker_env.RECONCILE_SECONDS,
        worker_env.CHECKPOINT_SECONDS,
    ):
        assert name not in env, name
    timing = _worker_config(synth).timing
    assert timing == LeaseTiming.from_lease()
    assert (timing.lease, timing.checkpoint) == (LEASE, 5.0)
    assert timing.margin == pytest.approx(0.22)
    assert "MAX_SKEW_SECONDS" not in env
    assert timing.heartbeat == pytest.approx(0.594)
    assert timing.reconcile == pytest.approx(0.594)


def test_service_rolls_back_failed_deployments_and_keeps_capacity(synth: Synthesized) -> None:
    _, service = only(synth.resources, "AWS::ECS::Service")
    deployment = service["DeploymentConfiguration"]
    assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
    assert deployment["MinimumHealthyPercent"] == 100
    assert deployment["MaximumPercent"] == 200
    assert service["LaunchType"] == "FARGATE"
    # The scaling target owns the count; a template value would reset it on each deploy.
    assert "DesiredCount" not in service
    _, cluster = only(synth.resources, "AWS::ECS::Cluster")
    assert {"Name": "containerInsights", "Value": "enabled"} in cluster["ClusterSettings"]


def test_new_vpc_has_public_subnets_only_no_nat_and_flow_logs(synth: Synthesized) -> None:
    assert of_type(synth.resources, "AWS::EC2::NatGateway") == {}
    subnets = of_type(synth.resources, "AWS::EC2::Subnet").values()
    assert subnets
    assert all(s["Properties"]["MapPublicIpOnLaunch"] for s in subnets)
    only(synth.resources, "AWS::EC2::FlowLog")
    _, service = only(synth.resources, "AWS::ECS::Service")
    assert service["NetworkConfiguration"]["AwsvpcConfiguration"]["AssignPublicIp"] == "ENABLED"
    _, group = only(synth.resources, "AWS::EC2::SecurityGroup")
    assert "SecurityGroupIngress" not in group


def test_scaling_tracks_exactly_the_metric_the_worker_publishes(synth: Synthesized) -> None:
    _, policy = only(synth.resources, "AWS::ApplicationAutoScaling::ScalingPolicy")
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    spec = tracking["CustomizedMetricSpecification"]
    assert spec == {
        "Namespace": metric_names.DEFAULT_NAMESPACE,
        "MetricName": metric_names.ACTIVE_CONNECTIONS,
        "Dimensions": [{"Name": metric_names.SERVICE_DIMENSION, "Value": "websocket-fleet"}],
        "Statistic": "Average",
    }
    assert tracking["TargetValue"] == synth.settings.options.target_connections_per_task
    assert tracking["ScaleInCooldown"] >= 300

    # Publish one period as the worker in this task definition would, and check that
    # the policy's metric is among what it wrote: same namespace, a dimension set that
    # is exactly {Service}, the same Service value.
    env = _environment(synth)
    out = io.StringIO()
    FleetMetrics(
        namespace=str(env[worker_env.METRICS_NAMESPACE]),
        service=str(env[worker_env.SERVICE_NAME]),
        task_id="task-1",
        active_connections=lambda: 7,
        out=out,
    ).flush()
    emf = json.loads(out.getvalue())
    (directive,) = emf["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == spec["Namespace"]
    assert [d["Name"] for d in spec["Dimensions"]] in directive["Dimensions"]
    assert emf[metric_names.SERVICE_DIMENSION] == spec["Dimensions"][0]["Value"]
    assert spec["MetricName"] in {metric["Name"] for metric in directive["Metrics"]}
    assert emf[spec["MetricName"]] in (7, [7])  # EMF may carry values as a list


def test_task_count_bounds_come_from_context(synth: Synthesized) -> None:
    _, target = only(synth.resources, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 10)
    assert target["ScalableDimension"] == "ecs:service:DesiredCount"
