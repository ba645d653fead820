"""The dashboard's graphs, row by row: the fleet's own metrics, then the services."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_cloudwatch as cw

from stacks.fleet_metrics import ONE_MINUTE, MonitoredFleet, per_task_search
from wsfleet import metric_names as m

Row = list[cw.IWidget]


def graph(
    title: str, left: Sequence[cw.IMetric], right: Sequence[cw.IMetric] = ()
) -> cw.GraphWidget:
    return cw.GraphWidget(title=title, left=list(left), right=list(right), width=8, height=6)


def fleet_rows(f: MonitoredFleet) -> list[Row]:
    """Connections and tasks; lease health; traffic."""
    active = m.ACTIVE_CONNECTIONS
    messages = cw.MathExpression(
        expression="messages / PERIOD(messages)",
        using_metrics={"messages": f.worker(m.MESSAGES_PROCESSED)},
        label="messages/s",
        period=ONE_MINUTE,
    )
    return [
        [
            graph(
                "Active connections (fleet)",
                [f.worker(active, label="total"), f.worker(active, statistic="Average")],
                right=[f.worker(active, statistic="SampleCount", label="tasks reporting")],
            ),
            graph("Active connections per task", [per_task_search(active, service=f.service_name)]),
            graph(
                "Worker tasks",
                [
                    f.container_insights("RunningTaskCount"),
                    f.container_insights("DesiredTaskCount"),
                ],
            ),
        ],
        [
            graph(
                "Orphans found / leases acquired",
                [f.worker(m.ORPHANS_FOUND), f.worker(m.LEASES_ACQUIRED)],
            ),
            graph(
                "Takeover latency (ms)",
                [
                    f.worker(m.TAKEOVER_LATENCY_MS, statistic=s, label=s)
                    for s in ("p50", "p90", "Maximum")
                ],
            ),
            graph(
                "Leases lost / renew failures / released",
                [f.worker(m.LEASES_LOST), f.worker(m.RENEW_FAILURES), f.worker(m.LEASES_RELEASED)],
            ),
        ],
        [
            graph("Messages / s", [messages]),
            graph("Upstream reconnects", [f.worker(m.UPSTREAM_RECONNECTS)]),
            graph("Handler errors", [f.worker(m.HANDLER_ERRORS)]),
        ],
    ]


def service_rows(f: MonitoredFleet) -> list[Row]:
    """Queues and the router; compute and DynamoDB (where the index's write
    amplification shows first)."""
    maximum = cw.Stats.MAXIMUM
    return [
        [
            graph(
                "Start queue",
                [f.queue.metric_approximate_number_of_messages_visible(label="visible")],
                right=[f.queue.metric_approximate_age_of_oldest_message(label="oldest (s)")],
            ),
            graph(
                "Dead-letter queues",
                [
                    f.dead_letter_queue.metric_approximate_number_of_messages_visible(
                        label="start DLQ", statistic=maximum
                    ),
                    f.failed_events.metric_approximate_number_of_messages_visible(
                        label="failed events", statistic=maximum
                    ),
                ],
            ),
            graph(
                "Router",
                [
                    f.router.metric_invocations(),
                    f.router.metric_errors(),
                    f.router.metric_throttles(),
                ],
                right=[f.api.metric_client_error(), f.api.metric_server_error()],
            ),
        ],
        [
            graph(
                "Worker CPU / memory (%)",
                [f.service.metric_cpu_utilization(), f.service.metric_memory_utilization()],
            ),
            graph(
                "DynamoDB consumed writes (per minute)",
                [
                    f.dynamodb("ConsumedWriteCapacityUnits"),
                    f.dynamodb("ConsumedWriteCapacityUnits", index=True),
                ],
            ),
            graph(
                "DynamoDB throttles",
                [
                    f.dynamodb(name, index=index)
                    for index in (False, True)
                    for name in ("WriteThrottleEvents", "ReadThrottleEvents")
                ],
            ),
        ],
    ]
