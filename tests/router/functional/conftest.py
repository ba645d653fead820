"""The router over real HTTP (the local adapter) against DynamoDB Local and moto's
server (started once per test run by tests/conftest.py); a fresh table and queue per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local_stack.resources import Queues
from tests.router.local_api import local_router


@pytest.fixture
def api(
    monkeypatch: pytest.MonkeyPatch,
    table: str,
    queues: Queues,
    dynamodb_endpoint: str,
    moto_endpoint: str,
) -> Iterator[str]:
    with local_router(
        monkeypatch,
        table=table,
        queue_url=queues.queue_url,
        dynamodb_endpoint=dynamodb_endpoint,
        sqs_endpoint=moto_endpoint,
    ) as base_url:
        yield base_url
