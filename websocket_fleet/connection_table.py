"""The connection table of docs/DESIGN.md §2: connection items, worker sessions and
their checkpoint pages under one composite key, with three global secondary indexes."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from websocket_fleet.options import ProvisionedCapacity
from wsfleet import schema, table_layout

_KEY_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}
_PROJECTIONS = {
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
    "INCLUDE": dynamodb.ProjectionType.INCLUDE,
}


def _attribute(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=_KEY_TYPES[table_layout.KEY_ATTRIBUTE_TYPE])


class ConnectionTable(Construct):
    """Key and indexes come from ``wsfleet.table_layout``, the module
    ``local_stack.resources`` creates local tables from; names from ``wsfleet.schema``,
    which the worker and the router read: the table and the code cannot drift apart.

    Session renews write the table only (one small item, no index attribute); the
    indexes move only when ownership does (``by-owner``, ``unowned``) or the router
    starts or stops a connection (``by-desired-state``). With provisioned billing each
    index gets the table's capacity range.
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
        partition, sort = table_layout.TABLE_KEY
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=_attribute(partition),
            sort_key=_attribute(sort),
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
        self.index_names = tuple(index.name for index in table_layout.INDEXES)
        self.index_arns = {
            name: f"{self.table.table_arn}/index/{name}" for name in self.index_names
        }
        for index in table_layout.INDEXES:
            self.table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attribute(index.partition_key),
                sort_key=_attribute(index.sort_key),
                projection_type=_PROJECTIONS[index.projection_type],
                non_key_attributes=list(index.non_key_attributes) or None,
                read_capacity=read,
                write_capacity=write,
            )
        if provisioned:
            self._auto_scale(capacity)

    def _auto_scale(self, c: ProvisionedCapacity) -> None:
        t = self.table
        scalables = [
            t.auto_scale_read_capacity(min_capacity=c.min_read, max_capacity=c.max_read),
            t.auto_scale_write_capacity(min_capacity=c.min_write, max_capacity=c.max_write),
        ]
        for index in self.index_names:
            scalables += [
                t.auto_scale_global_secondary_index_read_capacity(
                    index, min_capacity=c.min_read, max_capacity=c.max_read
                ),
                t.auto_scale_global_secondary_index_write_capacity(
                    index, min_capacity=c.min_write, max_capacity=c.max_write
                ),
            ]
        for scalable in scalables:
            scalable.scale_on_utilization(target_utilization_percent=c.target_utilization_percent)

    def grant_worker_access(self, grantee: iam.IGrantable) -> None:
        """The worker: open its session and write its checkpoint page (PutItem);
        renew, reap and retire sessions, take, release and park connections
        (UpdateItem); forget a dead session and its page (DeleteItem); read items
        (GetItem); list sessions (Query on the table); a session's connections
        (``by-owner``) and unowned ones (``unowned``). Never the router's index, never
        a scan."""
        self._grant(
            grantee,
            [
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
                "dynamodb:Query",
            ],
            [self.table.table_arn],
        )
        self._grant(
            grantee,
            ["dynamodb:Query"],
            [
                self.index_arns[schema.OWNER_INDEX_NAME],
                self.index_arns[schema.UNOWNED_INDEX_NAME],
            ],
        )

    def grant_router_access(self, grantee: iam.IGrantable) -> None:
        """The router: start/stop by conditional updates and the owner's session notice
        (UpdateItem); read a connection, its owner's session and page (GetItem); list
        through ``by-desired-state`` or by a Query or Scan of the table. It never puts
        or deletes an item (TTL removes stopped connections)."""
        self._grant(
            grantee,
            ["dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query", "dynamodb:Scan"],
            [self.table.table_arn],
        )
        self._grant(grantee, ["dynamodb:Query"], [self.index_arns[schema.STATE_INDEX_NAME]])

    @staticmethod
    def _grant(grantee: iam.IGrantable, actions: list[str], resources: list[str]) -> None:
        iam.Grant.add_to_principal(grantee=grantee, actions=actions, resource_arns=resources)
