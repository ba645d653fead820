"""Shared fixtures: real DynamoDB Local and moto servers on free loopback ports,
started once per test session; a fresh table and queue per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from local_stack import services
from local_stack.resources import Queues, create_connection_table, create_start_queue
from tests.router.local_api import local_router
from tests.support.fleet import Fleet

#: A DynamoDB Local that is already running (its endpoint URL), used instead of starting
#: one per session: scripts/mutation.sh runs thousands of short pytest sessions, and
#: starting the JVM for each would cost more than the tests themselves.
SHARED_DYNAMODB_ENV = "WSFLEET_TEST_DYNAMODB_ENDPOINT"

LOCAL_CREDENTIALS = {
    "region_name": "us-east-1",
    "aws_access_key_id": "local",
    "aws_secret_access_key": "local",
}


@pytest.fixture(scope="session")
def service_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def dynamodb_endpoint(service_log_dir: Path) -> Iterator[str]:
    shared = os.environ.get(SHARED_DYNAMODB_ENV)
    if shared:
        yield shared  # every test makes a table of its own, so sessions can share it
        return
    port = services.free_port()
    process = services.start_dynamodb_local(port, service_log_dir)
    yield services.endpoint_url(port)
    process.stop()


@pytest.fixture(scope="session")
def moto_endpoint(service_log_dir: Path) -> Iterator[str]:
    port = services.free_port()
    process = services.start_moto_server(port, service_log_dir)
    yield services.endpoint_url(port)
    process.stop()


@pytest.fixture
def ddb(dynamodb_endpoint: str):
    client = boto3.client(
        "dynamodb",
        endpoint_url=dynamodb_endpoint,
        config=Config(max_pool_connections=32, retries={"mode": "standard"}),
        **LOCAL_CREDENTIALS,
    )
    yield client
    client.close()


@pytest.fixture
def sqs(moto_endpoint: str):
    client = boto3.client("sqs", endpoint_url=moto_endpoint, **LOCAL_CREDENTIALS)
    yield client
    client.close()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table(ddb) -> Iterator[str]:
    name = unique_name("connections")
    create_connection_table(ddb, name)
    yield name
    ddb.delete_table(TableName=name)


@pytest.fixture
def queues(sqs) -> Queues:
    return create_start_queue(sqs, unique_name("starts"), max_receive_count=2, visibility_timeout=2)


@pytest.fixture
def router_api(monkeypatch, table, queues, dynamodb_endpoint, moto_endpoint) -> Iterator[str]:
    """The real router Lambda handler through the local HTTP adapter, against DynamoDB
    Local and moto's SQS; its base URL."""
    with local_router(
        monkeypatch,
        table=table,
        queue_url=queues.queue_url,
        dynamodb_endpoint=dynamodb_endpoint,
        sqs_endpoint=moto_endpoint,
    ) as url:
        yield url


@pytest.fixture(scope="session")
def feed_url(service_log_dir: Path) -> Iterator[str]:
    """The demo feed as its own process, 20 messages/s per connection by default."""
    port = services.free_port()
    process = services.start_feed(port, service_log_dir, rate=20.0)
    yield f"ws://127.0.0.1:{port}"
    process.stop()


@pytest.fixture
def fleet(ddb, sqs, table, queues, feed_url, dynamodb_endpoint, moto_endpoint, tmp_path):
    """Real worker processes on demand (tests.support.fleet), stopped after the test."""
    fleet = Fleet(
        ddb=ddb,
        sqs=sqs,
        table=table,
        queue_url=queues.queue_url,
        dlq_url=queues.dlq_url,
        feed_url=feed_url,
        endpoints={"dynamodb": dynamodb_endpoint, "sqs": moto_endpoint},
        work_dir=tmp_path,
    )
    yield fleet
    fleet.stop_all()
