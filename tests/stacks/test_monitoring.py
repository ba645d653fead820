"""Dashboard, alarms and stack outputs."""

from __future__ import annotations

import json

import pytest

from tests.stacks.cfn import arn, of_type, only
from tests.stacks.conftest import Synthesized, cdk_json_context, synthesize
from wsfleet import metric_names as m
from wsfleet import schema

pytestmark = pytest.mark.cdk

EMAIL = "oncall@example.com"


@pytest.fixture(scope="module")
def with_email(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """A synth (cdk-nag included) whose context subscribes an email address."""
    return synthesize(
        {**cdk_json_context(), "fleet:alarmEmail": EMAIL}, tmp_path_factory.mktemp("email.out")
    )


def _alarms(synth: Synthesized) -> dict[str, dict]:
    return {
        k: v["Properties"] for k, v in of_type(synth.resources, "AWS::CloudWatch::Alarm").items()
    }


def _alarm(synth: Synthesized, name: str) -> dict:
    (found,) = [props for k, props in _alarms(synth).items() if name in k]
    return found


def _start_queue(synth: Synthesized) -> tuple[str, dict]:
    (found,) = [
        (k, v["Properties"])
        for k, v in of_type(synth.resources, "AWS::SQS::Queue").items()
        if "RedrivePolicy" in v["Properties"]
    ]
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
    ("name", "metric", "period", "threshold", "datapoints", "periods"),
    [
        ("OrphansPersisting", m.ORPHANS_FOUND, 60, 1, 5, 5),
        ("LeaseLossesSpiking", m.LEASES_LOST, 300, 5, 1, 1),
        # sustained: failures in 3 of 5 one-minute periods, not one bad minute
        ("RenewFailuresSustained", m.RENEW_FAILURES, 60, 1, 3, 5),
        # any connection parked in five minutes: a person looks at the reason
        ("ConnectionsFailing", m.CONNECTIONS_FAILED, 300, 1, 1, 1),
        # any refusal: a deploy mixed two session protocols on one table
        ("ForeignSessionProtocol", m.FOREIGN_SESSIONS, 60, 1, 1, 1),
        # any message a sink set aside, any skipped: a loss a person must see
        ("SinkMessagesSetAside", m.SINK_MESSAGES_SET_ASIDE, 300, 1, 1, 1),
        ("MessagesSkipped", m.MESSAGES_SKIPPED, 300, 1, 1, 1),
    ],
)
def test_lease_alarms_read_the_worker_metrics(
    synth: Synthesized,
    name: str,
    metric: str,
    period: int,
    threshold: int,
    datapoints: int,
    periods: int,
) -> None:
    alarm = _alarm(synth, name)
    assert alarm["Namespace"] == m.DEFAULT_NAMESPACE
    assert alarm["MetricName"] == metric
    assert alarm["Dimensions"] == [
        {"Name": m.SERVICE_DIMENSION, "Value": synth.settings.options.service_name}
    ]
    assert alarm["Statistic"] == "Sum"
    assert (alarm["Period"], alarm["Threshold"]) == (period, threshold)
    assert (alarm["DatapointsToAlarm"], alarm["EvaluationPeriods"]) == (datapoints, periods)
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"


