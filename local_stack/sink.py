"""The Kinesis sink on the local stack (``--sink kinesis``): the stream in moto, the
workers' settings that write to it, the deduper's table in DynamoDB Local and the
environment of the consumer that reads it (:mod:`local_stack.sink_consumer`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Literal

from botocore.exceptions import ClientError

from local_stack import services
from local_stack.process_env import Endpoints, is_foreign_aws_setting, local_aws_settings
from worker import config as worker_settings

Sink = Literal["kinesis"]
SINKS: Final[tuple[Sink, ...]] = ("kinesis",)
KINESIS_FACTORY: Final = "worker.sinks.kinesis:factory"
SINK_STREAM_NAME: Final = "SINK_STREAM_NAME"
"""The Kinesis sink's setting (worker/sinks/settings.py)."""
KINESIS_ENDPOINT: Final = "AWS_ENDPOINT_URL_KINESIS"
STREAM_NAME: Final = "websocket-fleet-envelopes"
DEDUP_TABLE: Final = "websocket-fleet-dedup"
SHARDS: Final = 4
"""More than one, so that the consumer follows several; moto's work per record grows
with its shard's length, so a few short shards also keep it cheap."""
STREAM_ACTIVE_TIMEOUT_S: Final = 30.0


def create_stream(client: Any, name: str = STREAM_NAME, shards: int = SHARDS) -> str:
    """The stream, ``shards`` shards (one that exists is used as it is), once ACTIVE;
    its ARN."""
    try:
        client.create_stream(StreamName=name, ShardCount=shards)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise
    client.get_waiter("stream_exists").wait(
        StreamName=name,
        WaiterConfig={"Delay": 0.2, "MaxAttempts": int(STREAM_ACTIVE_TIMEOUT_S / 0.2)},
    )
    summary = client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
    arn: str = summary["StreamARN"]
    return arn


def create_delivery_stream(
    firehose: Any, s3: Any, name: str, bucket: str, *, prefix: str = "envelopes/"
) -> None:
    """A Direct PUT Firehose delivery stream ``name`` into a new S3 bucket ``bucket``
    (moto: the role is not checked)."""
    s3.create_bucket(Bucket=bucket)
    firehose.create_delivery_stream(
        DeliveryStreamName=name,
        DeliveryStreamType="DirectPut",
        ExtendedS3DestinationConfiguration={
            "RoleARN": "arn:aws:iam::123456789012:role/firehose",
            "BucketARN": f"arn:aws:s3:::{bucket}",
            "Prefix": prefix,
        },
    )


def worker_settings_for(endpoints: Endpoints, stream: str = STREAM_NAME) -> dict[str, str]:
    """What makes a worker write every message to ``stream`` in the local moto."""
    return {
        worker_settings.HANDLER: KINESIS_FACTORY,
        SINK_STREAM_NAME: stream,
        KINESIS_ENDPOINT: endpoints.kinesis,
    }


def consumer_env(base: Mapping[str, str], endpoints: Endpoints) -> dict[str, str]:
    """The consumer's environment: the local servers and placeholder credentials,
    nothing of the caller's AWS settings, the repository on the import path."""
    env = {name: value for name, value in base.items() if not is_foreign_aws_setting(name)}
    env.update(local_aws_settings(endpoints))
    env[KINESIS_ENDPOINT] = endpoints.kinesis
    env["PYTHONPATH"] = os.pathsep.join(
        [str(services.REPO_ROOT), *filter(None, [base.get("PYTHONPATH")])]
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env
