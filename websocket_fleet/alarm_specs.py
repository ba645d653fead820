"""What each alarm watches and when it fires. The runbook (what an alarm means, what to
check first, what to do) is in README.md, Operations; docs/DESIGN.md §6 lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_sqs as sqs

from websocket_fleet.fleet_metrics import ONE_MINUTE, MonitoredFleet
from wsfleet import metric_names as m

FIVE_MINUTES: Final = Duration.minutes(5)
GE: Final = cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD

LEASE_LOSSES_PER_5_MIN: Final = 5
"""A lost lease means the owner's session was reaped while the worker still ran the
connection (it stalled or was cut off for longer than the session lease), or a runner
broke. A reaped session loses every connection it ran at once, so this fires on one
stalled worker with five connections or more: a pattern to look at (CPU starvation,
long pauses, network trouble), not noise."""
ORPHAN_MINUTES: Final = 5
"""A connection in the sparse ``unowned`` index (STARTED, no owner, not parked) is
normally taken at once through its start hint, or by the next reconcile passes of a
worker with room (each pass reads two of the eight shards, so all of them within four
passes, 2.4 s at the defaults). Found in every minute for five minutes, they are not
being taken: acquires failing, or too little free capacity to take them all."""
RENEW_FAILURE_MINUTES: Final = (3, 5)
"""Session renew failures in 3 of 5 one-minute periods. ``RenewFailures`` counts
failed renews of a worker's session, one item per process renewed every heartbeat
(0.594 s at the defaults). The fence window (lease - margin) holds three renew
attempts, so an isolated failure, or one bad minute, costs nothing. Failures in most
minutes mean a cause that persists (table throttling, network trouble, a starved event
loop): a worker's whole session, every connection it runs, is at risk of pausing at
its fence and being reaped."""
ROUTER_ERROR_PERIODS: Final = (2, 3)
"""Errors in 2 of 3 five-minute periods, for the router function and the API's 5xx.
The router answers bad input with a 4xx, so an error is a bug or a failing dependency
(DynamoDB, SQS). One bad period is a blip that the retries absorb; two in fifteen
minutes are a cause that stays, and still fire under light traffic (a call every few
minutes)."""
NO_WORKER_MINUTES: Final = 3
"""No running task in each of three consecutive minutes: a deployment replaces tasks
before stopping the old ones, so the count never drops to zero on purpose."""
NO_WORKER_WARM_UP: Final = Duration.minutes(15)
"""How long a created (or updated) NoWorkerRunning alarm waits for its first data.
CloudFormation creates it once the service is stable, and Container Insights reports
the running tasks a few minutes later; the warm-up ends as soon as the evaluation
window holds data. A fleet that has reported nothing after 15 minutes is down."""


@dataclass(frozen=True, slots=True)
class AlarmSpec:
    name: str
    metric: cw.IMetric
    threshold: float
    description: str
    periods: int = 1
    datapoints: int = 1
    comparison: cw.ComparisonOperator = GE
    missing: cw.TreatMissingData = cw.TreatMissingData.NOT_BREACHING
    warm_up: Duration | None = None


def fleet_alarms(f: MonitoredFleet, *, start_age_seconds: int) -> list[AlarmSpec]:
    return [*_queue_alarms(f, start_age_seconds), *_worker_alarms(f), *_service_alarms(f)]


def _depth(queue: sqs.IQueue) -> cw.Metric:
    return queue.metric_approximate_number_of_messages_visible(
        period=FIVE_MINUTES, statistic=cw.Stats.MAXIMUM
    )


def _queue_alarms(f: MonitoredFleet, start_age_seconds: int) -> list[AlarmSpec]:
    oldest_start = f.queue.metric_approximate_age_of_oldest_message(
        period=ONE_MINUTE, statistic=cw.Stats.MAXIMUM
    )
    return [
        AlarmSpec(
            "StartDlqNotEmpty", _depth(f.dead_letter_queue), 1, "start hints reached the DLQ"
        ),
        AlarmSpec("FailedEventsNotEmpty", _depth(f.failed_events), 1, "router events failed"),
        AlarmSpec(
            "StartMessagesWaiting",
            oldest_start,
            start_age_seconds,
            f"a start hint has waited {start_age_seconds} s or more: no worker takes starts "
            "(fleet at capacity, or no worker polling)",
            periods=2,
            datapoints=2,
        ),
    ]


def _worker_alarms(f: MonitoredFleet) -> list[AlarmSpec]:
    renew_datapoints, renew_periods = RENEW_FAILURE_MINUTES
    return [
        AlarmSpec(
            "OrphansPersisting",
            f.worker(m.ORPHANS_FOUND),
            1,
            "STARTED connections stay in the unowned index: acquires failing or too "
            "little free capacity",
            periods=ORPHAN_MINUTES,
            datapoints=ORPHAN_MINUTES,
        ),
        AlarmSpec(
            "LeaseLossesSpiking",
            f.worker(m.LEASES_LOST, period=FIVE_MINUTES),
            LEASE_LOSSES_PER_5_MIN,
            "workers lose connections they run: a session reaped while its worker "
            "still ran (stalled or cut off past the session lease)",
        ),
        AlarmSpec(
            "RenewFailuresSustained",
            f.worker(m.RENEW_FAILURES),
            1,
            "session renews keep failing: workers are at risk of pausing every "
            "connection at the fence and losing their sessions",
            periods=renew_periods,
            datapoints=renew_datapoints,
        ),
        AlarmSpec(
            "ConnectionsFailing",
            f.worker(m.CONNECTIONS_FAILED, period=FIVE_MINUTES),
            1,
            "connections were parked (status failed): their upstream refused for good "
            "or delivered nothing for UPSTREAM_FAIL_AFTER_SECONDS; no worker retries "
            "them until they are started again",
        ),
        AlarmSpec(
            "SinkMessagesSetAside",
            f.worker(m.SINK_MESSAGES_SET_ASIDE, period=FIVE_MINUTES),
            1,
            "a built-in sink could never send a message (its payload is not JSON, its "
            "record is over the service's limit, or the service refused it for good) "
            "and sent a set-aside envelope in its place: the worker log 'message set "
            "aside' names it",
        ),
        AlarmSpec(
            "MessagesSkipped",
            f.worker(m.MESSAGES_SKIPPED, period=FIVE_MINUTES),
            1,
            "handler calls failed and were skipped (HANDLER_ERRORS=skip): those "
            "messages are lost; the worker log 'handler failed; message skipped' names "
            "their seqs",
        ),
        AlarmSpec(
            "ForeignSessionProtocol",
            f.worker(m.FOREIGN_SESSIONS),
            1,
            "workers of another session protocol share the table: the new ones refuse "
            "to open sessions until the others are gone (docs/DEPLOY.md, changing the "
            "session protocol)",
        ),
        AlarmSpec(
            "NoWorkerRunning",
            f.container_insights("RunningTaskCount", statistic=cw.Stats.MINIMUM),
            1,
            "no worker task is running: no connection is served, no metric published",
            periods=NO_WORKER_MINUTES,
            datapoints=NO_WORKER_MINUTES,
            comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            # Container Insights reports nothing for a service without tasks: no data
            # is the very condition this alarm exists for. The warm-up keeps the "no
            # data yet" of a fresh deploy from counting as that.
            missing=cw.TreatMissingData.BREACHING,
            warm_up=NO_WORKER_WARM_UP,
        ),
    ]


def _service_alarms(f: MonitoredFleet) -> list[AlarmSpec]:
    indexes: list[str | None] = [None, *f.index_names]  # None: the table itself
    throttles: dict[str, cw.IMetric] = {
        f"{kind[0].lower()}{n}": f.dynamodb(f"{kind}ThrottleEvents", index=index)
        for n, index in enumerate(indexes)
        for kind in ("Write", "Read")
    }
    throttled = cw.MathExpression(
        expression=" + ".join(f"FILL({name}, 0)" for name in throttles),
        using_metrics=throttles,
        label="throttle events (table + indexes)",
        period=ONE_MINUTE,
    )
    datapoints, periods = ROUTER_ERROR_PERIODS
    return [
        AlarmSpec(
            "DynamoDbThrottling",
            throttled,
            1,
            "DynamoDB throttles the table or an index: session renews fail (sustained, "
            "they pause connections), ownership changes, starts and stops are slowed",
            periods=5,
            datapoints=2,
        ),
        AlarmSpec(
            "RouterErrors",
            f.router.metric_errors(period=FIVE_MINUTES, statistic=cw.Stats.SUM),
            1,
            "the router function keeps failing: a bug, or DynamoDB or SQS failing",
            periods=periods,
            datapoints=datapoints,
        ),
        AlarmSpec(
            "ApiServerErrors",
            f.api_stage.metric_server_error(period=FIVE_MINUTES, statistic=cw.Stats.SUM),
            1,
            "the HTTP API keeps answering 5xx: router errors, throttles or timeouts",
            periods=periods,
            datapoints=datapoints,
        ),
    ]
