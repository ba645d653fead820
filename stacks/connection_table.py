"""The connection table of docs/DESIGN.md §2, with its keys-only state index."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks.settings import ProvisionedCapacity
from wsfleet import schema


class ConnectionTable(Construct):
    """Key and index names come from ``wsfleet.schema``: the worker and the router
    read the same constants, so the table and the code cannot drift apart.

    Every renew moves the item's GSI sort key (``lease_expires_at_ms``), so provisioned
    capacity is given to the index as to the table (each renew costs the index two
    writes: delete the old entry, put the new one).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        billing: str,
        capacity: ProvisionedCapacity,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        provisioned = billing == "PROVISIONED"
        read = capacity.min_read if provisioned else None
        write = capacity.min_write if provisioned else None
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(
                name=schema.PARTITION_KEY, type=dynamodb.AttributeType.STRING
            ),
            billing_mode=(
                dynamodb.BillingMode.PROVISIONED
                if provisioned
                else dynamodb.BillingMode.PAY_PER_REQUEST
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=schema.EXPIRES_AT,
            removal_policy=removal_policy,
            deletion_protection=removal_policy == RemovalPolicy.RETAIN,
            read_capacity=read,
            write_capacity=write,
        )
        self.table.add_global_secondary_index(
            index_name=schema.STATE_INDEX_NAME,
            partition_key=dynamodb.Attribute(
                name=schema.STATE_INDEX_PARTITION_KEY, type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(
                name=schema.STATE_INDEX_SORT_KEY, type=dynamodb.AttributeType.NUMBER
            ),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
            read_capacity=read,
            write_capacity=write,
        )
        if provisioned:
            self._auto_scale(capacity)
        self.index_arn = f"{self.table.table_arn}/index/{schema.STATE_INDEX_NAME}"

    def _auto_scale(self, c: ProvisionedCapacity) -> None:
        t, index = self.table, schema.STATE_INDEX_NAME
        for scalable in (
            t.auto_scale_read_capacity(min_capacity=c.min_read, max_capacity=c.max_read),
            t.auto_scale_write_capacity(min_capacity=c.min_write, max_capacity=c.max_write),
            t.auto_scale_global_secondary_index_read_capacity(
                index, min_capacity=c.min_read, max_capacity=c.max_read
            ),
            t.auto_scale_global_secondary_index_write_capacity(
                index, min_capacity=c.min_write, max_capacity=c.max_write
            ),
        ):
            scalable.scale_on_utilization(target_utilization_percent=c.target_utilization_percent)

    def grant_lease_access(self, grantee: iam.IGrantable) -> None:
        """The worker: read and conditionally update items, query the state index."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
            resource_arns=[self.table.table_arn],
        )
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["dynamodb:Query"], resource_arns=[self.index_arn]
        )

    def grant_desired_state_access(self, grantee: iam.IGrantable) -> None:
        """The router: start/stop by conditional updates, read, list by index or scan."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
            resource_arns=[self.table.table_arn],
        )
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["dynamodb:Query", "dynamodb:Scan"],
            resource_arns=[self.table.table_arn, self.index_arn],
        )
