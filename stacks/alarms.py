"""Alarms an on-call engineer acts on, each sent to the alarm topic."""

from __future__ import annotations

from typing import Final

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.fleet_metrics import MonitoredFleet
from wsfleet import metric_names as m

FIVE_MINUTES: Final = Duration.minutes(5)
LEASE_LOSSES_PER_5_MIN: Final = 5
"""A lost lease means a holder was paused or partitioned past its lease; a handful in
five minutes is a pattern (GC pauses, CPU starvation, a DynamoDB brown-out)."""
ORPHAN_MINUTES: Final = 5
"""Orphans are normally taken within about 30 s (lease + reconcile); seen in every
minute for five minutes they are not being taken (fleet full, or acquires failing)."""

GE: Final = cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD


def _depth(queue: sqs.IQueue) -> cw.Metric:
    return queue.metric_approximate_number_of_messages_visible(
        period=FIVE_MINUTES, statistic=cw.Stats.MAXIMUM
    )


class FleetAlarms(Construct):
    """Each alarm names the service and notifies ``topic`` on entering ALARM and on
    returning to OK: every alarm is made by ``_alarm``, which wires both actions."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleet: MonitoredFleet,
        topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, construct_id)
        f = fleet
        self._service_name = f.service_name
        self._action = cw_actions.SnsAction(topic)
        throttles = cw.MathExpression(
            expression="FILL(tw, 0) + FILL(tr, 0) + FILL(iw, 0) + FILL(ir, 0)",
            using_metrics={
                "tw": f.dynamodb("WriteThrottleEvents"),
                "tr": f.dynamodb("ReadThrottleEvents"),
                "iw": f.dynamodb("WriteThrottleEvents", index=True),
                "ir": f.dynamodb("ReadThrottleEvents", index=True),
            },
            label="throttle events (table + index)",
            period=Duration.minutes(1),
        )
        self.alarms: list[cw.Alarm] = [
            self._alarm(
                "StartDlqNotEmpty", _depth(f.dead_letter_queue), 1, "start hints reached the DLQ"
            ),
            self._alarm("FailedEventsNotEmpty", _depth(f.failed_events), 1, "router events failed"),
            self._alarm(
                "OrphansPersisting",
                f.worker(m.ORPHANS_FOUND),
                1,
                "STARTED connections stay unowned: fleet at capacity or acquires failing",
                periods=ORPHAN_MINUTES,
                datapoints=ORPHAN_MINUTES,
            ),
            self._alarm(
                "LeaseLossesSpiking",
                f.worker(m.LEASES_LOST, period=FIVE_MINUTES),
                LEASE_LOSSES_PER_5_MIN,
                "workers lose leases they hold: paused or partitioned holders",
            ),
            self._alarm(
                "DynamoDbThrottling",
                throttles,
                1,
                "throttled renews fence connections; the state index throttles first",
                periods=5,
                datapoints=2,
            ),
            self._alarm(
                "NoWorkerRunning",
                f.container_insights("RunningTaskCount", statistic="Minimum"),
                1,
                "no worker task is running: no connection is served, no metric published",
                periods=3,
                comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
                # No task reporting is the very condition this alarm exists for.
                missing=cw.TreatMissingData.BREACHING,
            ),
        ]

    def _alarm(
        self,
        name: str,
        metric: cw.IMetric,
        threshold: float,
        description: str,
        *,
        periods: int = 1,
        datapoints: int = 1,
        comparison: cw.ComparisonOperator = GE,
        missing: cw.TreatMissingData = cw.TreatMissingData.NOT_BREACHING,
    ) -> cw.Alarm:
        alarm = cw.Alarm(
            self,
            name,
            metric=metric,
            threshold=threshold,
            evaluation_periods=periods,
            datapoints_to_alarm=datapoints,
            comparison_operator=comparison,
            treat_missing_data=missing,
            alarm_description=f"{self._service_name}: {description}.",
        )
        alarm.add_alarm_action(self._action)
        alarm.add_ok_action(self._action)
        return alarm
