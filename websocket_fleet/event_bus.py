"""The event bus for Start/Stop Connection events, with its own door
(docs/DESIGN.md §5.2)."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from constructs import Construct


class FleetEventBus(Construct):
    """A bus of the fleet's own instead of the account's default bus.

    On the default bus, any principal allowed ``events:PutEvents`` there (a common,
    broad grant) could start connections and bypass the API's IAM authorization. This
    bus's resource policy lets in the account's own principals, which still need an
    IAM grant naming this bus (or ``*``), and the principals listed in
    ``putter_arns``, typically producers in other accounts; nobody else.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bus_name: str,
        putter_arns: Sequence[str],
    ) -> None:
        super().__init__(scope, construct_id)
        self.bus = events.EventBus(
            self,
            "Bus",
            event_bus_name=bus_name,
            description="Start Connection / Stop Connection events for the router",
        )
        # Each statement becomes an AWS::Events::EventBusPolicy of its own.
        self.bus.add_to_resource_policy(
            self._put_events("AccountPutsEvents", [iam.AccountRootPrincipal()])
        )
        if putter_arns:
            self.bus.add_to_resource_policy(
                self._put_events(
                    "ListedPrincipalsPutEvents", [iam.ArnPrincipal(arn) for arn in putter_arns]
                )
            )

    def _put_events(self, sid: str, principals: list[iam.IPrincipal]) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid=sid,
            principals=principals,
            actions=["events:PutEvents"],
            resources=[self.bus.event_bus_arn],
        )
