"""The on-call dashboard: fleet health at a glance, top to bottom by urgency."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_cloudwatch as cw
from constructs import Construct

from websocket_fleet.dashboard_widgets import fleet_rows, service_rows
from websocket_fleet.fleet_metrics import MonitoredFleet


class FleetDashboard(Construct):
    """Rows: alarm states; connections and tasks; lease health (connections found in
    the unowned index and leases acquired, takeover latency, session renew failures and
    sessions reaped, leases lost and released); traffic; queues and the router; compute
    and DynamoDB (the table and each index). Per-task lines come from a SEARCH over the
    ``[Service, TaskId]`` dimension set, since task ids change with every task."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        dashboard_name: str,
        fleet: MonitoredFleet,
        alarms: Sequence[cw.IAlarm],
    ) -> None:
        super().__init__(scope, construct_id)
        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=dashboard_name)
        self.dashboard.add_widgets(
            cw.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24, height=3)
        )
        for row in [*fleet_rows(fleet), *service_rows(fleet)]:
            self.dashboard.add_widgets(*row)
