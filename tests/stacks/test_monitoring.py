"""Dashboard, alarms and stack outputs."""

from __future__ import annotations

import json

import pytest

from tests.stacks.cfn import of_type, only
from tests.stacks.conftest import Synthesized
from wsfleet import metric_names as m

pytestmark = pytest.mark.cdk


def _alarms(synth: Synthesized) -> dict[str, dict]:
    return {
        k: v["Properties"] for k, v in of_type(synth.resources, "AWS::CloudWatch::Alarm").items()
    }


def _alarm(synth: Synthesized, name: str) -> dict:
    (found,) = [props for k, props in _alarms(synth).items() if name in k]
    return found


def test_dlq_alarms_fire_on_a_single_message(synth: Synthesized) -> None:
    for name in ("StartDlqNotEmpty", "FailedEventsNotEmpty"):
        alarm = _alarm(synth, name)
        assert alarm["Namespace"] == "AWS/SQS"
        assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert alarm["Threshold"] == 1
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    dlq = _alarm(synth, "StartDlqNotEmpty")["Dimensions"][0]["Value"]["Fn::GetAtt"][0]
    _, start_queue = next(
        (k, v)
        for k, v in of_type(synth.resources, "AWS::SQS::Queue").items()
        if "RedrivePolicy" in v["Properties"]
    )
    assert start_queue["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] == dlq


@pytest.mark.parametrize(
    ("name", "metric"),
    [("OrphansPersisting", m.ORPHANS_FOUND), ("LeaseLossesSpiking", m.LEASES_LOST)],
)
def test_lease_alarms_read_the_worker_metrics(synth: Synthesized, name: str, metric: str) -> None:
    alarm = _alarm(synth, name)
    assert alarm["Namespace"] == m.DEFAULT_NAMESPACE
    assert alarm["MetricName"] == metric
    assert alarm["Dimensions"] == [
        {"Name": m.SERVICE_DIMENSION, "Value": synth.settings.service_name}
    ]
    assert alarm["Statistic"] == "Sum"


def test_throttling_alarm_covers_table_and_index(synth: Synthesized) -> None:
    alarm = _alarm(synth, "DynamoDbThrottling")
    stats = [q["MetricStat"]["Metric"] for q in alarm["Metrics"] if "MetricStat" in q]
    names = {(s["MetricName"], len(s["Dimensions"])) for s in stats}
    assert names == {
        ("WriteThrottleEvents", 1),
        ("ReadThrottleEvents", 1),
        ("WriteThrottleEvents", 2),
        ("ReadThrottleEvents", 2),
    }


def test_no_alarm_actions_without_a_topic(synth: Synthesized) -> None:
    assert synth.settings.alarm_topic_arn is None
    assert all("AlarmActions" not in alarm for alarm in _alarms(synth).values())
    assert len(_alarms(synth)) == 6


def test_dashboard_shows_fleet_per_task_queue_ecs_and_dynamodb_metrics(synth: Synthesized) -> None:
    _, dashboard = only(synth.resources, "AWS::CloudWatch::Dashboard")
    body = json.dumps(dashboard["DashboardBody"])
    per_task = (
        f"SEARCH('{{{m.DEFAULT_NAMESPACE},{m.SERVICE_DIMENSION},{m.TASK_DIMENSION}}} "
        f'MetricName=\\\\\\"{m.ACTIVE_CONNECTIONS}\\\\\\"'
    )
    assert per_task in body
    for needle in (
        m.ACTIVE_CONNECTIONS,
        m.ORPHANS_FOUND,
        m.TAKEOVER_LATENCY_MS,
        m.LEASES_LOST,
        m.RENEW_FAILURES,
        m.MESSAGES_PROCESSED,
        m.UPSTREAM_RECONNECTS,
        m.HANDLER_ERRORS,
        "ApproximateNumberOfMessagesVisible",
        "ApproximateAgeOfOldestMessage",
        "RunningTaskCount",
        "CPUUtilization",
        "MemoryUtilization",
        "ConsumedWriteCapacityUnits",
        "WriteThrottleEvents",
        "GlobalSecondaryIndexName",
    ):
        assert needle in body, needle


def test_outputs(synth: Synthesized) -> None:
    outputs = synth.template.to_json()["Outputs"]
    assert {"ApiUrl", "TableName", "QueueUrl", "DashboardUrl"} <= set(outputs)
    assert "#dashboards/dashboard/" in json.dumps(outputs["DashboardUrl"])
    table_id, _ = only(synth.resources, "AWS::DynamoDB::Table")
    assert outputs["TableName"]["Value"] == {"Ref": table_id}
