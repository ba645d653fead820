"""The start queue (hints to acquire a connection) and its dead-letter queue."""

from __future__ import annotations

from typing import Final

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

VISIBILITY_TIMEOUT: Final = Duration.seconds(60)
"""A worker deletes a message once the acquire's outcome is known, which takes one
conditional write (botocore timeouts well under a heartbeat). 60 s leaves ample room,
yet a message whose outcome was unknown comes back within a minute."""
DLQ_RETENTION: Final = Duration.days(14)


class StartQueue(Construct):
    """Messages are hints (the table is the truth), so a poison message that a worker
    cannot handle lands in the DLQ after ``max_receive_count`` receives instead of
    cycling forever. Both queues are encrypted (SQS-managed keys, so no KMS grants are
    needed) and refuse requests without TLS."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        max_receive_count: int,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=DLQ_RETENTION,
            removal_policy=removal_policy,
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=VISIBILITY_TIMEOUT,
            retention_period=Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(
                max_receive_count=max_receive_count, queue=self.dead_letter_queue
            ),
            removal_policy=removal_policy,
        )

    def grant_worker_access(self, grantee: iam.IGrantable) -> None:
        """Receive, delete and delay start hints; send ``reassign`` hints on release."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=[
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:SendMessage",
            ],
            resource_arns=[self.queue.queue_arn],
        )

    def grant_send(self, grantee: iam.IGrantable) -> None:
        """The router: one ``start`` hint per start."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["sqs:SendMessage"], resource_arns=[self.queue.queue_arn]
        )
