"""The workers' read access to upstream credentials: exactly the secrets under the
deployment's allowed prefix, the same prefix the router admits references under."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_iam as iam

from wsfleet.secret_refs import secret_arn_pattern

READ_ACTIONS = ("secretsmanager:GetSecretValue",)
"""All a worker does with a secret: read its value when it connects."""


def grant_upstream_secrets(role: iam.IRole, prefix: str) -> str:
    """Let ``role`` read the secrets under ``prefix`` in the stack's own partition,
    region and account, and nothing else of Secrets Manager; returns the resource
    pattern granted."""
    stack = Stack.of(role)
    resource = secret_arn_pattern(
        prefix, partition=stack.partition, region=stack.region, account=stack.account
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=list(READ_ACTIONS), resources=[resource])
    )
    Validations.of(role).acknowledge(
        Acknowledgment(
            id=nag_finding(prefix),
            reason="Upstream credentials are secrets named under the allowed prefix, created "
            "after the deployment as connections need them, and Secrets Manager appends a "
            "random suffix to every secret's ARN: a pattern under the prefix is the narrowest "
            "grant that names them. The router admits references under the same prefix only, "
            "and the action is GetSecretValue alone.",
        )
    )
    return resource


def nag_finding(prefix: str) -> str:
    """cdk-nag's id of the wildcard finding on the granted pattern (intrinsics rendered
    as ``<AWS::Partition>`` and so on)."""
    pattern = secret_arn_pattern(
        prefix, partition="<AWS::Partition>", region="<AWS::Region>", account="<AWS::AccountId>"
    )
    return f"AwsSolutions-IAM5[Resource::{pattern}]"
