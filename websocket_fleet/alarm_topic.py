"""Where every alarm's notifications go: the stack's own SNS topic, or one given."""

from __future__ import annotations

from typing import Final

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

CLOUDWATCH: Final = "cloudwatch.amazonaws.com"


class AlarmTopic(Construct):
    """With ``existing_topic_arn`` the alarms notify that topic (its owner lets
    CloudWatch publish and manages who is subscribed). Otherwise the stack creates a
    topic that

    - is encrypted with a key of its own: CloudWatch cannot publish to a topic under
      the AWS managed SNS key, whose policy cannot name CloudWatch, so this key's
      policy lets CloudWatch encrypt;
    - refuses publishing without TLS, and lets this account's alarms publish: a topic
      policy replaces SNS's default one, which is what otherwise lets them;
    - has ``email`` subscribed when given (SNS asks the address to confirm).

    The key only protects notifications in transit through SNS, which stores none, so
    it goes with the stack (after KMS's 7-day waiting period).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        existing_topic_arn: str | None,
        email: str | None,
    ) -> None:
        super().__init__(scope, construct_id)
        if existing_topic_arn:
            self.topic: sns.ITopic = sns.Topic.from_topic_arn(self, "Topic", existing_topic_arn)
            return
        key = kms.Key(
            self,
            "Key",
            description="Encrypts the fleet's alarm notifications in SNS",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsEncrypt",
                principals=[iam.ServicePrincipal(CLOUDWATCH)],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
            )
        )
        topic = sns.Topic(self, "Topic", master_key=key, enforce_ssl=True)
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal(CLOUDWATCH)],
                actions=["sns:Publish"],
                resources=[topic.topic_arn],
                conditions={
                    "ArnLike": {
                        "aws:SourceArn": f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:"
                        f"{Aws.ACCOUNT_ID}:alarm:*"
                    }
                },
            )
        )
        if email:
            topic.add_subscription(subscriptions.EmailSubscription(email))
        self.topic = topic
