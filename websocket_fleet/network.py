"""Where the workers run: a new low-cost VPC, or an existing one given by ids."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from websocket_fleet.options import ImportedVpc


class FleetNetwork(Construct):
    """The workers only dial out (wss to upstreams, HTTPS to AWS APIs) and accept no
    inbound traffic. The new VPC therefore has public subnets only and no NAT
    gateway: each task gets a public IP, and its security group allows no ingress.
    That saves a NAT gateway per AZ (hourly plus per-GB charges on every message).

    An imported VPC is described by attributes (``Vpc.from_vpc_attributes``), never
    looked up, so synth needs no credentials.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        imported: ImportedVpc | None,
        flow_log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        if imported is None:
            vpc = ec2.Vpc(
                self,
                "Vpc",
                max_azs=2,
                nat_gateways=0,
                subnet_configuration=[
                    ec2.SubnetConfiguration(
                        name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24
                    )
                ],
            )
            flow_logs = logs.LogGroup(
                self, "FlowLogs", retention=flow_log_retention, removal_policy=removal_policy
            )
            vpc.add_flow_log(
                "FlowLog",
                destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                traffic_type=ec2.FlowLogTrafficType.ALL,
            )
            self.vpc: ec2.IVpc = vpc
            self.subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC)
            self.assign_public_ip = True
            return
        subnet_ids = list(imported.subnet_ids)
        self.vpc = ec2.Vpc.from_vpc_attributes(
            self,
            "Vpc",
            vpc_id=imported.vpc_id,
            availability_zones=list(imported.availability_zones),
            public_subnet_ids=subnet_ids if imported.assign_public_ip else None,
            private_subnet_ids=None if imported.assign_public_ip else subnet_ids,
        )
        self.subnets = ec2.SubnetSelection(
            subnets=[
                ec2.Subnet.from_subnet_attributes(
                    self, f"Subnet{index}", subnet_id=subnet_id, availability_zone=zone
                )
                for index, (subnet_id, zone) in enumerate(
                    zip(imported.subnet_ids, imported.availability_zones, strict=True)
                )
            ]
        )
        self.assign_public_ip = imported.assign_public_ip
