"""The local servers as child processes: DynamoDB Local, moto and the feed start on free
ports, serve real requests, and stop when asked."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from websockets.asyncio.client import connect

from local_stack import services
from local_stack.services import (
    LOCAL_CREDENTIALS,
    LOCAL_REGION,
    ManagedProcess,
    ServiceStartError,
    accepts_tcp,
    dynamodb_local_dir,
    free_port,
    start_dynamodb_local,
    start_feed,
    start_moto_server,
    wait_for_tcp,
)
from tests.support.timing import scaled

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient


def _dynamodb(
    port: int, region: str = LOCAL_REGION, key: str = LOCAL_CREDENTIALS
) -> DynamoDBClient:
    client: DynamoDBClient = services.local_client("dynamodb", port, region=region, key=key)
    return client


def _sqs(port: int) -> SQSClient:
    client: SQSClient = services.local_client("sqs", port)
    return client


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    """Collects boto3 clients and closes them, so no socket outlives the test."""
    made: list[Any] = []
    yield made
    for client in made:
        client.close()


def _assert_stopped(managed: ManagedProcess, port: int) -> None:
    status = managed.stop()
    assert status is not None
    assert managed.process.poll() is not None
    assert not managed.alive()
    assert managed.stop() == status  # idempotent
    deadline = time.monotonic() + scaled(5)
    while accepts_tcp(port):
        assert time.monotonic() < deadline, f"{managed.name} still listens on {port}"
        time.sleep(0.05)


@pytest.mark.timeout(scaled(120))
def test_dynamodb_local_and_moto_serve_requests_and_stop(
    tmp_path: Path, clients: list[Any]
) -> None:
    dynamo_port, moto_port = free_port(), free_port()
    dynamo = start_dynamodb_local(dynamo_port, tmp_path)
    try:
        moto = start_moto_server(moto_port, tmp_path)
        try:
            assert dynamo.alive()
            assert moto.alive()

            dynamodb = _dynamodb(dynamo_port)
            clients.append(dynamodb)
            dynamodb.create_table(
                TableName="connections",
                AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
            )
            dynamodb.put_item(TableName="connections", Item={"id": {"S": "c1"}})
            # -sharedDb: another region and other credentials see the same table.
            elsewhere = _dynamodb(dynamo_port, region="eu-west-1", key="other")
            clients.append(elsewhere)
            got = elsewhere.get_item(TableName="connections", Key={"id": {"S": "c1"}})
            assert got["Item"] == {"id": {"S": "c1"}}

            sqs = _sqs(moto_port)
            clients.append(sqs)
            queue_url = sqs.create_queue(QueueName="start-requests")["QueueUrl"]
            assert queue_url in sqs.list_queues().get("QueueUrls", [])
            sqs.send_message(QueueUrl=queue_url, MessageBody="hello")
            received = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=1)
            assert [m["Body"] for m in received["Messages"]] == ["hello"]
        finally:
            _assert_stopped(moto, moto_port)
    finally:
        _assert_stopped(dynamo, dynamo_port)
    assert dynamo.log_path.parent == tmp_path
    assert dynamo.log_path.stat().st_size > 0
    assert moto.log_path.stat().st_size > 0


@pytest.mark.timeout(scaled(60))
async def test_feed_process_streams_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    feed = start_feed(port, tmp_path, rate=0)
    try:
        async with connect(
            f"ws://127.0.0.1:{port}/feed-a?from_seq=4&count=6", ping_interval=None
        ) as ws:
            seqs = [
                json.loads(await asyncio.wait_for(ws.recv(), scaled(5)))["seq"] for _ in range(3)
            ]
        assert seqs == [4, 5, 6]
    finally:
        status = feed.stop()
    assert status == 0
    assert f"feed listening on ws://127.0.0.1:{port}" in feed.log_path.read_text()


@pytest.mark.timeout(scaled(60))
def test_a_server_that_exits_early_is_reported_with_its_log(tmp_path: Path) -> None:
    # Without the repository as working directory the package does not import.
    with pytest.raises(ServiceStartError, match="No module named"):
        start_feed(free_port(), tmp_path / "logs", repo_root=tmp_path)


def test_a_busy_port_is_refused(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with pytest.raises(OSError, match="already in use"):
            start_moto_server(port, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing was launched


def test_dynamodb_local_dir_says_to_run_npm_ci(tmp_path: Path) -> None:
    assert (dynamodb_local_dir() / "DynamoDBLocal.jar").is_file()
    with pytest.raises(FileNotFoundError, match="npm ci"):
        dynamodb_local_dir(tmp_path)


def test_wait_for_tcp_times_out_when_nothing_listens() -> None:
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="nothing accepted"):
        wait_for_tcp("127.0.0.1", free_port(), timeout=0.3)
    assert time.monotonic() - began < scaled(3)


def test_wait_for_tcp_returns_once_listening() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        wait_for_tcp("127.0.0.1", listener.getsockname()[1], timeout=scaled(5))
