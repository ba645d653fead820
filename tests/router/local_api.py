"""The router served by the local HTTP adapter, in-process, against DynamoDB Local and
moto's server: what ``./scripts/run-local.sh`` serves on 127.0.0.1:8080, on a free port."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest

from lambdas.router.main import service
from local_stack import api_server

LOCAL_ALLOWED_HOSTS = "127.0.0.1,localhost,*.example.com"


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
) -> Iterator[str]:
    """Serve the router on a free loopback port; yields its base URL."""
    for name, value in {
        "TABLE_NAME": table,
        "QUEUE_URL": queue_url,
        "ALLOWED_UPSTREAM_HOSTS": allowed_hosts,
        "ALLOW_INSECURE_WS": "true",
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint,
        "AWS_ENDPOINT_URL_SQS": sqs_endpoint,
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    service.cache_clear()
    # The adapter keeps socketserver's listen backlog of 5: a burst of 20 clients then
    # gets connection resets before any request is read (reported against
    # local_stack/api_server.py). A deeper backlog lets the tests send real bursts.
    monkeypatch.setattr(ThreadingHTTPServer, "request_queue_size", 128)
    server, thread = api_server.serve_router("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        service.cache_clear()


def request(
    base_url: str,
    method: str,
    target: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 15.0,
) -> Answer:
    """One HTTP request on a fresh connection; ``body`` is sent as JSON, ``raw`` as is."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port, timeout=timeout
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
