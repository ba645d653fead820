"""EventBridge: ``Start Connection`` / ``Stop Connection`` events to the router."""

from __future__ import annotations

from typing import Final

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

DETAIL_TYPES: Final = ("Start Connection", "Stop Connection")
DELIVERY_RETRY_ATTEMPTS: Final = 4
DELIVERY_MAX_EVENT_AGE: Final = Duration.hours(1)


class RouterEvents(Construct):
    """A rule on the fleet's own bus (``FleetEventBus``), never the default bus.

    Two bounded retry budgets, one dead-letter queue: EventBridge retries delivering
    to the function (throttling, for instance) a few times within an hour, and the
    function retries a failed invocation at most twice (see ``RouterFunction``).
    Either way an event ends in ``dead_letter_queue``, never in an endless loop; an
    invalid event is answered by the router with a logged 4xx and not retried at all.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: lambda_.IFunction,
        dead_letter_queue: sqs.IQueue,
        event_bus: events.IEventBus,
        source: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.rule = events.Rule(
            self,
            "Rule",
            description="Start and stop upstream WebSocket connections",
            event_bus=event_bus,
            event_pattern=events.EventPattern(source=[source], detail_type=list(DETAIL_TYPES)),
        )
        self.rule.add_target(
            targets.LambdaFunction(
                handler,
                dead_letter_queue=dead_letter_queue,
                retry_attempts=DELIVERY_RETRY_ATTEMPTS,
                max_event_age=DELIVERY_MAX_EVENT_AGE,
            )
        )
