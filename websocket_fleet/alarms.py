"""Alarms an on-call engineer acts on, each sent to the alarm topic."""

from __future__ import annotations

from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from constructs import Construct

from websocket_fleet.alarm_specs import AlarmSpec, fleet_alarms
from websocket_fleet.fleet_metrics import MonitoredFleet


class FleetAlarms(Construct):
    """The alarms of ``websocket_fleet.alarm_specs``. Each names the service in its description
    and notifies ``topic`` on entering ALARM and on returning to OK: every alarm is
    made by ``_alarm``, which wires both actions."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleet: MonitoredFleet,
        topic: sns.ITopic,
        start_age_alarm_seconds: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self._service_name = fleet.service_name
        self._action = cw_actions.SnsAction(topic)
        self.alarms: list[cw.Alarm] = [
            self._alarm(spec)
            for spec in fleet_alarms(fleet, start_age_seconds=start_age_alarm_seconds)
        ]

    def _alarm(self, spec: AlarmSpec) -> cw.Alarm:
        alarm = cw.Alarm(
            self,
            spec.name,
            metric=spec.metric,
            threshold=spec.threshold,
            evaluation_periods=spec.periods,
            datapoints_to_alarm=spec.datapoints,
            comparison_operator=spec.comparison,
            treat_missing_data=spec.missing,
            alarm_description=f"{self._service_name}: {spec.description}. "
            "Runbook: README.md, Operations.",
        )
        if spec.warm_up is not None:
            # Not in the L2 yet: the alarm stays INSUFFICIENT_DATA, without actions,
            # until its window holds data or the warm-up ends.
            cfn = alarm.node.default_child
            assert isinstance(cfn, cw.CfnAlarm)
            cfn.warm_up_configuration = cw.CfnAlarm.WarmUpConfigurationProperty(
                warm_up_period_duration_in_minutes=int(spec.warm_up.to_minutes())
            )
        alarm.add_alarm_action(self._action)
        alarm.add_ok_action(self._action)
        return alarm
