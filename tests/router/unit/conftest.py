"""The real router handler against in-process moto (DynamoDB and SQS): fine for
single-threaded unit tests (docs/DESIGN.md §7)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws

from lambdas.router.main import handler, service
from local_stack.api_server import LocalContext
from local_stack.process_env import is_foreign_aws_setting
from local_stack.resources import create_connection_table, create_start_queue
from tests.router.fixtures import (
    StateSnapshot,
    drain_start_messages,
    load_event,
    snapshot,
)
from wsfleet import session_rules
from wsfleet.checkpoint_page import PageEntry, page_item
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.start_messages import StartMessage
from wsfleet.timing import LeaseTiming

TABLE = "connections-unit"
ALLOWED_HOSTS = "*.example.com,127.0.0.1"
SECRET_PREFIX = "websocket-fleet/"
TIMING = LeaseTiming.from_lease(2.0)


@dataclass
class Router:
    """The handler plus what it writes to."""

    ddb: Any
    sqs: Any
    queue_url: str

    def invoke(self, event: Any) -> dict[str, Any]:
        context: Any = LocalContext()
        result: dict[str, Any] = handler(event, context)
        return result

    def call(self, name: str) -> dict[str, Any]:
        """Invoke the handler with the event fixture ``name``."""
        return self.invoke(load_event(name))

    def state(self) -> StateSnapshot:
        return snapshot(self.ddb, self.sqs, TABLE, self.queue_url)

    def item(self, connection_id: str) -> ConnectionItem | None:
        return get_connection(self.ddb, TABLE, connection_id)

    def raw_item(self, connection_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.ddb.get_item(
            TableName=TABLE,
            Key={"Pk": {"S": f"CONN#{connection_id}"}, "Sk": {"S": "CONN"}},
            ConsistentRead=True,
        )["Item"]
        return found

    def start_messages(self) -> list[StartMessage]:
        return drain_start_messages(self.sqs, self.queue_url)

    def set_last_seq(self, connection_id: str, last_seq: int) -> None:
        """What an owner's checkpoint does to the item."""
        self.ddb.update_item(
            TableName=TABLE,
            Key={"Pk": {"S": f"CONN#{connection_id}"}, "Sk": {"S": "CONN"}},
            UpdateExpression="SET last_seq = :seq",
            ExpressionAttributeValues={":seq": {"N": str(last_seq)}},
        )

    # --- what workers write: sessions, ownership, checkpoint pages -----------------------

    def open_session(self, worker_id: str, session_gen: int, now_ms: int) -> None:
        """A worker's session, expiring one lease after ``now_ms``."""
        self.ddb.put_item(
            TableName=TABLE,
            Item=session_rules.new_session_item(worker_id, session_gen, now_ms, TIMING, 10),
        )

    def own(self, connection_id: str, worker_id: str, session_gen: int, now_ms: int) -> Lease:
        """Take a started connection as that worker's session does."""
        lease = LeaseStore(self.ddb, TABLE, TIMING).acquire(
            connection_id, worker_id, session_gen, now_ms
        )
        assert isinstance(lease, Lease), lease
        return lease

    def write_page(
        self, worker_id: str, session_gen: int, entries: dict[str, PageEntry], now_ms: int
    ) -> None:
        self.ddb.put_item(TableName=TABLE, Item=page_item(worker_id, session_gen, entries, now_ms))


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> Iterator[Router]:
    # In-process moto answers only while no endpoint or profile points boto3 elsewhere.
    for name in [name for name in os.environ if is_foreign_aws_setting(name)]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("ALLOW_INSECURE_WS", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        create_connection_table(ddb, TABLE)
        queues = create_start_queue(sqs, "starts-unit")
        monkeypatch.setenv("TABLE_NAME", TABLE)
        monkeypatch.setenv("QUEUE_URL", queues.queue_url)
        monkeypatch.setenv("ALLOWED_UPSTREAM_HOSTS", ALLOWED_HOSTS)
        monkeypatch.setenv("ALLOWED_SECRET_PREFIX", SECRET_PREFIX)
        service.cache_clear()
        try:
            yield Router(ddb, sqs, queues.queue_url)
        finally:
            service.cache_clear()
