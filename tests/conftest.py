"""Shared fixtures: real DynamoDB Local and moto servers on free loopback ports,
started once per test session; a fresh table and queue per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_stack import services
from local_stack.fleet import CLIENT_CONFIG
from local_stack.process_env import Endpoints
from local_stack.resources import Queues, create_connection_table, create_start_queue
from tests.router.local_api import local_router
from tests.support.feed_log import FeedService
from tests.support.fleet import Fleet
from tests.support.timing import TIME_SCALE, scaled


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests without a timeout of their own get pyproject's, scaled like the rest."""
    if TIME_SCALE == 1:
        return
    default = scaled(float(config.getini("timeout")))
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(default))


#: A DynamoDB Local that is already running (its endpoint URL), used instead of starting
#: one per session: scripts/mutation.sh runs thousands of short pytest sessions, and
#: starting the JVM for each would cost more than the tests themselves.
SHARED_DYNAMODB_ENV = "WSFLEET_TEST_DYNAMODB_ENDPOINT"


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
    client = services.local_client("dynamodb", dynamodb_endpoint, config=CLIENT_CONFIG)
    yield client
    client.close()


@pytest.fixture
def sqs(moto_endpoint: str):
    client = services.local_client("sqs", moto_endpoint, config=CLIENT_CONFIG)
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
def feed_service(service_log_dir: Path) -> Iterator[FeedService]:
    """The demo feed as its own process, 20 messages/s per connection by default; its
    log tells when each stream was opened and closed (:mod:`tests.support.feed_log`)."""
    port = services.free_port()
    process = services.start_feed(port, service_log_dir, rate=20.0)
    yield FeedService(f"ws://127.0.0.1:{port}", process.log_path)
    process.stop()


@pytest.fixture(scope="session")
def feed_url(feed_service: FeedService) -> str:
    return feed_service.url


@pytest.fixture
def fleet(feed_url, dynamodb_endpoint, moto_endpoint, tmp_path):
    """A fresh table and queue served by their own router, with real worker processes
    on demand (tests.support.fleet); everything stopped after the test."""
    fleet = Fleet(
        Endpoints(dynamodb_endpoint, moto_endpoint),
        tmp_path,
        table=unique_name("connections"),
        queue=unique_name("starts"),
        feed_base=feed_url,
    )
    try:
        fleet.create_resources(max_receive_count=2, visibility_timeout=2)
        fleet.start_router()
        yield fleet
    finally:
        fleet.close()
