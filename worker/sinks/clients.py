"""The sinks' boto3 clients and threads, made by their factories.

As for the worker's own clients (:mod:`worker.aws_clients`), endpoints come from
boto3's ``AWS_ENDPOINT_URL_<SERVICE>`` variables (``AWS_ENDPOINT_URL_KINESIS``,
``AWS_ENDPOINT_URL_FIREHOSE``, ``AWS_ENDPOINT_URL_SQS``, or ``AWS_ENDPOINT_URL``);
nothing here passes ``endpoint_url``.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Literal

import boto3
from botocore.config import Config

log = logging.getLogger(__name__)

SINK_THREADS: Final = 32
"""Threads that make a sink's requests, and the client's pooled connections. The
sink's own, not the loop's default executor: that one makes the worker's DynamoDB
and SQS calls (acquires, releases, hints), which must not queue behind a busy
stream's records."""

SINK_CONFIG: Final = Config(
    connect_timeout=2,
    read_timeout=10,
    retries={"mode": "standard", "total_max_attempts": 3},
    max_pool_connections=SINK_THREADS,
)
"""A request that fails whole (a throttle, a lost connection) is retried by botocore;
records a request refuses one by one are the sink's to send again. A call waits ten
seconds at most per attempt: a request of 5 MiB takes well under that, and a call in
flight when the session's fence deadline passes is cut by the worker anyway."""

Service = Literal["kinesis", "firehose", "sqs"]

_ENDPOINT_VARIABLES: Final[dict[Service, str]] = {
    "kinesis": "AWS_ENDPOINT_URL_KINESIS",
    "firehose": "AWS_ENDPOINT_URL_FIREHOSE",
    "sqs": "AWS_ENDPOINT_URL_SQS",
}


def make_client(service: Service) -> Any:
    """A client of ``service`` in the configured region (us-east-1 when none is)."""
    session = boto3.session.Session()
    region: str | None = session.region_name
    if not region:
        region = "us-east-1"
        log.warning("no AWS region configured; the %s sink uses %s", service, region)
    local = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get(_ENDPOINT_VARIABLES[service])
    if local and session.get_credentials() is None:
        # A local endpoint (moto) accepts any key; without one botocore refuses to
        # sign at all.
        log.warning("no AWS credentials; using placeholder ones for the local %s", service)
        session = boto3.session.Session(
            aws_access_key_id="local", aws_secret_access_key="local", region_name=region
        )
    return session.client(service, region_name=region, config=SINK_CONFIG)


def make_executor(service: Service) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(SINK_THREADS, thread_name_prefix=f"sink-{service}")
