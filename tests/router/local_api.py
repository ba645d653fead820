"""The router served by the local HTTP adapter, in-process, against DynamoDB Local and
moto's server: what ``./scripts/run-local.sh`` serves on 127.0.0.1:8080, on a free port."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from lambdas.router.main import service
from lambdas.router.settings import ALLOWED_SECRET_PREFIX
from local_stack import api_server
from local_stack.process_env import (
    Endpoints,
    is_foreign_aws_setting,
    local_aws_settings,
    local_router_settings,
)
from tests.support.timing import scaled

LOCAL_ALLOWED_HOSTS = "127.0.0.1,localhost,*.example.com"
LOCAL_SECRET_PREFIX = "websocket-fleet/"


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


@contextmanager
def local_router(
    monkeypatch: pytest.MonkeyPatch,
    *,
    table: str,
    queue_url: str,
    dynamodb_endpoint: str,
    sqs_endpoint: str,
    allowed_hosts: str = LOCAL_ALLOWED_HOSTS,
    secret_prefix: str | None = LOCAL_SECRET_PREFIX,
) -> Iterator[str]:
    """Serve the router on a free loopback port, in this process (the handler reads its
    settings from this process's environment, set here for the test); yields its base
    URL. ``secret_prefix`` None: the router accepts no secret references."""
    for name in [name for name in os.environ if is_foreign_aws_setting(name)]:
        monkeypatch.delenv(name)
    settings = {
        **local_aws_settings(Endpoints(dynamodb_endpoint, sqs_endpoint)),
        **local_router_settings(table=table, queue_url=queue_url, allowed_hosts=allowed_hosts),
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    if secret_prefix is None:
        monkeypatch.delenv(ALLOWED_SECRET_PREFIX, raising=False)
    else:
        monkeypatch.setenv(ALLOWED_SECRET_PREFIX, secret_prefix)
    service.cache_clear()
    server, thread = api_server.serve_router("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=scaled(10))
        service.cache_clear()


def request(
    base_url: str,
    method: str,
    target: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
) -> Answer:
    """One HTTP request on a fresh connection; ``body`` is sent as JSON, ``raw`` as is."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port, timeout=timeout or scaled(15)
    )
    payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = {"Content-Type": "application/json", **(headers or {})}
    try:
        connection.request(method, target, body=payload, headers=sent)
        response = connection.getresponse()
        data = response.read()
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = data.decode(errors="replace")
    return Answer(response.status, parsed, answer_headers)
