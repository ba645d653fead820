"""The dashboard's graphs, row by row: the fleet's own metrics, then the services."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_cloudwatch as cw

from websocket_fleet.fleet_metrics import ONE_MINUTE, MonitoredFleet, per_task_search
from wsfleet import metric_names as m

Row = list[cw.IWidget]


def graph(
    title: str,
    left: Sequence[cw.IMetric],
    right: Sequence[cw.IMetric] = (),
    *,
    width: int = 8,
) -> cw.GraphWidget:
    return cw.GraphWidget(title=title, left=list(left), right=list(right), width=width, height=6)


def fleet_rows(f: MonitoredFleet) -> list[Row]:
    """Connections and tasks; lease health (connections found unowned and taken,
    takeover latency, session renew failures and reaps, leases lost and released);
    traffic."""
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
                "Unowned connections found / leases acquired",
                [
                    f.worker(m.ORPHANS_FOUND, label="found in the unowned index"),
                    f.worker(m.LEASES_ACQUIRED, label="acquired (starts and takeovers)"),
                ],
                width=6,
            ),
            graph(
                "Takeover latency after a session lapse (ms)",
                [
                    f.worker(m.TAKEOVER_LATENCY_MS, statistic=s, label=s)
                    for s in ("p50", "p90", "Maximum")
                ],
                width=6,
            ),
            graph(
                "Session renew failures / sessions reaped",
                [
                    f.worker(m.RENEW_FAILURES, label="session renews failed"),
                    f.worker(m.SESSIONS_REAPED, label="lapsed sessions reaped"),
                ],
                width=6,
            ),
            graph(
                "Leases lost / released",
                [
                    f.worker(m.LEASES_LOST, label="lost"),
                    f.worker(m.LEASES_RELEASED, label="released"),
                ],
                width=6,
            ),
        ],
        [
            graph("Messages / s", [messages]),
            graph(
                "Upstream reconnects / connections failed",
                [
                    f.worker(m.UPSTREAM_RECONNECTS, label="reconnects"),
                    f.worker(m.CONNECTIONS_FAILED, label="parked (failed)"),
                ],
            ),
            graph(
                "Handler errors / malformed items",
                [
                    f.worker(m.HANDLER_ERRORS, label="handler errors"),
                    f.worker(m.MALFORMED_ITEMS, label="malformed items"),
                ],
            ),
        ],
        [
            graph(
                "Balance: max / mean connections per task",
                [load_spread(f.service_name)],
                right=[f.worker(m.CONNECTIONS_MOVED, label="connections moved")],
                width=12,
            ),
            graph(
                "Streams that cannot resume: time lost per move or reconnect (ms)",
                [
                    f.worker(m.UPSTREAM_GAP_MS, statistic="p99", label="gap p99"),
                    f.worker(m.UPSTREAM_GAP_MS, statistic=cw.Stats.MAXIMUM, label="gap max"),
                ],
                right=[f.worker(m.UPSTREAM_GAPS, label="gaps")],
                width=12,
            ),
        ],
        [
            graph(
                "Upstream numbering: restarts, copies dropped, gaps",
                [
                    f.worker(m.SEQUENCE_RESETS, label="restarts (new sequence generation)"),
                    f.worker(m.SEQUENCE_COPIES, label="copies dropped"),
                    f.worker(m.SEQUENCE_GAPS, label="gaps"),
                    f.worker(m.UNREADABLE_FRAMES, label="unreadable frames"),
                ],
                width=24,
            ),
        ],
    ]


def load_spread(service: str) -> cw.MathExpression:
    """The busiest task's connections over the mean of all tasks: 1 when balanced; the
    fleet's balance rounds keep it at or below about 1 + BALANCE_TOLERANCE."""
    return cw.MathExpression(
        expression="MAX(tasks) / AVG(tasks)",
        using_metrics={"tasks": per_task_search(m.ACTIVE_CONNECTIONS, service=service)},
        label="max / mean",
        period=ONE_MINUTE,
    )


def service_rows(f: MonitoredFleet) -> list[Row]:
    """Queues and the router; compute and DynamoDB: the table, which takes the session
    renews, the checkpoint pages and the reconcile reads, and each index, which moves
    only with ownership changes and the router's starts and stops."""
    maximum = cw.Stats.MAXIMUM
    indexes: list[str | None] = [None, *f.index_names]  # None: the table itself
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
                "DynamoDB consumed capacity (per minute)",
                [f.dynamodb("ConsumedWriteCapacityUnits", index=i) for i in indexes],
                right=[f.dynamodb("ConsumedReadCapacityUnits", index=i) for i in indexes],
            ),
            graph(
                "DynamoDB throttles",
                [
                    f.dynamodb(name, index=index)
                    for index in indexes
                    for name in ("WriteThrottleEvents", "ReadThrottleEvents")
                ],
            ),
        ],
    ]