def test_oldest_start_message_alarm_uses_the_start_queue_and_the_context_threshold(
    synth: Synthesized,
) -> None:
    alarm = _alarm(synth, "StartMessagesWaiting")
    queue_id, _ = _start_queue(synth)
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/SQS", "ApproximateAgeOfOldestMessage")
    assert alarm["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": [queue_id, "QueueName"]}}
    ]
    assert (alarm["Statistic"], alarm["Period"]) == ("Maximum", 60)
    assert alarm["Threshold"] == synth.settings.options.start_age_alarm_seconds == 600
    assert (alarm["DatapointsToAlarm"], alarm["EvaluationPeriods"]) == (2, 2)
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_router_errors_and_api_5xx_alarms_fire_on_errors_in_2_of_3_periods(
    synth: Synthesized,
) -> None:
    (router_id,) = [
        k
        for k, v in of_type(synth.resources, "AWS::Lambda::Function").items()
        if v["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    api_id, _ = only(synth.resources, "AWS::ApiGatewayV2::Api")
    _, stage = only(synth.resources, "AWS::ApiGatewayV2::Stage")
    expected = {
        "RouterErrors": (
            "AWS/Lambda",
            "Errors",
            [{"Name": "FunctionName", "Value": {"Ref": router_id}}],
        ),
        "ApiServerErrors": (
            "AWS/ApiGateway",
            "5xx",
            [
                {"Name": "ApiId", "Value": {"Ref": api_id}},
                {"Name": "Stage", "Value": stage["StageName"]},
            ],
        ),
    }
    for name, (namespace, metric, dimensions) in expected.items():
        alarm = _alarm(synth, name)
        assert (alarm["Namespace"], alarm["MetricName"]) == (namespace, metric), name
        assert alarm["Dimensions"] == dimensions, name
        assert (alarm["Statistic"], alarm["Period"], alarm["Threshold"]) == ("Sum", 300, 1)
        assert (alarm["DatapointsToAlarm"], alarm["EvaluationPeriods"]) == (2, 3)
        assert alarm["TreatMissingData"] == "notBreaching"


def test_no_worker_alarm_counts_no_data_as_down_but_not_before_a_warm_up(
    synth: Synthesized,
) -> None:
    alarm = _alarm(synth, "NoWorkerRunning")
    cluster_id, _ = only(synth.resources, "AWS::ECS::Cluster")
    service_id, _ = only(synth.resources, "AWS::ECS::Service")
    (query,) = alarm["Metrics"]
    assert query["ReturnData"] is True
    assert query["MetricStat"]["Metric"] == {
        "Namespace": "ECS/ContainerInsights",
        "MetricName": "RunningTaskCount",
        "Dimensions": [
            {"Name": "ClusterName", "Value": {"Ref": cluster_id}},
            {"Name": "ServiceName", "Value": {"Fn::GetAtt": [service_id, "Name"]}},
        ],
    }
    assert (query["MetricStat"]["Stat"], query["MetricStat"]["Period"]) == ("Minimum", 60)
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1)
    assert (alarm["DatapointsToAlarm"], alarm["EvaluationPeriods"]) == (3, 3)
    # Container Insights is silent when no task runs, so missing data breaches; a
    # fresh stack has no data yet either, and stays INSUFFICIENT_DATA (no action)
    # until the window holds data or 15 minutes have passed.
    assert alarm["TreatMissingData"] == "breaching"
    assert alarm["WarmUpConfiguration"] == {"WarmUpPeriodDurationInMinutes": 15}
    others = [a for k, a in _alarms(synth).items() if "NoWorkerRunning" not in k]
    assert all(a["TreatMissingData"] == "notBreaching" for a in others)
    assert all("WarmUpConfiguration" not in a for a in others)


def test_throttling_alarm_covers_the_table_and_every_index(synth: Synthesized) -> None:
    alarm = _alarm(synth, "DynamoDbThrottling")
    table_id, _ = only(synth.resources, "AWS::DynamoDB::Table")
    stats = [q["MetricStat"]["Metric"] for q in alarm["Metrics"] if "MetricStat" in q]
    assert all(s["Namespace"] == "AWS/DynamoDB" for s in stats)
    seen = set()
    for stat in stats:
        dimensions = {d["Name"]: d["Value"] for d in stat["Dimensions"]}
        assert dimensions.pop("TableName") == {"Ref": table_id}
        seen.add((stat["MetricName"], dimensions.get("GlobalSecondaryIndexName")))
    places = [None, schema.STATE_INDEX_NAME, schema.OWNER_INDEX_NAME, schema.UNOWNED_INDEX_NAME]
    assert len(stats) == len(seen) == 8
    assert seen == {
        (f"{kind}ThrottleEvents", place) for kind in ("Write", "Read") for place in places
    }
    (expression,) = [q for q in alarm["Metrics"] if "Expression" in q]
    assert expression["ReturnData"] is True
    # every metric is summed, a missing one counting as 0
    assert expression["Expression"].count("FILL(") == 8


def test_every_alarm_notifies_the_stacks_topic_on_alarm_and_on_ok(synth: Synthesized) -> None:
    assert synth.settings.options.alarm_topic_arn is None
    topic_id, _ = only(synth.resources, "AWS::SNS::Topic")
    alarms = _alarms(synth)
    assert len(alarms) == 14
    for name, alarm in alarms.items():
        assert alarm["AlarmActions"] == [{"Ref": topic_id}], name
        assert alarm["OKActions"] == [{"Ref": topic_id}], name
    assert synth.template.to_json()["Outputs"]["AlarmTopicArn"]["Value"] == {"Ref": topic_id}


def test_alarm_topic_is_encrypted_with_a_key_cloudwatch_may_use(synth: Synthesized) -> None:
    key_id, key = only(synth.resources, "AWS::KMS::Key")
    synth.template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": arn(key_id)})
    assert key["EnableKeyRotation"] is True
    (cloudwatch,) = [
        statement
        for statement in key["KeyPolicy"]["Statement"]
        if statement["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    ]
    assert cloudwatch["Effect"] == "Allow"
    assert cloudwatch["Action"] == ["kms:Decrypt", "kms:GenerateDataKey*"]


def test_alarm_topic_requires_tls_and_lets_this_accounts_alarms_publish(
    synth: Synthesized,
) -> None:
    topic_id, _ = only(synth.resources, "AWS::SNS::Topic")
    _, policy = only(synth.resources, "AWS::SNS::TopicPolicy")
    assert policy["Topics"] == [{"Ref": topic_id}]
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert statements["AllowPublishThroughSSLOnly"] == {
        "Sid": "AllowPublishThroughSSLOnly",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "sns:Publish",
        "Resource": {"Ref": topic_id},
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    publish = statements["CloudWatchAlarmsPublish"]
    assert (publish["Effect"], publish["Action"]) == ("Allow", "sns:Publish")
    assert publish["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    source = publish["Condition"]["ArnLike"]["aws:SourceArn"]["Fn::Join"][1]
    assert source[1:] == [
        {"Ref": "AWS::Partition"},
        ":cloudwatch:",
        {"Ref": "AWS::Region"},
        ":",
        {"Ref": "AWS::AccountId"},
        ":alarm:*",
    ]
    assert len(statements) == 2


def test_no_email_subscription_unless_context_sets_one(synth: Synthesized) -> None:
    assert synth.settings.options.alarm_email is None
    assert of_type(synth.resources, "AWS::SNS::Subscription") == {}


def test_email_from_context_is_subscribed_to_the_alarm_topic(with_email: Synthesized) -> None:
    topic_id, _ = only(with_email.resources, "AWS::SNS::Topic")
    _, subscription = only(with_email.resources, "AWS::SNS::Subscription")
    assert subscription == {"Protocol": "email", "Endpoint": EMAIL, "TopicArn": {"Ref": topic_id}}
    with_email.template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"AlarmActions": [{"Ref": topic_id}], "OKActions": [{"Ref": topic_id}]},
    )


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
        m.LEASES_ACQUIRED,
        m.TAKEOVER_LATENCY_MS,
        m.RENEW_FAILURES,
        m.SESSIONS_REAPED,
        m.LEASES_LOST,
        m.LEASES_RELEASED,
        m.MESSAGES_PROCESSED,
        m.UPSTREAM_RECONNECTS,
        m.HANDLER_ERRORS,
        "ApproximateNumberOfMessagesVisible",
        "ApproximateAgeOfOldestMessage",
        "RunningTaskCount",
        "CPUUtilization",
        "MemoryUtilization",
        "ConsumedWriteCapacityUnits",
        "ConsumedReadCapacityUnits",
        "WriteThrottleEvents",
        "GlobalSecondaryIndexName",
        schema.STATE_INDEX_NAME,
        schema.OWNER_INDEX_NAME,
        schema.UNOWNED_INDEX_NAME,
    ):
        assert needle in body, needle


def _dashboard_widgets(synth: Synthesized) -> list[dict]:
    """The dashboard body as CloudWatch reads it, each intrinsic (region, names of
    resources) shown as ``X``."""
    _, dashboard = only(synth.resources, "AWS::CloudWatch::Dashboard")
    body = dashboard["DashboardBody"]
    text = (
        body
        if isinstance(body, str)
        else "".join(part if isinstance(part, str) else "X" for part in body["Fn::Join"][1])
    )
    widgets: list[dict] = json.loads(text)["widgets"]
    return widgets


def test_dashboard_lease_health_row_speaks_of_sessions(synth: Synthesized) -> None:
    """The row after the connections: what is found in the unowned index and taken,
    takeover latency, session renew failures next to the sessions reaped, leases lost
    and released."""
    graphs = {
        w["properties"]["title"]: w["properties"]["metrics"]
        for w in _dashboard_widgets(synth)
        if w["type"] == "metric"
    }
    # a metric line is [namespace, name, dimension, value, ..., options]; a math
    # expression's is [options] alone
    names = {title: {line[1] for line in lines if len(line) > 1} for title, lines in graphs.items()}
    assert names["Unowned connections found / leases acquired"] == {
        m.ORPHANS_FOUND,
        m.LEASES_ACQUIRED,
    }
    assert names["Takeover latency after a session lapse (ms)"] == {m.TAKEOVER_LATENCY_MS}
    assert names["Session renew failures / sessions reaped"] == {
        m.RENEW_FAILURES,
        m.SESSIONS_REAPED,
    }
    assert names["Leases lost / released"] == {m.LEASES_LOST, m.LEASES_RELEASED}
    assert not [title for title in graphs if "Orphan" in title]


def test_outputs(synth: Synthesized) -> None:
    outputs = synth.template.to_json()["Outputs"]
    assert {"ApiUrl", "TableName", "QueueUrl", "DashboardUrl"} <= set(outputs)
    assert "#dashboards/dashboard/" in json.dumps(outputs["DashboardUrl"])
    table_id, _ = only(synth.resources, "AWS::DynamoDB::Table")
    assert outputs["TableName"]["Value"] == {"Ref": table_id}


def test_dashboard_shows_the_balance_of_the_fleet(synth: Synthesized) -> None:
    """The busiest task over the mean, from the per-task ActiveConnections, next to the
    moves that keep it down; and parked connections next to the reconnects."""
    graphs = {
        w["properties"]["title"]: w["properties"]["metrics"]
        for w in _dashboard_widgets(synth)
        if w["type"] == "metric"
    }
    balance = graphs["Balance: max / mean connections per task"]
    expressions = [line[0]["expression"] for line in balance if "expression" in line[0]]
    assert "MAX(tasks) / AVG(tasks)" in expressions
    search = next(e for e in expressions if e.startswith("SEARCH("))
    assert f'MetricName="{m.ACTIVE_CONNECTIONS}"' in search
    assert {line[1] for line in balance if len(line) > 1} == {m.CONNECTIONS_MOVED}
    reconnects = graphs["Upstream reconnects / connections failed"]
    assert {line[1] for line in reconnects if len(line) > 1} == {
        m.UPSTREAM_RECONNECTS,
        m.CONNECTIONS_FAILED,
    }


def test_dashboard_shows_what_streams_that_cannot_resume_lose(synth: Synthesized) -> None:
    """live and json-field without resume lose what is sent during a move: the gap
    they measure is on the dashboard, its p99 and max beside how many there were."""
    graphs = {
        w["properties"]["title"]: w["properties"]["metrics"]
        for w in _dashboard_widgets(synth)
        if w["type"] == "metric"
    }
    gaps = graphs["Streams that cannot resume: time lost per move or reconnect (ms)"]
    named = [line[1] for line in gaps if len(line) > 1]
    assert named.count(m.UPSTREAM_GAP_MS) == 2
    assert m.UPSTREAM_GAPS in named
    stats = {line[-1].get("stat") for line in gaps if isinstance(line[-1], dict)}
    assert {"p99", "Maximum"} <= stats


def test_dashboard_shows_malformed_items_next_to_handler_errors(synth: Synthesized) -> None:
    """Items that cannot be decoded or run cost only themselves, so nothing else shows
    them: the count each worker publishes is on the dashboard."""
    graphs = {
        w["properties"]["title"]: w["properties"]["metrics"]
        for w in _dashboard_widgets(synth)
        if w["type"] == "metric"
    }
    errors = graphs["Handler errors / malformed items"]
    assert {line[1] for line in errors if len(line) > 1} == {
        m.HANDLER_ERRORS,
        m.MALFORMED_ITEMS,
    }
